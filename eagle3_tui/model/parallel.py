"""Catch-up on two cores: the later half of a big chunk is read in a worker process.

Decoding JSON is the bulk of a catch-up and stays in one core in Python, so a
chunk of at least :data:`PARALLEL_MIN` bytes is cut at a line boundary near its
middle: this process reads the first half while a worker process reads the
second into a :class:`~eagle3_tui.model.state.RunState` of its own, which is then
merged (:meth:`RunState.merge`, tested equal to reading serially). Anything
unusual — no second core, the worker unavailable, a restart or an overlap in the
later half — falls back to reading serially; nothing is lost either way.

The worker is a ``forkserver`` child (safe beside the UI's threads) started on
first use or by :func:`warm`. ``EAGLE3_TUI_SERIAL=1`` turns this off.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import threading
from concurrent.futures import Future, ProcessPoolExecutor

from eagle3_tui.model.state import RunState

PARALLEL_MIN = 16 * 1024 * 1024

_lock = threading.Lock()
_pool: ProcessPoolExecutor | None = None
_broken = False

Tail = tuple[bytes, int, int, bool]


def enabled() -> bool:
    return (os.cpu_count() or 1) >= 2 and os.environ.get("EAGLE3_TUI_SERIAL") != "1"


def pool() -> ProcessPoolExecutor | None:
    """The worker process, started on first use (None when unavailable)."""
    global _pool, _broken
    if _broken or not enabled():
        return None
    with _lock:
        if _pool is None:
            try:
                ctx = multiprocessing.get_context("forkserver")
                _pool = ProcessPoolExecutor(max_workers=1, mp_context=ctx)
                atexit.register(_pool.shutdown, wait=False, cancel_futures=True)
            except (OSError, ValueError):
                _broken = True
                return None
        return _pool


def warm() -> Future[None] | None:
    """Start the worker now (it takes ~0.3 s), so that a catch-up finds it ready."""
    p = pool()
    return p.submit(_noop) if p is not None else None


def _noop() -> None:
    return None


def read_part(data: bytes, offset: int, line_no: int) -> tuple[RunState, Tail]:
    """Read ``data`` (file bytes from ``offset``, after ``line_no`` lines) on its own."""
    from eagle3_tui.model.run import Run

    run = Run(offset=offset, line_no=line_no, parallel=False)
    run.feed(offset, data)
    return run.state, run.reader.tail()


def submit(data: bytes, offset: int, line_no: int) -> Future[tuple[RunState, Tail]] | None:
    p = pool()
    if p is None:
        return None
    try:
        return p.submit(read_part, data, offset, line_no)
    except RuntimeError:  # shut down or broken
        return None
