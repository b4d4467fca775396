"""Where a quiet trainer is: its main thread's stack, recorded when the steps stop.

A hung training says nothing about where it hangs. When the training step has
not advanced for ``max(STACK_MIN_QUIET_S, STACK_QUIET_STEPS × median step time)``,
(once the training made a step since telemetry began) the writer thread's
periodic tick reads every thread's current frame
(``sys._current_frames()``, no signal, no cooperation from the main thread:
that works while it is blocked in C code that released the GIL, which is where
a training hangs — a collective, a dataloader queue, a lock) and writes one
``stack`` record: the main thread's frames, innermost first, and the innermost
few of the other threads. While the run stays quiet the stack is looked at again
every ``RECHECK_S`` and written again only when it moved. Cheap: nothing at all
is read while steps advance.

A hang that holds the GIL stops every thread of the trainer, this one too; the
heartbeat's growing ``stats_age_s`` (from the sidecar) says so instead.

Standard library only.
"""

from __future__ import annotations

import os
import statistics
import sys
import sysconfig
import threading
import time
from collections import deque
from collections.abc import Callable
from types import FrameType
from typing import Any

STACK_MIN_QUIET_S = 20.0
"""The soonest a stack is taken: below the monitor's 30 s "stalled" limit, so the
location is there when the diagnosis turns."""
STACK_QUIET_STEPS = 5.0
"""...or this many median step times, whichever is longer (the monitor's rule)."""
RECHECK_S = 30.0
"""While quiet, how often the stack is looked at again (written only if it moved)."""
MAX_FRAMES = 40
OTHER_FRAMES = 3
MAX_THREADS = 16
OWN_THREADS = "eagle3-tui"
"""Thread names of the telemetry itself, left out of the record."""


def _prefixes() -> tuple[tuple[str, ...], tuple[str, ...]]:
    paths = sysconfig.get_paths()
    std = {paths.get("stdlib"), paths.get("platstdlib")}
    site = {paths.get("purelib"), paths.get("platlib")}
    stdlib = tuple(sorted(os.path.join(p, "") for p in std if p))
    library = tuple(sorted(os.path.join(p, "") for p in site if p))
    return stdlib, library


_STDLIB, _LIBRARY = _prefixes()


def frame_origin(filename: str) -> str:
    """``stdlib``, ``library`` (an installed package) or ``user`` (the training's own code)."""
    if filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
        return "stdlib" if filename.startswith("<frozen") else "user"
    if "/site-packages/" in filename or "/dist-packages/" in filename:
        return "library"
    if filename.startswith(_LIBRARY):
        return "library"
    if filename.startswith(_STDLIB):
        return "stdlib"
    return "user"


def frames_of(frame: FrameType | None, limit: int) -> list[dict[str, Any]]:
    """A thread's frames, innermost first: function, file, line, origin."""
    out: list[dict[str, Any]] = []
    while frame is not None and len(out) < limit:
        code = frame.f_code
        out.append(
            {
                "func": getattr(code, "co_qualname", code.co_name),
                "file": code.co_filename,
                "line": frame.f_lineno,
                "origin": frame_origin(code.co_filename),
            }
        )
        frame = frame.f_back
    return out


def capture(main_ident: int | None = None) -> dict[str, Any]:
    """The main thread's stack and the innermost frames of the other threads
    (this module's own telemetry threads left out)."""
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident if main_ident is None else main_ident
    payload: dict[str, Any] = {
        "thread": names.get(main, "MainThread"),
        "frames": frames_of(frames.get(main) if main is not None else None, MAX_FRAMES),
    }
    others: list[dict[str, Any]] = []
    for ident, frame in frames.items():
        name = names.get(ident, f"thread-{ident}")
        if ident == main or name.startswith(OWN_THREADS) or ident == threading.get_ident():
            continue
        if len(others) >= MAX_THREADS:
            break
        others.append({"name": name, "frames": frames_of(frame, OTHER_FRAMES)})
    payload["threads"] = others
    return payload


def signature(frames: list[dict[str, Any]]) -> tuple[tuple[str, int], ...]:
    return tuple((f["file"], f["line"]) for f in frames)


class StallWatch:
    """Decides, once per tick, whether the steps stopped long enough to record a stack.

    ``step()`` returns the last step logged (None before the first one);
    ``write(payload)`` writes a ``stack`` record. Call :meth:`tick` from a thread
    that is not the training loop (the writer thread does).
    """

    def __init__(
        self,
        step: Callable[[], int | None],
        write: Callable[[dict[str, Any]], object],
        *,
        clock: Callable[[], float] = time.monotonic,
        min_quiet_s: float = STACK_MIN_QUIET_S,
        recheck_s: float = RECHECK_S,
    ) -> None:
        self._step = step
        self._write = write
        self._clock = clock
        self.min_quiet_s = min_quiet_s
        self.recheck_s = recheck_s
        now = clock()
        self._last_step: int | None = step()
        self._since = now
        self._paces: deque[float] = deque(maxlen=50)
        self._looked_at: float | None = None
        self._written: tuple[tuple[str, int], ...] | None = None
        self._moved = False
        """Whether a step was made since the watch began: before that, a long start-up
        (imports, loading a model) is not a stall."""
        self.records = 0

    def limit(self) -> float:
        """How long without a new step counts as quiet."""
        if not self._paces:
            return self.min_quiet_s
        return max(self.min_quiet_s, STACK_QUIET_STEPS * statistics.median(self._paces))

    def tick(self) -> bool:
        """Look at the step; record the stack when quiet too long. Returns whether it wrote."""
        now = self._clock()
        step = self._step()
        if step != self._last_step:
            if step is not None and self._last_step is not None and step > self._last_step:
                self._paces.append((now - self._since) / (step - self._last_step))
            self._last_step, self._since = step, now
            self._looked_at = None
            self._written = None
            self._moved = True
            return False
        if not self._moved:
            return False
        quiet = now - self._since
        if quiet < self.limit():
            return False
        if self._looked_at is not None and now - self._looked_at < self.recheck_s:
            return False
        self._looked_at = now
        payload = capture()
        sig = signature(payload["frames"])
        if sig == self._written:
            return False
        self._written = sig
        payload["step"] = step
        payload["quiet_s"] = round(quiet, 3)
        self._write(payload)
        self.records += 1
        return True
