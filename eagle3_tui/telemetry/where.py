"""Where the trainer's main thread is, seen from the telemetry writer thread.

When a distributed run hangs, every rank looks the same from outside (alive, no
metric, idle devices): the one that stopped is told from the ones that wait by
*where* each main thread is. A rank waiting for a peer sits in a collective
(a frame of ``torch/distributed``); the rank that stopped sits anywhere else (a
stuck dataloader, a deadlock, a wedged kernel). ``sys._current_frames()`` gives
the main thread's frame from another thread at the cost of a dictionary; this
works while the main thread is in a C call that released the GIL (a gloo or NCCL
wait does), and not while it holds the GIL (then no telemetry thread runs at all,
which the heartbeat's growing ``stats_age_s`` says instead).

Standard library only.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

COLLECTIVE_PATH = os.sep + os.path.join("torch", "distributed") + os.sep
MAX_DEPTH = 200
_STDLIB = os.path.dirname(threading.__file__) + os.sep


def _is_stdlib(filename: str) -> bool:
    """threading.py's ``wait`` says less than the frame that called it."""
    if filename.startswith("<frozen"):
        return True
    return filename.startswith(_STDLIB) and "-packages" not in filename


def _describe(frame: Any) -> str:
    code = frame.f_code
    return f"{os.path.basename(code.co_filename)}:{frame.f_lineno} {code.co_name}"


class MainThreadWhere:
    """``where()``: the main thread's innermost frame outside the standard library, the
    collective it waits in (if any) and since when it has been at that same place."""

    def __init__(self) -> None:
        self._main = threading.main_thread().ident
        self._last: tuple[str, str | None] | None = None
        self._since = time.time()

    def where(self) -> dict[str, Any] | None:
        """None when called from the main thread itself (the last figures at close)."""
        if threading.get_ident() == self._main:
            return None
        frame: Any = sys._current_frames().get(self._main) if self._main is not None else None
        if frame is None:
            return None
        top: str | None = None
        collective: str | None = None
        f: Any = frame
        depth = 0
        while f is not None and depth < MAX_DEPTH:
            if top is None and not _is_stdlib(f.f_code.co_filename):
                top = _describe(f)  # the innermost frame of the program or a library
            if (
                collective is None
                and COLLECTIVE_PATH in f.f_code.co_filename
                and f.f_code.co_name != "<module>"  # an import, not a wait
            ):
                collective = f.f_code.co_name  # the innermost torch.distributed frame
            f = f.f_back
            depth += 1
        if top is None:
            top = _describe(frame)
        now = time.time()
        key = (top, collective)
        if key != self._last:
            self._last = key
            self._since = now
        return {"frame": top, "collective": collective, "for_s": round(now - self._since, 1)}
