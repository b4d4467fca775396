"""A long local read on two cores: the agent's side in a forked child, the model's here.

Reading a run on this machine is the agent's ``read`` and the client's ingest in one
process (transport/local.py's :func:`~eagle3_tui.transport.local.iter_frames`): the
plan and payloads of the file's columns (agent/column_plan.py, ~0.35 s for a 1M-step
run) and then their decoding and applying (~0.8 s), one after the other. Here a
forked child makes the frames and writes them into a pipe while this process applies
the ones before, where the machine has a second core.

The child also inflates each payload's columns (``inflate.inflate_ahead``): zlib, the
unshuffling and the sums were a third of this process's applying, while the child,
done planning, idled. They come after the payload as their values, which this process
applies as they are (``apply_segment``'s ``ahead``).

The child is this process forked (no interpreter to start, nothing to import), only
where that is safe and pays: one thread alive (a fork copies no other thread, and a
lock one held would stay held in the child), a second CPU, and a file of at least
:data:`FORK_MIN` bytes with a companion (without one there are no columns to plan).
The child only reads; it leaves with ``os._exit`` (no handler, no buffer of this
process runs twice). It sends each columns payload as ``offset, span, length`` and
its bytes, each range of lines between them as ``offset, length, -1`` (this process
reads those itself: through a pipe they would cost a copy each way, and a run whose
companion names another file, a copied run's, is all lines); an offset of -1 ends
the read. Where the child stops short of that (it failed, or was killed), the read
goes on here from the last whole part, as :func:`iter_frames` reads, so that a
failure is raised here as it would be without a child.

A command that knows it will read a long local run (``summary DIR``) starts the child
before it imports the model (:func:`start_early`): the child, which imports only the
agent's side (transport/parts.py), plans its first frames meanwhile (~0.2 s for a
1M-step run), and the read takes it up. One never taken is ended when the process
exits.

No textual here; light to import (numpy, the model and asyncio only where the parent
reads).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import io
import os
import signal
import struct
import termios
import threading
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from eagle3_tui.telemetry.columns import companion_path
from eagle3_tui.telemetry.safefs import open_file
from eagle3_tui.transport.parts import columnar_parts, file_bytes

if TYPE_CHECKING:
    from eagle3_tui.model.inflate import Inflated
    from eagle3_tui.transport.channel import DataFrame

FORK_MIN = 64 << 20
"""A file smaller than this is read in one process (a fork's cost, a few ms, would be
most of the gain)."""
PIPE_SIZE = 1 << 20
"""The pipe's buffer: the child runs this far ahead (the default 64 KiB is ~4 frames)."""
INFLATE_AHEAD_OF = 256 << 10
"""The child inflates a payload's columns while at least this much of what it sent is
unread (the parent has work; otherwise the parent is waiting and inflates it itself)."""
_WRITE_BUFFER = _READ_BUFFER = 64 << 10  # what is unread stays in the pipe (_unread)
_HEAD = struct.Struct("<qqq")
_COLUMN = struct.Struct("<qqq1s")  # an inflated column: place, size, length, type
_MOST = 1 << 32
"""No inflated column is longer (a frame of the pipe that says so is not one)."""
_END = -1
_F_SETPIPE_SZ = 1031  # Linux's fcntl


def read_inflated(
    path: Path, history: dict[str, Any] | None = None
) -> Generator[tuple[DataFrame, Inflated | None], None, None]:
    """:func:`~eagle3_tui.transport.local.iter_frames` of ``path``, the same frames
    made in a forked child where that is safe and pays (see the module's docstring),
    each with its columns inflated by the child (None: to be inflated as it is
    applied)."""
    from eagle3_tui.transport.channel import DataFrame
    from eagle3_tui.transport.local import columnar, iter_frames, open_input

    child = _take_early(path, history)
    if child is None and _worth_a_child(path):
        with open_input(path) as f:
            child = _Child.start(f, path, history)
    if child is None:
        for frame in iter_frames(path, history):
            yield frame, None
        return
    at = 0
    try:
        fd = child.file.fileno()
        for part in _received(child.pipe):
            if part is None:
                return  # the child planned to the end
            start, payload, span, ahead = part
            if payload is not None:
                yield DataFrame(start, payload, span), ahead
                at = start + span
                continue
            stop = None if span < 0 else start + span
            for offset, data, _ in file_bytes(fd, start, stop):
                yield DataFrame(offset, data), None
                at = offset + len(data)
        # the child stopped short: the rest is read here (a failure is raised here)
        for offset, data, span in columnar(fd, path, at, None, history):
            yield DataFrame(offset, data, span), None
    finally:
        child.end()


class _Child:
    """A forked child reading a file for this process: its pid, the pipe this process
    reads, and the file (its own handle: the ranges of lines are read here)."""

    def __init__(self, pid: int, pipe: io.BufferedReader[Any], file: BinaryIO) -> None:
        self.pid, self.pipe, self.file = pid, pipe, file
        st = os.fstat(file.fileno())
        self.ident = (st.st_dev, st.st_ino)

    @classmethod
    def start(cls, f: BinaryIO, path: Path, history: Any) -> _Child | None:
        """The child of a read of ``f`` (``path``, open); None where it cannot fork."""
        fd = os.dup(f.fileno())
        r, w = os.pipe()
        # a Ctrl-C waits until the child can take it as its own (it leaves at once)
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            pid = os.fork()
        except OSError:
            pid = -1
        if pid == 0:  # pragma: no cover (the child: measured by its parent's tests)
            _child(fd, path, (r, w), mask, history)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # (a Ctrl-C now: reaped)
        os.close(w)
        if pid < 0:
            os.close(r)
            os.close(fd)
            return None
        return cls(pid, io.BufferedReader(io.FileIO(r, "rb"), _READ_BUFFER), os.fdopen(fd, "rb"))

    def end(self) -> None:
        """The child gone and reaped (killed where the read ended early), its pipe and
        file closed."""
        _end(self.pid)
        self.pipe.close()
        self.file.close()


_early: dict[tuple[str, str], _Child] = {}


def start_early(path: Path, history: dict[str, Any] | None = None) -> None:
    """Start the child of a read of ``path`` that this process will make (before the
    imports a read needs: see the module's docstring). Nothing where a child would not
    be, or ``path`` cannot be opened (the read says why); never raises."""
    try:
        if not _worth_a_child(path):
            return
        with open_file(path) as f:
            child = _Child.start(f, path, history)
    except OSError:
        return
    if child is not None:
        if not _early:
            atexit.register(_end_early)
        _early[_key(path, history)] = child


def _key(path: Path, history: Any) -> tuple[str, str]:
    return os.path.realpath(path), repr(history)


def _take_early(path: Path, history: Any) -> _Child | None:
    """The child :func:`start_early` started for this read, if it reads this file."""
    child = _early.pop(_key(path, history), None)
    if child is None:
        return None
    try:
        st = os.stat(path)
        if (st.st_dev, st.st_ino) == child.ident:
            return child
    except OSError:
        pass
    child.end()  # the path names another file now
    return None


def _end_early() -> None:
    while _early:
        _early.popitem()[1].end()


def _worth_a_child(path: Path) -> bool:
    if not hasattr(os, "fork") or threading.active_count() != 1:
        return False
    try:
        if len(os.sched_getaffinity(0)) < 2:
            return False
        return path.stat().st_size >= FORK_MIN and os.path.exists(companion_path(str(path)))
    except (OSError, AttributeError):
        return False


def _child(
    fd: int, path: Path, pipe: tuple[int, int], mask: set[int | signal.Signals], history: Any
) -> None:
    """Write the frames and the end into the pipe; never return."""
    code = 1
    try:
        r, w = pipe
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a Ctrl-C ends the child at once
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(r)
        with contextlib.suppress(OSError):  # else a smaller pipe: the child runs less ahead
            fcntl.fcntl(w, _F_SETPIPE_SZ, PIPE_SIZE)
        with os.fdopen(w, "wb", buffering=_WRITE_BUFFER) as out:
            numpy_yet = False
            for offset, payload, span in columnar_parts(fd, path, 0, None, history):
                out.write(_HEAD.pack(offset, span, -1 if payload is None else len(payload)))
                if not numpy_yet:  # the first part on its way, then numpy (see below)
                    out.flush()
                    numpy_yet = _import_numpy()
                if payload is not None:
                    out.write(payload)
                    # inflated here while the parent has frames to apply; where it waits
                    # for this one, it inflates it itself
                    ahead = _unread(w) >= INFLATE_AHEAD_OF
                    _send_inflated(out, _inflated(payload) if ahead else {})
            out.write(_HEAD.pack(_END, 0, 0))
        code = 0
    finally:
        os._exit(code)


def _import_numpy() -> bool:
    """numpy imported in the child once its first part is sent: the plan's sums of the
    rows' and samples' places (``unpack_int_array``) take it where a process has it,
    ~8x faster (a 1M-step run's plan ~0.35 s less), and inflating imports it anyway."""
    with contextlib.suppress(ImportError):
        import numpy  # noqa: F401
    return True


def _inflated(payload: bytes) -> Inflated:
    from eagle3_tui.model.inflate import inflate_ahead  # (numpy: where it is needed)

    return inflate_ahead(payload) or {}


def _unread(fd: int) -> int:
    """The bytes in the pipe the parent has not read (Linux's FIONREAD); 0 if unknown."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0])
    except OSError:
        return 0


def _send_inflated(out: BinaryIO, inflated: Inflated) -> None:
    out.write(struct.pack("<q", len(inflated)))
    for (at, kind, size, n), values in inflated.items():
        out.write(_COLUMN.pack(at, size, n, kind.encode()))
        out.write(values.data)


def _received_inflated(pipe: io.BufferedReader[Any]) -> Inflated | None:
    """A payload's columns as the child inflated them; None where the pipe ends or
    says what no child sends."""
    import numpy as np

    from eagle3_tui.model.inflate import DTYPES

    head = pipe.read(8)
    if len(head) != 8:
        return None
    (count,) = struct.unpack("<q", head)
    if not 0 <= count <= 4096:
        return None
    inflated: Inflated = {}
    for _ in range(count):
        head = pipe.read(_COLUMN.size)
        if len(head) != _COLUMN.size:
            return None
        at, size, n, code = _COLUMN.unpack(head)
        dtype = DTYPES.get(code.decode("ascii", "replace"))
        if dtype is None or not 0 < n <= _MOST:
            return None
        raw = bytearray(n * dtype.itemsize)  # writable, as inflated arrays are
        if pipe.readinto(raw) != len(raw):
            return None
        inflated[at, code.decode(), size, n] = np.frombuffer(raw, dtype=dtype)
    return inflated


def _received(
    pipe: io.BufferedReader[Any],
) -> Iterator[tuple[int, bytes | None, int, Inflated | None] | None]:
    """The child's parts (:func:`~eagle3_tui.transport.local.columnar_parts`), each
    payload with its columns inflated, then None at its end; nothing more where it
    stopped short."""
    while True:
        head = pipe.read(_HEAD.size)
        if len(head) != _HEAD.size:
            return
        offset, span, n = _HEAD.unpack(head)
        if offset == _END:
            yield None
            return
        if n < 0:  # a range of the file's bytes: read here
            yield offset, None, span, None
            continue
        data = pipe.read(n)
        if len(data) != n or offset < 0:
            return
        inflated = _received_inflated(pipe)
        if inflated is None:
            return
        yield offset, data, span, inflated


def _end(pid: int) -> None:
    """The child gone and reaped (it is killed where the read ended early here)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
