"""Process control built on the run's manifest: ``kill`` and ``resume``.

Over 600 lines: a kill and the resume that follows it read the same manifest, process
tree and checkpoint state; apart, the stop's record would be passed between two modules
that both need all of it.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from eagle3_tui.agent.checkpoints import (
    checkpoint_dir,
    checkpoint_info,
    checkpoint_problems,
    checkpoint_report,
    files_state,
    interrupted_dir,
    latest_numbered,
)
from eagle3_tui.agent.discover import describe, manifest_of
from eagle3_tui.agent.frames import AgentError, emit
from eagle3_tui.agent.names import (
    ERR_GONE,
    ERR_REFUSED,
    EV_PROGRESS,
    EV_RESOLVED,
    EV_RESULT,
    KILL_GRACE_S,
    MANIFEST,
    OP_KILL,
    OP_RESUME,
    OP_SAVE_WAIT,
    SAVE_WAIT_S,
)
from eagle3_tui.agent.processes import (
    Member,
    Proc,
    find_members,
    settle,
    signal_member,
    verify_trainer,
    wait_gone,
)
from eagle3_tui.agent.processes import sigterm_targets as _sigterm_targets
from eagle3_tui.agent.restart import find as find_restart
from eagle3_tui.agent.restart import record as record_restart
from eagle3_tui.agent.restart import redo as steps_redone
from eagle3_tui.agent.runs import copy_of, read_manifest, resolve_run_dir
from eagle3_tui.agent.saving import wait_for_save
from eagle3_tui.agent.slurm import ended_job_of
from eagle3_tui.agent.stopping import (
    after_stop,
    ask_for_stop,
    joined_stop,
    owner_of,
    redo_from_records,
)
from eagle3_tui.agent.trust import manifest_owner, resume_problems, signal_owner
from eagle3_tui.agent.userfiles import as_user
from eagle3_tui.telemetry import procs
from eagle3_tui.telemetry.manifest import MANIFEST_LIMIT
from eagle3_tui.telemetry.parsing import parse_json
from eagle3_tui.telemetry.safefs import open_append, read_bounded, user_name
from eagle3_tui.telemetry.topology import TORCHRUN_ENV


def op_kill(req: dict[str, Any]) -> int:
    """Stop the run so that it saves its checkpoint, then make sure nothing of it remains.

    1. verify the trainer's PID (start time, boot id): refuse on a mismatch; if the
       run's records show a checkpoint save in progress, wait for it to finish (up to
       ``save_wait_s``: a SIGTERM in the middle of a save tears that checkpoint, see
       :mod:`saving`);
    2. a run whose telemetry stops at a step boundary (its manifest's ``stop``) is asked
       to, and nothing is signalled: it raises speculators' interrupt right after a
       step's optimizer update, saves ``interrupted/`` and exits; once it is gone that
       save becomes the numbered checkpoint speculators resumes from at the next step
       (:mod:`stopping`). Otherwise, or when no step boundary comes in time (the request
       withdrawn first), as before:
       SIGTERM the trainer, not its group: speculators' handler saves
       ``interrupted/`` and exits, its dataloader workers with it. Under torchrun,
       every rank of this node at once, not the agent: the agent forwards SIGTERM
       to each rank's whole process group, which kills the dataloader workers
       first and the save with them (measured here: "DataLoader worker ... is
       killed by signal: Terminated", no ``interrupted/``); once its ranks are
       gone the agent exits by itself, or is signalled;
    3. wait up to ``grace_s`` for them; then SIGKILL what remains (a rank that
       ignores SIGTERM); find every process of the run (descendants, marker) and
       SIGTERM, then SIGKILL what remains;
    4. report each PID: what it is (rank, worker, sidecar, agent), signals sent,
       how it ended (exit status or signal, where the kernel tells).
    """
    # Finish even if the client disconnects mid-way.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    grace = float(req.get("grace_s", KILL_GRACE_S))
    linger = float(req.get("linger_s", 3.0))
    m, run_dir, base = _kill_subject(req)
    trainer, problem = verify_trainer(m)
    uid, refused = signal_owner(m, base.pop("owner"), trainer.pid if trainer else None)
    if refused is not None:  # another user's manifest naming someone else's process
        emit(EV_RESULT, op=OP_KILL, status="refused", message=refused, processes=[], **base)
        return 0
    if trainer is not None and problem is not None:  # the PID was reused
        others = find_members(m, None, uid)
        processes = [mb.report() for mb in others.values()]
        emit(EV_RESULT, op=OP_KILL, status="refused", message=problem, processes=processes, **base)
        return 0
    members = find_members(m, trainer, uid)
    if not members and trainer is None:
        members = _outlived(m, uid)  # a training without telemetry: what its record saw
    if not members:
        note = problem or "the run is not running"
        emit(EV_RESULT, op=OP_KILL, status="not_running", message=note, processes=[], **base)
        return 0
    # what interrupted/ holds now: the report names only what this kill (or the one it
    # joins) produced
    before = files_state(interrupted_dir(m, run_dir))
    if _wait_for_other_kill(run_dir):  # one kill signals; this one reports how it ended
        _report_joined(m, run_dir, base, members, before)
        return 0
    _continue_held(members)
    launcher, targets = _sigterm_targets(members, trainer)
    save_wait = _wait_for_save(req, m, run_dir, targets if trainer is not None else [])
    stop = _ask_for_stop(req, m, run_dir, base, targets)
    if targets:
        stopping = stop is not None and stop["how"] != "sigterm"  # it exits by itself
        _stop_targets(m, members, trainer, targets, grace, None if stopping else signal.SIGTERM)
        if launcher and not wait_gone(launcher, linger):
            signal_member(launcher[0], signal.SIGTERM)  # its ranks are gone: it may go too
        wait_gone(list(members.values()), linger)
    _stop_the_rest(members, linger)
    remaining = [mb for mb in members.values() if mb.alive()]
    if stop is not None:  # its save made the checkpoint a restart continues from
        stop = after_stop(stop, m, run_dir, before, convert=not remaining)
    emit(
        EV_RESULT,
        op=OP_KILL,
        status="remaining" if remaining else "stopped",
        message=(
            f"{len(remaining)} process(es) of the run remain"
            if remaining
            else f"all {len(members)} process(es) of the run are gone"
        ),
        processes=[mb.report() for mb in members.values()],
        checkpoints=checkpoint_report(m, run_dir, before),
        signalled_trainer=bool(targets) and (stop is None or stop["how"] == "sigterm"),
        save_wait=save_wait,
        stop=stop,
        host=os.uname().nodename,
        node_rank=m.get("node_rank"),
        **base,
    )
    return 0


def _outlived(m: dict[str, Any], uid: int | None) -> dict[int, Member]:
    """A training without telemetry whose trainer is gone (a SIGKILL): the processes of
    it that outlived it (its dataloader workers, its helpers), as the observer's record
    of it knows them (same PID and start time, or of its group or session and started
    after it: ``discover.left_behind``). It has no marker to find them by, and the kill
    said "nothing to stop" beside the 1 GB of workers the monitor listed."""
    from eagle3_tui.agent.discover import left_behind_of
    from eagle3_tui.agent.timeline import find_ended

    pid, start = m.get("pid"), m.get("start_ticks")
    if not m.get("observed") or not isinstance(pid, int):
        return {}
    record = find_ended(pid, start if isinstance(start, int) else None, left_behind_of)
    if record is None:
        return {}
    out: dict[int, Member] = {}
    for row in left_behind_of(record):
        p = procs.stat(int(row["pid"]))
        if p is None or p.zombie or p.start_ticks != row.get("start_ticks"):
            continue
        if uid is not None and procs.owner(p.pid) != uid:
            continue
        role = str(row.get("role") or "child")
        out[p.pid] = Member(p, role if role in ("worker", "helper") else "child")
    return out


def _continue_held(members: dict[int, Member]) -> None:
    """SIGCONT to each process of the run held stopped (state ``T``: a SIGSTOP, Ctrl-Z):
    a stopped trainer takes no stop request and acts on no SIGTERM until it is continued
    (a kill of one waited for both in vain, then SIGKILLed it, its steps since its last
    checkpoint lost). One a debugger holds (``t``) stays as it is."""
    for mb in members.values():
        st = procs.stat(mb.pid)
        if st is not None and st.state == "T" and st.start_ticks == mb.start:
            signal_member(mb, signal.SIGCONT)


def _ask_for_stop(
    req: dict[str, Any],
    m: dict[str, Any],
    run_dir: Path,
    base: dict[str, Any],
    targets: list[Member],
) -> dict[str, Any] | None:
    """A run with telemetry (a run directory's manifest) whose trainer lives: ask it to
    stop at its next step boundary (:func:`stopping.ask_for_stop`); None for a training
    named by PID (no telemetry: SIGTERM, as before)."""
    if base.get("run_dir") is None or not targets:
        return None
    uid, gid = owner_of(run_dir / MANIFEST)
    stop = ask_for_stop(
        req,
        m,
        run_dir,
        lambda: any(t.alive() for t in targets),
        lambda fn, *args: as_user(uid, gid, fn, *args),
    )
    emit(
        EV_PROGRESS,
        step="stop",
        phase=stop["how"],
        elapsed=stop.get("waited_s", 0.0),
        reason=stop.get("reason"),  # a SIGTERM's: still starting up, no step boundary...
    )
    return stop


KILL_LOCK_NOTE_S = 5.0
"""How often a kill waiting for another kill of the same run says so."""
_kill_lock_fd: list[int] = []
"""The held lock (the agent is one process per operation: released at its exit)."""


def _wait_for_other_kill(run_dir: Path) -> bool:
    """Take the run's kill lock (an exclusive ``flock`` of the run directory itself: no
    file is made, and every user who can read the directory meets the same lock);
    True when another kill held it and this one waited for it to end. Where the
    filesystem has no locks, False at once."""
    try:
        fd = os.open(run_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC)
    except OSError:
        return False
    _kill_lock_fd.append(fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        pass
    except OSError:  # no locks here (some network filesystems)
        return False
    t0 = time.monotonic()
    emit(EV_PROGRESS, step="joined", elapsed=0.0)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            time.sleep(0.1)
        except OSError:
            return True
        elapsed = time.monotonic() - t0
        if elapsed // KILL_LOCK_NOTE_S != (elapsed - 0.1) // KILL_LOCK_NOTE_S:
            emit(EV_PROGRESS, step="joined", elapsed=elapsed)


def _report_joined(
    m: dict[str, Any],
    run_dir: Path,
    base: dict[str, Any],
    members: dict[int, Member],
    before: dict[str, tuple[int, int]] | None,
) -> None:
    """The result of a kill that waited for another kill of the run: no signal of its
    own, the same processes (found before it waited) and how each ended, the same
    checkpoint report, and the other kill's stop at a step boundary when it made one
    (:func:`stopping.joined_stop`: then no kill signalled the trainer); if the run still
    lives (the other kill was refused, or left processes), it says so and signals
    nothing: the other kill's report says why."""
    settle(members)
    stop = joined_stop(m, run_dir)
    remaining = [mb for mb in members.values() if mb.alive()]
    for mb in members.values():
        if mb.outcome != "alive":
            mb.outcome = "exited"  # ended by the other kill's signals, not by ours
    emit(
        EV_RESULT,
        op=OP_KILL,
        status="remaining" if remaining else "stopped",
        message=(
            f"another kill of this run was already running: this one waited for it and sent "
            f"no signal; {len(remaining)} process(es) of the run remain"
            if remaining
            else f"another kill of this run was already running: this one waited for it and "
            f"sent no signal; all {len(members)} process(es) of the run are gone"
        ),
        processes=[mb.report() for mb in members.values()],
        checkpoints=checkpoint_report(m, run_dir, before),
        signalled_trainer=stop is None,  # by the kill it joined: interrupted/ is that stop's
        joined=True,
        save_wait=None,
        stop=stop,
        host=os.uname().nodename,
        node_rank=m.get("node_rank"),
        **base,
    )


def _wait_for_save(
    req: dict[str, Any], m: dict[str, Any], run_dir: Path, savers: list[Member]
) -> dict[str, Any] | None:
    """A checkpoint save the run's records show in progress: waited for, up to the
    request's ``save_wait_s``, while a process that could be saving lives (the trainer,
    or this node's ranks; none when the trainer is dead: a save it left unfinished
    never ends, and its leftovers are killed at once)."""
    if not savers:
        return None
    metrics = run_dir / str(m.get("metrics_file") or "metrics.jsonl")
    wait_s = float(req.get("save_wait_s", SAVE_WAIT_S))
    return wait_for_save(metrics, lambda: any(mb.alive() for mb in savers), wait_s)


def op_save_wait(req: dict[str, Any]) -> int:
    """Wait, as a kill would before its first signal, for a checkpoint save in progress
    (a multi-node kill asks every node first, so that no node signals its ranks while
    another node's rank is in the middle of a save they share)."""
    run_dir = resolve_run_dir(req.get("run_dir"))
    m = read_manifest(run_dir)
    trainer, problem = verify_trainer(m)
    members = find_members(m, trainer) if problem is None else {}
    savers = _sigterm_targets(members, trainer)[1] if trainer is not None else []
    save_wait = _wait_for_save(req, m, run_dir, savers)
    emit(EV_RESULT, op=OP_SAVE_WAIT, save_wait=save_wait, run_dir=str(run_dir))
    return 0


def _kill_subject(req: dict[str, Any]) -> tuple[dict[str, Any], Path, dict[str, Any]]:
    """What ``kill`` acts on: a run directory's manifest, or a training found on the
    host by PID (no manifest); with the fields that every kill report carries (and
    ``owner``, the manifest's user, taken out before any report)."""
    if isinstance(req.get("pid"), int):
        m, run_dir = discovered_manifest(req)
        base = {"pid": m["pid"], "run_dir": None, "run_id": None, "owner": None}
        restart = record_restart(req, m)  # before any signal: it reads the live process
        if restart is not None:
            base["restart"] = restart
        return m, run_dir, base
    run_dir = resolve_run_dir(req.get("run_dir"))
    emit(EV_RESOLVED, run_dir=str(run_dir))
    m = read_manifest(run_dir)
    _refuse_a_copy(m, run_dir, "kill")
    owner = manifest_owner(run_dir)
    return m, run_dir, {"run_dir": str(run_dir), "run_id": m.get("run_id"), "owner": owner}


def _refuse_a_copy(m: dict[str, Any], run_dir: Path, verb: str) -> None:
    """A copy of a run directory (:func:`runs.copy_of`) is never acted on: its manifest
    names the first run's processes, command and directories (a kill stopped that run's
    trainer; a resume would relaunch that run, into its directory)."""
    first = copy_of(m, run_dir)
    if first is not None:
        raise AgentError(
            ERR_REFUSED,
            f"{run_dir} is a copy of the run in {first} (its manifest names that directory): "
            f"the processes, command and directories it names are that run's; nothing was "
            f"touched ({verb} {first} for that run)",
        )


def _stop_targets(
    m: dict[str, Any],
    members: dict[int, Member],
    trainer: Proc | None,
    targets: list[Member],
    grace: float,
    first: signal.Signals | None = signal.SIGTERM,
) -> None:
    """Send ``first`` to the targets (None: they stopped at a step boundary and exit by
    themselves) and give them ``grace`` seconds to save and exit; take in the processes
    the run spawned meanwhile; SIGKILL everything alive if a target outlived the grace
    (a rank that ignores SIGTERM)."""
    if first is not None:
        for target in targets:
            signal_member(target, first)
    _wait_saving(targets, grace)
    settle(members)  # how each rank ended, read before its pidfd is reused
    target = next((t for t in targets if t.alive()), targets[0])
    # workers and stragglers spawned meanwhile
    still = trainer if trainer is not None and members[trainer.pid].alive() else None
    for pid, mb in find_members(m, still).items():
        if pid in members:
            mb.ended()  # found again: let go of the second pidfd
        else:
            members[pid] = mb
    if target.alive():
        emit(EV_PROGRESS, step="timeout", pid=target.pid, grace_s=grace)
        for mb in members.values():
            if mb.alive():
                signal_member(mb, signal.SIGKILL)
        wait_gone(list(members.values()), 5.0)


def _wait_saving(targets: list[Member], grace: float) -> None:
    """Wait up to ``grace`` seconds for the targets to exit (their checkpoint save),
    telling the client every 5 s which one it waits for."""
    t0 = time.monotonic()
    while any(t.alive() for t in targets) and time.monotonic() - t0 < grace:
        wait_gone(targets, min(5.0, grace - (time.monotonic() - t0)))
        left = [t for t in targets if t.alive()]
        if left:
            emit(EV_PROGRESS, step="waiting", pid=left[0].pid, elapsed=time.monotonic() - t0)


def _stop_the_rest(members: dict[int, Member], linger: float) -> None:
    """Escaped or stuck processes of the run: SIGTERM (unless sent already), then
    SIGKILL; every member's ending read."""
    settle(members)
    rest = [mb for mb in members.values() if mb.alive()]
    if rest:
        for mb in rest:
            if "SIGTERM" not in mb.signals:
                signal_member(mb, signal.SIGTERM)
        wait_gone(rest, linger)
        settle(members)
        for mb in rest:
            if mb.alive():
                signal_member(mb, signal.SIGKILL)
        wait_gone(rest, 5.0)
    settle(members)


def discovered_manifest(req: dict[str, Any]) -> tuple[dict[str, Any], Path]:
    """A manifest-like identity of a process named by PID (a training without telemetry):
    the PID with the start time and boot id the client saw (checked again before any
    signal), the torchrun agent, the checkpoint directory; and the directory that
    relative paths are read from (its working directory)."""
    pid = int(req["pid"])
    start = req.get("start_ticks")
    if not isinstance(start, int):
        row = describe(pid)  # gone / permission / not a training: one-line errors
        start = row["start_ticks"]
    else:
        row = {}
        try:
            row = describe(pid, start)
        except AgentError as e:
            if e.kind != ERR_GONE:
                raise
    if row:  # (a worker's or rank's PID names its training: the trainer is signalled)
        m = manifest_of(row, os.uname().nodename)
    else:  # gone, or its PID reused: verify_trainer says which, nothing is signalled
        m = {"pid": pid, "start_ticks": start, "observed": True}
    if req.get("boot_id"):
        m["boot_id"] = req["boot_id"]
    emit(EV_RESOLVED, pid=pid)
    return m, Path(m.get("cwd") or "/")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        data = read_bounded(path, 8192, tail=True)
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


def _saved_environment(run_dir: Path, m: dict[str, Any]) -> dict[str, str] | None:
    """The trainer's own environment that ``attach`` saved (``resume_env_file``), if any."""
    name = m.get("resume_env_file")
    if not isinstance(name, str) or not name:
        return None
    try:
        env = parse_json(read_bounded(run_dir / name, MANIFEST_LIMIT))
    except (OSError, ValueError):
        return None
    if not isinstance(env, dict):
        return None
    return {str(k): str(v) for k, v in env.items()}


def op_resume(req: dict[str, Any]) -> int:
    """Relaunch the manifest's resume command, detached, from a complete checkpoint.

    Each check that could make the relaunch do harm refuses before anything starts:
    a run with processes alive, a run that finished, no complete numbered checkpoint,
    no resume command, no working directory, a file another user could have changed. A
    training started without eagle3-tui (``pid``) is the restart its kill recorded
    (agent/restart.py), with telemetry; none recorded: refused. ``plan``: every check,
    nothing started.
    """
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # inherited by the new run: nohup
    wait_s = float(req.get("wait_s", 30.0))
    pid = req.get("pid")  # a training without telemetry: the restart its kill recorded
    if isinstance(pid, int):
        try:
            run_dir = find_restart(pid, req)
        except AgentError:
            if procs.alive(pid, None):  # a live process that is no training says so, as
                describe(pid)  # summary and kill do (not "running without telemetry")
            raise
    else:
        run_dir = resolve_run_dir(req.get("run_dir"))
    emit(EV_RESOLVED, run_dir=str(run_dir))
    m = read_manifest(run_dir)
    _refuse_a_copy(m, run_dir, "resume")
    _refuse_if_running(m)
    if m.get("status") == "finished":  # its every step done: a relaunch would only redo
        raise AgentError(ERR_REFUSED, "the run finished: nothing to resume")
    latest = _resume_checkpoint(m, run_dir)
    cmd = _resume_command(m)
    launcher = m.get("launcher") if isinstance(m.get("launcher"), dict) else None
    cwd = str((launcher or {}).get("cwd") or m.get("cwd") or run_dir)
    if not os.path.isdir(cwd):
        raise AgentError(ERR_REFUSED, f"{cwd}: the run's working directory is gone")
    env = _resume_environment(run_dir, m, launcher)
    job = ended_job_of(env or {})
    if job is not None:  # relaunched here, it would run outside any allocation
        raise AgentError(
            ERR_REFUSED,
            f"this run was Slurm job {job}, which has ended: started here it would run "
            f"outside any allocation; requeue the job (eagle3-tui HOST:job/{job}, then r; "
            "or resume HOST:job/ID), or resume it from within a new allocation",
        )
    untrusted = resume_problems(run_dir, m, cmd, cwd, env, latest)
    if untrusted:  # nothing runs that another user could have chosen
        raise AgentError(
            ERR_REFUSED,
            f"not resumed as {user_name(os.geteuid())}: "
            + "; ".join(untrusted[:3])
            + ("" if len(untrusted) <= 3 else f"; and {len(untrusted) - 3} more")
            + " (resume it as the user who owns them, or fix their ownership and modes)",
        )
    log = run_dir / str(m.get("log_file") or "train.log")
    info = checkpoint_info(latest)
    metrics = run_dir / str(m.get("metrics_file") or "metrics.jsonl")
    # the run's own records where it has them (telemetry), else its restart record; read
    # before the banner: the stopped run's output ends the log
    redo = redo_from_records(metrics, info) or steps_redone(m, info)
    # a training started without eagle3-tui comes back with telemetry: from the restart
    # its kill recorded, or the telemetry its kill attached to it first
    restart = isinstance(m.get("restart"), dict) or isinstance(pid, int)
    if req.get("plan"):  # every check done, nothing started: what `r` shows before it asks
        _emit_resume_plan(run_dir, cmd, cwd, env, log, info, redo, restart)
        return 0
    proc = _start_detached(cmd, cwd, env, log, latest)
    rc, confirmed = _await_manifest(proc, run_dir, wait_s)
    if rc is None and confirmed:  # its telemetry began: does the program it runs?
        rc = _exit_within(proc, RESUME_SETTLE_S)
    if rc is not None:
        emit(
            EV_RESULT,
            op=OP_RESUME,
            status="failed",
            message=f"the resumed run exited at once with status {rc}",
            pid=proc.pid,
            log=str(log),
            log_tail=_tail(log),
            checkpoint=info,
            run_dir=str(run_dir),
        )
        return 0
    proc.returncode = 0  # detached on purpose: do not warn that it still runs
    emit(
        EV_RESULT,
        op=OP_RESUME,
        status="started",
        message=f"resumed from {latest}",
        pid=proc.pid,
        confirmed=confirmed,
        log=str(log),
        command=cmd,
        checkpoint=info,
        run_dir=str(run_dir),
        redo=redo,
        restart=restart,
    )
    return 0


def _emit_resume_plan(
    run_dir: Path,
    cmd: list[str],
    cwd: str,
    env: dict[str, str],
    log: Path,
    info: dict[str, Any],
    redo: dict[str, Any] | None,
    restart: bool,
) -> None:
    """What a resume would run, where, in which environment, into which log, from which
    checkpoint, and the steps it would do again; a restart of a training that had no
    telemetry (``restart``) says so."""
    emit(
        EV_RESULT,
        op=OP_RESUME,
        status="plan",
        message=f"would resume from {info['path']}",
        log=str(log),
        command=cmd,
        cwd=cwd,
        env_vars=len(env),
        checkpoint=info,
        run_dir=str(run_dir),
        redo=redo,
        restart=restart,
    )


def _refuse_if_running(m: dict[str, Any]) -> None:
    """Refuse while the trainer or any process of the run lives: two trainings would
    write the same checkpoints."""
    trainer, problem = verify_trainer(m)
    if trainer is not None and problem is None:
        raise AgentError(
            ERR_REFUSED, f"the run's trainer is still alive (pid {trainer.pid}); kill it first"
        )
    alive = find_members(m, None)
    if alive:
        pids = ", ".join(str(p) for p in sorted(alive))
        raise AgentError(
            ERR_REFUSED, f"processes of the run are still alive (pids {pids}); kill it first"
        )


def _resume_checkpoint(m: dict[str, Any], run_dir: Path) -> Path:
    """The checkpoint speculators will resume from, the newest numbered one; refused
    when there is none (it would start over) or it is incomplete (it would crash)."""
    ckpt = checkpoint_dir(m, run_dir)
    if ckpt is None:
        raise AgentError(ERR_REFUSED, "the manifest names no checkpoint_dir")
    latest = latest_numbered(ckpt)
    if latest is None:
        raise AgentError(
            ERR_REFUSED,
            f"{ckpt}: no numbered checkpoint, resuming would start over from step 0 "
            "(speculators ignores interrupted/)",
        )
    problems = checkpoint_problems(latest)
    if problems:
        raise AgentError(
            ERR_REFUSED,
            f"{latest}: incomplete checkpoint ({'; '.join(problems)}); speculators would "
            "resume from it and crash",
        )
    return latest


def _resume_command(m: dict[str, Any]) -> list[str]:
    """The manifest's resume command, its interpreter made absolute: "python" was
    found on the launching shell's PATH, maybe not on the agent's."""
    cmd = m.get("resume_command")
    if not isinstance(cmd, list) or not cmd or not all(isinstance(a, str) for a in cmd):
        raise AgentError(ERR_REFUSED, "the manifest has no resume_command")
    cmd = list(cmd)
    argv = m.get("argv") or []
    python = m.get("python")
    if not os.path.isabs(cmd[0]) and argv and cmd[0] == argv[0] and python:
        cmd[0] = str(python)
    return cmd


def _resume_environment(
    run_dir: Path, m: dict[str, Any], launcher: dict[str, Any] | None
) -> dict[str, str]:
    """The environment the run was started with, as far as it is known: the one a live
    attach saved (else the agent's), the torchrun agent's, the manifest's variables
    (except those torchrun sets per rank: the agent the command starts sets them again)."""
    env = dict(os.environ)
    saved = _saved_environment(run_dir, m)
    if saved is not None:  # a run attached to live: the environment it was started with
        env = saved
    if launcher is not None and isinstance(launcher.get("env"), dict):
        env.update({str(k): str(v) for k, v in launcher["env"].items()})
    for key, value in (m.get("env") or {}).items():
        if launcher is not None and key in TORCHRUN_ENV:
            continue  # set per rank by the torchrun agent the command starts again
        env[str(key)] = str(value)
    return env


def _start_detached(
    cmd: list[str], cwd: str, env: dict[str, str], log: Path, latest: Path
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in a session of its own (it outlives the agent), its output
    appended to the run's log after a line that says when and from what."""
    try:  # never through a link, never into another user's file
        fd, _ = open_append(log)
    except OSError as e:
        raise AgentError(ERR_REFUSED, f"{log}: {e.strerror or e}: not resumed") from None
    try:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        os.write(fd, f"\n--- eagle3-tui resume at {stamp} from {latest} ---\n".encode())
        return subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as e:
        raise AgentError(ERR_REFUSED, f"cannot start {cmd[0]}: {e.strerror or e}") from None
    finally:
        os.close(fd)


RESUME_SETTLE_S = 2.0
"""How long a resumed process, its telemetry started, is watched for an exit at once: the
program the telemetry's bootstrap runs may fail at its first import (a relaunch that
exited then was said started)."""


def _exit_within(proc: subprocess.Popen[bytes], seconds: float) -> int | None:
    """The process's exit status if it exits within ``seconds``, else None."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        rc = proc.poll()
        if rc is not None:
            return rc
        time.sleep(0.1)
    return proc.poll()


def _await_manifest(
    proc: subprocess.Popen[bytes], run_dir: Path, wait_s: float
) -> tuple[int | None, bool]:
    """Wait up to ``wait_s`` for the new process to write its PID into the manifest
    (confirmed: the resume took); its exit status if it exited first, else None."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        rc = proc.poll()
        if rc is not None:
            return rc, False
        try:
            now = parse_json(read_bounded(run_dir / MANIFEST, MANIFEST_LIMIT))
            if proc.pid in (now.get("pid"), now.get("launcher_pid")):
                return None, True
        except (OSError, ValueError, AttributeError):
            pass
        time.sleep(0.1)
    return None, False
