"""Run directories, the per-user index of runs, and what a run's state is: ``resolve``,
``runs``, ``status``."""

from __future__ import annotations

import os
import pwd
import time
from pathlib import Path
from typing import Any

from eagle3_tui.agent.checkpoints import checkpoint_dir, latest_numbered
from eagle3_tui.agent.frames import AgentError, emit
from eagle3_tui.agent.inputs import check_input
from eagle3_tui.agent.names import (
    ERR_MISSING,
    ERR_NO_MANIFEST,
    EV_RESULT,
    MANIFEST,
    OP_RESOLVE,
    OP_RUNS,
    OP_STATUS,
)
from eagle3_tui.agent.processes import kill_plan, leftovers, verify_trainer
from eagle3_tui.telemetry.manifest import MANIFEST_LIMIT, index_lock
from eagle3_tui.telemetry.parsing import parse_json
from eagle3_tui.telemetry.safefs import read_bounded, write_atomic

INDEX_LIMIT = 64 << 20
"""The index of runs is one short line per run started: 64 MiB is ~300,000 runs."""


def index_path() -> Path:
    """``${XDG_STATE_HOME:-~/.local/state}/eagle3-tui/runs.jsonl`` (as the manifest writes it)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return Path(state) / "eagle3-tui" / "runs.jsonl"


def read_index() -> list[dict[str, Any]]:
    """Entries of the index, oldest first; malformed lines skipped."""
    try:
        raw = read_bounded(index_path(), INDEX_LIMIT)
    except OSError:
        return []
    out = []
    for line in raw.splitlines():
        try:
            obj = parse_json(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("run_dir"), str):
            out.append(obj)
    return out


def _gone(path: str) -> bool:
    """Whether nothing is at ``path`` (not: cannot be looked at, e.g. no permission)."""
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False
    return False


def prune_index() -> list[str]:
    """Forget the runs whose directory is gone: the index rewritten without their
    lines (malformed lines kept as they are), under the lock the telemetry takes to
    append (``register_run``), so a run registered meanwhile is not lost. Returns the
    directories forgotten."""
    path = index_path()
    with index_lock(path):
        try:
            raw = read_bounded(path, INDEX_LIMIT)
        except OSError:
            return []
        kept: list[bytes] = []
        gone: list[str] = []
        for line in raw.splitlines(keepends=True):
            try:
                obj = parse_json(line)
            except ValueError:
                obj = None
            run_dir = obj.get("run_dir") if isinstance(obj, dict) else None
            if isinstance(run_dir, str) and _gone(run_dir):
                gone.append(run_dir)
            else:
                kept.append(line)
        if gone:
            write_atomic(path, b"".join(kept))
        return list(dict.fromkeys(gone))


def resolve_run_dir(run_dir: str | None) -> Path:
    """The given directory (``~`` expanded), or the latest registered run that still exists."""
    if run_dir:
        return Path(os.path.expanduser(run_dir))
    for entry in reversed(read_index()):
        if os.path.isdir(entry["run_dir"]):
            return Path(entry["run_dir"])
    raise AgentError(ERR_MISSING, f"no run registered on this host (index {index_path()})")


def check_run_dir(run_dir: Path) -> None:
    if not run_dir.exists():
        raise AgentError(ERR_MISSING, f"{run_dir}: no such run directory")
    check_input(str(run_dir))


def read_manifest(run_dir: Path) -> dict[str, Any]:
    check_run_dir(run_dir)
    path = run_dir / MANIFEST
    try:
        obj = parse_json(read_bounded(path, MANIFEST_LIMIT))  # a regular file, bounded
    except FileNotFoundError:
        raise AgentError(
            ERR_NO_MANIFEST, f"{run_dir}: no {MANIFEST} here (was the run started with telemetry?)"
        ) from None
    except (OSError, ValueError) as e:
        raise AgentError(ERR_MISSING, f"{path}: unreadable manifest ({e})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("pid"), int):
        raise AgentError(ERR_NO_MANIFEST, f"{path}: not a run manifest")
    return obj


def copy_of(m: dict[str, Any], run_dir: Path) -> Path | None:
    """The run directory ``run_dir`` was copied from: its manifest names another
    directory that exists and holds a manifest of the same run. The processes the
    manifest names (its trainer, the run's marker in their environment) are that run's,
    never this copy's. None: not a copy (a moved run directory, its first place gone, is
    the run)."""
    named = m.get("run_dir")
    if not isinstance(named, str) or not named:
        return None
    try:
        if os.path.samefile(named, run_dir):
            return None
        other = read_manifest(Path(named))
    except (OSError, AgentError):
        return None
    return Path(named) if other.get("run_id") == m.get("run_id") else None


def op_resolve(req: dict[str, Any]) -> int:
    """Which run directory a target means (the latest registered one when none is given)."""
    run_dir = resolve_run_dir(req.get("run_dir"))
    check_run_dir(run_dir)
    name = str(req.get("file") or "metrics.jsonl")
    emit(
        EV_RESULT,
        op=OP_RESOLVE,
        run_dir=str(run_dir),
        has_file=(run_dir / name).exists(),
        has_manifest=(run_dir / MANIFEST).exists(),
        host=os.uname().nodename,
    )
    return 0


def owned_by_me(run_dir: Path) -> bool:
    """Whether this user owns the run directory (a gone one counts as ours: its line is)."""
    try:
        return run_dir.stat().st_uid == os.getuid()
    except OSError:
        return True


def registered_rows(all_users: bool = False) -> tuple[list[dict[str, Any]], int]:
    """The runs registered on this host, newest first, with their state: this user's
    (the owner of the run directory), or every one's with ``all_users``; and how many
    other users' runs were left out."""
    seen: dict[str, dict[str, Any]] = {}
    for entry in read_index():
        key = str(entry.get("run_id") or entry["run_dir"])
        seen.pop(key, None)  # a resume registers the run again: it moves to its newest place
        # a directory started afresh holds its newest run alone (its manifest, its
        # records): an older run there is not listed again with the newer one's state
        for older in [k for k, e in seen.items() if e["run_dir"] == entry["run_dir"]]:
            del seen[older]
        seen[key] = entry
    runs = []
    others = 0
    for entry in reversed(list(seen.values())):
        run_dir = Path(entry["run_dir"])
        if not all_users and not owned_by_me(run_dir):
            others += 1
            continue
        row: dict[str, Any] = {
            "run_id": entry.get("run_id"),
            "run_dir": str(run_dir),
            "started_at": entry.get("started_at"),
            "exists": run_dir.is_dir(),
            "status": None,
            "pid": entry.get("pid"),
            "alive": False,
        }
        if row["exists"]:
            row["user"] = _owner(run_dir)
            try:
                m = read_manifest(run_dir)
            except AgentError:
                pass
            else:
                trainer, problem = verify_trainer(m)
                first = m.get("first_started_at")  # a resumed run's first start, not its last
                if isinstance(first, (int, float)) and not isinstance(first, bool):
                    row["started_at"] = float(first)
                row["status"] = m.get("status")
                row["pid"] = m.get("pid")
                row["alive"] = trainer is not None and problem is None
        runs.append(row)
    return runs, others


def _owner(path: Path) -> str | None:
    """The name of the user who owns ``path`` (its uid where it has none), or None."""
    try:
        uid = path.stat().st_uid
    except OSError:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def op_runs(req: dict[str, Any]) -> int:
    """The runs registered on this host (``all``: every user's), newest first."""
    runs, others = registered_rows(bool(req.get("all")))
    emit(
        EV_RESULT,
        op=OP_RUNS,
        runs=runs,
        others=others,
        index=str(index_path()),
        host=os.uname().nodename,
    )
    return 0


def op_status(req: dict[str, Any]) -> int:
    """Whether the run's trainer is alive (PID, start time and boot id checked), its
    manifest, and when it is not alive, what of the run still is (``leftovers``: its
    dataloader workers and helpers, with memory and GPU): what a monitor needs to tell
    a dead run from a silent one, and to say what ``kill`` would still end. ``plan``:
    with what a kill would act on now (``processes``: the ``k`` dialog's rows)."""
    emit(EV_RESULT, op=OP_STATUS, **status_of(req.get("run_dir"), bool(req.get("plan"))))
    return 0


def status_of(run_dir: str | None, plan: bool = False) -> dict[str, Any]:
    """``status``'s answer (also read in-process by the CLI for a run on this machine)."""
    path = resolve_run_dir(run_dir)
    m = read_manifest(path)
    trainer, problem = verify_trainer(m)
    alive = trainer is not None and problem is None
    copied = copy_of(m, path)  # its marked processes are the first run's, not its own
    ckpt = checkpoint_dir(m, path)
    return {
        "run_dir": str(path),
        "alive": alive,
        "problem": problem,
        "manifest": m,
        "leftovers": [] if alive or copied is not None else leftovers(m),
        "copy_of": str(copied) if copied is not None else None,
        # T: held stopped (a SIGSTOP, Ctrl-Z); its sidecar, held too, may say nothing
        "state": trainer.state if alive and trainer is not None else None,
        # what a resume continues from is there still (a moved directory: not)
        "checkpoints_present": None if ckpt is None else latest_numbered(ckpt) is not None,
        "processes": kill_plan(m, trainer) if plan and alive else [],
        "host": os.uname().nodename,
        "now": time.time(),
    }
