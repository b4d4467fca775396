"""A long local read on two cores: the agent's side in a forked child, the model's here.

Reading a run on this machine is the agent's ``read`` and the client's ingest in one
process (transport/local.py's :func:`~eagle3_tui.transport.local.iter_frames`): the
plan and payloads of the file's columns (agent/column_plan.py, ~0.35 s for a 1M-step
run) and then their decoding and applying (~0.8 s), one after the other. Here a
forked child makes the frames and writes them into a pipe while this process applies
the ones before: ~0.25 s less for that run where the machine has a second core.

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

No textual here.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from eagle3_tui.telemetry.columns import companion_path
from eagle3_tui.transport.channel import DataFrame
from eagle3_tui.transport.local import (
    columnar,
    columnar_parts,
    file_bytes,
    iter_frames,
    open_input,
)

FORK_MIN = 64 << 20
"""A file smaller than this is read in one process (a fork's cost, a few ms, would be
most of the gain)."""
PIPE_SIZE = 1 << 20
"""The pipe's buffer: the child runs this far ahead (the default 64 KiB is ~4 frames)."""
_HEAD = struct.Struct("<qqq")
_END = -1
_F_SETPIPE_SZ = 1031  # Linux's fcntl


def read_frames(path: Path, history: dict[str, Any] | None = None) -> Iterator[DataFrame]:
    """:func:`~eagle3_tui.transport.local.iter_frames` of ``path``: the same frames,
    made in a forked child where that is safe and pays (see the module's docstring)."""
    if not _worth_a_child(path):
        yield from iter_frames(path, history)
        return
    with open_input(path) as f:
        fd = f.fileno()
        r, w = os.pipe()
        # a Ctrl-C waits until the child can take it as its own (it leaves at once)
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            pid = os.fork()
        except OSError:
            pid = -1
        if pid == 0:  # pragma: no cover (the child: measured by its parent's tests)
            _child(fd, path, (r, w), mask, history)
        if pid < 0:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            os.close(r)
            os.close(w)
            yield from iter_frames(path, history)
            return
        at = 0
        try:
            os.close(w)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # (a Ctrl-C now: reaped)
            with os.fdopen(r, "rb", buffering=PIPE_SIZE) as pipe:
                for part in _received(pipe):
                    if part is None:
                        return  # the child planned to the end
                    start, payload, span = part
                    if payload is not None:
                        yield DataFrame(start, payload, span)
                        at = start + span
                        continue
                    stop = None if span < 0 else start + span
                    for offset, data, _ in file_bytes(fd, start, stop):
                        yield DataFrame(offset, data)
                        at = offset + len(data)
            # the child stopped short: the rest is read here (a failure is raised here)
            for offset, data, span in columnar(fd, path, at, None, history):
                yield DataFrame(offset, data, span)
        finally:
            _end(pid)


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
        with os.fdopen(w, "wb", buffering=PIPE_SIZE) as out:
            for offset, payload, span in columnar_parts(fd, path, 0, None, history):
                out.write(_HEAD.pack(offset, span, -1 if payload is None else len(payload)))
                out.write(payload or b"")
            out.write(_HEAD.pack(_END, 0, 0))
        code = 0
    finally:
        os._exit(code)


def _received(pipe: BinaryIO) -> Iterator[tuple[int, bytes | None, int] | None]:
    """The child's parts (:func:`~eagle3_tui.transport.local.columnar_parts`), then None
    at its end; nothing more where it stopped short."""
    while True:
        head = pipe.read(_HEAD.size)
        if len(head) != _HEAD.size:
            return
        offset, span, n = _HEAD.unpack(head)
        if offset == _END:
            yield None
            return
        if n < 0:  # a range of the file's bytes: read here
            yield offset, None, span
            continue
        data = pipe.read(n)
        if len(data) != n or offset < 0:
            return
        yield offset, data, span


def _end(pid: int) -> None:
    """The child gone and reaped (it is killed where the read ended early here)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
