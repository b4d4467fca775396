"""What a run's files may make this agent do, when they could come from another user.

``resume`` runs a command written in ``run.json``, in a directory, with an
environment and a script named there, and speculators then loads the checkpoint's
pickled optimizer state: root resuming a run another user can write would run that
user's code as root. So before anything starts, the whole chain must be such that
nobody but the caller (or root) could have changed it (:func:`resume_problems`).

``kill`` signals the processes ``run.json`` names: a manifest another user wrote
may only name that user's processes (:func:`signal_owner`), so root never signals
root's own processes (or a third user's) on another user's say-so.

Standard library only (the agent).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from eagle3_tui.agent.names import MANIFEST
from eagle3_tui.agent.process_facts import entry_point
from eagle3_tui.telemetry import procs
from eagle3_tui.telemetry.rerun import BOOTSTRAP
from eagle3_tui.telemetry.safefs import trust_problem, user_name


def which(name: str, env: dict[str, str], cwd: str) -> str | None:
    """The file ``name`` runs as (``PATH`` of the run's environment for a bare name)."""
    if "/" in name:
        return os.path.normpath(os.path.join(cwd, name))
    for folder in (env.get("PATH") or os.defpath).split(os.pathsep):
        path = os.path.join(folder or cwd, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _program_files(cmd: list[str], cwd: str) -> list[str]:
    """The files the command runs besides its interpreter: the script (a ``.py`` file, or
    one such as torchrun's), or the ``-m`` module's file when it is below ``cwd``, and
    every other argument naming an existing ``.py`` file (a torchrun command's training
    script)."""
    out: list[str] = []
    kind, what = entry_point(cmd)
    if kind == "script":
        path = os.path.normpath(os.path.join(cwd, what))
        if os.path.isfile(path):
            out.append(path)
    if kind == "module":
        rel = what.replace(".", os.sep)
        for cand in (
            rel + ".py",
            os.path.join(rel, "__main__.py"),
            os.path.join(rel, "__init__.py"),
        ):
            path = os.path.join(cwd, cand)
            if os.path.isfile(path):
                out.append(path)
    for arg in cmd[1:]:
        if arg.endswith(".py"):
            path = os.path.normpath(os.path.join(cwd, arg))
            if os.path.isfile(path) and path not in out:
                out.append(path)
    return out


def resume_problems(
    run_dir: Path,
    m: dict[str, Any],
    cmd: list[str],
    cwd: str,
    env: dict[str, str],
    checkpoint: Path,
) -> list[str]:
    """Why relaunching ``cmd`` as this agent's user could run code another user chose:
    each file and directory it depends on (the run directory and its manifest, the
    saved environment, the working directory, the interpreter, the script, the
    directories on ``PYTHONPATH``, the checkpoint it loads) must belong to this user
    or root and be writable by nobody else, nor lie in a directory anyone else may
    write. Empty when the chain holds."""
    checks: list[tuple[str, str]] = [
        ("the run directory", str(run_dir)),
        ("the manifest", str(run_dir / MANIFEST)),
    ]
    saved = m.get("resume_env_file")
    if isinstance(saved, str) and saved:
        checks.append(("the saved environment", str(run_dir / saved)))
    checks.append(("the working directory", cwd))
    program = which(cmd[0], env, cwd) if cmd else None
    if program is None:
        return [f"{cmd[0] if cmd else '?'}: not found on the run's PATH"]
    checks.append(("the interpreter", program))
    checks += [("the script", path) for path in _program_files(cmd, cwd)]
    checks += _bootstrap_files(cmd, env, cwd)
    for folder in (env.get("PYTHONPATH") or "").split(os.pathsep):
        if folder and os.path.isdir(os.path.join(cwd, folder)):
            checks.append(("PYTHONPATH", os.path.join(cwd, folder)))
    checks.append(("the checkpoint", str(checkpoint)))
    try:
        files = sorted(p for p in checkpoint.iterdir() if p.is_file())
    except OSError:
        files = []
    checks += [("the checkpoint", str(p)) for p in files]
    problems: list[str] = []
    seen: set[str] = set()
    for what, path in checks:
        if path in seen:
            continue
        seen.add(path)
        problem = trust_problem(path)
        if problem is not None:
            problems.append(f"{what}: {problem}")
    return problems


LIB_FILES = 400
"""More files than the telemetry package has (~30): a directory this full is not it."""


def _bootstrap_files(cmd: list[str], env: dict[str, str], cwd: str) -> list[tuple[str, str]]:
    """What else a command with telemetry runs (telemetry/rerun.py): the interpreter
    torchrun starts each rank with (the word after ``--no-python``), and the telemetry
    package named after ``-c BOOTSTRAP`` (its directory and every file in it)."""
    out: list[tuple[str, str]] = []
    for i, arg in enumerate(cmd[:-1]):
        if arg in ("--no-python", "--no_python"):
            rank = which(cmd[i + 1], env, cwd)
            out.append(("the ranks' interpreter", rank or cmd[i + 1]))
        if arg == "-c" and cmd[i + 1] == BOOTSTRAP and i + 2 < len(cmd):
            lib = os.path.normpath(os.path.join(cwd, cmd[i + 2]))
            out.append(("the telemetry package", lib))
            out += [("the telemetry package", path) for path in _tree(lib, LIB_FILES)]
    return out


def _tree(root: str, limit: int) -> list[str]:
    """Every entry below ``root`` (links not followed), at most ``limit`` + 1 of them."""
    out: list[str] = []
    for folder, dirs, files in os.walk(root):
        out += [os.path.join(folder, name) for name in dirs + files]
        if len(out) > limit:
            break
    return out[: limit + 1]


def manifest_owner(run_dir: Path) -> int | None:
    """The user ``run.json`` belongs to (None when it cannot be looked at)."""
    try:
        return os.stat(run_dir / MANIFEST).st_uid
    except OSError:
        return None


def signal_owner(
    m: dict[str, Any], owner: int | None, trainer_pid: int | None
) -> tuple[int | None, str | None]:
    """Whose processes a kill may signal, and a reason to refuse.

    A manifest of this user or root says what it likes; one of another user may only
    name that user's processes: its trainer must run as that user (else refused) and
    only that user's processes are taken in. While the trainer lives, only processes
    of the trainer's user are its (a dataloader worker runs as its trainer; a process
    of someone else carrying the run's marker is not the run's)."""
    me = os.geteuid()
    trainer_uid = procs.owner(trainer_pid) if trainer_pid is not None else None
    untrusted = owner is not None and owner not in (me, 0)
    if untrusted and trainer_uid is not None and trainer_uid != owner:
        who = user_name(owner) if owner is not None else "?"
        return None, (
            f"run.json belongs to {who} but names pid {trainer_pid}, a process of "
            f"{user_name(trainer_uid)}: not signalled"
        )
    if trainer_uid is not None:
        return trainer_uid, None
    return (owner if untrusted else None), None
