"""Health of a run, decided from the evidence, with one sentence saying why.

Over 600 lines: every verdict and the evidence each weighs are one decision, read
together (torchrun's ranks and the write failures included).

Evidence, most decisive first:

* lifecycle events in the file (``finish``, ``interrupt``, ``crash``) of the
  current process (since its ``start``/``resume``); an interrupt is never
  overwritten by a ``finish`` written after it;
* whether the process is alive: a probe from outside (``RunState.liveness``)
  or, lacking one, whether the writer's heartbeat is still arriving; each of the
  process it names (a probe or heartbeat of the trainer before a resume says
  nothing of the resumed one); a trainer its sidecar finds held stopped (state T)
  for 30 s is *stalled*, whatever it was doing;
* what the hardware does: GPU utilisation, dataloader bytes read, checkpoint
  saves (from the samplers' records);
* when the last metric record came, against the run's own pace.

Only evidence that reached the client counts. Records carry the host's clock
(``ts``); the client's clock is turned into the host's (``Liveness.clock_offset``,
from the host's ``now``). While the link is down nothing can arrive, so the run
is judged as of the moment it went down (the quiet clock stops) and the diagnosis
says so (``Diagnosis.link_down_since``); once the link is back and what was
written meanwhile has been read, the clock runs again.

``quiet_limit = max(30 s, 5 × the mean time between logged steps)``: a run that
logged no metric for longer than that is *silent* if its process works (GPU busy,
data being read, checkpoints growing) and *stalled* if nothing moves. A checkpoint
save or a validation epoch in progress is neither, unless a validation hangs: long
past its run's earlier ones, the trainer's CPU time, reads and GPUs still for 2 min.
Each process start (``start``, ``resume``) has a start-up allowance before its first
step instead: ``max(90 s, 3 × the longest start-up this run had before)``. A
non-finite loss, or a loss far above its smoothed value, is *diverged*, also after the run ended.
No record of any kind for that long while the host reports no room on the run's
filesystem (``model/files.py``: under 1 MiB, or read-only) is *disk full*, before
silent or stalled: the writes fail, the trainer may train on; heartbeats that stop
then say nothing of the trainer (only a probe that finds it gone makes it dead).

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from eagle3_tui.model.derived import Pace, run_pace, step_number, steps_done
from eagle3_tui.model.events import Event
from eagle3_tui.model.files import WRITE_ERRORS, DiskSpace, FileNotice, Outcome
from eagle3_tui.model.median import median
from eagle3_tui.model.observed import metrics_source
from eagle3_tui.model.stack import StackSample, stack_line
from eagle3_tui.model.state import RunState
from eagle3_tui.model.units import clock, size
from eagle3_tui.model.verdict import (
    AFTER_LAST_STEP_S,
    DIVERGE_FACTOR,
    HEARTBEAT_DEAD_S,
    MIN_QUIET_S,
    Diagnosis,
    Evidence,
    Health,
    ago,
    evidence,
    exit_text,
    leftovers_sentence,
    quiet_limit,
    startup_allowance,
    usual_step_s,
)


def _diverged(state: RunState) -> str | None:
    loss = state.latest("train/loss")
    step = step_number(state.global_step)
    if loss is not None and not math.isfinite(loss):
        since = _nonfinite_since(state)
        at = f"since step {since:,}" if since is not None and since != step else f"at step {step}"
        return f"The loss is {loss} {at}: training has diverged (check the learning rate)."
    values = state.table.floats("train/loss", 400)
    if values is None or len(values) < 50:
        return None
    history, recent = values[:-5], values[-5:]
    history = history[np.isfinite(history)]
    if len(history) < 40 or not np.isfinite(recent).all():
        return None
    base = float(median(history[-200:]))
    now_level = float(median(recent))
    if base > 0 and now_level > DIVERGE_FACTOR * base:
        return (
            f"The loss jumped to {now_level:.4g} at step {step}, "
            f"{now_level / base:.1f}× its recent level ({base:.4g}): training may be diverging."
        )
    return None


def _nonfinite_since(state: RunState) -> int | None:
    """The number of the first step of the trailing run of non-finite losses."""
    values = state.table.view("train/loss")
    if values is None or not len(values):
        return None
    finite = np.flatnonzero(np.isfinite(values))
    first = int(finite[-1]) + 1 if len(finite) else 0
    if first >= len(state.table.steps):
        return None
    return step_number(state.table.steps[first])


HUNG_MIN_S = 300.0
"""A validation is never called hung before this long (see :func:`_activity_hung`)."""
HUNG_FACTOR = 3.0
"""Nor before this many times the run's longest earlier validation."""
HUNG_IDLE_S = 120.0
"""How long nothing of it must have moved."""
HUNG_CPU_SHARE = 0.05
"""The trainer's CPU use that counts as nothing: its telemetry's own threads use some."""


def diagnose(state: RunState, now: float) -> Diagnosis:
    """The run's health from its records and any process probe, at ``now`` on the
    client's clock (turned into the host's, which the records' ``ts`` use)."""
    state.settle()
    at = state.liveness.host_time(now)
    if state.liveness.copy_of is not None:
        return _a_copy(state, at)
    down = state.liveness.link_down_since
    if down is None:
        return judge(state, at)
    # nothing can arrive: judged as of the moment the link went down, said so
    verdict = judge(state, min(at, state.liveness.host_time(down)))
    return _while_link_down(verdict, state, now, down)


def judge(state: RunState, now: float) -> Diagnosis:
    """The verdict on what has been read, at ``now`` on the host's clock."""
    step = state.global_step
    if state.records == 0 and state.malformed_count:
        return _unreadable(state)
    foreign = _another_runs(state)
    if foreign is not None:
        return foreign
    end = _ranks_end(state)  # torchrun: the first rank to end says how the run ended
    if end is not None and end.event == "crash":
        return _rank_death(end)
    last = end_event(state)
    diverged = _diverged(state)
    count = steps_done(state)
    first = _before_first(state)
    if last is not None and last.event == "finish":
        done = f"after {count:,} steps" if count else first.replace("its first", "any")
        if diverged is not None:
            return Diagnosis(Health.DIVERGED, f"Training finished {done}, diverged: {diverged}")
        return Diagnosis(Health.FINISHED, f"Training finished {done}.{leftovers_sentence(state)}")
    if last is not None and last.event == "crash":
        err = f": {last.error.splitlines()[0][:160]}" if last.error else ""
        at_step = f"after step {count}" if step is not None else first
        return Diagnosis(
            Health.DEAD, f"The trainer crashed {at_step}{err}.{leftovers_sentence(state)}"
        )
    if last is not None and last.event == "interrupt":
        after = f"after step {count:,}" if count else first
        if last.error:
            saved = f"({last.error.splitlines()[0][:120]})"
        elif stop_requested(state):  # a kill's stop: no signal; its save is converted
            saved = "(stopped at a step boundary, as a kill asked)"
        else:
            saved = "(a signal); speculators saved checkpoints/interrupted/"
        # a stop's save counts too: the kill makes it a numbered checkpoint
        if state.liveness.checkpoints_present is False:  # the host found none there now
            then = (
                "Its checkpoint directory holds no numbered checkpoint now: "
                "a resume would start over."
            )
        elif numbered_checkpoint(state) or stop_requested(state):
            then = "Resume continues from the last numbered checkpoint."
        else:  # speculators resumes from no interrupted/: only from a numbered save
            then = "No numbered checkpoint is in its records: a resume may start over."
        stopped = f"Interrupted {after} {saved}. {then}"
        if diverged is not None:
            return Diagnosis(Health.DIVERGED, f"{stopped} Before that: {diverged}")
        return Diagnosis(Health.STOPPED, stopped)
    if diverged is not None:
        return Diagnosis(Health.DIVERGED, diverged)
    if state.observed is not None:  # no telemetry: judged from outside (issue 11)
        from eagle3_tui.model.observed_health import diagnose_observed

        observed = diagnose_observed(state, now)
        if observed is not None:
            return observed

    # what the probe and the sidecar said is of the process they name: of an earlier one
    # (a resumed run whose new trainer's records came before the next probe) it says
    # nothing of the trainer now
    current = current_process(state)
    alive = state.liveness.process_alive
    if not _about(current, state.manifest.get("pid")):
        alive = None
    hb, hb_at = state.samplers.heartbeat, state.samplers.last_heartbeat_ts
    seen_by_sidecar = hb.trainer if hb is not None and isinstance(hb.trainer, dict) else None
    if current is not None and hb_at is not None and hb_at < current.ts:
        hb_at = None  # the heartbeats are of an earlier process
    if seen_by_sidecar is not None and not _about(current, seen_by_sidecar.get("pid")):
        seen_by_sidecar = None
    held = _held(state, current, hb_at, now) if alive is not False else None
    if held is None and alive:
        held = _probed_held(state, now)
    if held is not None:
        return held
    full = _no_room(state, now)
    if alive is None and hb_at is not None:
        fresh = (now - hb_at) <= HEARTBEAT_DEAD_S
        if fresh and seen_by_sidecar is not None and seen_by_sidecar.get("alive") is False:
            alive = False  # the sidecar watched the trainer go
        elif not fresh and full is not None:
            alive = None  # no heartbeat can be written: it says nothing of the trainer
        else:
            alive = fresh
    if alive is False:
        pid = (
            (current.pid if current is not None else None)
            or state.manifest.get("pid")
            or (seen_by_sidecar or {}).get("pid")
        )
        who = f"The trainer (pid {pid})" if pid else "The trainer"
        at = f"after step {step_number(step)}" if step is not None else _before_first(state)
        probed_gone = state.liveness.process_alive is False and _about(current, pid)
        if probed_gone or (seen_by_sidecar is not None and seen_by_sidecar.get("alive") is False):
            how = "is gone"
        else:
            how = f"stopped writing heartbeats {ago(now - (hb_at or now))} ago"
        return Diagnosis(
            Health.DEAD,
            f"{who} {how} without a finish event, {at}: it crashed or was killed (see "
            f"train.log).{leftovers_sentence(state)}",
        )

    pace = run_pace(state)
    limit = quiet_limit(state, pace)
    last_metric = state.last_train_ts
    # no metric for a while on a full disk: the writes fail (a small record, a
    # heartbeat, may still fit in the slack of a file's last block: not a sign of steps)
    newest = last_metric if last_metric is not None else state.last_ts
    if full is not None and (newest is None or now - newest > limit):
        return Diagnosis(Health.DISK_FULL, _disk_full_sentence(state, full))
    if state.activity is not None:
        what = state.activity
        label = "Saving a checkpoint" if what.what == "saving" else "Validating"
        hung = _activity_hung(state, now, current, hb_at, label)
        if hung is not None:
            return hung
        return Diagnosis(
            Health.RUNNING,
            f"{label} ({what.detail}) for {ago(now - what.since)}; metrics resume after it.",
        )
    starting = state.starting
    if starting is not None and starting.ts:
        return _starting(state, now, starting.event, starting.ts)
    remade = _remade(state) if last_metric is None else None
    if remade is not None:  # its steps went with the file: none since is no start
        last_metric = remade.at if remade.at is not None else remade.noted
        if last_metric is None:
            last_metric = state.first_ts if state.first_ts is not None else now
    if last_metric is None:
        started = state.first_ts
        if started is None:
            return Diagnosis(Health.WAITING, "Waiting for the first record.")
        return _starting(state, now, "start", started)

    quiet_for = now - last_metric
    if quiet_for <= limit:
        if remade is not None:
            said = state.file_sentence(remade)
            return Diagnosis(
                Health.RUNNING,
                f"No step logged in this file yet: {said} ({ago(quiet_for)} ago).",
            )
        return Diagnosis(Health.RUNNING, _running_sentence(state, pace))
    rank_stall = _rank_stall(state, now, quiet_for)  # before "GPU busy": NCCL waits spin at 100 %
    if rank_stall is not None:
        return rank_stall
    # what the samplers saw since the metrics stopped: not the samples of the last step
    ev = evidence(state, now, min(limit, quiet_for - AFTER_LAST_STEP_S))
    if ev.gpu_busy or ev.reading or ev.saving:
        return Diagnosis(
            Health.SILENT,
            _silent_sentence(
                ev, quiet_for, never=False, own=_own_handler(state), problem=_unread(state)
            ),
        )
    if alive or ev.gpu_known or ev.reads_known:
        parts = []
        if ev.gpu_known:
            util = f"{ev.gpu_util:.0f}%" if ev.gpu_util is not None else "no readings"
            parts.append(f"GPUs idle ({util})")
        if ev.reads_known:
            parts.append("no data read")
        idle = ", ".join(parts) if parts else "no activity reported"
        step_s = usual_step_s(state)
        usual = f" (a step usually takes {ago(step_s)})" if step_s else ""
        return Diagnosis(
            Health.STALLED,
            f"No metric for {ago(quiet_for)}{usual}, {idle}{_stuck_clause(state)}: "
            f"{_stall_hint(state)}",
        )
    return Diagnosis(
        Health.STALLED,
        f"No record of any kind for {ago(quiet_for)} and no process evidence: "
        "the run may have stopped or the file is no longer written.",
    )


def _before_first(state: RunState) -> str:
    """When a run without a step ended: before its first step, or (its file made again
    mid-run: :func:`_remade`) with none in this file (its earlier ones went with it)."""
    if _remade(state) is not None:
        return "with no step in this file (its steps before went with the one before)"
    return "before its first step"


def _remade(state: RunState) -> FileNotice | None:
    """The writer's word, in a file without a step or a start of its own, that it made
    the file again mid-run (the one before deleted, replaced or cut to nothing, after it
    wrote records there): the run's steps went with it, and no step since is no start
    ("No training step logged yet (0.2 s since start)" of a run at step 24)."""
    if state.process_start() is not None:
        return None
    for notice in reversed(state.file_notices):
        if (
            notice.outcome is Outcome.HERE
            and notice.written_before
            and notice.change
            in (
                "deleted",
                "replaced",
                "truncated",
            )
        ):
            return notice
    return None


def _starting(state: RunState, now: float, how: str, since: float) -> Diagnosis:
    """A process that has not logged its first step: within its start-up allowance it
    is starting; past it, silent if it visibly works, else still waiting."""
    quiet_for = now - since
    allowance = startup_allowance(state)
    ev = evidence(state, now, max(MIN_QUIET_S, min(quiet_for, 60.0)))
    working = ev.gpu_busy or ev.reading or ev.saving
    if quiet_for > allowance and working:
        never = how == "start" and not state.startups
        return Diagnosis(
            Health.SILENT,
            _silent_sentence(
                ev, quiet_for, never=never, own=_own_handler(state), problem=_unread(state)
            ),
        )
    what = {"resume": "since the resume", "start": "since start"}.get(how, f"since {how}")
    learned = (
        f"; its earlier starts took up to {ago(max(state.startups))}" if state.startups else ""
    )
    return Diagnosis(
        Health.WAITING,
        f"No training step logged yet ({ago(quiet_for)} {what}{learned}).",
    )


def _another_runs(state: RunState) -> Diagnosis | None:
    """The file read names only other runs than the directory's ``run.json`` (another
    run's file moved over this run's, read afresh: ``summary``, a monitor opened then):
    what it says is not this run's, which cannot be judged from it. None otherwise
    (a monitor that saw the change keeps the run's history apart: ``foreign``)."""
    mine, named = state.manifest.get("run_id"), state.file_run_ids
    if not isinstance(mine, str) or not mine or state.foreign or not named:
        return None
    if mine[:80] in named:
        return None
    theirs = ", ".join(named[-3:])
    return Diagnosis(
        Health.UNREADABLE,
        f"metrics.jsonl holds another run's records (run {theirs}), not this directory's "
        f"(its run.json names run {mine}): another file was put at the path, and this "
        "run's own is not there to judge it by (its telemetry moves such a file aside "
        "and writes its own at its next record).",
    )


def _unreadable(state: RunState) -> Diagnosis:
    """Not one valid record, only malformed lines: not a file of this schema."""
    bad = state.malformed[-1]
    return Diagnosis(
        Health.UNREADABLE,
        f"No valid record in {state.malformed_count:,} malformed lines (the last: "
        f"{bad.reason[:100]}): this is not an eagle3-tui metrics file, or not yet one.",
    )


def _a_copy(state: RunState, now: float) -> Diagnosis:
    """A copy of a run directory (its host says which): nothing writes it, so it is
    judged as of its last record, and said to be a copy; a trainer alive is the first
    run's, whose directory is the one to read."""
    last = state.last_ts
    verdict = judge(state, min(now, last) if last is not None else now)
    if end_event(state) is not None or verdict.health is Health.UNREADABLE:
        return verdict  # the run's end is in the copy: as true of it as of the first
    # what the records said when it was copied, never a run's health now: COPY
    original = state.liveness.copy_of
    alive = state.liveness.original_alive
    pid = state.manifest.get("pid")
    there = (
        f", where its trainer{f' (pid {pid})' if pid else ''} still runs"
        if alive
        else ", whose trainer is not running"
    )
    ends = f" (its records end {clock(last)}, {ago(now - last)} ago)" if last else ""
    step = steps_done(state)
    at = f" at step {step:,}" if step else ""
    return replace(
        verdict,
        health=Health.COPY,
        reason=(
            f"A copy of {original}{ends}: nothing writes it; the run is written there{there} "
            f"(eagle3-tui {original}). When it was copied: {verdict.health.value}{at}. "
            f"{verdict.reason}"
        ),
    )


def _while_link_down(verdict: Diagnosis, state: RunState, now: float, down: float) -> Diagnosis:
    """The verdict as of the link's drop, said to be that: nothing newer can arrive."""
    if verdict.health in (Health.FINISHED, Health.STOPPED, Health.UNREADABLE):
        return verdict  # an end that reached the client stays true
    detail = f" ({state.liveness.link_detail[:120]})" if state.liveness.link_detail else ""
    step = steps_done(state)
    at = f" at step {step:,}" if step else ""
    return replace(
        verdict,
        reason=(
            f"No data since {clock(down)} ({ago(now - down)}): the link to the host is "
            f"down{detail}. Last known: {verdict.health.value}{at}. {verdict.reason}"
        ),
        link_down_since=down,
    )


# ---- a full disk ----------------------------------------------------------------------


def _no_room(state: RunState, now: float) -> DiskSpace | None:
    """A current report of a file's filesystem with no room left on it, if one came."""
    return next((d for d in state.disk.values() if d.full(now)), None)


def _disk_full_sentence(state: RunState, disk: DiskSpace) -> str:
    """No metric for a while, and no room: the writes fail (a full disk is
    not a hang). How many were lost, where the writers' newest figures say it."""
    lost = _not_written(state)
    counted = (
        f"{lost[0]:,} records not written so far (the writers' count at {clock(lost[1])})"
        if lost is not None
        else "how many records were not written is not known until space returns"
    )
    return f"{disk.as_reason()}: metrics cannot be written; {counted}."


def _not_written(state: RunState) -> tuple[int, float] | None:
    """The records the writers could not write, as their newest heartbeat that reached
    the client counts them, when it counts write errors of a full disk (the count
    since its writer started), and when."""
    hb = state.samplers.heartbeat
    if hb is None:
        return None
    side = hb.sidecar if isinstance(hb.sidecar, dict) else {}
    side_errors = side.get("errors")
    errors = set(hb.errors or {}) | set(side_errors if isinstance(side_errors, dict) else {})
    if not errors & set(WRITE_ERRORS):
        return None
    dropped = (hb.dropped or 0) + (side["dropped"] if type(side.get("dropped")) is int else 0)
    return dropped, hb.ts


# ---- where it is stuck (issue 12: a `stack` record from telemetry) --------------------


def stuck_at(state: RunState) -> StackSample | None:
    """The main thread's stack taken since the last training step, if telemetry took one."""
    sample = state.samplers.stack
    if sample is None:
        return None
    if state.last_train_ts is not None and sample.ts < state.last_train_ts:
        return None  # taken in an earlier quiet spell
    return sample


def _stuck_clause(state: RunState) -> str:
    sample = stuck_at(state)
    return f"; stuck in {stack_line(sample)}" if sample is not None else ""


def _own_handler(state: RunState) -> str | None:
    """What writes its metrics when that is a handler of the user's own or one of the
    library's backends (its file, its event files or its log, read by the agent; or a
    file of plain speculators dicts), in words: it has a handler, whatever it does
    now. None: eagle3-tui's telemetry, or nothing."""
    obs = state.observed
    if obs is not None and obs.info.handler is not None:
        return metrics_source(obs.info.handler)
    return "its own handler" if state.plain_records > 0 else None


def _unread(state: RunState) -> str | None:
    """What of its metrics file could not be read (bad records, broken framing)."""
    obs = state.observed
    if obs is None or not obs.info.metrics_stuck:
        return None  # records skipped here and there do not silence a run
    return obs.info.metrics_problem


def _silent_sentence(
    ev: Evidence, quiet_for: float, *, never: bool, own: str | None, problem: str | None = None
) -> str:
    signs = []
    if ev.gpu_busy and ev.gpu_util is not None:
        signs.append(f"the GPU is busy ({ev.gpu_util:.0f}%)")
    if ev.reading:
        signs.append(f"data files are being read ({size(ev.read_bytes / ev.window)}/s)")
    if ev.saving:
        signs.append("checkpoints are being written")
    lead = "No metric has ever been logged" if never else f"No metric for {ago(quiet_for)}"
    if own and problem:
        return (
            f"{lead} although {' and '.join(signs)}: what {own} wrote cannot all be "
            f"read ({problem})."
        )
    if own:
        return (
            f"{lead} although {' and '.join(signs)}: {own} has written none since (the "
            "trainer no longer logs them, or the handler fails)."
        )
    return (
        f"{lead} although {' and '.join(signs)}: the speculators.metrics logger may have "
        "no handler, or its level is above INFO."
    )


def _stall_hint(state: RunState) -> str:
    hb = state.samplers.heartbeat
    trainer = hb.trainer if hb is not None and isinstance(hb.trainer, dict) else {}
    if trainer.get("state") in ("T", "t") and trainer.get("alive") is not False:
        # before it has been held long enough for its own verdict (_held): not the GIL
        return (
            f"the trainer (pid {trainer.get('pid')}) is held stopped (its sidecar finds it "
            "so: a SIGSTOP, Ctrl-Z or a debugger); nothing runs until it is continued."
        )
    age = hb.stats_age_s if hb is not None else None
    if age is not None and math.isfinite(age) and age > MIN_QUIET_S:
        return (
            f"the trainer's Python has not run for {ago(age)} (its writer thread is silent "
            "too): it is stuck in a C call, a collective, or holding the GIL."
        )
    frac = state.latest("profile/fetch_frac")
    if frac is not None and math.isfinite(frac) and frac > 0.5:
        return (
            f"the last steps waited on data ({frac:.0%} of step time): "
            "a dataloader worker may be stuck."
        )
    causes = []  # only what this run has: a run of one process has no collective to wait in
    if any(w.role == "worker" for w in state.samplers.io_workers.values()):
        causes.append("a dataloader deadlock")
    if _distributed(state):
        causes.append("a collective waiting for a rank")
    if not causes:
        causes.append("a deadlock, or a call that never returns")
    return f"the training loop looks hung ({', or '.join(causes)})."


def _running_sentence(state: RunState, pace: Pace) -> str:
    rate = f", {pace.steps_per_s:.2f} steps/s" if pace.steps_per_s else ""
    return f"Step {step_number(state.global_step)} logged{rate}."


# ---- torchrun: which rank ----------------------------------------------------------------


_ENDS = ("crash", "interrupt", "finish")


def _distributed(state: RunState) -> bool:
    world = state.manifest.get("world_size")
    return (isinstance(world, int) and world > 1) or len(state.samplers.rank_heartbeats) > 1


def _held(
    state: RunState, current: Event | None, hb_at: float | None, now: float
) -> Diagnosis | None:
    """STALLED where the sidecar's heartbeats, fresh, have found the trainer held in a
    stop (process state T or t) for at least :data:`MIN_QUIET_S`: a SIGSTOP, Ctrl-Z or a
    debugger holds it, whatever it was doing (a validation, a save, a start-up), and
    nothing moves until it is continued. Also sooner, where the trainer logged nothing
    for that long before: a sidecar held with it (a job-wide stop) finds it held only
    once the sidecar is continued, and its first samples then count what was read
    before the stop. None otherwise."""
    if hb_at is None or now - hb_at > HEARTBEAT_DEAD_S:
        return None
    last = state.last_train_ts if state.last_train_ts is not None else state.first_ts
    # under torchrun each rank's sidecar says its own trainer: a rank's, fresh, is this
    # run's now (rank 1 held during a validation was "Validating …; metrics resume")
    ranks = {
        hb.trainer.get("pid"): (rank, hb.ts)
        for rank, hb in state.samplers.rank_heartbeats.items()
        if isinstance(hb.trainer, dict) and hb.ts is not None
    }
    for pid, since in state.samplers.held_since.items():
        who = f"The trainer (pid {pid})"
        if current is not None and pid != current.pid:
            rank = ranks.get(pid)
            if rank is None or now - rank[1] > HEARTBEAT_DEAD_S:
                continue  # an earlier process's
            who = f"Rank {rank[0]}'s trainer (pid {pid})"
        if now - since >= MIN_QUIET_S:
            return Diagnosis(
                Health.STALLED,
                f"{who} has been held stopped for {ago(now - since)} "
                f"(its sidecar finds it so: a SIGSTOP, Ctrl-Z or a debugger); nothing runs "
                f"until it is continued (kill -CONT {pid}, or the debugger lets go).",
            )
        if last is not None and now - last >= MIN_QUIET_S:
            return Diagnosis(
                Health.STALLED,
                f"{who} is held stopped (its sidecar finds it so since "
                f"{clock(since)}: a SIGSTOP, Ctrl-Z or a debugger) and logged nothing for "
                f"{ago(now - last)}; nothing runs until it is continued (kill -CONT {pid}, or "
                "the debugger lets go).",
            )
    return None


def _probed_held(state: RunState, now: float) -> Diagnosis | None:
    """STALLED where the probe found the trainer held stopped (state T: its sidecar,
    stopped with it by a job-wide SIGSTOP, says nothing) and no record of any kind came
    for :data:`MIN_QUIET_S`; how long it has been held is not known, the quiet is."""
    live = state.liveness
    if live.process_state not in ("T", "t"):
        return None
    last = state.last_ts
    if last is None or now - last < MIN_QUIET_S:
        return None
    pid = state.manifest.get("pid")
    who = f"The trainer (pid {pid})" if pid else "The trainer"
    cont = f" (kill -CONT {pid}" if pid else " (kill -CONT"
    how = "traced (a debugger holds it)" if live.process_state == "t" else "held stopped"
    return Diagnosis(
        Health.STALLED,
        f"{who} is {how}, as the host found it, and no record of any kind came for "
        f"{ago(now - last)} (its sidecar is held too, or cannot write): nothing runs until "
        f"it is continued{cont}, or the debugger lets go).",
    )


def _activity_hung(
    state: RunState, now: float, current: Event | None, hb_at: float | None, label: str
) -> Diagnosis | None:
    """STALLED where a validation has gone on for at least :data:`HUNG_MIN_S` and
    :data:`HUNG_FACTOR` times the longest earlier one, and for the last
    :data:`HUNG_IDLE_S` nothing of it moved, each by evidence that reached us: the
    trainer's CPU time (its sidecar's fresh heartbeats, back to the window's start) grew
    less than :data:`HUNG_CPU_SHARE` of a core, no data was read (the io sampler's
    samples in the window), no checkpoint event, and the GPUs, where they are read, were
    idle. A slow validation computes, reads or waits on a busy GPU (a collective
    waiting for another rank spins its GPU); a hung one does none of it. A save is never
    called hung here: a slow filesystem's flush leaves all of these still. None
    otherwise."""
    what = state.activity
    if what is None or what.what != "validating" or current is None or hb_at is None:
        return None
    if now - hb_at > HEARTBEAT_DEAD_S:
        return None
    took = now - what.since
    before = state.activity_took.get(what.what)
    if took < HUNG_MIN_S or (before is not None and took < HUNG_FACTOR * before):
        return None
    since = now - HUNG_IDLE_S  # within the validation: HUNG_MIN_S is longer
    pid = current.pid
    used = state.samplers.cpu_used(pid, since) if isinstance(pid, int) else None
    if used is None:
        return None
    cpu, from_ts = used
    span = hb_at - from_ts
    if span < HUNG_IDLE_S * 0.9 or cpu > HUNG_CPU_SHARE * span:
        return None
    ev = evidence(state, now, HUNG_IDLE_S)
    if not ev.reads_known or ev.reading or ev.saving or ev.gpu_busy:
        return None
    signs = [f"the trainer (pid {pid}) used only {cpu:.1f} s of CPU"]
    if ev.gpu_known:
        util = f"{ev.gpu_util:.0f}%" if ev.gpu_util is not None else "no readings"
        signs.append(f"GPUs idle ({util})")
    signs.append("no data read")
    longest = f" (the longest before it took {ago(before)})" if before is not None else ""
    hb = state.samplers.heartbeat
    age = hb.stats_age_s if hb is not None else None
    if age is not None and math.isfinite(age) and age > MIN_QUIET_S:
        why = (
            f"the trainer's Python has not run for {ago(age)} (its writer thread is silent "
            "too): it is stuck in a C call, a collective, or holding the GIL."
        )
    else:
        why = "the validation looks hung (a dataloader deadlock, or a lock never released)."
    return Diagnosis(
        Health.STALLED,
        f"{label} ({what.detail}) for {ago(took)}{longest}, standing still for the last "
        f"{ago(HUNG_IDLE_S)}: {', '.join(signs)}{_stuck_clause(state)}; {why}",
    )


def current_process(state: RunState) -> Event | None:
    """The ``start`` or ``resume`` of the run's current trainer (rank 0's, under
    torchrun) that says its pid; None where none does."""
    for event in reversed(state.events):
        if event.event in ("start", "resume") and event.rank in (None, 0):
            return event if isinstance(event.pid, int) else None
    return None


def _about(current: Event | None, pid: object) -> bool:
    """Whether evidence naming ``pid`` (a probe's manifest, a sidecar's trainer) may be
    of the current trainer: it is, or either is unknown."""
    return current is None or not isinstance(pid, int) or pid == current.pid


def numbered_checkpoint(state: RunState) -> bool:
    """Whether the records show a complete numbered save (``checkpoints/N``): what
    speculators resumes from (never ``interrupted/``)."""
    return any(
        c.event in ("save_finished", "completed")
        and c.complete is not False
        and c.path.rstrip("/").rsplit("/", 1)[-1].isdigit()
        for c in state.ckpt_events
    )


def stop_requested(state: RunState) -> bool:
    """Whether the current process recorded a stop at a step boundary (a kill's request,
    telemetry/stop.py) before it ended: no signal reached it, and the kill makes its
    save the numbered checkpoint a resume continues from (not ``interrupted/``)."""
    for event in reversed(state.events):
        if event.event in ("start", "resume"):
            return False
        if event.event == "stop":
            return True
    return False


def end_event(state: RunState) -> Event | None:
    """How the run's current process ended (its ``finish``, ``interrupt`` or ``crash``;
    under torchrun the first rank's end); None while it runs."""
    end = _ranks_end(state)
    return end if end is not None else state.ending()


def ended_at(state: RunState, verdict: Diagnosis) -> float | None:
    """When the run ended, on the host's clock; None while it runs. Its end event's time;
    for a run without telemetry the last look that found it alive (else the look that
    found it gone); for a trainer judged dead without an end event (its heartbeats
    stopped, a probe found it gone) its last record. Rates and the uptime stop there."""
    end = end_event(state)
    if end is not None:
        return end.ts
    obs = state.observed
    if obs is not None and not obs.alive:
        from eagle3_tui.model.observed_health import last_seen_alive

        info = obs.info
        alive = last_seen_alive(state)
        return next((t for t in (alive, info.ended_at) if t is not None), obs.ts)
    if verdict.health is Health.DEAD:
        return state.last_ts
    return None


def _ranks_end(state: RunState) -> Event | None:
    """A distributed run's first end since its last start or resume (what follows it is
    torchrun, or a kill, ending the other ranks: not news). Of crashes close together,
    a rank that died rather than one that raised because its peer hung up."""
    if not _distributed(state) or not state.events:
        return None
    began = max((e.ts for e in state.events if e.event in ("start", "resume")), default=0.0)
    ends = [e for e in state.events if e.ts >= began and e.event in _ENDS]
    if not ends:
        return None
    first = min(ends, key=_ts)
    if first.event != "crash":
        return first
    soon = sorted((e for e in ends if e.event == "crash" and e.ts - first.ts <= 10.0), key=_ts)
    return next((e for e in soon if not _peer_error(e.error)), first)


def _rank_death(first: Event) -> Diagnosis:
    """The rank that died, how, and at which step."""
    where = f"pid {first.pid}" if first.pid else ""
    if first.host:
        where = f"{where} on {first.host}" if where else f"on {first.host}"
    who = f"Rank {first.rank}" + (f" ({where})" if where else "")
    at = f"after step {first.shown_step}" if first.step is not None else "before its first step"
    if first.exit_status is not None or (first.error or "").startswith("the trainer process"):
        how = exit_text(first.exit_status)  # seen from outside by its sidecar
    else:
        how = (first.error or "an exception").splitlines()[0][:160]
    return Diagnosis(
        Health.DEAD,
        f"{who} died {at}: {how}; torchrun stops the other ranks when one fails (see train.log).",
    )


_PEER_ERRORS = ("by peer", "connection closed", "connection reset", "remote process", "broken pipe")


def _ts(e: Event) -> float:
    return e.ts


def _peer_error(error: str | None) -> bool:
    """An error a rank raises when another rank is gone (gloo, NCCL)."""
    low = (error or "").lower()
    return any(s in low for s in _PEER_ERRORS)


def _rank_stall(state: RunState, now: float, quiet_for: float) -> Diagnosis | None:
    """A distributed run with no metric whose ranks split into some waiting in a
    collective and some that are not: the latter stopped, the former wait for them."""
    if not _distributed(state):
        return None
    live = {
        r: hb
        for r, hb in state.samplers.rank_heartbeats.items()
        if now - hb.ts <= HEARTBEAT_DEAD_S and isinstance(hb.where, dict)
    }
    waiting = sorted(r for r, hb in live.items() if (hb.where or {}).get("collective"))
    stopped = sorted(r for r in live if r not in waiting)
    if not waiting or not stopped:
        return None

    def step_of(rank: int) -> str:
        last = live[rank].last_step
        return f"step {last + 1}" if isinstance(last, int) else "its first step"

    parts = []
    for r in stopped:
        where = live[r].where or {}
        frame = str(where.get("frame") or "?")[:80]
        held = where.get("for_s")
        # (a frame its sidecar has seen for under a second says nothing of how long:
        # a rank held stopped read "for 0.0 s" after 40 s)
        since = f" for {ago(float(held))}" if isinstance(held, int | float) and held >= 1 else ""
        on = f" on {live[r].host}" if len({hb.host for hb in live.values()}) > 1 else ""
        parts.append(f"rank {r}{on} stopped at {step_of(r)} (in {frame}{since})")
    collectives = sorted({str((live[r].where or {}).get("collective")) for r in waiting})
    names = ", ".join(str(r) for r in waiting)
    ranks = "rank" if len(waiting) == 1 else "ranks"
    verb = "waits" if len(waiting) == 1 else "wait"
    text = (
        f"No metric for {ago(quiet_for)}: {'; '.join(parts)}; {ranks} {names} {verb} for it "
        f"in a collective ({', '.join(collectives)[:80]}) at {step_of(waiting[0])}."
    )
    return Diagnosis(Health.STALLED, text[0].upper() + text[1:])
