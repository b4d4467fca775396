"""The words of a verdict: a run's :class:`Health`, its :class:`Diagnosis`, the
thresholds both judges use, what the samplers say (:func:`evidence`) and the sentences
they share. ``health.py`` judges a run from its records (with telemetry, or a user's
own handler); ``observed_health.py`` judges a training watched from outside; both
build on this module and neither on the other's internals.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

from eagle3_tui.model.derived import Pace, run_pace
from eagle3_tui.model.state import RunState
from eagle3_tui.model.units import size
from eagle3_tui.telemetry.thresholds import SILENT_FROM_START_S as SILENT_FROM_START_S

MIN_QUIET_S = 30.0
QUIET_STEPS = 5.0
"""A run is quiet after ``max(MIN_QUIET_S, QUIET_STEPS × mean time between logged steps)``."""
STARTUP_FACTOR = 3.0
"""A start-up may take this many times the run's longest earlier start-up."""
HEARTBEAT_DEAD_S = 30.0
"""No heartbeat for this long, and no probe: the writer's process is taken as gone."""
GPU_BUSY_UTIL = 10.0
AFTER_LAST_STEP_S = 2.0
"""Samples this close after the last metric still show its step's work (a sample covers
the interval before it): a quiet run is judged on the samples after them."""
DIVERGE_FACTOR = 4.0
"""Diverged when the last losses sit this many times above their smoothed history."""


class Health(enum.Enum):
    """What a run is doing. The value is what ``summary`` prints."""

    UNREADABLE = "unreadable"
    """Not a metrics file: no valid record, only malformed lines."""
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    STOPPED = "stopped"
    SILENT = "silent"
    STALLED = "stalled"
    DEAD = "dead"
    DIVERGED = "diverged"
    DISK_FULL = "disk_full"
    """Quiet, and the host says the run's filesystem has no room: the writes fail."""
    COPY = "copy"
    """A copy of another run's directory (its host says which): nothing writes it; the
    run goes on, or ended, in the first one."""


WORST_FIRST = (
    "dead",
    "stalled",
    "diverged",
    "silent",
    "disk_full",
    "unreadable",
    "stopped",
    "copy",
    "waiting",
    "running",
    "finished",
)
"""Every health's value, the one that most needs a person first (``watch --once``'s exit
status is the worst found's; the fleet's rows sort so)."""
ENDED = ("finished", "stopped", "dead")
"""The healths of a run whose trainer is gone: nothing more will come (until a resume)."""


@dataclass(frozen=True, slots=True)
class Diagnosis:
    health: Health
    reason: str
    link_down_since: float | None = None
    """Client time since which no data can arrive: ``health`` is then the last known
    one, judged on what reached the client before."""

    @property
    def label(self) -> str:
        """What the header and banner call it: the health, or ``LINK DOWN`` while the
        link is down, whatever the last verdict (the header then shows that one beside
        it, in its own colours: an alarm is never hidden, nor shown as current)."""
        if self.link_down_since is not None:
            return "LINK DOWN"
        return self.health.value.upper().replace("_", " ")


def ago(seconds: float) -> str:
    """A duration in words: seconds below 90 s, minutes and seconds below 10 min
    ("1 min 30 s", never 90 s rounded to "2 min": a message that compares two
    durations must not read "for 2 min … longer than the 2 min"), whole minutes
    below 90 min, then hours."""
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    whole = round(seconds)
    if whole < 600:
        minutes, rest = divmod(whole, 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def quiet_limit(state: RunState, pace: Pace | None = None) -> float:
    """How long the current process may log nothing before it is quiet."""
    record_s = (pace or run_pace(state)).record_s
    return max(MIN_QUIET_S, QUIET_STEPS * record_s) if record_s else MIN_QUIET_S


def startup_allowance(state: RunState) -> float:
    """How long a process start may take to its first step: learned from the run's
    earlier starts (a resume also loads a checkpoint and spawns its workers again)."""
    learned = max(state.startups, default=0.0)
    return max(SILENT_FROM_START_S, STARTUP_FACTOR * learned)


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the samplers say about the last ``window`` seconds."""

    gpu_known: bool
    gpu_busy: bool
    gpu_util: float | None
    reads_known: bool
    reading: bool
    read_bytes: float
    window: float
    saving: bool


def evidence(state: RunState, now: float, window: float) -> Evidence:
    since = now - window
    utils = [
        dev.util
        for ts, devs in state.samplers.gpu_samples
        if ts >= since
        for dev in devs
        if dev.util is not None
    ]
    gpu_known = bool(utils) or (
        state.samplers.last_gpu_ts is not None and state.samplers.gpu_status == "ok"
    )
    peak = max(utils) if utils else None
    io = [p for p in state.samplers.io_history if p.ts >= since]
    read_bytes = sum(p.bytes for p in io)
    # a write: not the best one an inventory names (dated by its look, not by a save)
    ckpt_recent = any(e.ts >= since and e.event != "best" for e in state.ckpt_events)
    return Evidence(
        gpu_known=gpu_known,
        gpu_busy=peak is not None and peak >= GPU_BUSY_UTIL,
        gpu_util=peak,
        reads_known=bool(io),
        reading=read_bytes > 0,
        read_bytes=read_bytes,
        window=window,
        saving=ckpt_recent,
    )


def leftovers_sentence(
    state: RunState,
    lead: str = "Left behind, still alive",
    hint: str = " (k ends them)",
    gone_too: bool = False,
) -> str:
    """The run's processes that outlived its trainer (dataloader workers...), by name:
    those alive at the last look, or (``gone_too``) all that were when it ended."""
    kept = [x for x in state.liveness.leftovers if gone_too or not x.gone]
    if not kept:
        return ""
    shown = []
    for left in kept[:6]:
        parts = [f"pid {left.pid} {left.comm}"]
        if left.rss_bytes is not None:
            parts.append(f"{size(left.rss_bytes)} RAM")
        if left.gpu_bytes:
            gpus = ",".join(str(g) for g in left.gpus)
            parts.append(f"{size(left.gpu_bytes)} on GPU {gpus}")
        shown.append(" ".join(parts[:1]) + (f" ({', '.join(parts[1:])})" if parts[1:] else ""))
    n = len(kept)
    more = f" and {n - 6} more" if n > 6 else ""
    return f" {lead}: {'; '.join(shown)}{more}{hint}."


def exit_text(status: int | None) -> str:
    if status is None:
        return "killed, or exited without a word (exit status unknown)"
    if status < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"


USUAL_ROWS = 200
"""Logged steps a step's usual time is the median of."""


PAUSE_FACTOR = 5.0
"""A gap between logged steps over this many times their 90th percentile is a pause."""


def usual_step_s(state: RunState) -> float | None:
    """What a step usually takes: the mean time per step over the last
    :data:`USUAL_ROWS` logged steps (the mean: a data-bound run's quick steps and its
    waits for data alike), leaving out pauses (a gap over :data:`PAUSE_FACTOR` times
    their 90th percentile: a SIGSTOP, a slow save), which moved the last minute's mean
    (1.7 s for steps of 0.27 s)."""
    steps, ts = state.table.step_view(), state.table.ts_view()
    n = min(len(steps), USUAL_ROWS + 1)
    if n < 2:
        return None
    ds = np.diff(steps[-n:]).astype(np.float64)
    dt = np.diff(ts[-n:])
    ok = (ds > 0) & (dt >= 0)
    if not ok.any():
        return None
    ds, dt = ds[ok], dt[ok]
    top = float(np.percentile(dt / ds, 90))
    keep = dt / ds <= PAUSE_FACTOR * top if top > 0 else np.ones(len(ds), dtype=bool)
    per = float(dt[keep].sum() / ds[keep].sum())
    return per if per > 0 and math.isfinite(per) else None
