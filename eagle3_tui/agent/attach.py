"""``attach``: add eagle3-tui telemetry to a live speculators training, no restart.

Two steps, one request each (the client asks the person in between):

``plan``
    Every check that needs nothing but ``/proc``, before anything touches the
    process; each refusal names its fix: the PID exists and is the process that
    was shown (start time, boot id); we may trace it (same user or
    CAP_SYS_PTRACE; Yama's ``ptrace_scope``); it runs CPython 3.8 or later; the
    tool its version needs is there (gdb on PATH for 3.8-3.13; for 3.14+ remote
    debugging not disabled); it is not instrumented already (the launcher's
    ``EAGLE3_TUI_RUN_ID`` in its environment, its PID in its user's run index, an
    attach of it queued or done); it is a training (PyTorch loaded; speculators
    seen in its command or script, else looked for inside). The answer says what
    will happen: PID, Python, mechanism, where the metrics go, the resume command.
``inject``
    The same checks again (the process must be the one confirmed), then: the
    telemetry package (sent in the request) is written to a private, versioned
    directory of the trainer's user (``${XDG_CACHE_HOME:-~/.cache}/eagle3-tui/lib/``,
    mode 0700, written atomically); an entry file and the request go to a
    per-process directory next to it; the trainer's own interpreter is made to run
    the entry file at its next safe point, in its main thread:

    * CPython 3.8-3.13: ``gdb -p`` loads only libpython's and libc's symbols (all
      of a PyTorch process's take seconds, with the trainer stopped: 8.6 s
      measured, 11 ms this way), maps a fresh page, copies a line of Python into
      it, and ``Py_AddPendingCall(PyRun_SimpleString, page)``; detach. The line
      runs the entry file and swallows every exception (one escaping
      ``PyRun_SimpleString`` would surface in the trainer as a SystemError).
    * CPython 3.14+: ``sys.remote_exec(pid, entry)`` (PEP 768), run by the
      target's own interpreter binary.

    Then it waits for the entry file's result (``telemetry/inject.py``): attached,
    already, no trainer, failed with a traceback, and the pause it caused. No
    result yet means the main thread is blocked in C code: the call stays queued
    and runs when it next runs Python (``queued``; asking again reports it).
    Once attached it waits a little for the first training step's metrics.

Files are written as the trainer's user (a forked child drops to its uid when
root attaches to another user's process): they run in that process.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eagle3_tui.agent.frames import emit
from eagle3_tui.agent.names import MANIFEST, OP_ATTACH, RUN_ID_ENV
from eagle3_tui.agent.processes import all_procs, ancestors, boot_id, proc_stat
from eagle3_tui.agent.pyprocess import (
    PythonInfo,
    build_allows_remote_debug,
    cmdline,
    container_hint,
    environ,
    exe_path,
    mapped_files,
    permission_problem,
    python_of,
    remote_debug_problem,
    status_ids,
    training_evidence,
    user_name,
)
from eagle3_tui.telemetry.inject import ENTRY_NAME, entry_source
from eagle3_tui.telemetry.rerun import resume_command

MIN_VERSION = (3, 8)
REMOTE_EXEC_VERSION = (3, 14)
GDB_TIMEOUT_S = 60.0
RESULT_WAIT_S = 10.0
METRIC_WAIT_S = 15.0
DEFAULT_RUNS = "eagle3-runs"
"""Without a run directory: ``<the trainer's cwd>/eagle3-runs/attached-<pid>``."""
QUEUED = "queued: runs when the trainer's main thread next runs Python"

# RefusedError reasons (a result's ``reason``); the client maps them to exit statuses.
GONE = "gone"  # no such process, or it exited
REUSED = "reused"  # the PID belongs to another process than the one confirmed
PERMISSION = "permission"  # another user, ptrace_scope, no CAP_SYS_PTRACE
NOT_PYTHON = "not_python"  # not CPython
UNSUPPORTED = "unsupported"  # CPython older than 3.8
NOT_TRAINER = "not_trainer"  # no PyTorch loaded / no Trainer found inside
NO_GDB = "no_gdb"  # gdb missing (3.8-3.13)
REMOTE_DEBUG_OFF = "remote_debug_off"  # 3.14+: -X disable_remote_debug, env, build
ALREADY = "already"  # telemetry is attached already
PENDING = "queued"  # an attach is queued in the process already
RUN_DIR = "run_dir"  # the run directory cannot be used
CHOOSE = "choose"  # no --pid, and not exactly one training
FAILED = "failed"  # the injection itself failed


class RefusedError(Exception):
    """An answer that ends the operation: nothing was done to the process."""

    def __init__(self, reason: str, message: str, status: str = "refused", **fields: Any) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status
        self.fields = fields


# ---- which process ----------------------------------------------------------------


def training_candidates() -> list[dict[str, Any]]:
    """Python processes with PyTorch loaded that this user may attach to, outermost
    only (not their dataloader workers); a torchrun agent stands for its rank 0.
    (A minimal discovery: ``eagle3-tui runs`` of a later version lists more.)"""
    procs = all_procs()
    mine = ancestors(os.getpid(), procs)
    me = os.geteuid()
    found: dict[int, list[str]] = {}
    for pid, p in procs.items():
        if pid in mine or p.zombie or p.comm == "pt_data_worker":
            continue
        if me != 0 and status_ids(pid).get("Uid", [me])[0] != me:
            continue
        maps = mapped_files(pid)
        if not any(os.path.basename(m).startswith("libtorch") for m in maps):
            continue
        if python_of(pid, maps) is None:
            continue
        argv = cmdline(pid)
        if any("eagle3_tui.telemetry" in a for a in argv):
            continue
        found[pid] = argv
    out = []
    for pid, argv in sorted(found.items()):
        if ancestors(procs[pid].ppid, procs) & set(found):
            continue  # a rank under a torchrun agent, or a worker: its root stands for it
        if any("torchrun" in a or "torch.distributed.run" in a for a in argv[:3]):
            ranks = [c for c in found if procs[c].ppid == pid]
            zero = [c for c in ranks if (environ(c) or {}).get("RANK") == "0"]
            if zero:
                pid, argv = zero[0], found[zero[0]]
        out.append({"pid": pid, "argv": argv[:8], "user": user_name(status_ids(pid)["Uid"][0])})
    return out


def choose_pid() -> int:
    found = training_candidates()
    if len(found) == 1:
        return int(found[0]["pid"])
    if not found:
        raise RefusedError(
            CHOOSE, "no training process found here (PyTorch loaded): give --pid PID"
        )
    listed = "; ".join(f"{c['pid']} {' '.join(c['argv'])[:60]}" for c in found[:8])
    raise RefusedError(
        CHOOSE, f"{len(found)} trainings here, choose one with --pid: {listed}", candidates=found
    )


# ---- where files go -----------------------------------------------------------------


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


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


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
        obj = json.loads(data)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def as_user(uid: int, gid: int, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` as the user ``uid`` (a forked child drops to it when we are not it),
    so that root writes another user's files as that user. Its result travels as JSON;
    its exception as an OSError."""
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
        out = json.loads(b"".join(chunks))
    except ValueError:
        raise OSError("the helper running as the trainer's user failed") from None
    if "error" in out:
        raise OSError(out["error"])
    return out["ok"]


# ---- the checks ---------------------------------------------------------------------


def _index_of(env: dict[str, str] | None, uid: int) -> Path:
    env = env or {}
    state = env.get("XDG_STATE_HOME")
    if not state:
        home = env.get("HOME")
        if not home:
            try:
                import pwd

                home = pwd.getpwuid(uid).pw_dir
            except (ImportError, KeyError):
                home = os.path.expanduser("~")
        state = os.path.join(home, ".local", "state")
    return Path(state) / "eagle3-tui" / "runs.jsonl"


def registered_run(pid: int, start: int, env: dict[str, str] | None, uid: int) -> str | None:
    """The run directory under which ``pid`` (started at ``start``) is registered in its
    user's index of runs (the one-liner ``attach()`` in a script registers it)."""
    try:
        raw = _index_of(env, uid).read_bytes()[-(4 << 20) :]
    except OSError:
        return None
    here = boot_id()
    for line in reversed(raw.splitlines()):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict) or entry.get("pid") != pid:
            continue
        run_dir = str(entry.get("run_dir"))
        m = read_json_file(os.path.join(run_dir, MANIFEST))
        same = m is not None and m.get("pid") == pid and m.get("start_ticks") == start
        if same and m is not None and m.get("boot_id") in (None, "", here):
            return run_dir
    return None


def default_run_dir(pid: int) -> str:
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = os.getcwd()
    return os.path.join(cwd, DEFAULT_RUNS, f"attached-{pid}")


def stdout_file(pid: int) -> str | None:
    """Where the trainer's stdout goes, when it is a regular file (``nohup … > log``)."""
    try:
        target = os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return None
    if target.endswith(" (deleted)") or not target.startswith("/"):
        return None
    try:
        return target if stat.S_ISREG(os.stat(target).st_mode) else None
    except OSError:
        return None


def _check_run_dir(run_dir: str, same_user: bool) -> None:
    if os.path.exists(os.path.join(run_dir, MANIFEST)):
        raise RefusedError(
            RUN_DIR,
            f"{run_dir} holds a run already ({MANIFEST}): choose another run directory",
            run_dir=run_dir,
        )
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise RefusedError(RUN_DIR, f"{run_dir}: not a directory", run_dir=run_dir)
    if not same_user:
        return  # the trainer's user creates it; an error comes back in the result
    parent = run_dir
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise RefusedError(
            RUN_DIR,
            f"{parent} is not writable: choose a run directory the trainer's user may create",
            run_dir=run_dir,
        )


def plan(req: dict[str, Any]) -> dict[str, Any]:
    """Every check that reads ``/proc`` only; raises :class:`RefusedError`. The plan."""
    pid = req.get("pid")
    if pid is None:
        pid = choose_pid()
    if not isinstance(pid, int) or pid <= 0:
        raise RefusedError(GONE, f"{pid!r} is not a process id")
    p = proc_stat(pid)
    if p is None or p.zombie:
        raise RefusedError(GONE, f"no process {pid} here (it exited?)", pid=pid)
    here = boot_id()
    expect = req.get("start_ticks")
    if (expect is not None and expect != p.start) or req.get("boot_id") not in (None, here):
        raise RefusedError(
            REUSED,
            f"pid {pid} is another process now ({p.comm}, started at tick {p.start}; the one "
            f"shown started at tick {expect}): nothing was done",
            pid=pid,
        )
    problem = permission_problem(pid)
    if problem is not None:
        raise RefusedError(PERMISSION, problem, pid=pid)
    uid = status_ids(pid).get("Uid", [os.geteuid()])[0]
    gid = status_ids(pid).get("Gid", [os.getegid()])[0]
    maps = mapped_files(pid)
    py = python_of(pid, maps)
    exe = exe_path(pid) or "?"
    if py is None or py.implementation != "cpython" or py.version is None:
        what = "PyPy: only CPython can be attached to" if py is not None else f"runs {exe}"
        raise RefusedError(
            NOT_PYTHON, f"pid {pid} ({p.comm}) is not a CPython process: {what}", pid=pid
        )
    if py.version < MIN_VERSION:
        raise RefusedError(
            UNSUPPORTED,
            f"pid {pid} runs Python {py.version[0]}.{py.version[1]}: attach needs CPython 3.8 "
            "or later",
            pid=pid,
        )
    argv = cmdline(pid)
    env = environ(pid)
    start = p.start
    if env is not None and env.get(RUN_ID_ENV):
        raise RefusedError(
            ALREADY,
            f"pid {pid} was launched with eagle3-tui telemetry (run {env[RUN_ID_ENV]}): "
            "nothing to attach",
            status=ALREADY,
            pid=pid,
            run_dir=env.get("EAGLE3_TUI_RUN_DIR"),
        )
    registered = registered_run(pid, start, env, uid)
    if registered is not None:
        raise RefusedError(
            ALREADY,
            f"pid {pid} has telemetry already: its run is {registered}",
            status=ALREADY,
            pid=pid,
            run_dir=registered,
        )
    key = attach_key(pid, start, here)
    mechanism = "remote_exec" if py.version >= REMOTE_EXEC_VERSION else "gdb"
    gdb = shutil.which("gdb")
    if mechanism == "gdb" and gdb is None:
        raise RefusedError(
            NO_GDB,
            f"gdb is not on PATH on this host ({os.environ.get('PATH', '')}); CPython "
            f"{py.version[0]}.{py.version[1]} is attached through gdb: install it "
            "(apt-get install gdb, dnf install gdb)",
            pid=pid,
        )
    if mechanism == "remote_exec":
        problem = remote_debug_problem(pid, argv, env)
        if problem is None and build_allows_remote_debug(_runnable_exe(pid, py)) is False:
            problem = (
                f"{py.exe} was built without remote debugging (--without-remote-debug): "
                "sys.remote_exec cannot reach it"
            )
        if problem is not None:
            raise RefusedError(REMOTE_DEBUG_OFF, problem, pid=pid)
    evidence, why = training_evidence(pid, argv, maps)
    if evidence is False:
        raise RefusedError(NOT_TRAINER, f"pid {pid} is not a training: {why}", pid=pid)
    run_dir = req.get("run_dir") or default_run_dir(pid)
    run_dir = os.path.abspath(os.path.expanduser(str(run_dir)))
    same_user = uid == os.geteuid()
    _check_run_dir(run_dir, same_user)
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = None
    root = str(cache_dir(uid))
    earlier = attach_state(root, key)
    if earlier == "attached":
        raise RefusedError(ALREADY, f"pid {pid} was attached to already", status=ALREADY, pid=pid)
    if earlier == "queued":
        raise RefusedError(
            PENDING,
            f"an attach of pid {pid} is {QUEUED}",
            status=PENDING,
            pid=pid,
            result_file=os.path.join(root, "attach", key, "result.json"),
        )
    torchrun = bool(env and env.get("TORCHELASTIC_RUN_ID"))
    return {
        "pid": pid,
        "start_ticks": start,
        "boot_id": here,
        "comm": p.comm,
        "uid": uid,
        "gid": gid,
        "user": user_name(uid),
        "python": py.to_dict(),
        "mechanism": mechanism,
        "gdb": gdb if mechanism == "gdb" else None,
        "argv": argv,
        "cwd": cwd,
        "run_dir": run_dir,
        "log_file": stdout_file(pid),
        "evidence": why,
        "speculators_seen": evidence is True,
        "files": root,
        "key": key,
        "torchrun": torchrun,
        "host": os.uname().nodename,
    }


def attach_state(root: str, key: str) -> str | None:
    """``attached`` or ``queued`` when an attach of this process ran or waits to run."""
    where = os.path.join(root, "attach", key)
    result = read_json_file(os.path.join(where, "result.json"))
    if result is not None:
        return "attached" if result.get("status") in ("attached", "already") else None
    return "queued" if os.path.exists(os.path.join(where, "injected")) else None


def _runnable_exe(pid: int, py: PythonInfo) -> str:
    return py.exe if os.path.exists(py.exe) else f"/proc/{pid}/exe"


# ---- the injection ------------------------------------------------------------------


def _prepare(
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
    if previous is None and (where / "injected").exists():
        return {"state": "queued", "result": str(result)}
    for name in ("result.json", "injected"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(where / name)
    request = dict(request, result=str(result))
    _write_private(where / "request.json", json.dumps(request))
    entry = where / "entry.py"
    _write_private(entry, entry_source(lib, str(where / "request.json"), str(result)))
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


def _mark_injected(where: str) -> None:
    _write_private(Path(where) / "injected", f"{time.time()}\n")


def python_line(entry: str) -> str:
    """The Python that ``PyRun_SimpleString`` runs: the entry file, with every exception
    stopped here (one escaping would come out of the trainer's current bytecode as a
    SystemError, a SystemExit would end the process); a Ctrl+C that lands meanwhile
    is given back to the main thread."""
    return (
        "try:\n"
        f" __import__('runpy').run_path({entry!r}, run_name={ENTRY_NAME!r})\n"
        "except KeyboardInterrupt:\n"
        " __import__('_thread').interrupt_main()\n"
        "except BaseException:\n"
        " pass\n"
    )


_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ./_-:,()=[]'")


def c_string(text: str) -> str:
    """``text`` as a C string literal for gdb: anything but plain characters as octal."""
    return '"' + "".join(chr(b) if b in _SAFE else f"\\{b:03o}" for b in text.encode()) + '"'


def gdb_script(pid: int, line: str, libpython: str | None) -> str:
    """Attach, load only libpython's and libc's symbols (a PyTorch process has hundreds
    of MB of others that gdb would read with the trainer stopped), queue the line,
    detach. An error in a command file stops it there; a signal inside a called
    function unwinds it (``unwindonsignal``); a failed mmap stops before the copy."""
    size = (len(line.encode()) // 4096 + 1) * 4096
    lines = [
        "set confirm off",
        "set pagination off",
        "set width 0",
        "set auto-solib-add off",
        "set unwindonsignal on",
        "shell date +EAGLE3_T0=%s.%N",
        f"attach {pid}",
    ]
    if libpython:
        lines.append(f"sharedlibrary {re.escape(os.path.basename(libpython))}")
    lines += [
        "sharedlibrary libc[.-]",
        f"set $buf = (char *) mmap(0, {size}, 3, 0x22, -1, 0)",
        "if (long) $buf == -1 || (long) $buf == 0",
        "  echo EAGLE3_MMAP_FAILED\\n",
        "else",
        f"  call (void) strcpy($buf, {c_string(line)})",
        "  print (int) Py_AddPendingCall((int (*)(void *)) PyRun_SimpleString, $buf)",
        "end",
        "detach",
        "shell date +EAGLE3_T1=%s.%N",
    ]
    return "\n".join(lines) + "\n"


def gdb_command(gdb: str, script: str) -> list[str]:
    return [
        gdb,
        "-nx",
        "-batch",
        "-iex",
        "set debuginfod enabled off",
        "-iex",
        "set auto-load off",
        "-x",
        script,
    ]


def parse_gdb(output: str) -> dict[str, Any]:
    """What gdb's output says: queued (``$1 = 0``), the stop time, or the problem."""
    out: dict[str, Any] = {"queued": False}
    t0 = re.search(r"EAGLE3_T0=(\d+\.\d+)", output)
    t1 = re.search(r"EAGLE3_T1=(\d+\.\d+)", output)
    if t0 and t1:
        out["stopped_ms"] = round((float(t1.group(1)) - float(t0.group(1))) * 1000.0, 1)
    value = re.search(r"^\$\d+ = (-?\d+)\s*$", output, re.M)
    if value is not None and value.group(1) == "0":
        out["queued"] = True
        return out
    if "Operation not permitted" in output and "ptrace" in output:
        out["reason"] = PERMISSION
        out["problem"] = "ptrace was refused (Operation not permitted)" + container_hint()
    elif "EAGLE3_MMAP_FAILED" in output:
        out["problem"] = "mmap failed in the trainer: nothing was queued"
    elif "No symbol" in output and "Py_AddPendingCall" in output:
        out["problem"] = "the interpreter does not export Py_AddPendingCall (a stripped build?)"
    elif value is not None:
        out["problem"] = f"Py_AddPendingCall returned {value.group(1)} (its queue is full?)"
    else:
        tail = " | ".join(ln for ln in output.strip().splitlines()[-4:] if ln.strip())
        out["problem"] = f"gdb did not queue the call: {tail[-400:]}"
    return out


def inject_gdb(gdb: str, pid: int, entry: str, libpython: str | None) -> dict[str, Any]:
    fd, script = tempfile.mkstemp(prefix="eagle3-tui-attach-", suffix=".gdb")
    try:
        os.write(fd, gdb_script(pid, python_line(entry), libpython).encode())
        os.close(fd)
        t0 = time.monotonic()
        try:
            proc = subprocess.run(
                gdb_command(gdb, script),
                capture_output=True,
                text=True,
                errors="replace",
                timeout=GDB_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired as e:
            return {
                "queued": False,
                "problem": f"gdb did not finish in {GDB_TIMEOUT_S:.0f} s (it was stopped)",
                "output": str(e.output or "")[-2000:],
            }
        out = parse_gdb(proc.stdout + proc.stderr)
        out["gdb_s"] = round(time.monotonic() - t0, 3)
        out["output"] = (proc.stdout + proc.stderr)[-2000:]
        return out
    finally:
        os.unlink(script)


def remote_exec_command(exe: str, pid: int, entry: str) -> list[str]:
    """``sys.remote_exec`` run by the target's own interpreter binary (PEP 768 needs
    the same version on both sides); -I -S: nothing of the caller's environment."""
    return [
        exe,
        "-I",
        "-S",
        "-c",
        "import sys;sys.remote_exec(int(sys.argv[1]), sys.argv[2])",
        str(pid),
        entry,
    ]


def inject_remote_exec(exe: str, pid: int, entry: str) -> dict[str, Any]:
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            remote_exec_command(exe, pid, entry),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=GDB_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"queued": False, "problem": f"sys.remote_exec did not run: {e}"}
    out: dict[str, Any] = {"queued": proc.returncode == 0, "gdb_s": round(time.monotonic() - t0, 3)}
    if proc.returncode != 0:
        err = " ".join(proc.stderr.strip().splitlines()[-2:])[-400:]
        if "PermissionError" in err or "Operation not permitted" in err:
            out["reason"] = PERMISSION
            err += container_hint()
        out["problem"] = f"sys.remote_exec failed: {err}"
    return out


def first_metric(run_dir: str, since: float, timeout: float) -> dict[str, Any] | None:
    """The first training step written to ``run_dir/metrics.jsonl`` after ``since``."""
    path = os.path.join(run_dir, "metrics.jsonl")
    deadline = time.monotonic() + timeout
    offset = 0
    pending = b""
    while True:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            data = b""
        offset += len(data)
        lines = (pending + data).split(b"\n")
        pending = lines.pop()
        for line in lines:
            if b'"train"' not in line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("kind") == "train" and float(rec.get("ts", 0)) >= since:
                return {"step": rec.get("step"), "ts": rec.get("ts")}
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def inject(info: dict[str, Any], req: dict[str, Any]) -> dict[str, Any]:
    sources = req.get("lib")
    if not isinstance(sources, dict) or not sources:
        raise RefusedError(FAILED, "the request carries no telemetry package", status=FAILED)
    pid = int(info["pid"])
    python = info["python"]
    run_dir = info["run_dir"]
    root = info["files"]
    lib_dir = str(Path(root) / "lib" / lib_name(sources))
    resume = None
    if info["torchrun"]:
        parent = proc_stat(pid)
        resume = cmdline(parent.ppid) if parent is not None else None
    else:
        resume = resume_command(info["argv"], lib_dir, run_dir, python=python["exe"])
    request = {
        "pid": pid,
        "run_dir": run_dir,
        "log_file": info["log_file"],
        "resume_command": resume,
        "mechanism": info["mechanism"],
        "requested_at": time.time(),
    }
    uid, gid = int(info["uid"]), int(info["gid"])
    try:
        ready = as_user(uid, gid, _prepare, root, info["key"], sources, request)
    except (OSError, ValueError) as e:
        raise RefusedError(
            FAILED, f"cannot write the telemetry files under {root}: {e}", status=FAILED
        ) from None
    if ready["state"] == "already":
        raise RefusedError(ALREADY, f"pid {pid} was attached to already", status=ALREADY)
    if ready["state"] == "queued":
        raise RefusedError(
            PENDING,
            f"an attach of pid {pid} is {QUEUED}",
            status=PENDING,
            result_file=ready["result"],
        )
    t_inject = time.time()
    if info["mechanism"] == "gdb":
        done = inject_gdb(str(info["gdb"]), pid, ready["entry"], python.get("libpython"))
    else:
        exe = python["exe"] if os.path.exists(python["exe"]) else f"/proc/{pid}/exe"
        done = inject_remote_exec(exe, pid, ready["entry"])
    base = {
        "stopped_ms": done.get("stopped_ms"),
        "tool_s": done.get("gdb_s"),
        "result_file": ready["result"],
        "lib": ready["lib"],
    }
    if not done["queued"]:
        reason = done.get("reason", FAILED)
        raise RefusedError(
            reason,
            str(done.get("problem")),
            status="refused" if reason == PERMISSION else FAILED,
            output=done.get("output"),
            **base,
        )
    as_user(uid, gid, _mark_injected, ready["dir"])
    deadline = time.monotonic() + float(req.get("wait_s", RESULT_WAIT_S))
    result = None
    while result is None and time.monotonic() < deadline:
        result = as_user(uid, gid, read_json_file, ready["result"])
        if result is None:
            if proc_stat(pid) is None:
                raise RefusedError(
                    GONE, f"pid {pid} exited before the attach ran", status="refused"
                )
            time.sleep(0.05)
    if result is None:
        return {"status": PENDING, "message": f"{QUEUED} (pid {pid})", **base}
    out = dict(result, **base)
    status = result.get("status")
    if status == "attached":
        metric = first_metric(run_dir, t_inject, float(req.get("metric_wait_s", METRIC_WAIT_S)))
        if metric is not None:
            out["first_step"] = metric["step"]
            out["first_metric_s"] = round(float(metric["ts"]) - t_inject, 3)
    elif status == "no_trainer":
        out["reason"] = NOT_TRAINER
    elif status == "already":
        out["reason"] = ALREADY
    else:
        out["reason"] = FAILED
    return out


def op_attach(req: dict[str, Any]) -> int:
    """``step``: ``plan`` (checks and what would happen) or ``inject`` (do it)."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a dropped connection must not cut gdb short
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    step = req.get("step") or "plan"
    try:
        info = plan(req)
        if step == "plan":
            emit("result", op=OP_ATTACH, status="plan", **info)
            return 0
        if step != "inject":
            raise RefusedError(FAILED, f"unknown step {step!r}", status=FAILED)
        result = inject(info, req)
        emit("result", op=OP_ATTACH, plan=info, **result)
    except RefusedError as r:
        emit(
            "result",
            op=OP_ATTACH,
            status=r.status,
            reason=r.reason,
            message=str(r),
            **r.fields,
        )
    return 0
