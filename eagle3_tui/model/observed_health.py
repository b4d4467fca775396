"""Health of a run observed without telemetry (see ``observed.py``), when no metric was
ever logged:

* **silent**: alive and working, yet no metric — flagged within
  ``max(30 s, 5 × step time)`` (step time from the epoch bars) of the evidence that the
  training loop runs (GPU busy, data read by dataloader workers, checkpoints written,
  epoch bars printed); on a busy CPU or a growing log alone, 90 s after the trainer
  started (start-up looks like that too);
* **stalled**: alive, and no CPU, no reads, no GPU, no log growth for that long (said for
  as long as nothing moved, as far as was watched); or held stopped (state T: its
  trainer, or its dataloader workers while it idles), said at once with ``kill -CONT``;
* **dead** / **stopped** / **finished**: the trainer exited (an error in its log,
  ``interrupted/`` saved, its last epoch done; otherwise its exit status is unknown).

A run whose metrics a handler or backend writes is judged on its ``train`` records
(``health.diagnose``), but for a quiet spell past the usual limit
(:func:`_quiet_with_metrics`): a trainer seen working is RUNNING with a note while the
pause is no longer than the run has shown one can be (an epoch's save and validation),
then SILENT; one doing nothing is STALLED. Each sign of work a reason names is said in
the present tense only when seen within :data:`RECENT_S`, else with its age.

Pure: no textual, no asyncssh.

Over 600 lines: each verdict of a run seen from outside weighs the same evidence (the
processes' states, CPU, reads, GPU, log, checkpoints, epoch bars, a backend's metrics),
and the clauses that say it must agree with the rules that chose it; kept in one file
so that a rule and its sentence change together.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from eagle3_tui.model.events import LogLine
from eagle3_tui.model.observed import (
    Member,
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
    AFTER_LAST_STEP_S,
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
    usual_step_s,
)
from eagle3_tui.model.verdict import quiet_limit as metrics_quiet_limit
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
RECENT_S = 10.0
"""A sign of work is said in the present tense ("its log is growing", "checkpoints are
being written") only when it was seen within this long (the agent looks every second);
an older one is said with its age ("a checkpoint was written 40 s ago")."""
PAUSE_MARGIN = 1.5
"""A run that logs its metrics may pause (an epoch's save and validation) this many
times the longest pause between logged steps it has shown, working, before its quiet
is called silent."""
EPOCH_END_SHARE = 0.5
"""Before any such pause was seen, an epoch's end (its last step logged, or its bar
done) may take this share of the epoch's training time (at least
:data:`SILENT_FROM_START_S`)."""
_HELD_ROLES = {"trainer": "the trainer", "rank": "a rank", "worker": "a dataloader worker"}


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
    # when each was last seen (the host's clock): what a sentence may say of it now
    cpu_at: float | None = None
    cpu_now: float | None = None
    """The newest sample's CPU (the tree's, % of a core)."""
    gpu_at: float | None = None
    read_at: float | None = None
    checkpoint_at: float | None = None
    bar_at: float | None = None
    bar_done: bool = False
    log_at: float | None = None

    @property
    def strong(self) -> bool:
        """Signs that the training loop itself runs."""
        return self.gpu_busy or self.reading or self.checkpoints or self.bars

    @property
    def weak(self) -> bool:
        """Signs of work that start-up shows too."""
        return (self.cpu_pct or 0.0) >= BUSY_CPU_PCT or self.log_growing


def observed_evidence(
    state: RunState, now: float, window: float, after: float | None = None
) -> ObservedEvidence:
    """What was seen of the trainer's work in the last ``window`` seconds (checkpoints
    and epoch bars only those after ``after``: the last metric's time)."""
    since = now - window
    samples = [s for s in state.proc_samples if s.ts >= since]
    cpus = [s.cpu_pct for s in samples if s.cpu_pct is not None]
    base = evidence(state, now, window)
    io = [p for p in state.samplers.io_history if p.ts >= since]
    worker_bytes = sum(p.worker_bytes for p in io)
    after = since if after is None else max(since, after)
    writes = [e.ts for e in state.ckpt_events if e.ts >= after and e.event in _CKPT_WRITES]
    bars = [b for b in state.bars if b.ts >= after]
    busy = [s.ts for s in samples if (s.cpu_pct or 0.0) >= BUSY_CPU_PCT]
    grew = [s.ts for s in samples if (s.log_grew or 0) > 0]
    obs = state.observed
    mtime = obs.info.log_mtime if obs is not None else None
    if mtime is not None and mtime >= since:
        grew.append(mtime)
    gpus = [
        ts
        for ts, devs in state.samplers.gpu_samples
        if ts >= since and any((d.util or 0.0) >= GPU_BUSY_UTIL for d in devs)
    ]
    newest = max(samples, key=lambda s: s.ts) if samples else None
    return ObservedEvidence(
        sampled=len(cpus) >= 2,
        cpu_pct=max(cpus) if cpus else None,
        gpu_util=base.gpu_util,
        gpu_busy=base.gpu_util is not None and base.gpu_util >= GPU_BUSY_UTIL,
        # bytes read, not files held open: a hung worker keeps its files open
        reading=worker_bytes > 0,
        read_bytes=worker_bytes,
        checkpoints=bool(writes),
        bars=bool(bars),
        log_growing=bool(grew),
        cpu_at=max(busy, default=None),
        cpu_now=newest.cpu_pct if newest is not None else None,
        gpu_at=max(gpus, default=None),
        read_at=max((p.ts for p in io if p.worker_bytes > 0), default=None),
        checkpoint_at=max(writes, default=None),
        bar_at=bars[-1].ts if bars else None,
        bar_done=bool(bars) and bars[-1].bar.done,
        log_at=max(grew, default=None),
    )


def quiet_limit(state: RunState) -> float:
    st = step_time(state.bars)
    return max(MIN_QUIET_S, QUIET_STEPS * st) if st else MIN_QUIET_S


def training_step_s(state: RunState) -> float | None:
    """Seconds per training step from the latest epoch bar told to be the training
    loop's, None where it cannot be told. An epoch prints two bars of the same name
    (``Epoch N``), its training's then its validation's, and the agent tells them by
    their order; that order is known for an epoch whose validation bar came after it,
    or one that came after a bar of an earlier epoch (the log was read from before it
    began). A first look that starts inside a long log may see an epoch's validation
    bar first (read as its training's); an agent that counted only the bars that ended
    at 100% read the validation after a training cut short as the training's: bars
    called training with different totals (a training loop's is its loader's length)
    are not told apart either."""
    bars = list(state.bars)
    for i in range(len(bars) - 1, -1, -1):
        b = bars[i].bar
        if b.phase != "train" or b.n <= 0:
            continue
        if any(x.bar.phase == "train" and x.bar.total != b.total for x in bars):
            return None
        validated = any(x.bar.epoch == b.epoch and x.bar.phase == "val" for x in bars[i + 1 :])
        after = any(x.bar.epoch < b.epoch for x in bars[:i])
        if not (validated or after):
            return None
        if b.elapsed_s and b.n:
            return b.elapsed_s / b.n
        return 1.0 / b.rate if b.rate else None
    return None


def _recent(at: float | None, now: float) -> bool:
    return at is not None and now - at <= RECENT_S


def _sign_list(ev: ObservedEvidence, window: float, now: float) -> list[str]:
    """Each sign of work, true when said: in the present tense when seen within
    :data:`RECENT_S`, else with how long ago it was seen."""
    signs = []
    if ev.cpu_pct is not None and ev.cpu_pct >= BUSY_CPU_PCT:
        if ev.cpu_now is not None and ev.cpu_now >= BUSY_CPU_PCT:
            signs.append(f"its CPU is busy ({ev.cpu_now:.0f}%)")
        else:
            signs.append(
                f"its CPU was busy ({ev.cpu_pct:.0f}%) {ago(now - (ev.cpu_at or now))} ago"
            )
    if ev.gpu_busy and ev.gpu_util is not None:
        if _recent(ev.gpu_at, now):
            signs.append(f"the GPU is busy ({ev.gpu_util:.0f}%)")
        else:
            signs.append(
                f"the GPU was busy ({ev.gpu_util:.0f}%) {ago(now - (ev.gpu_at or now))} ago"
            )
    if ev.reading:
        per_s = ev.read_bytes / window
        rate = f" ({size(per_s)}/s)" if per_s >= 1024 else ""
        if _recent(ev.read_at, now):
            signs.append(f"its dataloader workers read data files{rate}")
        else:
            signs.append(
                f"its dataloader workers read data files until {ago(now - (ev.read_at or now))} ago"
            )
    if ev.checkpoints:
        if _recent(ev.checkpoint_at, now):
            signs.append("checkpoints are being written")
        else:
            signs.append(f"a checkpoint was written {ago(now - (ev.checkpoint_at or now))} ago")
    if ev.bars:
        bar_ago = ago(now - (ev.bar_at or now))
        if ev.bar_done:
            signs.append(
                "epochs complete in its output"
                if _recent(ev.bar_at, now)
                else f"an epoch ended in its output {bar_ago} ago"
            )
        else:
            signs.append(
                "its epoch bar advances"
                if _recent(ev.bar_at, now)
                else f"its epoch bar last advanced {bar_ago} ago"
            )
    if ev.log_growing:
        if _recent(ev.log_at, now):
            signs.append("its log is growing")
        else:
            signs.append(f"its log last grew {ago(now - (ev.log_at or now))} ago")
    return signs


def _signs(ev: ObservedEvidence, window: float, now: float) -> str:
    signs = _sign_list(ev, window, now)
    if len(signs) > 1:
        return ", ".join(signs[:-1]) + " and " + signs[-1]
    return signs[0] if signs else "it is alive"


def held_stopped(state: RunState) -> list[Member]:
    """Its trainer, ranks and dataloader workers the last look found held stopped
    (state T: a SIGSTOP, Ctrl-Z), while the trainer lives."""
    obs = state.observed
    if obs is None or not obs.alive:
        return []
    return [m for m in obs.members if m.state == "T" and m.role in _HELD_ROLES]


def _held(state: RunState, now: float, info: ProcessInfo) -> Diagnosis | None:
    """Where the last look found the trainer (or a rank) held stopped: STALLED at once.
    Where its dataloader workers alone are held: STALLED once the trainer waits on them
    (:func:`_waits_on_held`: nothing of its tree has moved for :data:`HELD_QUIET_LOOKS`
    looks, the trainer idle); while it goes on without them (a validation with workers
    of its own, the batches it holds), neither stalled nor silent: RUNNING, the held
    workers named. Which processes, for at least how long (since a look first saw each
    so), and the remedy."""
    held = held_stopped(state)
    if not held:
        return None
    obs = state.observed
    main = [m for m in held if m.role != "worker"]
    who = _held_who(held)
    verb = "is" if len(held) == 1 else "are"
    firsts = [m.held_since for m in (main or held) if m.held_since is not None]
    if firsts:
        since = min(firsts)
        how_long = (
            f" for at least {ago(now - since)} (first seen so at {clock(since)}; it may have "
            "been stopped before)"
        )
    else:
        how_long = " (as the last look found it)"
    pids = " ".join(str(m.pid) for m in held)
    stopped = f"{who} {verb} held stopped (state T: a SIGSTOP, Ctrl-Z or a job-control stop)"
    if main:
        return Diagnosis(
            Health.STALLED,
            f"{stopped}{how_long}: nothing of it runs until it is continued (kill -CONT {pids}).",
        )
    me = next((m for m in obs.members if m.pid == info.pid), None) if obs else None
    cpu = me.cpu_pct if me is not None else None
    quiet = _waits_on_held(state, held, info)
    if quiet is not None and cpu is not None:
        return Diagnosis(
            Health.STALLED,
            f"{stopped}{how_long}; the trainer (pid {info.pid}) waits on "
            f"{'it' if len(held) == 1 else 'them'} (its CPU is idle, {cpu:.0f}%, and nothing "
            f"of its processes has moved for at least {ago(now - quiet)}): it goes on only "
            f"once {'it is' if len(held) == 1 else 'they are'} continued (kill -CONT {pids}).",
        )
    if state.last_train_ts is not None:
        return None  # a handler writes its metrics: judged on them meanwhile
    limit = quiet_limit(state)
    signs = _sign_list(observed_evidence(state, now, limit), limit, now)
    them, they = ("it", "it is") if len(held) == 1 else ("them", "they are")
    blocked = (
        f"{stopped}{how_long}: nothing the trainer (pid {info.pid}) asks of {them} comes "
        f"until {they} continued (kill -CONT {pids})"
    )
    if not signs:  # (a first look: too few samples to say either)
        return Diagnosis(
            Health.WAITING,
            f"{blocked}; whether it waits on {them} is not known yet (watched too briefly).",
        )
    listed = ", ".join(signs[:-1]) + " and " + signs[-1] if len(signs) > 1 else signs[0]
    return Diagnosis(
        Health.RUNNING,
        f"{blocked}; meanwhile it is not idle ({listed}): not stalled until it waits on "
        f"{them}. It runs without telemetry: no metric is logged.",
    )


def _held_who(held: list[Member]) -> str:
    """``A dataloader worker (pid 11) and a dataloader worker (pid 12)``: at most six."""
    whos = [f"{_HELD_ROLES[m.role]} (pid {m.pid})" for m in held[:6]]
    more = f" and {len(held) - 6} more" if len(held) > 6 else ""
    who = (", ".join(whos[:-1]) + " and " + whos[-1]) if len(whos) > 1 else whos[0]
    return who[0].upper() + who[1:] + more


HELD_QUIET_LOOKS = 2
"""Looks in a row (a second each) in which nothing of the tree moved before the trainer
is said to wait on its held dataloader workers: one idle look is no evidence (a trainer
waiting for its validation workers' first batch, or starved of CPU on a busy host,
idles for a second)."""


def _waits_on_held(state: RunState, held: list[Member], info: ProcessInfo) -> float | None:
    """Since when the trainer has waited on its held dataloader workers, as the looks
    saw it: the last :data:`HELD_QUIET_LOOKS` looks (or more) found nothing of its tree
    moving (no CPU, no data read by its other workers, no log growth, no bar, no
    checkpoint written, no busy GPU), the last one the trainer idle and none of its
    other processes running or in uninterruptible I/O (a worker reading, a save);
    None where that is not so."""
    obs = state.observed
    if obs is None:
        return None
    stopped = {m.pid for m in held}
    for m in obs.members:
        if m.pid in stopped or m.role not in _HELD_ROLES:
            continue
        if m.state in ("R", "D") or (m.cpu_pct or 0.0) >= BUSY_CPU_PCT:
            return None
    last = _last_work(state)
    looks = [
        s for s in state.proc_samples if s.cpu_pct is not None and (last is None or s.ts > last)
    ]
    if len(looks) < HELD_QUIET_LOOKS:
        return None
    newest = state.proc_samples[-1]
    if looks[-1] is not newest:
        return None  # (the newest look has no CPU figure)
    # watched from the interval the first idle look covers (a look's CPU is of the
    # interval since the one before it); before it only the log and the files say
    before = [s.ts for s in state.proc_samples if s.ts < looks[0].ts]
    watched = before[-1] if before else looks[0].ts
    return max(last, watched) if last is not None else watched


def _last_work(state: RunState) -> float | None:
    """The last moment any sign of work was seen: CPU, data read, a busy GPU, its log
    growing (or its mtime), an epoch bar, a checkpoint written, a metric."""
    seen = [
        s.ts
        for s in state.proc_samples
        if (s.cpu_pct or 0.0) >= BUSY_CPU_PCT or (s.log_grew or 0) > 0
    ]
    seen += [p.ts for p in state.samplers.io_history if p.worker_bytes > 0]
    seen += [b.ts for b in state.bars]
    seen += [e.ts for e in state.ckpt_events if e.event in _CKPT_WRITES]
    seen += [
        ts
        for ts, devs in state.samplers.gpu_samples
        if any((d.util or 0.0) >= GPU_BUSY_UTIL for d in devs)
    ]
    obs = state.observed
    if obs is not None and obs.info.log_mtime is not None:
        seen.append(obs.info.log_mtime)
    if state.last_train_ts is not None:
        seen.append(state.last_train_ts)
    return max(seen, default=None)


def _idle_words(state: RunState, now: float, started: float, pace: str) -> str:
    """For how long nothing moved, as far as was seen: from the last sign of work, when
    the agent's samples reach back to it; else what the samples watched and what the
    log (its mtime) says for longer."""
    last = _last_work(state)
    begin = max(started, last) if last is not None else started
    watched = state.proc_samples[0].ts if state.proc_samples else now
    if watched <= begin + 2.0:  # (a sample covers the second before it)
        return (
            f"for {ago(now - begin)}{pace} no CPU, no data read, nothing on a GPU, nothing "
            "new in its log"
        )
    return (
        f"no CPU, no data read, nothing on a GPU in the {ago(now - watched)} watched{pace}, "
        f"and nothing new in its log for {ago(now - begin)}"
    )


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


def _hang_causes(state: RunState) -> str:
    """What may hold a hung trainer, only what this run has: dataloader workers (a
    deadlock there), ranks (a collective waiting for one)."""
    obs = state.observed
    roles = {m.role for m in obs.members} if obs is not None else set()
    causes = []
    if "worker" in roles:
        causes.append("a dataloader deadlock")
    if "rank" in roles or (obs is not None and obs.info.launcher_pid is not None):
        causes.append("a collective waiting for a rank")
    return ", or ".join(causes) if causes else "a deadlock, or a call that never returns"


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
    held = _held(state, now, info)
    if held is not None:
        return held
    if state.last_train_ts is not None:
        # a handler writes the metric dicts: judged on them, but for a quiet spell
        return _quiet_with_metrics(state, now, info)
    limit = quiet_limit(state)
    started = info.started if info.started is not None else (state.first_ts or now)
    age = now - started
    ev = observed_evidence(state, now, limit)
    pace = ""
    st = training_step_s(state)
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
            f"{ago(age)} ago, although it is alive and {_signs(ev, limit, now)}: {why}. "
            + (SLURM_REMEDY if info.slurm_job else REMEDY),
        )
    if ev.sampled and not ev.strong and not ev.weak and age >= limit:
        idle = _idle_words(state, now, started, pace)
        stuck = stuck_observed(state)
        if stuck is not None:  # where it is: the guess at why is not needed
            return Diagnosis(
                Health.STALLED,
                f"The trainer (pid {info.pid}) looks hung: {idle}; stuck in {stack_line(stuck)}.",
            )
        return Diagnosis(
            Health.STALLED,
            f"The trainer (pid {info.pid}) looks hung: {idle} ({_hang_causes(state)})"
            f"{_unknown_where(state)}.",
        )
    return Diagnosis(
        Health.WAITING,
        f"The trainer (pid {info.pid}) started {ago(age)} ago and has logged no metric yet; "
        "it runs without telemetry, watched from outside.",
    )


def longest_pause(state: RunState, limit: float) -> float | None:
    """The longest gap between two logged steps the run has shown that was a pause
    (over ``limit``: an epoch's save and validation), None if none was."""
    ts = state.table.ts_view()
    if len(ts) < 2:
        return None
    gaps = np.diff(ts)
    top = float(gaps.max())
    return top if top > limit and math.isfinite(top) else None


def _exact(seconds: float) -> str:
    """A quiet spell and the pause allowed, said in seconds up to 10 min: ``ago`` rounds
    90 s to "2 min", which read "No metric for 2 min … longer than the 2 min a pause may
    take" after 93 s."""
    return f"{seconds:.0f} s" if seconds < 600 else ago(seconds)


def _pause_allowance(state: RunState, limit: float) -> tuple[float, str]:
    """How long a working trainer may log no metric before its quiet is silent, and why
    in words: :data:`PAUSE_MARGIN` times the longest pause it has shown; before any,
    an epoch's end (its last step logged or its bar done) may take
    :data:`EPOCH_END_SHARE` of the epoch's time; else :data:`SILENT_FROM_START_S`."""
    longest = longest_pause(state, limit)
    if longest is not None:
        allow = max(limit, PAUSE_MARGIN * longest)
        return allow, f"the longest pause between its logged steps so far took {ago(longest)}"
    seen = last_train_bar(state.bars)
    last = state.last_train_ts or 0.0
    step = state.global_step
    epoch_end = seen is not None and (
        (seen.bar.done and seen.ts >= last - limit)
        or (step is not None and seen.bar.total > 0 and (step + 1) % seen.bar.total == 0)
    )
    if epoch_end and seen is not None:
        epoch_s = seen.bar.elapsed_s or 0.0
        allow = max(limit, SILENT_FROM_START_S, EPOCH_END_SHARE * epoch_s)
        return allow, "its last logged step ended an epoch (a save and a validation follow)"
    return (
        max(limit, SILENT_FROM_START_S),
        "no pause between its logged steps has been seen yet",
    )


def _quiet_with_metrics(state: RunState, now: float, info: ProcessInfo) -> Diagnosis | None:
    """A run without telemetry whose metrics a handler or backend writes, quiet past the
    usual limit: judged from outside, as its records cannot say. A busy trainer is
    never hung: a pause (an epoch's save and validation) is RUNNING with a note while it
    is no longer than the run has shown it can be, then SILENT with what is seen now; a
    trainer that does nothing is STALLED, for as long as nothing moved. None: not
    quiet (or saying what it does: a validation or a save its log announced), judged on
    its records."""
    last = state.last_train_ts
    if last is None or state.activity is not None:
        return None
    limit = metrics_quiet_limit(state)
    quiet = now - last
    if quiet <= limit:
        return None
    # what was seen since the metrics stopped: not the samples of the last step
    window = min(limit, quiet - AFTER_LAST_STEP_S)
    ev = observed_evidence(state, now, window, after=last)
    if not ev.sampled:
        return None  # nothing seen of the process: its records are all there is
    st = usual_step_s(state)  # as the verdict of a run with telemetry says it
    usual = f" (a step usually takes {ago(st)})" if st else ""
    working = ev.strong or ev.weak
    if not working:
        started = info.started if info.started is not None else (state.first_ts or now)
        idle = _idle_words(state, now, max(started, last), "")
        stuck = stuck_observed(state)
        where = (
            f"; stuck in {stack_line(stuck)}"
            if stuck is not None
            else f" ({_hang_causes(state)}){_unknown_where(state)}"
        )
        return Diagnosis(
            Health.STALLED,
            f"No metric for {ago(quiet)}{usual} and the trainer (pid {info.pid}) looks hung: "
            f"{idle}{where}.",
        )
    signs = _signs(ev, window, now)
    own = metrics_source(info.handler) or ("its own handler" if state.plain_records else None)
    if own and info.metrics_stuck and info.metrics_problem:
        return Diagnosis(  # nothing more of it can be read: no pause explains the quiet
            Health.SILENT,
            f"No metric for {ago(quiet)} although the trainer (pid {info.pid}) works "
            f"({signs}): what {own} wrote cannot all be read ({info.metrics_problem}).",
        )
    allow, why = _pause_allowance(state, limit)
    if quiet <= allow:
        return Diagnosis(
            Health.RUNNING,
            f"No metric for {_exact(quiet)}{usual}, but the trainer (pid {info.pid}) is not idle "
            f"({signs}): a pause between logged steps, as a checkpoint save or a validation "
            f"makes; {why}. Silent only if none comes within {_exact(allow)}.",
        )
    if own:
        cause = (
            f"{own} has written none since (the trainer no longer logs them, or the handler fails)"
        )
    else:
        cause = "the speculators.metrics logger may have no handler, or its level is above INFO"
    return Diagnosis(
        Health.SILENT,
        f"No metric for {_exact(quiet)}{usual} although the trainer (pid {info.pid}) works "
        f"({signs}), longer than the {_exact(allow)} a pause may take ({why}): {cause}.",
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
