"""The files of a live attach on the host, written as the trainer's user.

``${XDG_CACHE_HOME:-~/.cache}/eagle3-tui/`` of that user, private (0700):

* ``lib/<version>-<hash>/eagle3_tui/…``: the telemetry package the trainer imports,
  written once per content (a temporary directory renamed into place);
* ``attach/<boot>-<pid>-<start>/``: per attached process, ``request.json`` (what to
  do), ``entry.py`` (what its interpreter runs), ``injected`` (the call was queued),
  ``result.json`` (what happened, written by the trainer); removed once the process
  is gone.

When root attaches to another user's process, a forked child drops to that user
to write them (:func:`as_user`): they are run by that process, as that user.

Standard library only (the agent).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eagle3_tui.agent.processes import boot_id, proc_stat
from eagle3_tui.telemetry.inject import entry_source
from eagle3_tui.telemetry.parsing import parse_json
from eagle3_tui.telemetry.safefs import write_atomic


def cache_dir(uid: int) -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/eagle3-tui`` of the user ``uid`` (this process's
    environment when it is ``uid``, else that user's home)."""
    if uid == os.geteuid():
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    else:
        import pwd

        base = os.path.join(pwd.getpwuid(uid).pw_dir, ".cache")
    return Path(base) / "eagle3-tui"


def attach_key(pid: int, start: int, boot: str | None) -> str:
    return f"{(boot or 'noboot')[:8]}-{pid}-{start}"


def lib_name(sources: dict[str, str]) -> str:
    digest = hashlib.sha256()
    for name in sorted(sources):
        digest.update(name.encode() + b"\0" + sources[name].encode() + b"\0")
    version = "0"
    init = sources.get("eagle3_tui/__init__.py", "")
    found = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", init)
    if found:
        version = found.group(1)
    return f"{version}-{digest.hexdigest()[:16]}"


def write_lib(root: Path, sources: dict[str, str]) -> str:
    """The package in ``root/lib/<version>-<hash>/`` (0700), written once, atomically:
    files go to a temporary directory renamed into place."""
    lib = root / "lib"
    lib.mkdir(mode=0o700, parents=True, exist_ok=True)
    final = lib / lib_name(sources)
    if (final / ".complete").is_file():
        return str(final)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=lib))
    for name, text in sources.items():
        if name.startswith("/") or ".." in Path(name).parts or not name.endswith(".py"):
            raise ValueError(f"bad file name in the package: {name!r}")
        path = tmp / name
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    (tmp / ".complete").write_text("ok\n")
    try:
        os.rename(tmp, final)
    except OSError:  # written meanwhile by another attach: theirs is the same
        shutil.rmtree(tmp, ignore_errors=True)
        if not (final / ".complete").is_file():
            raise
    return str(final)


def write_private(path: Path, text: str) -> None:
    """``path`` replaced by ``text``, mode 0600 (safefs.write_atomic: never through a link)."""
    write_atomic(path, text.encode(), 0o600, fsync=False)


def read_json_file(path: str) -> dict[str, Any] | None:
    """A small JSON file, never following a link or opening a FIFO; None if absent."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, 1 << 20)
    finally:
        os.close(fd)
    try:
        obj = parse_json(data)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def as_user(uid: int, gid: int, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` as the user ``uid`` (a forked child drops to it when we are not it),
    so that root writes another user's files as that user (in that user's home: its
    cache, its index of runs). Its result travels as JSON; its exception as an OSError."""
    if uid == os.geteuid():
        return fn(*args)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            os.close(read_end)
            import pwd

            entry = pwd.getpwuid(uid)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            os.environ["HOME"] = entry.pw_dir
            os.environ.pop("XDG_CACHE_HOME", None)
            os.environ.pop("XDG_STATE_HOME", None)  # that user's index of runs, not ours
            out = {"ok": fn(*args)}
        except BaseException as e:
            out = {"error": f"{type(e).__name__}: {e}"}
        try:
            os.write(write_end, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    chunks = []
    while True:
        data = os.read(read_end, 65536)
        if not data:
            break
        chunks.append(data)
    os.close(read_end)
    os.waitpid(child, 0)
    try:
        out = parse_json(b"".join(chunks))
    except ValueError:
        raise OSError("the helper running as the trainer's user failed") from None
    if "error" in out:
        raise OSError(out["error"])
    return out["ok"]


def attach_state(root: str, key: str) -> str | None:
    """``attached`` or ``queued`` when an attach of this process ran or waits to run."""
    where = os.path.join(root, "attach", key)
    result = read_json_file(os.path.join(where, "result.json"))
    if result is not None:
        return "attached" if result.get("status") in ("attached", "already") else None
    return "queued" if os.path.exists(os.path.join(where, "injected")) else None


def prepare(
    root: str, key: str, sources: dict[str, str], request: dict[str, Any]
) -> dict[str, str]:
    """As the trainer's user: the package, and this attach's directory with the
    request and the entry file. Refuses when an attach of this process is queued or
    done (a failed one is cleared for the new try)."""
    for folder in (Path(root), Path(root) / "attach"):
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    lib = write_lib(Path(root), sources)
    forget_gone(Path(root) / "attach")
    where = Path(root) / "attach" / key
    where.mkdir(mode=0o700, exist_ok=True)
    os.chmod(where, 0o700)
    result = where / "result.json"
    previous = read_json_file(str(result))
    if previous is not None and previous.get("status") in ("attached", "already"):
        return {"state": "already", "result": str(result)}
    failed = (where / "entry.py.failed").exists()  # debugger.failed_file: it ended
    if previous is None and (where / "injected").exists() and not failed:
        return {"state": "queued", "result": str(result)}
    for name in ("result.json", "injected", "entry.py.failed"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(where / name)
    request = dict(request, result=str(result))
    write_private(where / "request.json", json.dumps(request))
    entry = where / "entry.py"
    write_private(entry, entry_source(lib, str(where / "request.json"), str(result)))
    return {
        "state": "ready",
        "lib": lib,
        "entry": str(entry),
        "result": str(result),
        "dir": str(where),
    }


def forget_gone(folder: Path) -> None:
    """Remove the attach directories of processes that are gone (same boot, PID free or
    reused; any other boot): one small directory per attached process otherwise stays."""
    here = (boot_id() or "noboot")[:8]
    for entry in os.scandir(folder):
        parts = entry.name.split("-")
        if len(parts) != 3 or not entry.is_dir(follow_symlinks=False):
            continue
        boot, pid, start = parts
        if boot == here and pid.isdigit() and start.isdigit():
            p = proc_stat(int(pid))
            if p is not None and p.start == int(start) and not p.zombie:
                continue
        shutil.rmtree(entry.path, ignore_errors=True)


def mark_injected(where: str) -> None:
    write_private(Path(where) / "injected", f"{time.time()}\n")
