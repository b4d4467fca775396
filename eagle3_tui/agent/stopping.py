"""The kill's stop at a step boundary: asked of the run's telemetry, waited for (bounded),
else withdrawn and replaced by today's SIGTERM; then the stop's save made the numbered
checkpoint speculators resumes from at the next step.

The trainer's side is ``telemetry/stop.py`` (its docstring has the protocol). Here:

* only a run whose manifest advertises ``stop`` is asked (an older telemetry, a run
  without telemetry keep the SIGTERM path), and only where the run has logged a step since
  its process started: before that a SIGTERM loses nothing (the run starts from the
  checkpoint it resumed from) and no step boundary would come before the model is loaded;
* the request is written as the run's user, atomically (``safefs.write_atomic``: a link
  at its name is replaced, never written through);
* the wait is bounded by the run's own pace (:func:`stop_wait_s`); a save in progress
  holds it (the next step comes after the save);
* at the bound the request is withdrawn by deleting it. The telemetry takes a request by
  deleting it too, so exactly one of the two succeeds: withdrawn, nothing of the stop can
  start and SIGTERM is safe; taken, the stop is under way (several ranks agree on the
  step first) and the kill waits for it rather than signal a trainer that may be in the
  middle of its interrupt save.

Standard library only (the agent).
"""

from __future__ import annotations

import json
import os
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eagle3_tui.agent.checkpoints import (
    checkpoint_dir,
    checkpoint_info,
    latest_numbered,
    resume_at_stop,
    stop_save_problems,
)
from eagle3_tui.agent.frames import emit
from eagle3_tui.agent.names import EV_PROGRESS, MANIFEST
from eagle3_tui.agent.saving import is_stale, metrics_tail, save_in_progress
from eagle3_tui.agent.userfiles import as_user
from eagle3_tui.telemetry import manifest as mf
from eagle3_tui.telemetry.parsing import parse_json
from eagle3_tui.telemetry.safefs import read_bounded, write_atomic
from eagle3_tui.telemetry.stop import STOP_VERSION, read_request

STOP_MIN_S = 60.0
"""The shortest wait for a step boundary: a CPU step is ~50 ms, a GPU step up to seconds,
but a dataloader's first batch of an epoch, a validation epoch or a save between two steps
takes longer (the run's own longest gap counts too: :func:`stop_wait_s`)."""
STOP_STEPS = 5
"""Median gaps between logged steps the wait allows at least (a slow run's few steps)."""
STOP_LONGEST = 1.5
"""Times the longest gap between logged steps seen since the process started (an epoch's
end: its save and validation)."""
STATE_LIMIT = 64 << 10
POLL_S = 0.2
TELL_S = 5.0
STOPPED = ("stopped", "saved", "save_failed")
"""The state file's phases once the trainer has raised at its step boundary."""
UNDER_WAY = ("accepted", "scheduled")
NOT_STARTED = "no step logged since the process started"
"""The start of the reason a kill gives for the SIGTERM it sends at once, asking nothing
(:func:`ask_for_stop`): the trainer is still starting up (loading the model, spawning its
workers), before its first step; what a client says of it (``reports.py``, the ``k``
dialog) keys on it."""


def stop_files(m: dict[str, Any]) -> tuple[str, str] | None:
    """The request and state files the manifest's ``stop`` field names, when the run's
    telemetry stops at a step boundary (plain names inside the run directory); None
    for a telemetry that does not (it is never sent a request)."""
    stop = m.get("stop")
    if not isinstance(stop, dict) or stop.get("version") != STOP_VERSION:
        return None
    names = stop.get("request"), stop.get("state")
    for name in names:
        if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
            return None
    return str(names[0]), str(names[1])


class Pace:
    """What the run's records say about its steps since its process started."""

    def __init__(self) -> None:
        self.steps = 0
        """Training steps logged since the last start or resume."""
        self.attached = False
        """The process was attached to live (it had trained before its telemetry began)."""
        self.median_gap: float | None = None
        self.longest_gap: float | None = None
        self.last_step: int | None = None
        """The last training step logged (0-based), whatever the process."""


def step_pace(metrics: Path) -> Pace:
    """The gaps between the logged steps of the current process, from the end of
    ``metrics.jsonl`` (read as a regular file, bounded; bad lines skipped)."""
    pace = Pace()
    data = metrics_tail(metrics)
    if data is None:
        return pace
    times: list[float] = []
    for line in data.split(b"\n"):
        if b'"train"' not in line and b'"lifecycle"' not in line:
            continue
        try:
            rec = parse_json(line)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        kind, ts = rec.get("kind"), rec.get("ts")
        if kind == "lifecycle" and rec.get("event") in ("start", "resume"):
            times, pace.attached = [], False
        elif kind == "lifecycle" and rec.get("event") == "attach":
            pace.attached = True
        elif kind == "train" and isinstance(ts, (int, float)):
            times.append(float(ts))
            step = rec.get("step")
            if isinstance(step, int) and not isinstance(step, bool):
                pace.last_step = step
    pace.steps = len(times)
    gaps = [times[i + 1] - times[i] for i in range(len(times) - 1) if times[i + 1] >= times[i]]
    if gaps:
        pace.median_gap = statistics.median(gaps)
        pace.longest_gap = max(gaps)
    return pace


def stop_wait_s(pace: Pace) -> float:
    """How long a kill waits for the step boundary before it falls back to SIGTERM:
    ``max(60 s, 5 × the median gap between logged steps, 1.5 × the longest one)``."""
    wait = STOP_MIN_S
    if pace.median_gap is not None:
        wait = max(wait, STOP_STEPS * pace.median_gap)
    if pace.longest_gap is not None:
        wait = max(wait, STOP_LONGEST * pace.longest_gap)
    return wait


class StopRequest:
    """One kill's request to the run's telemetry: written, read back, withdrawn; the
    files touched as the run's user (``as_user``: root writes another user's files as
    that user)."""

    def __init__(
        self,
        run_dir: Path,
        names: tuple[str, str],
        as_owner: Callable[..., Any],
    ) -> None:
        self.path = run_dir / names[0]
        self.state_path = run_dir / names[1]
        self.as_owner = as_owner
        self.id = uuid.uuid4().hex[:16]
        self.at = 0.0

    def write(self) -> None:
        """The request, replacing whatever an earlier kill left (never through a link)."""
        self.at = time.time()
        body = json.dumps({"id": self.id, "at": self.at, "by": "eagle3-tui kill"})
        self.as_owner(_write_request, str(self.path), body)

    def withdraw(self) -> bool:
        """Delete the request: True when it was still there (the telemetry never took it:
        no stop can start), False when the telemetry took it first."""
        return bool(self.as_owner(_delete, str(self.path)))

    def state(self) -> dict[str, Any] | None:
        """The telemetry's state file, when it answers this request (its ``id``)."""
        return read_state(self.state_path, self.id)

    def pending(self) -> bool:
        """Whether this request is still at its path (not taken, not withdrawn)."""
        found = read_request(self.path)
        return found is not None and found["id"] == self.id


def read_state(path: Path, request_id: object) -> dict[str, Any] | None:
    """The telemetry's state file at ``path``, when it answers the request
    ``request_id``."""
    obj = _state_file(path)
    if obj is None or obj.get("id") != request_id:
        return None
    return obj


def _state_file(path: Path) -> dict[str, Any] | None:
    """The telemetry's state file at ``path`` (read bounded, never through a link)."""
    try:
        obj = parse_json(read_bounded(path, STATE_LIMIT, follow=False))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def _write_request(path: str, body: str) -> bool:
    write_atomic(path, body.encode(), 0o644, fsync=False)
    return True


def _delete(path: str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def wait_for_stop(
    request: StopRequest,
    alive: Callable[[], bool],
    wait_s: float,
    metrics: Path,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Wait for the telemetry to stop at a step boundary. Returns ``{"how", "waited_s",
    "state", "reason"}``: ``how`` is ``step_boundary`` (the trainer raised at a step
    boundary: ``state`` says where), ``exited`` (the trainer ended first, without a
    stop: finished or crashed), or ``sigterm`` (refused by the telemetry, or no step
    boundary within ``wait_s`` and the request withdrawn: the caller signals). A request
    the telemetry took is waited for until the stop (twice ``wait_s`` at most: the ranks
    agree first), never withdrawn; a save in progress holds the bound."""
    t0 = told = clock()
    deadline = t0 + wait_s
    taken = False
    emit(EV_PROGRESS, step="stop", phase="asked", elapsed=0.0, wait_s=wait_s)
    while True:
        state = request.state()
        phase = state.get("phase") if state is not None else None
        if phase in STOPPED:
            return _waited("step_boundary", t0, clock, state)
        if phase == "refused":
            request.withdraw()
            why = str(state.get("reason") if state is not None else "")[:300]
            return _waited("sigterm", t0, clock, state, f"the telemetry cannot stop there: {why}")
        if not alive():
            request.withdraw()
            state = request.state()  # written just before it ended?
            if state is not None and state.get("phase") in STOPPED:
                return _waited("step_boundary", t0, clock, state)
            return _waited("exited", t0, clock, state, "the trainer ended before a step boundary")
        now = clock()
        if phase in UNDER_WAY or (not taken and not request.pending()):
            taken = True  # the telemetry has it: never withdrawn from now on
        if now >= deadline and _saving(metrics):
            deadline = now + POLL_S  # the step boundary comes after the save
        elif now >= deadline and not taken:
            if request.withdraw():
                why = f"no step boundary within {wait_s:.0f} s (the request was withdrawn)"
                return _waited("sigterm", t0, clock, state, why)
            taken = True  # taken in the meantime: the stop is under way
        elif now >= deadline + wait_s:
            return _waited(
                "sigterm",
                t0,
                clock,
                state,
                f"the stop taken at {phase or 'its start'} did not come within {2 * wait_s:.0f} s",
            )
        if now - told >= TELL_S:
            told = now
            emit(EV_PROGRESS, step="stop", phase=phase or "asked", elapsed=now - t0, wait_s=wait_s)
        time.sleep(POLL_S)


def _saving(metrics: Path) -> bool:
    """A checkpoint save the records show under way (not a stale one)."""
    save = save_in_progress(metrics)
    return save is not None and not is_stale(save, time.time())


def _waited(
    how: str,
    t0: float,
    clock: Callable[[], float],
    state: dict[str, Any] | None,
    reason: str | None = None,
) -> dict[str, Any]:
    return {"how": how, "waited_s": round(clock() - t0, 2), "state": state, "reason": reason}


def ask_for_stop(
    req: dict[str, Any],
    m: dict[str, Any],
    run_dir: Path,
    alive: Callable[[], bool],
    as_owner: Callable[..., Any],
) -> dict[str, Any]:
    """A kill's first step on a run with telemetry, before any signal: ask it to stop at
    its next step boundary and wait for that (:func:`wait_for_stop`), or say why not
    (``how``: ``sigterm`` with its ``reason``: the caller signals as before). The request's
    ``stop_wait_s`` overrides the bound (:func:`stop_wait_s`). Another node's kill of a
    multi-node run asks nothing: rank 0 takes the request on node 0 and every rank stops
    at the same step; this node waits for its ranks to end the same way (``node0``), up
    to twice the bound, then signals."""
    names = stop_files(m)
    metrics = run_dir / str(m.get("metrics_file") or "metrics.jsonl")
    pace = step_pace(metrics)
    wait_s = float(req.get("stop_wait_s", stop_wait_s(pace)))
    if names is None:
        why = "its telemetry does not stop at a step boundary (an older eagle3-tui)"
        return _not_asked(why)
    node = m.get("node_rank")
    if isinstance(node, int) and node > 0:
        # before the pace: a node k > 0 logs no step of its own (rank 0 writes the
        # metrics), so its records would always say "no step since the start" and its
        # ranks would be signalled while node 0's stop has them agree on a step
        return _follow_node0(alive, 2 * wait_s)
    if pace.steps == 0 and not pace.attached:
        # a SIGTERM loses nothing: the process has not trained since the checkpoint it
        # resumed from (or since step 0), and no step boundary comes while it loads
        return _not_asked(f"{NOT_STARTED}: a signal loses nothing")
    request = StopRequest(run_dir, names, as_owner)
    try:
        request.write()
    except OSError as e:
        return _not_asked(f"the stop request could not be written ({e})")
    stop = wait_for_stop(request, alive, wait_s, metrics)
    stop["request"] = request.id
    stop["wait_s"] = round(wait_s, 1)
    return stop


def _not_asked(reason: str) -> dict[str, Any]:
    return {"how": "sigterm", "reason": reason, "waited_s": 0.0, "state": None}


def _follow_node0(alive: Callable[[], bool], wait_s: float) -> dict[str, Any]:
    """Node k > 0 of a multi-node run: its ranks stop with rank 0's (the job's store
    tells them the step); wait for them to end, else signal."""
    t0 = time.monotonic()
    while alive() and time.monotonic() - t0 < wait_s:
        time.sleep(POLL_S)
    if alive():
        why = f"its ranks did not stop with node 0's within {wait_s:.0f} s"
        return {"how": "sigterm", "reason": why, "waited_s": round(time.monotonic() - t0, 2)}
    return {"how": "node0", "waited_s": round(time.monotonic() - t0, 2), "state": None}


def redo_from_records(metrics: Path, checkpoint: dict[str, Any] | None) -> dict[str, Any] | None:
    """The steps a restart from ``checkpoint`` (``checkpoints.checkpoint_info``; None: no
    numbered checkpoint, it starts over) does again, by the run's own records: the last
    training step logged against the checkpoint's steps done (``exact``; with ``log_freq``
    above 1 a few unlogged steps after the last logged one are not counted). The shape of
    ``restart.redo``'s answer. None when the records show no step."""
    last = step_pace(metrics).last_step
    saved = checkpoint.get("global_step") if checkpoint is not None else 0
    if last is None or not isinstance(saved, int):
        return None
    return {
        "checkpoint_step": saved,
        "steps": max(0, last + 1 - saved),
        "exact": True,
        "source": "metrics",
        "last_step": last,
    }


def after_stop(
    stop: dict[str, Any],
    m: dict[str, Any],
    run_dir: Path,
    before: dict[str, tuple[int, int]] | None,
    *,
    convert: bool = True,
) -> dict[str, Any]:
    """The kill's report of its stop once the run's processes are gone (``convert``;
    else nothing is moved: a process of the run remains): where the save holds the
    run, the save made the numbered checkpoint speculators resumes from
    (:func:`checkpoints.resume_at_stop`, as the save's owner) when it is this stop's and
    complete (else ``not_converted`` says why), and what a restart will redo."""
    state = stop.pop("state", None) or {}
    names = stop_files(m)
    if names is not None and state:  # now that it is gone: saved, or the save failed
        state = read_state(run_dir / names[1], state.get("id")) or state
    if stop.get("how") == "exited" and _finished(m, run_dir):  # its last step came first
        why = "the training finished by itself first (its every step done): nothing to resume"
        return {**stop, "how": "finished", "reason": why}
    report = {**stop, **where_stopped(state)}
    ckpt = checkpoint_dir(m, run_dir)
    if stop.get("how") == "step_boundary" and ckpt is not None:
        problems = stop_save_problems(ckpt, state, before)
        if not convert:
            problems.append("processes of the run remain: nothing moved under them")
        if problems:
            report["not_converted"] = problems
        else:
            try:
                uid, gid = owner_of(ckpt / "interrupted")
                report["checkpoint"] = as_user(
                    uid,
                    gid,
                    resume_at_stop,
                    str(ckpt),
                    state["epoch"],
                    state["local_step"],
                    state["global_step"],
                )
            except OSError as e:
                report["not_converted"] = [f"{ckpt}: {e}"]
            else:
                _note_stop_save(run_dir, str(ckpt / "interrupted"), report["checkpoint"])
    latest = latest_numbered(ckpt) if ckpt is not None else None
    metrics = run_dir / str(m.get("metrics_file") or "metrics.jsonl")
    report["redo"] = redo_from_records(metrics, checkpoint_info(latest) if latest else None)
    return report


def _finished(m: dict[str, Any], run_dir: Path) -> bool:
    """The manifest, read again, says the same trainer finished (while a kill waited for
    its step boundary: a validation or a save after its last step)."""
    try:
        now = mf.read_manifest(run_dir / MANIFEST)
    except (OSError, ValueError):
        return False
    return now.get("status") == "finished" and now.get("pid") == m.get("pid")


def _note_stop_save(run_dir: Path, saved: str, made: Any) -> None:
    """The run's manifest says which numbered checkpoint its stop's save became (the
    records name ``interrupted/``): as the manifest's owner. A manifest that cannot be
    written changes nothing of the stop (the records keep the save's first name)."""
    path = made.get("path") if isinstance(made, dict) else None
    if not isinstance(path, str):
        return
    manifest = run_dir / MANIFEST
    try:
        uid, gid = owner_of(manifest)
        as_user(uid, gid, mf.note_stop_save, str(manifest), saved, path)
    except (OSError, ValueError):
        pass


def where_stopped(state: dict[str, Any]) -> dict[str, Any]:
    """What a kill's report says of the state file (written by the run: checked): its
    ``phase``, and the ``epoch``, ``local_step`` and ``global_step`` the save holds."""
    out: dict[str, Any] = {}
    if isinstance(state.get("phase"), str):
        out["phase"] = state["phase"][:40]
    for key in ("epoch", "local_step", "global_step"):
        value = state.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            out[key] = value
    return out


def joined_stop(m: dict[str, Any], run_dir: Path) -> dict[str, Any] | None:
    """For a kill that waited for another kill of the run (``control._report_joined``):
    the stop at a step boundary the other kill made, as :func:`after_stop` reports it
    (``how``, where the save holds the run, what a restart redoes; the conversion is the
    other kill's), when the state file says the run's trainer (the manifest's ``pid``)
    raised at a step boundary; None when it was not stopped so (the other kill
    signalled it, or it ended by itself)."""
    names, pid = stop_files(m), m.get("pid")
    state = _state_file(run_dir / names[1]) if names is not None else None
    if state is None or state.get("phase") not in STOPPED:
        return None
    if not isinstance(pid, int) or state.get("pid") != pid:  # an earlier process's stop
        return None
    rid = state.get("id")
    report: dict[str, Any] = {"how": "step_boundary"}
    report["request"] = rid if isinstance(rid, str) else None
    where = where_stopped(state)
    report.update(where)
    ckpt = checkpoint_dir(m, run_dir)
    latest = latest_numbered(ckpt) if ckpt is not None else None
    info = checkpoint_info(latest) if latest is not None else None
    keys = ("epoch", "local_step", "global_step")
    if info is not None and all(k in where and info.get(k) == where[k] for k in keys):
        report["checkpoint"] = {"path": info["path"]}  # the other kill made the save this
    else:
        report["not_converted"] = ["the kill it joined did not make the save a checkpoint"]
    metrics = run_dir / str(m.get("metrics_file") or "metrics.jsonl")
    report["redo"] = redo_from_records(metrics, info)
    return report


def owner_of(path: Path) -> tuple[int, int]:
    """The user who owns ``path`` (not followed) and that user's group."""
    st = os.lstat(path)
    try:
        import pwd

        return st.st_uid, pwd.getpwuid(st.st_uid).pw_gid
    except (KeyError, ImportError):
        return st.st_uid, st.st_gid
