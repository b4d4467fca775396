"""What a directory or a PID names on this host: the ``choose``, ``look`` and ``describe``
operations (a run directory, a training working there without telemetry, several; a
stopped run to resume), from the rows ``discover.py`` builds.

Standard library only, Python 3.8+.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

from eagle3_tui.agent.discover import (
    attached_run,
    describe,
    ended_rows,
    live_or_ended,
    live_rows,
    manifest_of,
)
from eagle3_tui.agent.follow import send_file
from eagle3_tui.agent.frames import AgentError, emit
from eagle3_tui.agent.inputs import check_input
from eagle3_tui.agent.names import (
    CHOICE_PROCESS,
    CHOICE_RUN,
    CHOICE_SEVERAL,
    ERR_GONE,
    ERR_MISSING,
    ERR_NOT_NAMED,
    ERR_PERMISSION,
    EV_CHOSEN,
    EV_RESULT,
    MANIFEST,
    OP_CHOOSE,
    OP_DESCRIBE,
    OP_STATUS,
    PURPOSE_RESUME,
)
from eagle3_tui.agent.process_facts import eagle3_metrics, load_manifest, user_name
from eagle3_tui.agent.processes import kill_plan
from eagle3_tui.agent.runs import registered_rows, resolve_run_dir, status_of
from eagle3_tui.agent.trackers import TRACKER_NAMES
from eagle3_tui.telemetry import procs
from eagle3_tui.telemetry.procs import describe_exit

# ---- operations ------------------------------------------------------------------------


NAMED_BY = (
    ("run_dir", "run directory"),
    ("cwd", "working directory"),
    ("log", "log directory"),
    ("metrics_file", "metrics directory"),
    ("checkpoint_dir", "checkpoint directory"),
)
"""What a directory may be to a training to name it (for a file, its directory)."""


def own_directories(row: dict[str, Any]) -> list[tuple[str, str]]:
    """The directories that name the training ``row`` (a discovery row, a registered
    run, an observed run's record), each with what it is to it, resolved (``realpath``)."""
    out = []
    for key, what in NAMED_BY:
        value = row.get(key)
        if not isinstance(value, str) or not value:
            continue
        path = os.path.dirname(value) if key in ("log", "metrics_file") else value
        out.append((what, os.path.realpath(path)))
    return out + _command_directories(row)


def _command_directories(row: dict[str, Any]) -> list[tuple[str, str]]:
    """The directories a training's command line names after an option of where it
    writes (``--run-dir runs/exp7``, ``--output_dir=out``, ``--save-path``, a checkpoint
    or log directory): where a run without telemetry keeps its run. What it reads
    (``--data /shared``) names it not: a kill of that directory would stop each reader."""
    argv, cwd = row.get("command"), row.get("cwd")
    if not isinstance(argv, list) or not isinstance(cwd, str):
        return []
    out = []
    pairs = zip(argv[:MAX_COMMAND_ARGS], argv[1:MAX_COMMAND_ARGS])  # noqa: B905, RUF007 (3.8)
    for prev, arg in pairs:
        if not isinstance(arg, str) or not isinstance(prev, str):
            continue
        if arg.startswith("-") and "=" in arg:
            option, arg = arg.split("=", 1)
        elif prev.startswith("-"):
            option = prev
        else:
            continue  # a directory named as an option's value only
        if not _WRITES_TO.search(option):
            continue
        if not arg or arg.startswith("-") or len(arg) > 4096:
            continue
        path = os.path.realpath(os.path.join(cwd, arg))
        if os.path.isdir(path) and path != os.path.realpath(cwd):
            out.append(("directory its command line names", path))
    return out


_WRITES_TO = re.compile(r"run|out|save|ckpt|checkpoint|log", re.IGNORECASE)
"""An option that names where a training writes (not its data)."""
MAX_COMMAND_ARGS = 64
"""Of another user's command line, the arguments looked at (bounded)."""


def names(row: dict[str, Any], directory: str) -> bool:
    """Whether ``directory`` names the training: it is its run directory, working
    directory, log directory or checkpoint directory (its own handler's, too), exactly,
    after ``realpath``. A directory above them names none: ``kill /tmp/x`` stopped a
    training whose run directory was /tmp/x/run3 (issue 26)."""
    root = os.path.realpath(directory)
    return any(path == root for _, path in own_directories(row))


def works_below(row: dict[str, Any], directory: str) -> bool:
    """Whether one of the training's own directories lies below ``directory`` (which
    then names it not: it is a candidate the refusal lists)."""
    root = os.path.realpath(directory)
    prefix = root if root.endswith("/") else root + "/"
    return any(path.startswith(prefix) for _, path in own_directories(row))


def _candidate(row: dict[str, Any]) -> str:
    """A training that works below a directory, for the refusal: what it is, and each
    of its own directories (one of which the user can give instead)."""
    argv = row.get("command") or []
    cmd = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(argv))[:60]
    if "status" in row:  # a registered run
        head = f"run {row['run_dir']} ({row.get('status') or '?'}, pid {row.get('pid')})"
    else:
        ended = ", ended" if row.get("alive") is False else ""
        who = "" if row.get("mine", True) else f" of {row.get('user')}"
        head = f"pid {row.get('pid')} ({cmd}){who}{ended}"
    dirs = ", ".join(f"{what} {path}" for what, path in own_directories(row))
    return f"{head}: {dirs}"


CANDIDATES_SHOWN = 8


def not_named(path: str, candidates: list[dict[str, Any]], live: int) -> AgentError:
    """The refusal of a directory that is none of a training's own but above some:
    nothing is chosen (nothing signalled), the candidates (the first ``live`` of them
    live trainings, then runs and trainings that ended) are listed."""
    listed = "; ".join(_candidate(r) for r in candidates[:CANDIDATES_SHOWN])
    more = len(candidates) - CANDIDATES_SHOWN
    tail = f"; and {more} more" if more > 0 else ""
    below = (
        f"{len(candidates)} training(s) work below it"
        if live == len(candidates)
        else f"{len(candidates)} training(s) or run(s) lie below it, {live} of them live"
    )
    return AgentError(
        ERR_NOT_NAMED,
        f"{path} names no training: it is not the run, working, log or checkpoint directory "
        f"of one; {below} (give one of their directories, or --pid PID): {listed}{tail}",
    )


def _manifest_status(run_dir: str) -> str:
    m = load_manifest(run_dir)
    return str(m.get("status") or "?") if m is not None else "?"


def latest_stopped_run(live_dirs: set[str]) -> str | None:
    """The newest registered run of this user that is not running (its trainer gone)
    and whose directory no live training uses: what ``resume HOST`` means."""
    rows, _ = registered_rows(False)  # newest first
    for r in rows:
        run_dir = str(r.get("run_dir") or "")
        if r.get("exists") and not r.get("alive") and run_dir not in live_dirs:
            return run_dir
    return None


def registered_in(directory: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """This user's registered runs (newest first) that ``directory`` names, and those
    whose own directories lie below it: rows with the directories that name them."""
    rows, _ = registered_rows(False)  # newest first
    named, below = [], []
    for r in rows:
        run_dir = str(r.get("run_dir") or "")
        manifest = load_manifest(run_dir)
        if manifest is None:
            continue
        log = manifest.get("log_file")
        row = {
            "run_dir": run_dir,
            "cwd": manifest.get("cwd"),
            "checkpoint_dir": manifest.get("checkpoint_dir"),
            "log": os.path.join(run_dir, log) if isinstance(log, str) and log else None,
            "pid": manifest.get("pid"),
            "started": r.get("started_at"),
            "status": manifest.get("status"),
        }
        if names(row, directory):
            named.append(row)
        elif works_below(row, directory):
            below.append(row)
    return named, below


def run_working_in(directory: str) -> str | None:
    """The newest run of this user whose trainer worked in ``directory`` (it is its
    working directory, log or checkpoint directory or run directory): a work directory
    names its stopped run too, e.g. a live attach's ``eagle3-runs/attached-PID``."""
    named, _ = registered_in(directory)
    return str(named[0]["run_dir"]) if named else None


def _describe_choice(row: dict[str, Any]) -> str:
    cmd = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(row["command"]))
    where = f" in {row['cwd']}" if row.get("cwd") else ""
    if row.get("telemetry"):
        tel = "telemetry attached"
    elif row.get("handler"):
        handler = str(row["handler"])
        tel = "no telemetry, " + {
            "tensorboard": "metrics from its TensorBoard event files",
            "printed": "metrics printed in its log",
            "json": "metrics by its own JSON handler",
        }.get(handler, f"metrics by its {TRACKER_NAMES.get(handler, 'own')} handler")
    else:
        tel = "no telemetry"
    return f"pid {row['pid']} ({cmd[:60]}){where}, {tel}"


def _when(ts: Any) -> str:
    if not isinstance(ts, (int, float)):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _describe_end(row: dict[str, Any]) -> str:
    """How an observed training ended, for a choice's note."""
    at, before = row.get("ended_at"), row.get("last_alive")
    when = f"between {_when(before)} and {_when(at)}" if before else f"at {_when(at)}"
    how = describe_exit(row.get("exit_status"))
    return f"ended {when} ({how}): its record, kept since eagle3-tui first saw it"


def _is_run_directory(path: str) -> bool:
    """eagle3-tui's run directory: its manifest, or its telemetry's ``metrics.jsonl``
    (a ``metrics.jsonl`` of the user's own handler is a work directory's file)."""
    metrics = os.path.join(path, "metrics.jsonl")
    if os.path.exists(os.path.join(path, MANIFEST)):
        return True
    return os.path.exists(metrics) and eagle3_metrics(metrics)


def op_choose(req: dict[str, Any]) -> int:
    """Which run or process a target means (:func:`choice_of`)."""
    emit(EV_RESULT, **choice_of(req))
    return 0


def choice_of(req: dict[str, Any]) -> dict[str, Any]:
    """Which run or process a target means: ``choose``'s answer.

    ``pid``: that process's training (after it ended: its record, when an eagle3-tui
    look kept one). ``run_dir``: the run there (it has run.json, or eagle3-tui's
    metrics.jsonl), else the live training it names (it is that training's run,
    working, log or checkpoint directory), else its newest stopped run (registered, or
    observed and ended); a directory above trainings' directories is refused with them
    listed. Neither: the SSH user's live training; when there is none, the latest
    registered run. A finished run or another user's never pre-empts a live one of this
    user. ``purpose`` resume with neither: the latest stopped run (a live one cannot be
    resumed), else as above. The answer says what was chosen and what was not
    (``note``); several candidates come back as a list.
    """
    host = os.uname().nodename
    me = user_name(os.geteuid())
    pid = req.get("pid")
    base: dict[str, Any] = {"op": OP_CHOOSE, "host": host, "user": me}
    if isinstance(pid, int):
        return _choose_pid(pid, req.get("start_ticks"), base)
    run_dir = req.get("run_dir")
    live: list[dict[str, Any]] = []
    if run_dir:
        path = os.path.expanduser(str(run_dir))
        if not os.path.exists(path):
            raise AgentError(ERR_MISSING, f"{path}: no such run directory")
        check_input(path)
        if _is_run_directory(path):
            return dict(choice=CHOICE_RUN, run_dir=path, note="", short="", **base)
        live = live_rows(health=False)
        rows = [r for r in live if names(r, path)]
        scope = f"in {path}"
    else:
        path = ""
        rows = live_rows(health=False)
        scope = f"of {me} on {host}"
    mine = [r for r in rows if r["mine"]]
    others = [r for r in rows if not r["mine"]]
    skipped = f"; {len(others)} live training(s) of other users not shown" if others else ""
    if not path and req.get("purpose") == PURPOSE_RESUME:
        stopped = latest_stopped_run({str(r.get("run_dir")) for r in rows if r.get("run_dir")})
        if stopped is not None:  # a live run cannot be resumed: the stopped one is meant
            status = _manifest_status(stopped)
            left = f"; {len(mine)} live training(s) of {me} left as they are" if mine else ""
            return dict(
                choice=CHOICE_RUN,
                run_dir=stopped,
                note=f"the latest stopped run of {me} on {host}: {stopped} ({status}){left}"
                f"{skipped}",
                short=f"the latest stopped run ({status})",
                **base,
            )
    if len(mine) > 1:
        return dict(
            choice=CHOICE_SEVERAL,
            runs=mine,
            note=f"{len(mine)} live trainings {scope}{skipped}",
            short=f"one of {len(mine)} live trainings",
            **base,
        )
    if len(mine) == 1:
        row = mine[0]
        note = f"the live training {scope}: {_describe_choice(row)}{skipped}"
        short = f"the live training of {me}"
        if row.get("run_dir"):
            return dict(
                choice=CHOICE_RUN,
                run_dir=row["run_dir"],
                row=row,
                note=note,
                short=short,
                **base,
            )
        else:
            return dict(choice=CHOICE_PROCESS, row=row, note=note, short=short, **base)
    if path:
        if others:
            who = ", ".join(sorted({str(r["user"]) for r in others}))
            raise AgentError(
                ERR_PERMISSION,
                f"{path}: no metrics.jsonl here; the live training working here belongs to "
                f"{who}, not to {me} (connect as that user)",
            )
        return _choose_stopped(path, live, req.get("purpose") == PURPOSE_RESUME, base)
    try:
        latest = resolve_run_dir(None)
    except AgentError:
        raise AgentError(
            ERR_MISSING, f"no live training of {me} and no run registered on {host}{skipped}"
        ) from None
    status = _manifest_status(str(latest))
    return dict(
        choice=CHOICE_RUN,
        run_dir=str(latest),
        note=f"no live training of {me} on {host}: the latest registered run, {latest} "
        f"({status}){skipped}",
        short=f"no live training of {me}: the latest run ({status})",
        **base,
    )


def _choose_pid(pid: int, start_ticks: Any, base: dict[str, Any]) -> dict[str, Any]:
    """``--pid``: that process's training; gone, the record of it when one was kept."""
    start = start_ticks if isinstance(start_ticks, int) else None
    row, ended = live_or_ended(pid, start)
    if ended is not None:
        note = f"{_describe_choice(row)}, {_describe_end(row)}"
        attached = attached_run(row)
        if attached is not None:  # its telemetry's records say how it ended, not the outside
            note += f"; telemetry was attached to it: its run {attached}"
            now = (load_manifest(attached) or {}).get("pid")
            if isinstance(now, int) and now != pid:  # the run, resumed: its trainer now
                note += f" (resumed since: its trainer is pid {now})"
            short = f"pid {pid}"
            return dict(choice=CHOICE_RUN, run_dir=attached, note=note, short=short, **base)
        return dict(choice=CHOICE_PROCESS, row=row, note=note, short=f"pid {pid}", **base)
    named = row.get("named_pid")
    note = f"pid {pid} is the {named['role']} of " if named else ""
    return dict(
        choice=CHOICE_PROCESS,
        row=row,
        note=note + _describe_choice(row),
        short=f"pid {pid}",
        **base,
    )


def _choose_stopped(
    path: str, live: list[dict[str, Any]], resume: bool, base: dict[str, Any]
) -> dict[str, Any]:
    """A work directory no live training of this user is named by: its newest stopped
    run (registered; or observed without telemetry and ended, not for a resume), else
    the ``metrics.jsonl`` of a user's own handler there read as it is, else a refusal
    listing the trainings below it, else missing."""
    registered, registered_below = registered_in(path)
    ended = [] if resume else ended_rows()
    ended_named = [r for r in ended if names(r, path)]
    newest_run = registered[0] if registered else None
    newest_end = ended_named[0] if ended_named else None
    run_start = float(newest_run.get("started") or 0.0) if newest_run else -1.0
    end_start = float(newest_end.get("started") or 0.0) if newest_end else -1.0
    # the restart a kill recorded for the observed training is that same process: its
    # record says how it went (a resume, which needs the restart, sees no records)
    same = bool(newest_end and newest_run and newest_run.get("pid") == newest_end.get("pid"))
    if newest_run is not None and run_start >= end_start and not same:
        earlier = str(newest_run["run_dir"])
        status = _manifest_status(earlier)
        return dict(
            choice=CHOICE_RUN,
            run_dir=earlier,
            note=f"no live training works in {path}: its latest run, {earlier} ({status})",
            short=f"the latest run in {path} ({status})",
            **base,
        )
    if newest_end is not None:
        return dict(
            choice=CHOICE_PROCESS,
            row=newest_end,
            note=f"no live training works in {path}: {_describe_choice(newest_end)}, "
            f"{_describe_end(newest_end)}",
            short=f"pid {newest_end['pid']}, ended",
            **base,
        )
    if os.path.exists(os.path.join(path, "metrics.jsonl")):  # its own handler's, read as is
        return dict(choice=CHOICE_RUN, run_dir=path, note="", short="", **base)
    below = [r for r in live if works_below(r, path)]
    live_below = len(below)
    # a live run with telemetry is also a registered one: listed once, as the live row
    live_dirs = {os.path.realpath(str(r["run_dir"])) for r in below if r.get("run_dir")}
    below += [
        r for r in registered_below if os.path.realpath(str(r.get("run_dir"))) not in live_dirs
    ]
    below += [r for r in ended if works_below(r, path)]
    if below:
        raise not_named(path, below, live_below)
    raise AgentError(
        ERR_MISSING,
        f"{path}: no metrics.jsonl here (is telemetry attached to the trainer?), and no "
        "live training works in this directory",
    )


def op_look(req: dict[str, Any]) -> int:
    """A look at a target in one process (what ``choose``, ``read`` and ``status`` say
    one after the other): ``choose``'s answer to ``run_dir`` and ``pid``; where that is
    a run with telemetry, the answer as a ``chosen`` event (``read_dir``: the run
    directory read), then that run's file as ``read`` sends it, its ``eof`` carrying
    the run's ``status`` (null where it has none: no manifest, an unreadable one;
    ``status_problem`` says why). ``since``: an earlier look's ``run_dir``, ``offset``
    and ``identity``; where this look chooses that run directory again, its file is
    read on from there. Any other answer (a training without telemetry, several) is
    the result, as ``choose`` gives it."""
    chosen = choice_of(req)
    row = chosen.get("row")
    row = row if isinstance(row, dict) else {}
    if chosen.get("choice") == CHOICE_RUN or (row.get("telemetry") and row.get("run_dir")):
        run_dir = str(row.get("run_dir") or chosen.get("run_dir") or "")
        read = {k: v for k, v in req.items() if k not in ("offset", "identity", "since")}
        read["run_dir"] = run_dir
        since = req.get("since")
        if isinstance(since, dict) and since.get("run_dir") == run_dir:
            read.update(offset=since.get("offset"), identity=since.get("identity"))
        emit(EV_CHOSEN, read_dir=run_dir, **chosen)
        send_file(read, _status_fields)
        return 0
    emit(EV_RESULT, **chosen)
    return 0


def _status_fields(run_dir: str) -> dict[str, Any]:
    """A look's ``status`` of the run it read (null with the reason where it has none)."""
    try:
        return {"status": dict(status_of(run_dir), op=OP_STATUS)}
    except Exception as e:  # (as a status call that failed: judged from the records)
        return {"status": None, "status_problem": str(e) or type(e).__name__}


def op_describe(req: dict[str, Any]) -> int:
    """One discovered training: its row, whether it is alive, a manifest-like identity
    and what ``k`` would act on (``processes``), as ``status`` answers for a registered
    run."""
    pid = int(req["pid"])
    start = req.get("start_ticks")
    host = os.uname().nodename
    try:
        row = describe(pid, start if isinstance(start, int) else None)
    except AgentError as e:
        if e.kind != ERR_GONE:
            raise
        emit(
            EV_RESULT,
            op=OP_DESCRIBE,
            alive=False,
            problem=str(e),
            manifest={"pid": pid, "start_ticks": start, "observed": True},
            host=host,
            now=time.time(),
        )
        return 0
    manifest = manifest_of(row, host)
    emit(
        EV_RESULT,
        op=OP_DESCRIBE,
        alive=True,
        problem=None,
        row=row,
        processes=kill_plan(manifest, procs.stat(int(row["pid"]))),
        manifest=manifest,
        host=host,
        now=time.time(),
    )
    return 0
