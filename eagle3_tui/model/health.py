"""Health of a run, decided from the evidence, with one sentence saying why.

Evidence, most decisive first:

* lifecycle events in the file (``finish``, ``interrupt``, ``crash``);
* whether the process is alive: a probe from outside (``RunState.process_alive``)
  or, lacking one, whether the writer's heartbeat is still arriving;
* what the hardware does: GPU utilisation, dataloader bytes read, checkpoint
  saves (from the samplers' records);
* when the last metric record came, against the run's own pace.

``quiet_limit = max(30 s, 5 × median step time)``: a run that logged no metric for
longer than that is *silent* if its process works (GPU busy, data being read,
checkpoints growing) and *stalled* if nothing moves. A checkpoint save or a
validation epoch in progress is neither. A non-finite loss, or a loss far above
its smoothed value, is *diverged*.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

from eagle3_tui.model.state import Event, RunState

MIN_QUIET_S = 30.0
QUIET_STEPS = 5.0
"""A run is quiet after ``max(MIN_QUIET_S, QUIET_STEPS × median step time)``."""
SILENT_FROM_START_S = 90.0
"""With no metric ever, a working process is called silent after this long."""
HEARTBEAT_DEAD_S = 30.0
"""No heartbeat for this long, and no probe: the writer's process is taken as gone."""
GPU_BUSY_UTIL = 10.0
DIVERGE_FACTOR = 4.0
"""Diverged when the last losses sit this many times above their smoothed history."""


class Health(enum.Enum):
    """What a run is doing. The value is what ``summary`` prints."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    STOPPED = "stopped"
    SILENT = "silent"
    STALLED = "stalled"
    DEAD = "dead"
    DIVERGED = "diverged"


@dataclass(frozen=True, slots=True)
class Diagnosis:
    health: Health
    reason: str


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def median_step_time(state: RunState, last_n: int = 200) -> float | None:
    """Median wall time between consecutive logged steps (per step), recent window."""
    table = state.table
    n = len(table)
    if n < 2:
        return None
    ts = np.frombuffer(table.ts, dtype=np.float64)[max(0, n - last_n - 1) :].copy()
    st = np.frombuffer(table.steps, dtype=np.int64)[max(0, n - last_n - 1) :].copy()
    dt = np.diff(ts)
    ds = np.diff(st)
    ok = (ds > 0) & (dt >= 0)
    if not ok.any():
        return None
    return float(np.median(dt[ok] / ds[ok]))


def quiet_limit(state: RunState) -> float:
    med = median_step_time(state)
    return max(MIN_QUIET_S, QUIET_STEPS * med) if med is not None else MIN_QUIET_S


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
        for ts, devs in state.gpu_samples
        if ts >= since
        for dev in devs
        if dev.util is not None
    ]
    gpu_known = bool(utils) or (state.last_gpu_ts is not None and state.gpu_status == "ok")
    peak = max(utils) if utils else None
    io = [p for p in state.io_history if p.ts >= since]
    read_bytes = sum(p.bytes for p in io)
    ckpt_recent = any(e.ts >= since for e in state.ckpt_events)
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


def _diverged(state: RunState) -> str | None:
    loss = state.latest("train/loss")
    step = state.global_step
    if loss is not None and not math.isfinite(loss):
        return (
            f"The loss is {loss} at step {step}: training has diverged (check the learning rate)."
        )
    col = state.table.columns.get("train/loss")
    if col is None or len(col) < 50:
        return None
    values = np.frombuffer(col, dtype=np.float32)[-400:].astype(np.float64)
    history, recent = values[:-5], values[-5:]
    history = history[np.isfinite(history)]
    if len(history) < 40 or not np.isfinite(recent).all():
        return None
    base = float(np.median(history[-200:]))
    now_level = float(np.median(recent))
    if base > 0 and now_level > DIVERGE_FACTOR * base:
        return (
            f"The loss jumped to {now_level:.4g} at step {step}, "
            f"{now_level / base:.1f}× its recent level ({base:.4g}): training may be diverging."
        )
    return None


def diagnose(state: RunState, now: float) -> Diagnosis:
    """The run's health from its records and any process probe."""
    state.settle()
    step = state.global_step
    end = _ranks_end(state)  # torchrun: the first rank to end says how the run ended
    if end is not None and end.event == "crash":
        return _rank_death(end)
    last = end or state.last_event()
    if last is not None and last.event == "finish":
        done = f"after {last.step} steps" if last.step is not None else f"at step {step}"
        return Diagnosis(Health.FINISHED, f"Training finished {done}.")
    if last is not None and last.event == "crash":
        err = f": {last.error.splitlines()[0][:160]}" if last.error else ""
        return Diagnosis(Health.DEAD, f"The trainer crashed at step {last.step or step}{err}.")
    if last is not None and last.event == "interrupt":
        return Diagnosis(
            Health.STOPPED,
            f"Interrupted at step {last.step or step} (a signal); speculators saved "
            "checkpoints/interrupted/. Resume continues from the last numbered checkpoint.",
        )
    diverged = _diverged(state)
    if diverged is not None:
        return Diagnosis(Health.DIVERGED, diverged)

    alive = state.process_alive
    hb = state.heartbeat
    seen_by_sidecar = hb.trainer if hb is not None and isinstance(hb.trainer, dict) else None
    if alive is None and state.last_heartbeat_ts is not None:
        fresh = (now - state.last_heartbeat_ts) <= HEARTBEAT_DEAD_S
        if fresh and seen_by_sidecar is not None and seen_by_sidecar.get("alive") is False:
            alive = False  # the sidecar watched the trainer go
        else:
            alive = fresh
    if alive is False:
        pid = state.manifest.get("pid") or (seen_by_sidecar or {}).get("pid")
        who = f"The trainer (pid {pid})" if pid else "The trainer"
        at = f"at step {step}" if step is not None else "before its first step"
        if state.process_alive is False or (
            seen_by_sidecar is not None and seen_by_sidecar.get("alive") is False
        ):
            how = "is gone"
        else:
            how = f"stopped writing heartbeats {_ago(now - (state.last_heartbeat_ts or now))} ago"
        return Diagnosis(
            Health.DEAD,
            f"{who} {how} without a finish event, {at}: it crashed or was killed (see train.log).",
        )

    limit = quiet_limit(state)
    last_metric = state.last_train_ts
    if state.activity is not None:
        what = state.activity
        label = "Saving a checkpoint" if what.what == "saving" else "Validating"
        return Diagnosis(
            Health.RUNNING,
            f"{label} ({what.detail}) for {_ago(now - what.since)}; metrics resume after it.",
        )
    if last_metric is None:
        started = state.first_ts
        if started is None:
            if state.malformed_count:
                bad = state.malformed[-1]
                return Diagnosis(
                    Health.WAITING,
                    f"No valid record yet, {state.malformed_count} malformed lines (the last: "
                    f"{bad.reason[:80]}): is this file written by eagle3-tui telemetry?",
                )
            return Diagnosis(Health.WAITING, "Waiting for the first record.")
        quiet_for = now - started
        ev = evidence(state, now, max(limit, 60.0))
        working = ev.gpu_busy or ev.reading or ev.saving
        if quiet_for > SILENT_FROM_START_S and working:
            return Diagnosis(Health.SILENT, _silent_sentence(ev, quiet_for, never=True))
        return Diagnosis(
            Health.WAITING, f"No training step logged yet ({_ago(quiet_for)} since start)."
        )

    quiet_for = now - last_metric
    if quiet_for <= limit:
        return Diagnosis(Health.RUNNING, _running_sentence(state))
    rank_stall = _rank_stall(state, now, quiet_for)  # before "GPU busy": NCCL waits spin at 100 %
    if rank_stall is not None:
        return rank_stall
    ev = evidence(state, now, limit)
    if ev.gpu_busy or ev.reading or ev.saving:
        return Diagnosis(Health.SILENT, _silent_sentence(ev, quiet_for, never=False))
    if alive or ev.gpu_known or ev.reads_known:
        parts = []
        if ev.gpu_known:
            util = f"{ev.gpu_util:.0f}%" if ev.gpu_util is not None else "no readings"
            parts.append(f"GPUs idle ({util})")
        if ev.reads_known:
            parts.append("no data read")
        idle = ", ".join(parts) if parts else "no activity reported"
        med = median_step_time(state)
        pace = f" (a step usually takes {_ago(med)})" if med else ""
        return Diagnosis(
            Health.STALLED,
            f"No metric for {_ago(quiet_for)}{pace}, {idle}: {_stall_hint(state)}",
        )
    return Diagnosis(
        Health.STALLED,
        f"No record of any kind for {_ago(quiet_for)} and no process evidence: "
        "the run may have stopped or the file is no longer written.",
    )


def _silent_sentence(ev: Evidence, quiet_for: float, *, never: bool) -> str:
    signs = []
    if ev.gpu_busy and ev.gpu_util is not None:
        signs.append(f"the GPU is busy ({ev.gpu_util:.0f}%)")
    if ev.reading:
        signs.append(f"data files are being read ({_bytes(ev.read_bytes / ev.window)}/s)")
    if ev.saving:
        signs.append("checkpoints are being written")
    lead = "No metric has ever been logged" if never else f"No metric for {_ago(quiet_for)}"
    return (
        f"{lead} although {' and '.join(signs)}: the speculators.metrics logger may have "
        "no handler, or its level is above INFO."
    )


def _stall_hint(state: RunState) -> str:
    hb = state.heartbeat
    age = hb.stats_age_s if hb is not None else None
    if age is not None and math.isfinite(age) and age > MIN_QUIET_S:
        return (
            f"the trainer's Python has not run for {_ago(age)} (its writer thread is silent "
            "too): it is stuck in a C call, a collective, or holding the GIL."
        )
    frac = state.latest("profile/fetch_frac")
    if frac is not None and math.isfinite(frac) and frac > 0.5:
        return (
            f"the last steps waited on data ({frac:.0%} of step time): "
            "a dataloader worker may be stuck."
        )
    return (
        "the training loop looks hung (a dataloader deadlock, or a collective waiting for a rank)."
    )


def _running_sentence(state: RunState) -> str:
    med = median_step_time(state)
    pace = f", {1 / med:.2f} steps/s" if med else ""
    return f"Step {state.global_step} logged{pace}."


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


# ---- torchrun: which rank ----------------------------------------------------------------


_ENDS = ("crash", "interrupt", "finish")


def _distributed(state: RunState) -> bool:
    world = state.manifest.get("world_size")
    return (isinstance(world, int) and world > 1) or len(state.rank_heartbeats) > 1


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
    at = f"after step {first.step}" if first.step is not None else "before its first step"
    if first.exit_status is not None or (first.error or "").startswith("the trainer process"):
        how = _exit_text(first.exit_status)  # seen from outside by its sidecar
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


def _exit_text(status: int | None) -> str:
    if status is None:
        return "killed, or exited without a word (exit status unknown)"
    if status < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"


def _rank_stall(state: RunState, now: float, quiet_for: float) -> Diagnosis | None:
    """A distributed run with no metric whose ranks split into some waiting in a
    collective and some that are not: the latter stopped, the former wait for them."""
    if not _distributed(state):
        return None
    live = {
        r: hb
        for r, hb in state.rank_heartbeats.items()
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
        since = f" for {_ago(float(held))}" if isinstance(held, int | float) else ""
        on = f" on {live[r].host}" if len({hb.host for hb in live.values()}) > 1 else ""
        parts.append(f"rank {r}{on} stopped at {step_of(r)} (in {frame}{since})")
    collectives = sorted({str((live[r].where or {}).get("collective")) for r in waiting})
    names = ", ".join(str(r) for r in waiting)
    ranks = "rank" if len(waiting) == 1 else "ranks"
    verb = "waits" if len(waiting) == 1 else "wait"
    text = (
        f"No metric for {_ago(quiet_for)}: {'; '.join(parts)}; {ranks} {names} {verb} for it "
        f"in a collective ({', '.join(collectives)[:80]}) at {step_of(waiting[0])}."
    )
    return Diagnosis(Health.STALLED, text[0].upper() + text[1:])
