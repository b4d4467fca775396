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
import stat
from pathlib import Path
from typing import Any

from eagle3_tui.agent.names import MANIFEST
from eagle3_tui.agent.process_facts import entry_point
from eagle3_tui.telemetry import procs
from eagle3_tui.telemetry.rerun import BOOTSTRAP
from eagle3_tui.telemetry.safefs import _group_name, _group_shared, trust_problem, user_name


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
    saved environment, the working directory, the interpreter, the script, every file
    or directory a variable of its environment makes it load, run or search
    (:data:`ENV_FILES`, :data:`ENV_DIRS`), the checkpoint it loads) must belong to this
    user or root and be writable by nobody else, nor lie in a directory anyone else may
    write; one that does not exist yet must not be creatable by anyone else. Each
    problem once, in order. Empty when the chain holds."""
    checks: list[tuple[str, str, bool]] = [
        ("the run directory", str(run_dir), False),
        ("the manifest", str(run_dir / MANIFEST), False),
    ]
    saved = m.get("resume_env_file")
    if isinstance(saved, str) and saved:
        checks.append(("the saved environment", str(run_dir / saved), False))
    checks.append(("the working directory", cwd, False))
    program = which(cmd[0], env, cwd) if cmd else None
    if program is None:
        return [f"{cmd[0] if cmd else '?'}: not found on the run's PATH"]
    checks.append(("the interpreter", program, False))
    checks += [("the script", path, False) for path in _program_files(cmd, cwd)]
    checks += [(what, path, False) for what, path in _bootstrap_files(cmd, env, cwd)]
    env_checks, problems = _env_paths(env, cwd)
    checks += [(what, path, True) for what, path in env_checks]
    checks.append(("the checkpoint", str(checkpoint), False))
    try:
        files = sorted(p for p in checkpoint.iterdir() if p.is_file())
    except OSError:
        files = []
    checks += [("the checkpoint", str(p), False) for p in files]
    labels: dict[str, str] = {}  # a checked path (and where it leads): its label
    for what, path, _ in checks:
        for key in (os.path.abspath(path), os.path.realpath(path)):
            labels.setdefault(key, what)
    said: set[str] = set()  # a problem (path and reason) already said: not again
    for item in problems:
        said.add(item.partition(": ")[2])
    seen: set[str] = set()
    for what, path, may_be_missing in checks:
        path = os.path.abspath(path)
        if path in seen:
            continue
        seen.add(path)
        problem: str | None = None
        if may_be_missing and not os.path.lexists(path):
            problem = _creatable_problem(path)
        else:
            problem = trust_problem(path)
        if problem is None or problem in said:
            continue
        said.add(problem)
        problems.append(f"{_label(what, path, problem, labels)}: {problem}")
    return problems


def _label(what: str, path: str, problem: str, labels: dict[str, str]) -> str:
    """What a problem found checking ``path`` (labelled ``what``) is about: ``what`` when
    it names ``path`` itself, the label of another checked path it names (the run
    directory, when the manifest's check finds that directory writable), else ``what``
    and ``path`` (a directory above it, or a link on the way to it, is the problem)."""
    if _names(problem, path) or _names(problem, os.path.realpath(path)):
        return what
    named = [key for key in labels if _names(problem, key)]
    if named:
        return labels[max(named, key=len)]
    return f"{what} {path}"


def _names(problem: str, path: str) -> bool:
    """Whether ``problem`` (as :func:`trust_problem` words it) is about ``path``."""
    return problem.startswith((path + " ", path + ":"))


ENV_FILES = {
    "LD_PRELOAD": " :",  # libraries loaded into every program started
    "LD_AUDIT": ":",
    "BASH_ENV": "",  # run by every non-interactive bash (a training's subprocesses too)
    "ENV": "",  # run by an interactive sh
    "PYTHONSTARTUP": "",  # run by an interactive python
    "PYTHONEXECUTABLE": "",  # sys.executable (macOS): what multiprocessing starts
}
"""Variables naming files the relaunched process (or a program it starts) loads or
runs, and the characters that separate several."""

ENV_DIRS = {
    "PATH": ":",  # where programs are found (a compiler triton or inductor starts)
    "LD_LIBRARY_PATH": ":;",  # where libraries are found
    "GCONV_PATH": ":",  # where glibc's iconv finds the modules it loads
    "PYTHONPATH": ":",
    "PYTHONHOME": ":",  # the standard library
    "PYTHONUSERBASE": "",  # the user site
    "PYTHONPYCACHEPREFIX": "",  # a cache of compiled code, read back and run
    "TRITON_CACHE_DIR": "",
    "TORCHINDUCTOR_CACHE_DIR": "",
    "TORCH_EXTENSIONS_DIR": "",
    "CUDA_CACHE_PATH": "",
}
"""Variables naming directories it searches or keeps code in, and their separators.
An empty entry of a search path is the working directory (checked as such)."""

EXPANDED = {
    "LD_PRELOAD": "$",  # ld.so expands $ORIGIN, $LIB, $PLATFORM
    "LD_AUDIT": "$",
    "LD_LIBRARY_PATH": "$",
    "BASH_ENV": "$`",  # the shell expands parameters and runs command substitutions
    "ENV": "$`",
}
"""Characters that make a value mean something else than it says (not checked: refused)."""


def _env_paths(env: dict[str, str], cwd: str) -> tuple[list[tuple[str, str]], list[str]]:
    """The files and directories the variables of ``env`` (:data:`ENV_FILES`,
    :data:`ENV_DIRS`) name, relative ones resolved against ``cwd``, each labelled with
    its variable; and the problems of values that cannot be checked (expanded when
    used). A bare library name in ``LD_PRELOAD`` or ``LD_AUDIT`` is the file of that
    name on ``LD_LIBRARY_PATH``, if any (else a system library)."""
    out: list[tuple[str, str]] = []
    problems: list[str] = []
    lib_dirs = [os.path.join(cwd, d) for d in _split(env.get("LD_LIBRARY_PATH") or "", ":;") if d]
    for var, seps in list(ENV_FILES.items()) + list(ENV_DIRS.items()):
        value = env.get(var)
        if not value:
            continue
        if any(c in value for c in EXPANDED.get(var, "")):
            problems.append(f"{var}: {value} is expanded when used, so it cannot be checked")
            continue
        for entry in _split(value, seps) if seps else [value]:
            if not entry:
                continue  # the working directory, or nothing
            if var in ("LD_PRELOAD", "LD_AUDIT") and "/" not in entry:
                found = [os.path.join(d, entry) for d in lib_dirs]
                out += [(var, path) for path in found if os.path.lexists(path)]
                continue
            out.append((var, os.path.join(cwd, entry)))
    return out, problems


def _split(value: str, seps: str) -> list[str]:
    for sep in seps[1:]:
        value = value.replace(sep, seps[0])
    return value.split(seps[0])


def _creatable_problem(path: str) -> str | None:
    """Why a missing ``path`` could be made by someone other than this user or root:
    the nearest directory above it that exists is untrusted, or anybody else may
    create entries in it (a sticky one, as ``/tmp``, too: the first to make the
    entry owns it)."""
    up = path
    while not os.path.lexists(up):
        nxt = os.path.dirname(up)
        if nxt == up:
            break
        up = nxt
    problem = trust_problem(up)
    if problem is not None:
        return problem
    try:
        st = os.stat(up)
    except OSError as e:
        return f"{up}: {e.strerror or e}"
    if st.st_mode & stat.S_IWOTH:
        return f"{path} does not exist, and every user may create it in {up}"
    if st.st_mode & stat.S_IWGRP and _group_shared(st):
        return (
            f"{path} does not exist, and the group {_group_name(st.st_gid)} may create it in {up}"
        )
    return None


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
