"""What one process is, read from ``/proc`` and its files without its cooperation: its
entry point and source files, where its output goes, whether it has a metrics handler of
its own, its training options and checkpoint directory (what ``discover.py`` builds a
training's row from).

Standard library only, Python 3.8+.
"""

from __future__ import annotations

import os
import pwd
import re
from typing import Any

from eagle3_tui.agent.logparse import KeyValueBlock, clean, metric_dict
from eagle3_tui.agent.names import (
    MANIFEST,
)
from eagle3_tui.telemetry import procs
from eagle3_tui.telemetry.isolation import as_module
from eagle3_tui.telemetry.manifest import MANIFEST_LIMIT
from eagle3_tui.telemetry.parsing import parse_json
from eagle3_tui.telemetry.safefs import read_bounded

_PYTHON = re.compile(r"^python[0-9.]*$")
_LOCAL_IMPORTS = re.compile(
    r"^\s*(?:from\s+([A-Za-z_]\w*)[\w.]*\s+import|import\s+([A-Za-z_]\w*))", re.M
)
_CKPT_LINK = re.compile(r"^epoch\d+_(?:end|step\d+)$")
_TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
_PY_FLAGS_WITH_VALUE = ("-X", "-W", "--check-hash-based-pycs")
SCRIPT_BYTES = 256 * 1024
LOG_TAIL_BYTES = 64 * 1024


# ---- one process ---------------------------------------------------------------------


def is_python(argv: list[str], comm: str) -> bool:
    base = os.path.basename(argv[0]) if argv else ""
    return bool(_PYTHON.match(base) or _PYTHON.match(comm))


def entry_point(argv: list[str]) -> tuple[str, str]:
    """What the interpreter runs: ``("script", path)``, ``("module", name)``,
    ``("code", text)`` or ``("", "")`` (an interactive interpreter). eagle3-tui's own
    isolated ``-c BOOT ROOT MODULE`` (telemetry/isolation.py) is the module it runs."""
    argv = as_module(argv)
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "-m" and i + 1 < len(argv):
            return "module", argv[i + 1]
        if a.startswith("-m") and len(a) > 2:
            return "module", a[2:]
        if a == "-c" and i + 1 < len(argv):
            return "code", argv[i + 1]
        if a in _PY_FLAGS_WITH_VALUE:
            i += 2
            continue
        if a == "-" or not a.startswith("-"):
            return ("script", a) if a != "-" else ("", "")
        i += 1
    return "", ""


def is_torchrun(argv: list[str]) -> bool:
    kind, what = entry_point(argv)
    if kind == "module":
        return what in _TORCHRUN_MODULES
    return kind == "script" and os.path.basename(what) in ("torchrun", "torch-distributed-run")


def read_script(path: str, limit: int = SCRIPT_BYTES) -> str | None:
    """The start of a regular file (a FIFO or device never blocks or floods the scan)."""
    try:
        return read_bounded(path, limit).decode("utf-8", "replace")
    except OSError:
        return None


def read_log_tail(path: str, limit: int = LOG_TAIL_BYTES) -> str:
    """The end of a regular file ("" for anything else: a FIFO, ``/dev/zero``)."""
    try:
        return read_bounded(path, limit, tail=True).decode("utf-8", "replace")
    except OSError:
        return ""


def load_manifest(run_dir: str) -> dict[str, Any] | None:
    """``run_dir/run.json`` as an object, read bounded; None when it is not one."""
    try:
        obj = parse_json(read_bounded(os.path.join(run_dir, MANIFEST), MANIFEST_LIMIT))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def source_files(argv: list[str], cwd: str | None) -> list[str]:
    """The files the interpreter runs: the script (or module) and the local modules it
    imports (one level: ``from mylib import …`` beside the script)."""
    kind, what = entry_point(argv)
    base = cwd or "/"
    first: str | None = None
    if kind == "script":
        first = what if os.path.isabs(what) else os.path.join(base, what)
    elif kind == "module":
        rel = what.replace(".", os.sep)
        for cand in (rel + ".py", os.path.join(rel, "__main__.py")):
            if os.path.isfile(os.path.join(base, cand)):
                first = os.path.join(base, cand)
                break
    if first is None or not os.path.isfile(first):
        return []
    out = [first]
    text = read_script(first) or ""
    here = os.path.dirname(first)
    for m in _LOCAL_IMPORTS.finditer(text):
        name = m.group(1) or m.group(2)
        for cand in (name + ".py", os.path.join(name, "__init__.py")):
            path = os.path.join(here, cand)
            if path not in out and os.path.isfile(path):
                out.append(path)
        if len(out) >= 8:
            break
    return out


_regular = procs.regular_path


def stdout_file(pid: int, fds: dict[int, str] | None, pgrp: int) -> str | None:
    """The regular file the process's stdout (else stderr) goes to: directly, or through a
    pipe into a ``tee FILE`` of the same process group."""
    if not fds:
        return None
    for fd in (1, 2):
        target = fds.get(fd, "")
        found = _regular(target) or (
            _tee_file(pid, target, pgrp) if target.startswith("pipe:") else None
        )
        if found:
            return found
    return None


def _tee_file(pid: int, pipe: str, pgrp: int) -> str | None:
    """The file written by the process that reads ``pipe`` (``| tee train.log``)."""
    for other in procs.all_stats().values():
        if other.pgrp != pgrp or other.pid == pid:
            continue
        theirs = procs.fd_targets(other.pid) or {}
        if theirs.get(0) != pipe:
            continue
        for fd, target in sorted(theirs.items()):
            if fd > 2 and _regular(target) and procs.fd_writable(other.pid, fd):
                return target
    return None


def eagle3_metrics(path: str) -> bool:
    """Whether the ``metrics.jsonl`` at ``path`` is eagle3-tui's telemetry file (a
    ``run.json`` beside it, or our envelope in its first line), not a file a handler of
    the user's own writes under that name."""
    if os.path.exists(os.path.join(os.path.dirname(path), MANIFEST)):
        return True
    try:
        first = read_bounded(path, 4096).split(b"\n", 1)[0]
        obj = parse_json(first)
    except (OSError, ValueError):
        return False
    return isinstance(obj, dict) and "kind" in obj and "w" in obj


_NOT_METRICS = (".safetensors", ".pt", ".bin", ".arrow", ".lock", ".json", ".py", ".so")
HANDLER_FILES = 8
"""Files a trainer writes that are looked at for its own handler's metrics, at most."""


def own_handler(
    pid: int, fds: dict[int, str], log: str | None, log_tail: str
) -> tuple[str | None, str | None]:
    """A handler of the user's own on ``speculators.metrics``, found by what it wrote:
    ``("json", path)`` for a file the trainer has open to write (not its log) whose last
    lines are speculators' metric dicts as JSON (under ``msg``, or bare); ``("json" or
    "printed", log)`` when its log carries them (a handler printing to stdout);
    ``(None, None)`` when no metric is written anywhere."""
    looked = 0
    for fd, target in sorted(fds.items()):
        if fd <= 2 or looked >= HANDLER_FILES:
            continue
        path = _regular(target)
        if path is None or path == log or path.endswith(_NOT_METRICS):
            continue
        if not procs.fd_writable(pid, fd):
            continue
        looked += 1
        if metric_lines(read_log_tail(path, LOG_TAIL_BYTES)) == "json":
            return "json", path
    kind = metric_lines(log_tail)
    if kind is not None and log:
        return kind, log
    return None, None


def metric_lines(text: str) -> str | None:
    """``json`` when the newest of these lines that carries a speculators metric dict is
    a JSON line, ``printed`` when it is printed (a ``repr``, or ``key=value`` as the
    library's CLI prints it), None when none does."""
    for line in reversed(text.splitlines()[-200:]):
        if metric_dict(line) is not None:
            return "json" if line.lstrip().startswith("{") else "printed"
        if KeyValueBlock().start(clean(line)):
            return "printed"
    return None


def arg_value(argv: list[str], names: tuple[str, ...]) -> str | None:
    for i, a in enumerate(argv):
        for name in names:
            if a == name and i + 1 < len(argv):
                return argv[i + 1]
            for sep in ("=",):
                if a.startswith(name + sep):
                    return a[len(name) + 1 :]
                bare = name.lstrip("-").replace("-", "_")
                if a.startswith(bare + sep):
                    return a[len(bare) + 1 :]
    return None


_OPTIONS = ("save_path", "epochs", "logger", "log_dir", "run_name")
"""What of the library CLI's configuration the agent uses (where its checkpoints and
metric backends write, how many epochs)."""
_YAML_OPTION = re.compile(
    r"^[ \t]*(" + "|".join(_OPTIONS) + r")[ \t]*:[ \t]*"  # key:
    r"(?:\"([^\"]*)\"|'([^']*)'|([^#\n]*?))[ \t]*(?:#.*)?$",  # "value", 'value', value # note
    re.M,
)


def train_options(argv: list[str], cwd: str | None) -> dict[str, str]:
    """The library CLI's ``save_path``, ``epochs``, ``logger``, ``log_dir``, ``run_name``
    as it resolves them, flag over ``--config`` file (``speculators train --config
    run.yaml``: its keys nested under ``train:`` and their groups, read for these
    scalar keys only, bounded); absent keys are absent."""
    out: dict[str, str] = {}
    config = arg_value(argv, ("--config",))
    if config:
        path = config if os.path.isabs(config) or not cwd else os.path.join(cwd, config)
        try:
            text = read_bounded(path, 256 << 10).decode("utf-8", "replace")
        except OSError:
            text = ""
        for m in _YAML_OPTION.finditer(text):
            value = next((g for g in m.groups()[1:] if g is not None), "").strip()
            if value and value not in ("null", "~"):
                out.setdefault(m.group(1), value)
    for key in _OPTIONS:
        flag = arg_value(argv, ("--" + key.replace("_", "-"),))
        if flag is not None:
            out[key] = flag
    return out


def speculators_layout(path: str) -> bool:
    """Whether ``path`` looks like a speculators ``save_path``."""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return False
    for e in entries:
        try:
            if e.is_symlink() and _CKPT_LINK.match(e.name):
                return True
            if (
                e.is_dir()
                and e.name.isdigit()
                and os.path.exists(os.path.join(e.path, "training_state.json"))
            ):
                return True
        except OSError:
            continue
    return False


MAX_COMMAND_DIRS = 64
"""Of a command line, the arguments looked at as directories that may hold checkpoints."""


def find_checkpoint_dir(
    cwd: str | None,
    limit: int = 400,
    command: list[str] | None = None,
    pid: int | None = None,
    since: float | None = None,
) -> str | None:
    """A speculators-shaped checkpoint directory at most two levels below ``cwd``, or
    below (or at) a directory the ``command`` line names (``--run-dir /data/exp7``,
    ``--save-path=ckpts``: a run kept outside its working directory). Below ``cwd``, one
    in another run's directory (its ``run.json`` names another trainer than ``pid``) is
    that run's, not this process's: a sibling run's checkpoints were taken for its own;
    and one nothing was saved into since the process started (``since``) is an earlier
    run's (a resumed one's, found once it saves)."""
    if not cwd:
        return None
    seen = 0
    todo = [(cwd, 0)]
    for arg in (command or [])[:MAX_COMMAND_DIRS]:  # (another user's argv: bounded)
        value = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
        if not value or value.startswith("-") or len(value) > 4096:
            continue
        path = os.path.normpath(os.path.join(cwd, value))
        if path != cwd and os.path.isdir(path) and speculators_layout(path):
            return path
        if path != cwd and os.path.isdir(path) and (path, 1) not in todo:
            todo.append((path, 1))  # its children are looked at (one level less)
    while todo and seen < limit:
        path, depth = todo.pop(0)
        if (
            depth
            and speculators_layout(path)
            and not _another_runs(path, pid)
            and (since is None or _saved_since(path, since))
        ):
            return path
        if depth >= 2:
            continue
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            seen += 1
            try:
                if e.is_dir(follow_symlinks=False) and not e.name.startswith("."):
                    todo.append((e.path, depth + 1))
            except OSError:
                continue
    return None


def _saved_since(path: str, since: float) -> bool:
    """Something was saved into ``path`` (an entry added or replaced: its mtime) since."""
    try:
        return os.stat(path).st_mtime >= since
    except OSError:
        return False


def _another_runs(path: str, pid: int | None) -> bool:
    """``path`` lies in a run directory whose manifest names another trainer."""
    for run_dir in (os.path.dirname(path), path):
        m = load_manifest(run_dir)
        if m is not None:
            return m.get("pid") != pid
    return False


def user_name(uid: int | None) -> str:
    if uid is None:
        return "?"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
