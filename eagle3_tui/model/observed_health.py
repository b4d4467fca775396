"""Health of a run observed without telemetry (see ``observed.py``), when no metric was
ever logged:

* **silent**: alive and working, yet no metric — flagged within
  ``max(30 s, 5 × step time)`` (step time from the epoch bars) of the evidence that the
  training loop runs (GPU busy, data read by dataloader workers, checkpoints written,
  epoch bars printed); on a busy CPU or a growing log alone, 90 s after the trainer
  started (start-up looks like that too);
* **stalled**: alive, and no CPU, no reads, no GPU, no log growth for that long;
* **dead** / **stopped** / **finished**: the trainer exited (an error in its log,
  ``interrupted/`` saved, its last epoch done; otherwise its exit status is unknown).

A run whose output carries metric dicts (a user's handler printing them) is not
silent: its ``train`` records are judged as any run's (``health.diagnose``).

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from eagle3_tui.model.health import (
    GPU_BUSY_UTIL,
    MIN_QUIET_S,
    QUIET_STEPS,
    SILENT_FROM_START_S,
    Diagnosis,
    Health,
    _ago,
    evidence,
)
from eagle3_tui.model.observed import ProcessInfo, last_train_bar, step_time
from eagle3_tui.model.stack import StackSample, describe
from eagle3_tui.model.state import RunState
from eagle3_tui.model.units import size

BUSY_CPU_PCT = 10.0
"""Above this (% of one core, the whole tree) the trainer is working."""
_CKPT_WRITES = frozenset({"save_started", "save_progress", "save_finished", "completed"})
REMEDY = (
    "Attach live (a, or eagle3-tui attach), or kill it with a checkpoint (k) and restart "
    "it with telemetry."
)


@dataclass(frozen=True, slots=True)
class ObservedEvidence:
    sampled: bool
    cpu_pct: float | None
    gpu_util: float | None
    gpu_busy: bool
    reading: bool
    read_bytes: float
    checkpoints: bool
    bars: bool
    log_growing: bool

    @property
    def strong(self) -> bool:
        """Signs that the training loop itself runs."""
        return self.gpu_busy or self.reading or self.checkpoints or self.bars

    @property
    def weak(self) -> bool:
        """Signs of work that start-up shows too."""
        return (self.cpu_pct or 0.0) >= BUSY_CPU_PCT or self.log_growing


def observed_evidence(state: RunState, now: float, window: float) -> ObservedEvidence:
    since = now - window
    samples = [s for s in state.proc_samples if s.ts >= since]
    cpus = [s.cpu_pct for s in samples if s.cpu_pct is not None]
    base = evidence(state, now, window)
    io = [p for p in state.io_history if p.ts >= since]
    worker_bytes = sum(p.worker_bytes for p in io)
    return ObservedEvidence(
        sampled=len(cpus) >= 2,
        cpu_pct=max(cpus) if cpus else None,
        gpu_util=base.gpu_util,
        gpu_busy=base.gpu_util is not None and base.gpu_util >= GPU_BUSY_UTIL,
        # bytes read, not files held open: a hung worker keeps its files open
        reading=worker_bytes > 0,
        read_bytes=worker_bytes,
        checkpoints=any(e.ts >= since and e.event in _CKPT_WRITES for e in state.ckpt_events),
        bars=any(b.ts >= since for b in state.bars),
        log_growing=any((s.log_grew or 0) > 0 for s in samples) or _log_changed_since(state, since),
    )


def _log_changed_since(state: RunState, since: float) -> bool:
    """The log changed in the window, as its mtime says (a look that began within the
    window sees no growth of its own for what was written before it)."""
    obs = state.observed
    mtime = obs.info.log_mtime if obs is not None else None
    return mtime is not None and mtime >= since


def quiet_limit(state: RunState) -> float:
    st = step_time(state)
    return max(MIN_QUIET_S, QUIET_STEPS * st) if st else MIN_QUIET_S


def _signs(ev: ObservedEvidence, window: float) -> str:
    signs = []
    if ev.cpu_pct is not None and ev.cpu_pct >= BUSY_CPU_PCT:
        signs.append(f"its CPU is busy ({ev.cpu_pct:.0f}%)")
    if ev.gpu_busy and ev.gpu_util is not None:
        signs.append(f"the GPU is busy ({ev.gpu_util:.0f}%)")
    if ev.reading:
        per_s = ev.read_bytes / window
        rate = f" ({size(per_s)}/s)" if per_s >= 1024 else ""
        signs.append(f"its dataloader workers read data files{rate}")
    if ev.checkpoints:
        signs.append("checkpoints are being written")
    if ev.bars:
        signs.append("epochs complete in its output")
    if ev.log_growing:
        signs.append("its log is growing")
    if len(signs) > 1:
        return ", ".join(signs[:-1]) + " and " + signs[-1]
    return signs[0] if signs else "it is alive"


def stuck_observed(state: RunState) -> StackSample | None:
    """The main thread's stack the agent read (py-spy) in the trainer's current idle
    spell: after the last sign of work (CPU, reads, log growth, an epoch bar)."""
    sample = state.stack
    if sample is None:
        return None
    busy = [s.ts for s in state.proc_samples if (s.cpu_pct or 0.0) >= BUSY_CPU_PCT]
    busy += [s.ts for s in state.proc_samples if (s.log_grew or 0) > 0]
    busy += [p.ts for p in state.io_history if p.worker_bytes > 0]
    busy += [b.ts for b in state.bars]
    if busy and max(busy) > sample.ts:
        return None  # taken in an earlier idle spell: it moved on since
    return sample


def _unknown_where(state: RunState) -> str:
    """Why where the trainer is stuck cannot be said (no py-spy on the host)."""
    obs = state.observed
    why = obs.info.stack_unavailable if obs is not None else None
    return f"; where it is stuck is not known: {why}" if why else ""


def diagnose_observed(state: RunState, now: float) -> Diagnosis | None:
    """The health of a run observed without telemetry; None to judge it as any run
    (its output carries metric dicts, or it is not an observed run)."""
    obs = state.observed
    if obs is None:
        return None
    info = obs.info
    if not obs.alive:
        return _exited(state, info)
    if state.last_train_ts is not None:
        return None  # a handler prints the metric dicts: judged on them
    limit = quiet_limit(state)
    started = info.started if info.started is not None else (state.first_ts or now)
    age = now - started
    ev = observed_evidence(state, now, limit)
    pace = ""
    st = step_time(state)
    if st:
        pace = f" (a step takes {_ago(st)})"
    if (ev.strong and age >= limit) or (ev.weak and age >= max(limit, SILENT_FROM_START_S)):
        return Diagnosis(
            Health.SILENT,
            f"No metric has been logged since the trainer (pid {info.pid}) started "
            f"{_ago(age)} ago, although it is alive and {_signs(ev, limit)}: the "
            "speculators.metrics logger has no handler, or its level is above INFO. " + REMEDY,
        )
    if ev.sampled and not ev.strong and not ev.weak and age >= limit:
        idle = (
            f"for {_ago(limit)}{pace} no CPU, no data read, nothing on a GPU, nothing new in "
            "its log"
        )
        stuck = stuck_observed(state)
        if stuck is not None:  # where it is: the guess at why is not needed
            return Diagnosis(
                Health.STALLED,
                f"The trainer (pid {info.pid}) looks hung: {idle}; stuck in {describe(stuck)}.",
            )
        return Diagnosis(
            Health.STALLED,
            f"The trainer (pid {info.pid}) looks hung: {idle} (a dataloader deadlock, or a "
            f"collective waiting for a rank){_unknown_where(state)}.",
        )
    return Diagnosis(
        Health.WAITING,
        f"The trainer (pid {info.pid}) started {_ago(age)} ago and has logged no metric yet; "
        "it runs without telemetry, watched from outside.",
    )


def _exited(state: RunState, info: ProcessInfo) -> Diagnosis:
    who = f"The trainer (pid {info.pid})"
    started = info.started or 0.0
    interrupted = [
        e
        for e in state.ckpt_events
        if os.path.basename(e.path) == "interrupted" and e.ts >= started
    ]
    if interrupted:
        return Diagnosis(
            Health.STOPPED,
            f"{who} exited after saving {interrupted[-1].path} (a SIGTERM or Ctrl+C); a "
            "restart resumes from the last numbered checkpoint.",
        )
    recent = list(state.logs)[-30:]
    errors = [line for line in recent if line.level in ("ERROR", "CRITICAL")]
    if errors:
        last = errors[-1].msg.strip().splitlines()[0][:160]
        return Diagnosis(Health.DEAD, f"{who} exited with an error: {last}")
    seen = last_train_bar(state)
    epochs = info.epochs or state.epochs_total
    if seen is not None and epochs and seen.bar.done and seen.bar.epoch + 1 >= epochs:
        return Diagnosis(
            Health.FINISHED, f"{who} exited after its last epoch ({seen.bar.epoch + 1}/{epochs})."
        )
    tail = recent[-1].msg.strip()[:120] if recent else ""
    last_line = f"; the last line of its log: {tail}" if tail else ""
    return Diagnosis(
        Health.DEAD,
        f"{who} is gone; without telemetry its exit status is unknown (killed, or crashed "
        f"without a message){last_line}.",
    )
