"""A run directory on this machine, read and followed like ``tail -F``.

No textual here.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from eagle3_tui.agent.diskspace import DiskWatch
from eagle3_tui.agent.inputs import BadInputError, check_input, input_problem
from eagle3_tui.agent.names import ERR_PERMISSION, ERR_WRONG_KIND
from eagle3_tui.telemetry.safefs import (
    open_file,
    open_regular,
)
from eagle3_tui.telemetry.schema import MANIFEST_FILE, METRICS_FILE
from eagle3_tui.transport.base import (
    Chunk,
    DiskSpace,
    FileChanged,
    Link,
    LinkChanged,
    NoPermissionError,
    StreamEvent,
    TargetError,
    WrongKindError,
    printable,
)
from eagle3_tui.transport.channel import DataFrame
from eagle3_tui.transport.glancing import glance_local
from eagle3_tui.transport.parts import READ_SIZE, columnar_parts, file_bytes

if TYPE_CHECKING:
    from eagle3_tui.model.glance import GlanceData


def _error(problem: BadInputError) -> TargetError:
    message = printable(str(problem))
    if problem.kind == ERR_PERMISSION:
        return NoPermissionError(message)
    if problem.kind == ERR_WRONG_KIND:
        return WrongKindError(message)
    return TargetError(message)


def input_error(path: Path, e: OSError) -> TargetError:
    """The one-line error for a local input the system refused with ``e``: no
    permission (:class:`NoPermissionError`, with the mode and owner that refuse it),
    not what it must be (:class:`WrongKindError`: a FIFO, a directory, a link), or
    missing (:class:`TargetError`)."""
    return _error(input_problem(str(path), e))


def open_input(path: Path) -> BinaryIO:
    """``path`` opened to be read (a regular file, opened without blocking: a FIFO put
    there since it was checked is refused, not waited on), or :func:`input_error`'s."""
    try:
        return open_file(path)
    except OSError as e:
        raise input_error(path, e) from None


def check_local_input(path: Path) -> None:
    """A local TARGET as this user can read it, before anything is read (the agent's
    :func:`~eagle3_tui.agent.inputs.check_input`, which a host's agent does there): a
    ``chmod 000`` anywhere there is no permission, not a traceback; a path that does not
    exist is left to the reader, which says what it missed."""
    try:
        check_input(str(path))
    except BadInputError as problem:
        raise _error(problem) from None


def check_run_dir(run_dir: Path, wait_for_file: bool = False) -> Path:
    """The metrics file of ``run_dir``, or a one-line TargetError saying what is wrong
    (:func:`check_local_input`'s, or what is missing). A run directory whose ``run.json``
    is there without its file (deleted or moved away under the run): ``wait_for_file``
    (the monitor: it waits for the file, as it does when the file goes while it follows),
    else said so, not "is telemetry attached?"."""
    check_local_input(run_dir)
    if not run_dir.exists():
        raise TargetError(f"{run_dir}: no such run directory")
    path = run_dir / METRICS_FILE
    if not path.exists():
        if (run_dir / MANIFEST_FILE).exists():
            if wait_for_file:
                return path
            raise TargetError(
                f"{run_dir}: no {METRICS_FILE} here, though its {MANIFEST_FILE} is (deleted "
                "or moved away under the run?): its telemetry writes the file again with its "
                f"next record; the monitor waits for it (eagle3-tui {run_dir})"
            )
        raise TargetError(
            f"{run_dir}: no {METRICS_FILE} here (is telemetry attached to the trainer?)"
        )
    return path


def iter_chunks(path: Path, offset: int = 0, size: int = READ_SIZE) -> Iterator[Chunk]:
    """The file from ``offset`` to its current end, a chunk at a time (a catch-up
    holds one chunk, not the whole file). A regular file only (:func:`open_input`)."""
    with open_input(path) as f:
        f.seek(offset)
        while True:
            data = f.read(size)
            if not data:
                return
            yield Chunk(offset, data)
            offset += len(data)


def iter_frames(path: Path, history: dict[str, Any] | None = None) -> Iterator[DataFrame]:
    """The file from its start to its end now, as the agent's ``read`` sends it (see
    :func:`columnar`). ``history``: a read request's (agent/names.py's ``SUMMARY_HISTORY``)."""
    with open_input(path) as f:
        fd = f.fileno()
        for offset, data, span in columnar(fd, path, 0, None, history):
            yield DataFrame(offset, data, span)


def columnar(
    fd: int, path: Path, offset: int, stop: int | None, history: dict[str, Any] | None = None
) -> Iterator[tuple[int, bytes, int]]:
    """The file (open as ``fd``) from ``offset`` to ``stop`` (None: its end now) as
    (offset, data, span): what its companion stands for as columns payloads
    (agent/column_plan.py: the steps' columns, the events' lines and the samples'
    envelopes; where it accounts for every byte of a range, nothing else of the range
    is read), the rest as the file's bytes (span -1), a read at a time."""
    for start, payload, span in columnar_parts(fd, path, offset, stop, history):
        if payload is None:
            yield from file_bytes(fd, start, None if span < 0 else start + span)
        else:
            yield start, payload, span


CATCH_UP_BYTES = 16 * READ_SIZE
"""The most read in one go: a 2.5 GB file is not held whole while the model takes it."""
COLUMNAR_MIN = 32 << 20
"""A catch-up of at least this many bytes reads what the companion stands for as
columns (:func:`columnar`), as the agent's catch-up does."""
IDLE_POLL_S = 0.25
"""The longest wait between two looks at a file that stopped growing: a step written
then is read within it, well inside the app's one-second picture of new data."""


class LocalTransport:
    """Follows ``run_dir/metrics.jsonl``: reads what is there, then polls for appends.

    It looks again ``poll_interval`` after an append, then twice as long after each
    look that found nothing, up to ``idle_interval``. By default both are
    ``IDLE_POLL_S``: a run that writes twice a second costs 4 looks a second (each one
    a wake-up of the app's event loop; 0.05 s after an append cost ~10), and what it
    writes is read within 0.25 s, inside the one-second picture of new data. Each
    look reads all there is, so a fast run is read in as few looks.

    As the agent's ``follow`` does, it holds the file open: a file replaced or deleted
    under it is read to its end, then the file at the path now from 0, and it says
    which happened and when (``FileChanged``; a truncated one too), and the room on the
    run's filesystem (``DiskSpace``, from the agent's :class:`DiskWatch`).

    A file it may not open (``chmod 000`` on it or its directory, a FIFO put there) is
    said as ``Link.UNREADABLE`` with :func:`input_error`'s line, and looked at again
    until it can be read: what it holds then is read on from where the stream was.
    """

    def __init__(
        self,
        run_dir: Path,
        poll_interval: float = IDLE_POLL_S,
        idle_interval: float = IDLE_POLL_S,
        columnar_min: int = COLUMNAR_MIN,
    ) -> None:
        self.run_dir = run_dir
        self.path = run_dir / METRICS_FILE
        self.poll_interval = poll_interval
        self.idle_interval = max(poll_interval, idle_interval)
        self.columnar_min = columnar_min

    @property
    def label(self) -> str:
        return str(self.run_dir)

    def fork(self) -> LocalTransport:
        """A transport of its own for the same run (a second stream beside this one)."""
        return LocalTransport(
            self.run_dir, self.poll_interval, self.idle_interval, self.columnar_min
        )

    async def glance(self, tail_rows: int, min_size: int) -> GlanceData | str:
        """The run at a glance (transport/glancing.py), or why there is none."""
        return await asyncio.to_thread(glance_local, self.path, tail_rows, min_size)

    async def stream(self, offset: int = 0) -> AsyncIterator[StreamEvent]:
        disk = DiskWatch(str(self.run_dir), str(self.path))
        fd: int | None = None
        identity: tuple[int, int] | None = None  # of the file followed, once there was one
        gone = False  # it was there, and the path has none now: deleted
        leaving = False  # the path holds another file: the old one is read to its end first
        waiting = False
        unreadable = ""  # what the last look that could not open the file said
        wait = self.poll_interval
        try:
            while True:
                room = DiskSpace.of(disk.poll())
                if room is not None:
                    yield room
                if fd is None:
                    try:
                        if identity is not None:  # a file made there since: checked as the
                            os.lstat(self.path)  # first was (another's link), once the open
                            check_input(str(self.run_dir))  # could see it (else its words)
                        fd, st = open_regular(self.path)  # never a FIFO: no hang
                    except BadInputError as problem:
                        why = str(_error(problem))
                        if why != unreadable:
                            yield LinkChanged(Link.UNREADABLE, why)
                            unreadable = why
                        await asyncio.sleep(self.idle_interval)
                        continue
                    except FileNotFoundError:
                        if identity is not None and not gone:
                            gone = True
                            yield FileChanged("deleted", time.time(), offset)
                        if not waiting:
                            yield LinkChanged(Link.WAITING, f"waiting for {self.path}")
                            waiting = True
                        await asyncio.sleep(self.poll_interval)
                        continue
                    except OSError as e:
                        why = str(input_error(self.path, e))
                        if why != unreadable:
                            yield LinkChanged(Link.UNREADABLE, why)
                            unreadable = why
                        await asyncio.sleep(self.idle_interval)
                        continue
                    ident = (st.st_dev, st.st_ino)
                    if identity is not None and (gone or ident != identity):
                        change = "deleted" if gone else "replaced"
                        yield FileChanged(change, time.time(), offset, st.st_size)
                        offset = 0
                    elif st.st_size < offset:
                        yield FileChanged("truncated", time.time(), offset, st.st_size)
                        offset = 0
                    if identity is None or waiting or unreadable:
                        yield LinkChanged(Link.LOCAL, str(self.run_dir), size=st.st_size)
                    identity, gone, waiting, unreadable = ident, False, False, ""
                size = os.fstat(fd).st_size
                if size < offset:
                    yield FileChanged("truncated", time.time(), offset, size)
                    offset = 0
                if size - offset >= self.columnar_min:  # what the companion stands for
                    frames = columnar(fd, self.path, offset, size)
                    while (got := await asyncio.to_thread(next, frames, None)) is not None:
                        chunk = Chunk(got[0], got[1], span=got[2])
                        yield chunk
                        offset = chunk.end
                    continue
                if size > offset:  # a catch-up a few MB at a time: memory stays bounded
                    end = min(size, offset + CATCH_UP_BYTES)
                    for chunk in await asyncio.to_thread(_read, fd, offset, end):
                        yield chunk
                        offset = chunk.end
                    wait = self.poll_interval
                    continue
                if _identity(self.path) != identity:
                    if leaving:  # read to its end: the path's file from now on
                        os.close(fd)
                        fd, leaving = None, False
                    else:
                        leaving = True  # one more look: what was appended before the swap
                    continue
                await asyncio.sleep(wait)
                wait = min(self.idle_interval, 2 * wait)
        finally:
            if fd is not None:
                os.close(fd)


def _identity(path: Path) -> tuple[int, int] | None:
    """The file at ``path`` now (device, inode); None when there is none, or none this
    user may see (its directory made unreadable: the open that follows says why)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _read(fd: int, offset: int, end: int, size: int = READ_SIZE) -> list[Chunk]:
    """The file from ``offset`` to ``end``, as chunks."""
    out = []
    while offset < end:
        data = os.pread(fd, min(size, end - offset), offset)
        if not data:
            break
        out.append(Chunk(offset, data))
        offset += len(data)
    return out
