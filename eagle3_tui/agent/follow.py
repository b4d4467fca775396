"""Following a run file: ``follow`` (like ``tail -F`` with byte offsets, inotify-woken)
and ``read`` (a file to its end)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import time
import zlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from eagle3_tui.agent.column_plan import ready
from eagle3_tui.agent.diskspace import DiskWatch, disk_space
from eagle3_tui.agent.frames import (
    AgentError,
    client_gone,
    emit,
    emit_columns,
    emit_data,
    emit_zdata,
    tick,
)
from eagle3_tui.agent.names import COMPRESS_ZLIB, ERR_INVALID, TICK_S
from eagle3_tui.agent.runs import check_run_dir, resolve_run_dir
from eagle3_tui.telemetry.safefs import open_regular

READ_SIZE = 1 << 20
SAFETY_POLL_S = 0.5  # with inotify: re-check anyway (NFS sends no events)
POLL_S = 0.05  # without inotify
ZLIB_LEVEL = 1
"""Level 1 packs metrics records 2.9x at ~70-90 MB/s a core, level 6 3.3x at ~20 MB/s
(benchmarks/records.py's train records), so level 1 outruns a 100 Mbit/s link from one
core. Measured through a 100 Mbit/s relay (benchmarks/bench_catchup.py, 200k steps,
host and client on one loaded 2-core machine), the first frame took 10.4 s at level 1,
24.7 s at level 6, and 13.7 s with the level raised while writes waited longer than
compression (a busy host's sshd makes writes wait too): a request's ``level`` may
ask for more."""
MIN_ZLIB = 16 * 1024
"""Smaller reads (the live tail's appends) go as plain D frames: no latency added."""
MAX_THREADS = 4

# inotify (linux/inotify.h)
IN_MODIFY = 0x002
IN_ATTRIB = 0x004
IN_CLOSE_WRITE = 0x008
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000

FILE_MASK = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_DELETE_SELF | IN_MOVE_SELF
DIR_MASK = IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF


class Inotify:
    """inotify through ctypes; ``fd`` is None where it is unavailable."""

    def __init__(self) -> None:
        self.fd: int | None = None
        try:
            self._libc = ctypes.CDLL(None, use_errno=True)
            fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        except (OSError, AttributeError):
            return
        if fd >= 0:
            self.fd = fd

    def add(self, path: Path, mask: int) -> int | None:
        if self.fd is None:
            return None
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(str(path)), mask)
        return int(wd) if wd >= 0 else None

    def remove(self, wd: int | None) -> None:
        if self.fd is not None and wd is not None:
            self._libc.inotify_rm_watch(self.fd, wd)

    def drain(self) -> None:
        """Consume the queued events (one read takes them all; more wake the next poll)."""
        if self.fd is None:
            return
        with contextlib.suppress(OSError):  # EAGAIN: nothing queued after all
            os.read(self.fd, 65536)


def _identity(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}"


class Deflater:
    """Compresses a catch-up's reads ahead of the writes, in threads (zlib lets go of
    the GIL): reading, compressing and sending overlap."""

    def __init__(self, level: int = ZLIB_LEVEL) -> None:
        self.level = max(0, min(9, level))
        self.threads = max(1, min(MAX_THREADS, os.cpu_count() or 1))
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, data: bytes) -> Future[bytes]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads)
        return self._pool.submit(zlib.compress, data, self.level)


def deflater_for(req: dict[str, Any]) -> Deflater | None:
    """A :class:`Deflater` where the client asked for Z frames (an older client did not);
    the request's ``level`` fixes the zlib level."""
    if req.get("compress") != COMPRESS_ZLIB:
        return None
    level = req.get("level")
    return Deflater(level if isinstance(level, int) and not isinstance(level, bool) else ZLIB_LEVEL)


def _pump(fd: int, offset: int, z: Deflater | None = None, stop: int | None = None) -> int:
    """Send the file from ``offset`` to its current end (or to ``stop``); returns the
    new offset.

    Reads what fstat says is there (a pread of a fixed 1 MiB would allocate and free
    1 MiB per appended line); an append after the fstat wakes the next round. With
    ``z``, reads of at least :data:`MIN_ZLIB` bytes go compressed (Z frames), each on
    its own so that every frame ends at an exact offset the client can resume from.
    """
    ahead: deque[tuple[int, bytes, Future[bytes] | None]] = deque()
    end = offset  # where the next read starts
    depth = 1 if z is None else z.threads + 1
    while True:
        if client_gone():
            return offset
        if len(ahead) < depth:
            left = (os.fstat(fd).st_size if stop is None else stop) - end
            if left > 0:
                data = os.pread(fd, min(left, READ_SIZE), end)
                if data:
                    big = z is not None and len(data) >= MIN_ZLIB
                    ahead.append((end, data, z.submit(data) if z is not None and big else None))
                    end += len(data)
                    continue
        if not ahead:
            return offset
        at, data, packed = ahead.popleft()
        if packed is None:
            emit_data(at, data)
        else:
            zdata = packed.result()
            if len(zdata) < len(data):
                emit_zdata(at, len(data), zdata)
            else:
                emit_data(at, data)
        offset = at + len(data)


def _catch_up(fd: int, path: Path, offset: int, z: Deflater | None, req: dict[str, Any]) -> int:
    """Where the client asked for ``"columns"`` and the file has a companion, send
    what it indexes as C frames and the rest as lines, up to the file's size now;
    returns the new offset (the rest is :func:`_pump`'s). ``"samples"`` (per sampler
    kind, how many of the newest the client keeps) lets the older ones in those frames
    go as envelopes."""
    keep = req.get("columns")
    if not isinstance(keep, dict):
        return offset
    size = os.fstat(fd).st_size
    history = req.get("history")
    for start, end, payload in ready(
        fd, str(path), offset, size, req.get("samples"), keep, history
    ):
        offset = _pump(fd, offset, z, stop=start)
        if client_gone() or offset != start:
            return offset
        emit_columns(start, end - start, payload)
        offset = end
    return offset


def _stdin_closed() -> bool:
    try:
        return not os.read(0, 65536)
    except OSError:
        return True


def _batch_s(value: object) -> float:
    """A client's ``batch_s``: how long to gather appends before a frame (0 to 10 s)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    return min(10.0, max(0.0, float(value)))


def op_follow(req: dict[str, Any]) -> int:
    """Stream ``run_dir/file`` from ``offset`` forever, like ``tail -F`` with offsets."""
    run_dir = resolve_run_dir(req.get("run_dir"))
    emit("resolved", run_dir=str(run_dir))
    check_run_dir(run_dir)
    path = run_dir / str(req.get("file") or "metrics.jsonl")
    offset = int(req.get("offset") or 0)
    want: str | None = req.get("identity")
    z = deflater_for(req)
    batch_s = _batch_s(req.get("batch_s"))
    ino = Inotify()
    timeout_ms = int(1000 * (SAFETY_POLL_S if ino.fd is not None else POLL_S))
    poller = select.poll()
    poller.register(0, select.POLLIN)
    if ino.fd is not None:
        poller.register(ino.fd, select.POLLIN)
    ino.add(run_dir, DIR_MASK)
    fd: int | None = None
    file_wd: int | None = None
    announced = False
    disk = DiskWatch(str(run_dir), str(path))  # a full disk is not a hang: say the room
    while True:
        room = disk.poll()
        if room is not None:
            emit("disk", **room)
        if fd is None:
            try:
                fd, _ = open_regular(path)  # a FIFO or device there: refused, never a hang
            except FileNotFoundError:
                if not announced:
                    emit("waiting", path=str(path), now=time.time())
                    announced = True
            except OSError as e:
                raise AgentError("missing", f"{path}: {e.strerror or e}") from None
            else:
                file_wd = ino.add(path, FILE_MASK)
                st = os.fstat(fd)
                ident = _identity(st)
                seen = {"size": st.st_size, "now": time.time()}
                if want is not None and ident != want:
                    emit("restarted", reason="replaced", offset=0, expected=offset, **seen)
                    offset = 0
                elif st.st_size < offset:
                    emit("restarted", reason="truncated", offset=0, expected=offset, **seen)
                    offset = 0
                want = ident
                announced = False
                emit(
                    "opened",
                    path=str(path),
                    identity=ident,
                    size=st.st_size,
                    offset=offset,
                    now=time.time(),  # the host's clock: the records' ts are in its time
                )
                offset = _catch_up(fd, path, offset, z, req)
        if fd is not None:
            offset = _pump(fd, offset, z)
            st = os.fstat(fd)
            if st.st_size < offset:
                emit(
                    "restarted",
                    reason="truncated",
                    offset=0,
                    expected=offset,
                    size=st.st_size,
                    now=time.time(),
                )
                offset = 0
                continue
            try:
                current: str | None = _identity(os.stat(path))
            except FileNotFoundError:
                current = None
            if current != _identity(st):
                offset = _pump(fd, offset, z)  # what was appended to the old file before the swap
                os.close(fd)
                ino.remove(file_wd)
                fd, file_wd = None, None
                if current is None:
                    want = ""  # deleted: whatever comes next is a new file (a reused inode too)
                continue  # reopen: the identity differs, so it restarts at 0
        if client_gone():
            return 0
        ready = poller.poll(timeout_ms)
        for fd_ready, _ in ready:
            if fd_ready == 0 and _stdin_closed():
                return 0  # the client went away
            if fd_ready == ino.fd:
                ino.drain()
        if ready and batch_s:  # what is written meanwhile goes out in the same frame
            time.sleep(batch_s)
        tick(TICK_S)  # a quiet file: the client still hears that this agent runs


def op_read(req: dict[str, Any]) -> int:
    """Send ``run_dir/file`` from ``offset`` to its current end, then ``eof`` (with the
    file's ``identity``). With the ``identity`` of the file an earlier read ended in: a
    file that is another one now, or shorter than ``offset``, is said (``restarted``,
    as a follow says it) and sent from 0."""
    send_file(req)
    return 0


def send_file(req: dict[str, Any], more: Callable[[str], dict[str, Any]] | None = None) -> None:
    """``read``: the file from the request's offset, then ``eof`` (with ``more(run_dir)``'s
    fields)."""
    run_dir = resolve_run_dir(req.get("run_dir"))
    emit("resolved", run_dir=str(run_dir))
    check_run_dir(run_dir)
    name = str(req.get("file") or "metrics.jsonl")
    path = run_dir / name
    try:
        fd, _ = open_regular(path)  # a FIFO or device there: refused, never a hang
    except FileNotFoundError:
        raise AgentError(
            "missing", f"{run_dir}: no {name} here (is telemetry attached to the trainer?)"
        ) from None
    except OSError as e:
        raise AgentError("missing", f"{path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        ident = _identity(st)
        offset = _offset(req.get("offset"))
        want = req.get("identity")
        replaced = offset > 0 and want is not None and want != ident
        if replaced or st.st_size < offset:
            reason = "replaced" if replaced else "truncated"
            seen = {"size": st.st_size, "now": time.time()}
            emit("restarted", reason=reason, offset=0, expected=offset, **seen)
            offset = 0
        z = deflater_for(req)
        offset = _catch_up(fd, path, offset, z, req)
        offset = _pump(fd, offset, z)
    finally:
        os.close(fd)
    # the room on its filesystem: a summary of a run on a full disk says so
    disk = disk_space(str(run_dir), str(path))
    extra = more(str(run_dir)) if more is not None else {}
    emit("eof", size=offset, now=time.time(), identity=ident, disk=disk, **extra)


def _offset(value: object) -> int:
    """A request's ``offset``: a whole number of bytes (anything else: AgentError)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        if value is None:
            return 0
        raise AgentError(ERR_INVALID, f"offset {value!r}: not a number of bytes")
    return value
