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

import math
import os
from dataclasses import dataclass

from eagle3_tui.model.events import LogLine
from eagle3_tui.model.observed import (
    ProcessInfo,
    bar_progress,
    last_train_bar,
    metrics_source,
    step_time,
)
from eagle3_tui.model.stack import StackSample, stack_line
from eagle3_tui.model.state import RunState
from eagle3_tui.model.units import clock, size
from eagle3_tui.model.verdict import (
    GPU_BUSY_UTIL,
    MIN_QUIET_S,
    QUIET_STEPS,
    SILENT_FROM_START_S,
    Diagnosis,
    Health,
    ago,
    evidence,
    exit_text,
    leftovers_sentence,
)
from eagle3_tui.telemetry.thresholds import BUSY_CPU_PCT

_CKPT_WRITES = frozenset({"save_started", "save_progress", "save_finished", "completed"})
REMEDY = (
    "Attach live (a, or eagle3-tui attach), or kill it with a checkpoint (k) and restart "
    "it with telemetry."
)
SLURM_REMEDY = (
    "Attach live (a, or eagle3-tui attach): a stop and a requeue (k, then r) bring its "
    "script back as it was, without telemetry."
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
    io = [p for p in state.samplers.io_history if p.ts >= since]
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
    st = step_time(state.bars)
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
    sample = state.samplers.stack
    if sample is None:
        return None
    busy = [s.ts for s in state.proc_samples if (s.cpu_pct or 0.0) >= BUSY_CPU_PCT]
    busy += [s.ts for s in state.proc_samples if (s.log_grew or 0) > 0]
    busy += [p.ts for p in state.samplers.io_history if p.worker_bytes > 0]
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
    st = step_time(state.bars)
    if st:
        pace = f" (a step takes {ago(st)})"
    # once its loop was seen running (an epoch done, a checkpoint written), start-up is
    # over: CPU or a growing log then say it works, as at any later time
    looped = bool(state.bars) or any(
        e.ts >= started and e.event in _CKPT_WRITES for e in state.ckpt_events
    )
    weak_from = limit if looped else max(limit, SILENT_FROM_START_S)
    if (ev.strong and age >= limit) or (ev.weak and age >= weak_from):
        if info.handler and info.metrics_stuck and info.metrics_problem:
            source = metrics_source(info.handler)
            why = f"what {source} writes cannot be read: {info.metrics_problem}"
        elif info.handler:
            why = (
                f"{metrics_source(info.handler)} writes to {info.metrics_file}, but no metric "
                "came there"
            )
        else:
            why = "the speculators.metrics logger has no handler, or its level is above INFO"
        return Diagnosis(
            Health.SILENT,
            f"No metric has been logged since the trainer (pid {info.pid}) started "
            f"{ago(age)} ago, although it is alive and {_signs(ev, limit)}: {why}. "
            + (SLURM_REMEDY if info.slurm_job else REMEDY),
        )
    if ev.sampled and not ev.strong and not ev.weak and age >= limit:
        idle = (
            f"for {ago(limit)}{pace} no CPU, no data read, nothing on a GPU, nothing new in its log"
        )
        stuck = stuck_observed(state)
        if stuck is not None:  # where it is: the guess at why is not needed
            return Diagnosis(
                Health.STALLED,
                f"The trainer (pid {info.pid}) looks hung: {idle}; stuck in {stack_line(stuck)}.",
            )
        return Diagnosis(
            Health.STALLED,
            f"The trainer (pid {info.pid}) looks hung: {idle} (a dataloader deadlock, or a "
            f"collective waiting for a rank){_unknown_where(state)}.",
        )
    return Diagnosis(
        Health.WAITING,
        f"The trainer (pid {info.pid}) started {ago(age)} ago and has logged no metric yet; "
        "it runs without telemetry, watched from outside.",
    )


def _exited(state: RunState, info: ProcessInfo) -> Diagnosis:
    """How a trainer without telemetry ended, from what was seen of it: ``interrupted/``
    saved since it started (stopped), its exit status where the kernel said it (0:
    finished; a signal or another status: dead), an error in its log, its last epoch
    done; with when it ended, its log's last lines and what of it outlived it."""
    who = f"The trainer (pid {info.pid})"
    when = _end_time(info, last_seen_alive(state))
    status = info.exit_status
    how = f" ({exit_text(status)})" if status is not None else ""
    started = info.started or 0.0
    interrupted = [
        e
        for e in state.ckpt_events
        if os.path.basename(e.path) == "interrupted" and e.ts >= started
    ]
    if interrupted:
        return Diagnosis(
            Health.STOPPED,
            # (a kill's stop asks at a step boundary, sends no signal, and renames the
            # save: "a SIGTERM" and the path were said of such a stop too)
            f"{who} stopped {when}{how} after saving {interrupted[-1].path} (a stop: a "
            "SIGTERM, Ctrl+C, or a kill's request, which makes it a numbered checkpoint); "
            "a restart resumes from the last numbered checkpoint.",
        )
    seen = last_train_bar(state.bars)
    epochs = info.epochs or state.epochs_total
    last_epoch = seen is not None and epochs and seen.bar.done and seen.bar.epoch + 1 >= epochs
    progress = _progress(state, epochs)
    if status == 0 or (status is None and last_epoch and not _errors(state)):
        # its helpers can outlive it a moment (k ends them): said while they do
        left = leftovers_sentence(state)
        return Diagnosis(Health.FINISHED, f"{who} finished {when}{how}{progress}.{left}")
    left = leftovers_sentence(state, "Still alive when it ended", "", gone_too=True)
    errors = _errors(state)
    if errors:
        last = errors[-1].msg.strip().splitlines()[0][:160]
        return Diagnosis(Health.DEAD, f"{who} died {when}{how} with an error: {last}.{left}")
    lines = _last_lines(state)
    if status is not None:
        return Diagnosis(Health.DEAD, f"{who} died {when}{how}{progress}{lines}.{left}")
    return Diagnosis(
        Health.DEAD,
        f"{who} is gone ({when}); without telemetry its exit status is unknown (killed, or "
        f"crashed without a message){progress}{lines}.{left}",
    )


def last_seen_alive(state: RunState) -> float | None:
    """A training without telemetry found gone by a later look: the last moment it is
    known to have lived, the look that found it alive or a checkpoint it finished
    saving since (its end lies between that and the look that found it gone, ``ended_by``);
    None where a look watched it go (its end is known to a look's interval)."""
    obs = state.observed
    if obs is None or obs.alive or obs.info.last_alive is None:
        return None
    alive, gone = obs.info.last_alive, obs.info.ended_at
    until = gone if gone is not None else math.inf
    saves = [
        e.ts for e in state.ckpt_events if e.event == "save_finished" and alive < e.ts <= until
    ]
    return max([alive, *saves])


def ended_by(state: RunState) -> float | None:
    """Where the end of a training without telemetry lies between two looks: the look
    that found it gone (:func:`last_seen_alive` the other end); else None."""
    obs = state.observed
    if last_seen_alive(state) is None or obs is None:
        return None
    return obs.info.ended_at


def _end_time(info: ProcessInfo, alive: float | None) -> str:
    """When it ended: ``at 14:02:11`` when a look watched it go, else between the last
    moment it is known alive (:func:`last_seen_alive`) and the look that found it gone."""
    if info.ended_at is None:
        return "at an unknown time"
    if alive is None:
        return f"at {clock(info.ended_at)}"
    return f"between {clock(alive)} and {clock(info.ended_at)}"


def _errors(state: RunState) -> list[LogLine]:
    return [line for line in list(state.logs)[-30:] if line.level in ("ERROR", "CRITICAL")]


def _progress(state: RunState, epochs: int | None) -> str:
    """``, after step 75 (epoch 3/3)``: how far it got, from its metrics or its bars."""
    bars = bar_progress(state.bars, state.epochs_total)
    step = state.global_step if state.global_step is not None else (bars.step if bars else None)
    if step is None:
        return ""
    epoch = bars.epoch + 1 if bars is not None else None
    of = f"/{epochs}" if epochs else ""
    at_epoch = f" (epoch {min(epoch, epochs) if epochs else epoch}{of})" if epoch else ""
    return f", after step {step + 1:,}{at_epoch}"


LAST_LINES = 3


def _last_lines(state: RunState) -> str:
    """The last lines of its log, for a death that said nothing else."""
    recent = [line.msg.strip()[:100] for line in list(state.logs)[-LAST_LINES:]]
    recent = [line for line in recent if line]
    return f"; the last lines of its log: {' | '.join(recent)}" if recent else ""
