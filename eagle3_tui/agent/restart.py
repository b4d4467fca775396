"""What restarting a training that has no telemetry takes: recorded by ``kill`` before its
first signal, found again by ``resume``.

A training started by a user's own script (``nohup python train.py > train.log 2>&1 &``)
has no manifest, so no resume command. While it is still there to be read, a kill by PID
records what relaunching it needs, from ``/proc`` (bounded reads):

* its command line: the trainer's, or under torchrun the agent's (``torchrun`` is
  relaunched as ``torchrun``);
* its working directory and its whole initial environment (``/proc/PID/environ``: the
  script's own variables, the scheduler's, the user's PATH);
* the file its stdout and stderr go to (discovery's ``log``), its interpreter, its
  checkpoint directory;
* how far it got: the last step its output shows (only a handler of the user's prints
  one), the pace its numbered checkpoints show.

It is written as the trainer's user (root stopping alice's run writes alice's files as
alice: :func:`userfiles.as_user`), readable by that user only, into a run directory of
its own::

    <its working directory>/eagle3-runs/restart-<pid>/      (else restart-<pid>-<start
        run.json          0600   a manifest (schema 1)        ticks>; where the working
        resume-env.json   0600   the whole environment         directory is not the
    ~/.cache/eagle3-tui/lib/<version>-<hash>/                  user's to write: under
                          0700   the telemetry package         ~/.local/state/eagle3-tui/
                                 (as attach writes it)         restarts/)

and added to that user's index of runs (``runs`` lists it, ``resume HOST`` means it when
it is the latest stopped run, ``resume WORKDIR`` by its working directory). Its
``resume_command`` is the same command under the telemetry bootstrap
(:mod:`eagle3_tui.telemetry.rerun`), its ``log_file`` the user's own log: ``resume``
takes it through the path every run takes (trust chain, complete checkpoint, detached
start, output appended to that log after a banner), and the run comes back with
telemetry from its first line, writing its metrics into that directory.

Standard library only (the agent).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from eagle3_tui.agent.checkpoints import checkpoint_dir
from eagle3_tui.agent.frames import AgentError
from eagle3_tui.agent.logparse import bar, clean, metric_dict
from eagle3_tui.agent.names import ERR_REFUSED, MANIFEST, RUNS_FOLDER
from eagle3_tui.agent.process_facts import load_manifest
from eagle3_tui.agent.runs import read_index
from eagle3_tui.agent.trust import which
from eagle3_tui.agent.userfiles import as_user, cache_dir, write_lib
from eagle3_tui.telemetry import manifest as mf
from eagle3_tui.telemetry import procs
from eagle3_tui.telemetry.parsing import parse_json
from eagle3_tui.telemetry.rerun import resume_command, torchrun_resume_command
from eagle3_tui.telemetry.safefs import foreign_dir_problem, private_dir, read_bounded

PREFIX = "restart-"
_EPOCH = re.compile(r"^Epoch (\d+)$")
LOG_TAIL_BYTES = 256 * 1024
"""How much of the end of the trainer's log is read for the last step it printed."""
STATE_LIMIT = 1 << 20


class NotRecordedError(OSError):
    """Why no restart record could be made (the kill goes on: this is said in its report)."""


# ---- at the kill ----------------------------------------------------------------------


def record(req: dict[str, Any], m: dict[str, Any]) -> dict[str, Any] | None:
    """What the kill report says of a restart (its ``restart``): where the record is and
    what ``resume`` will run, or ``problem``, why none could be made. None for a
    training with telemetry (its run directory has its manifest). Called before any
    signal: the process must still be there to be read."""
    if m.get("run_dir") or not isinstance(m.get("pid"), int):
        return None
    try:
        spec = _process(m, req.get("lib"))
        written: dict[str, Any] = as_user(spec["uid"], spec["gid"], _write, spec)
    except (OSError, ValueError) as e:
        return {"problem": f"no restart recorded: {e}"}
    return written


def _process(m: dict[str, Any], lib: object) -> dict[str, Any]:
    """The process whose command a restart reruns (the trainer, or the torchrun agent),
    read from ``/proc`` with what the kill knows of the training (``m``)."""
    if not isinstance(lib, dict) or not lib:
        raise NotRecordedError("the request carries no telemetry package (an older client)")
    pid, start = int(m["pid"]), m.get("start_ticks")
    launcher = m.get("launcher_pid") if isinstance(m.get("launcher_pid"), int) else None
    main = launcher if launcher is not None else pid
    argv, cwd, env = procs.cmdline(main), procs.cwd(main), procs.environ(main)
    rank_argv = procs.cmdline(pid)
    if not argv or cwd is None or env is None or not rank_argv:
        raise NotRecordedError(f"pid {main}: its command line, directory or environment is gone")
    st, agent = procs.stat(pid), procs.stat(main)
    if st is None or agent is None or st.start_ticks != start:
        raise NotRecordedError(f"pid {pid} is no longer the training shown")
    try:
        owner = os.stat(f"/proc/{main}")
    except OSError as e:
        raise NotRecordedError(f"pid {main}: {e.strerror or e}") from None
    program = argv[0] if "/" in argv[0] else which(argv[0], env, cwd)  # as its shell found it
    argv = [os.path.normpath(os.path.join(cwd, program or argv[0])), *argv[1:]]
    started = procs.started_at(st)
    ckpt = checkpoint_dir(m, Path(cwd))
    return {
        "pid": pid,
        "start_ticks": start,
        "boot_id": m.get("boot_id") or procs.boot_id(),
        "launcher": (
            {"pid": main, "start_ticks": agent.start_ticks, "argv": argv, "cwd": cwd}
            if launcher is not None
            else None
        ),
        "argv": argv,
        "rank_argv": rank_argv,
        "cwd": cwd,
        "env": env,
        "log_file": m.get("log_file"),
        "checkpoint_dir": str(ckpt) if ckpt is not None else None,
        "started_at": started,
        "host": os.uname().nodename,
        "uid": owner.st_uid,
        "gid": owner.st_gid,
        "cache": str(cache_dir(owner.st_uid)),
        "lib": lib,
        "stopped": {"at": time.time(), "pace": _checkpoint_pace(ckpt, started)},
    }


def _saved_steps(ckpt: Path | None) -> list[tuple[int, float]]:
    """(global_step, when it was saved) of each numbered checkpoint, by step."""
    out = []
    try:
        entries = list(os.scandir(ckpt)) if ckpt is not None else []
    except OSError:
        return []
    for e in entries:
        if not e.name.isdigit() or e.is_symlink():
            continue
        state = os.path.join(e.path, "training_state.json")
        try:
            step = parse_json(read_bounded(state, STATE_LIMIT)).get("global_step")
            saved = os.stat(state).st_mtime
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(step, int) and not isinstance(step, bool):
            out.append((step, saved))
    return sorted(out)


def _checkpoint_pace(ckpt: Path | None, started: float | None) -> float | None:
    """Steps per second as the run's numbered checkpoints show it (between the first and
    the last; with one, since the process started: its start-up counted, a lower bound)."""
    saved = _saved_steps(ckpt)
    if len(saved) >= 2 and saved[-1][1] > saved[0][1]:
        return (saved[-1][0] - saved[0][0]) / (saved[-1][1] - saved[0][1])
    if saved and started is not None and saved[-1][1] > started:
        return saved[-1][0] / (saved[-1][1] - started)
    return None


def _write(spec: dict[str, Any]) -> dict[str, Any]:
    """As the trainer's user: the telemetry package, the run directory, its environment
    and manifest (both 0600), the index entry. What the kill report says."""
    lib = write_lib(Path(spec["cache"]), spec["lib"])
    run_dir = _place(spec)
    if spec["launcher"] is not None:
        command = torchrun_resume_command(spec["argv"], spec["rank_argv"], lib, str(run_dir))
    else:
        command = resume_command(spec["argv"], lib, str(run_dir))
    without = None
    if command is None:  # nothing the bootstrap could start: the same command, as it was
        command = list(spec["argv"])
        without = "its command runs no Python program the telemetry could be started in"
    m = _manifest(spec, run_dir, command, lib, without)
    mf.save_environment(run_dir / mf.RESUME_ENV_FILE, spec["env"])
    mf.write_manifest(run_dir / MANIFEST, m, 0o600)
    mf.register_run(m)
    return {
        "run_dir": str(run_dir),
        "resume_command": command,
        "telemetry": without is None,
        "note": without,
        "log_file": m["log_file"],
        "env_file": str(run_dir / mf.RESUME_ENV_FILE),
        "env_vars": len(spec["env"]),
        "lib": lib,
        "checkpoint_dir": spec["checkpoint_dir"],
    }


def _manifest(
    spec: dict[str, Any], run_dir: Path, command: list[str], lib: str, without: str | None
) -> dict[str, Any]:
    """The record as a run manifest: what ``resume`` reads for every run."""
    launcher = spec["launcher"]
    now = time.time()
    run_id = mf.new_run_id()
    return {
        "schema": mf.MANIFEST_SCHEMA,
        "run_id": run_id,
        "run_dir": str(run_dir),
        "host": spec["host"],
        "pid": spec["pid"],
        "start_ticks": spec["start_ticks"],
        "boot_id": spec["boot_id"],
        "launcher_pid": launcher["pid"] if launcher is not None else None,
        **({"launcher": launcher} if launcher is not None else {}),
        "argv": spec["argv"],
        "cwd": spec["cwd"],
        "python": spec["argv"][0],
        # resume_env_file holds the whole environment; the run marker from the first line
        "env": {mf.RUN_ID_ENV: run_id, mf.RUN_DIR_ENV: str(run_dir)},
        "checkpoint_dir": spec["checkpoint_dir"],
        "epochs": None,
        "steps_per_epoch": None,
        "total_steps": None,
        "resume_command": command,
        "resume_env_file": mf.RESUME_ENV_FILE,
        "metrics_file": "metrics.jsonl",
        "log_file": spec["log_file"],
        "started_at": spec["started_at"],
        "first_started_at": spec["started_at"],
        "updated_at": now,
        "status": "interrupted",
        "resumes": 0,
        "restart": {
            "of": {
                "pid": spec["pid"],
                "start_ticks": spec["start_ticks"],
                "boot_id": spec["boot_id"],
                "launcher_pid": launcher["pid"] if launcher is not None else None,
            },
            "recorded_at": now,
            "telemetry": without is None,
            "lib": lib,
            "stopped": spec["stopped"],
        },
    }


def _place(spec: dict[str, Any]) -> Path:
    """The record's directory, made 0700: ``<cwd>/eagle3-runs/restart-<pid>`` (with the
    start ticks when that name holds another process's record), else in the user's state
    directory when the working directory is not the user's to write."""
    pid, start = spec["pid"], spec["start_ticks"]
    tried = []
    for base in (Path(spec["cwd"]) / RUNS_FOLDER, mf.index_path().parent / "restarts"):
        for name in (f"{PREFIX}{pid}", f"{PREFIX}{pid}-{start}"):
            folder = base / name
            if not _free_for(folder, spec):
                continue
            try:
                base.mkdir(parents=True, exist_ok=True)
                problem = foreign_dir_problem(base)
                if problem is not None:
                    raise NotRecordedError(problem)
                private_dir(folder)
                os.chmod(folder, 0o700)
            except OSError as e:
                tried.append(f"{folder}: {e.strerror or e}")
                break  # this base will not do: the next one
            return folder
    raise NotRecordedError("no directory to write it in (" + "; ".join(tried) + ")")


def _free_for(folder: Path, spec: dict[str, Any]) -> bool:
    """Whether ``folder`` may hold this process's record: it holds no run, or this same
    process's record (a second kill of it)."""
    if not os.path.lexists(folder):
        return True
    m = load_manifest(str(folder))
    if m is None:
        return not os.path.lexists(folder / MANIFEST)
    return _record_of(m) == (spec["pid"], spec["start_ticks"], spec["boot_id"])


def _record_of(m: dict[str, Any]) -> tuple[object, object, object] | None:
    """(pid, start ticks, boot id) of the process whose restart ``m`` records."""
    restart = m.get("restart")
    of = restart.get("of") if isinstance(restart, dict) else None
    if not isinstance(of, dict):
        return None
    return of.get("pid"), of.get("start_ticks"), of.get("boot_id")


# ---- at the resume --------------------------------------------------------------------


def find(pid: int, req: dict[str, Any]) -> Path:
    """The restart record of the process ``pid`` (``req``: its ``start_ticks`` and its
    working directory, ``cwd``, when the client knows them): looked for where the kill
    writes it, then in this user's index of runs (newest first)."""
    start = req.get("start_ticks") if isinstance(req.get("start_ticks"), int) else None
    cwd = req.get("cwd") if isinstance(req.get("cwd"), str) else None
    candidates: list[str] = []
    if cwd:
        base = os.path.join(cwd, RUNS_FOLDER)
        candidates += [os.path.join(base, f"{PREFIX}{pid}{tail}") for tail in (f"-{start}", "")]
    for entry in reversed(read_index()):
        name = os.path.basename(entry["run_dir"].rstrip("/"))
        if name == f"{PREFIX}{pid}" or name.startswith(f"{PREFIX}{pid}-"):
            candidates.append(entry["run_dir"])
    for run_dir in dict.fromkeys(candidates):
        m = load_manifest(run_dir)
        found = _record_of(m) if m is not None else None
        if found is not None and found[0] == pid and start in (None, found[1]):
            return Path(run_dir)
    attached = _attached_run(pid, start, cwd)
    if attached is not None:  # its kill attached it first: that run resumes
        return attached
    if procs.alive(pid, start):
        raise AgentError(
            ERR_REFUSED,
            f"pid {pid} is running without telemetry: kill it first (the kill records what a "
            "restart needs), or attach telemetry to it live (eagle3-tui attach)",
        )
    raise AgentError(
        ERR_REFUSED,
        f"pid {pid}: no restart record: it was not stopped by eagle3-tui's kill (which "
        "records its command line, directory and environment); start your script again",
    )


def _attached_run(pid: int, start: int | None, cwd: str | None) -> Path | None:
    """The run directory of the telemetry attached live to the process ``pid`` (a kill
    attaches a training without telemetry first, to stop it at a step boundary): where
    attach puts it by default, else in this user's index (newest first); the newest
    whose manifest names that process and says it was attached."""
    candidates = [os.path.join(cwd, RUNS_FOLDER, f"attached-{pid}")] if cwd else []
    candidates += [e["run_dir"] for e in reversed(read_index())]
    for run_dir in dict.fromkeys(candidates):
        m = load_manifest(run_dir)
        if m is None or m.get("pid") != pid or not isinstance(m.get("attached"), dict):
            continue
        if start in (None, m.get("start_ticks")) and m.get("boot_id") == procs.boot_id():
            return Path(run_dir)
    return None


def redo(m: dict[str, Any], checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """How many steps resuming from ``checkpoint`` (``checkpoints.checkpoint_info``) does
    again, as best a restart record tells (``source``): the last step the stopped run's
    output shows, a metric line in its log (``log``: a handler of the user's) or its
    epoch's progress bar (``bar``: speculators prints it when the stop ends the epoch's
    loop), against the checkpoint's global step; else, about, the pace of its checkpoints
    over the time from that checkpoint's save to the stop. None when nothing tells. Read
    before the resume writes its banner into the log."""
    restart = m.get("restart")
    saved = checkpoint.get("global_step")
    if not isinstance(restart, dict) or not isinstance(saved, int):
        return None
    out: dict[str, Any] = {"checkpoint_step": saved, "exact": True}
    done, source = _steps_done(m.get("log_file"), checkpoint)
    if done is not None:
        out.update(steps=max(0, done - saved), last_step=done - 1, source=source)
        return out
    stopped = restart.get("stopped")
    pace, at = (stopped.get("pace"), stopped.get("at")) if isinstance(stopped, dict) else (0, 0)
    if not isinstance(pace, (float, int)) or pace <= 0 or not isinstance(at, (float, int)):
        return None
    try:
        state = os.stat(os.path.join(str(checkpoint["path"]), "training_state.json"))
    except (OSError, KeyError):
        return None
    since = max(0.0, float(at) - state.st_mtime)
    out.update(steps=round(pace * since), exact=False, pace=pace, since_s=since, source="pace")
    return out


def _steps_done(log: object, checkpoint: dict[str, Any]) -> tuple[int | None, str]:
    """The steps the stopped run had done, from the end of its output: its last metric
    line's global step + 1, or its last training bar (``Epoch E  n/total`` where total is
    an epoch's steps, known from the checkpoint) as E × total + n; with what told
    (``log``: a metric line of the log, never ``metrics``, which names metrics.jsonl)."""
    if not isinstance(log, str):
        return None, ""
    try:
        tail = read_bounded(log, LOG_TAIL_BYTES, tail=True).decode("utf-8", "replace")
    except OSError:
        return None, ""
    per_epoch = _steps_per_epoch(checkpoint)
    for raw in reversed(tail.splitlines()):
        line = clean(raw)
        found = metric_dict(line)
        step = found.get("global_step") if found is not None and "train" in found else None
        if isinstance(step, int) and not isinstance(step, bool):
            return step + 1, "log"
        figures = bar(line) if per_epoch is not None else None
        epoch = _EPOCH.match(figures["desc"]) if figures is not None else None
        if per_epoch and figures and epoch and figures["total"] == per_epoch:
            return int(epoch.group(1)) * per_epoch + int(figures["n"]), "bar"
    return None, ""


def _steps_per_epoch(checkpoint: dict[str, Any]) -> int | None:
    """An epoch's steps, from a checkpoint's training state: an end-of-epoch save
    (``local_step`` 0) of epoch e holds (e + 1) × that many steps, a mid-epoch one of
    epoch e > 0 e × that many plus its ``local_step``."""
    g, e, k = (checkpoint.get(key) for key in ("global_step", "epoch", "local_step"))
    if not (isinstance(g, int) and isinstance(e, int) and isinstance(k, int)):
        return None
    whole, epochs = (g, e + 1) if k == 0 else (g - k, e)
    if epochs <= 0 or whole <= 0 or whole % epochs:
        return None
    return whole // epochs
