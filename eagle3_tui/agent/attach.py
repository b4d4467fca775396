"""``attach``: add eagle3-tui telemetry to a live speculators training, no restart.

Two steps, one request each (the client asks the person in between):

``plan``
    Every check that needs nothing but ``/proc``, before anything touches the
    process; each refusal names its fix: the PID exists and is the process that
    was shown (start time, boot id); we may trace it (same user or
    CAP_SYS_PTRACE; Yama's ``ptrace_scope``; no other tracer); it runs CPython 3.8
    or later; there is a way in (3.8-3.13: eagle3-tui's injector, else gdb on PATH
    that can call into a process here; 3.14+: remote debugging not disabled); it
    is not instrumented already (the launcher's
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

    * CPython 3.8-3.13: eagle3-tui's injector (``agent/ptrace.py``: only the main
      thread stopped, for milliseconds, every register given back, AMX included),
      or gdb where the injector cannot go (``agent/debugger.py``): a fresh page, a
      line of Python copied into it, ``Py_AddPendingCall(PyRun_SimpleString,
      page)``. The line runs the entry file and swallows every exception (one
      escaping ``PyRun_SimpleString`` would surface in the trainer as a SystemError).
    * CPython 3.14+: ``sys.remote_exec(pid, entry)`` (PEP 768), run by the
      target's own interpreter binary.

    Then it waits for the entry file's result (``telemetry/inject.py``): attached,
    already, no trainer, failed with a traceback, and the pause it caused. No
    result yet means the main thread is blocked in C code: the call stays queued
    and runs when it next runs Python (``queued``; asking again reports it).
    Once attached it waits a little for the first training step's metrics.

Files are written as the trainer's user (a forked child drops to its uid when
root attaches to another user's process): they run in that process.

Over 600 lines: the plan and the injection are one request pair whose every check
(process identity, permissions, Python version, the way in) must hold again at the
second step; the injector itself is ``ptrace.py``.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import time
from pathlib import Path
from typing import Any

from eagle3_tui.agent import ptrace
from eagle3_tui.agent.debugger import (
    failed_file,
    gdb_call_problem,
    inject_gdb,
    inject_ptrace,
    inject_remote_exec,
)
from eagle3_tui.agent.frames import emit
from eagle3_tui.agent.names import EV_RESULT, MANIFEST, OP_ATTACH, RUN_ID_ENV, RUNS_FOLDER
from eagle3_tui.agent.processes import all_procs, ancestors, boot_id, proc_stat
from eagle3_tui.agent.pyprocess import (
    PythonInfo,
    build_allows_remote_debug,
    exe_path,
    mapped_files,
    permission_problem,
    python_of,
    remote_debug_problem,
    status_ids,
    training_evidence,
    user_name,
)
from eagle3_tui.agent.userfiles import (
    as_user,
    attach_key,
    attach_state,
    cache_dir,
    lib_name,
    mark_injected,
    prepare,
    read_json_file,
)
from eagle3_tui.telemetry.parsing import parse_json
from eagle3_tui.telemetry.procs import ProcStat, cmdline, cwd, environ
from eagle3_tui.telemetry.rerun import resume_command, torchrun_resume_command
from eagle3_tui.telemetry.safefs import open_file

MIN_VERSION = (3, 8)
REMOTE_EXEC_VERSION = (3, 14)
RESULT_WAIT_S = 10.0
ENTRY_TRIES = 4
"""How many times the line is queued when it stops before the entry's own code."""
ENTRY_RETRY_S = 0.3
METRIC_WAIT_S = 15.0
DEFAULT_RUNS = RUNS_FOLDER
"""Without a run directory: ``<the trainer's cwd>/eagle3-runs/attached-<pid>``."""
QUEUED = "queued: runs when the trainer's main thread next runs Python"

# RefusedError reasons (a result's ``reason``); the client maps them to exit statuses.
GONE = "gone"  # no such process, or it exited
REUSED = "reused"  # the PID belongs to another process than the one confirmed
PERMISSION = "permission"  # another user, ptrace_scope, no CAP_SYS_PTRACE
NOT_PYTHON = "not_python"  # not CPython
UNSUPPORTED = "unsupported"  # CPython older than 3.8
NOT_TRAINER = "not_trainer"  # no PyTorch loaded / no Trainer found inside
NO_GDB = "no_gdb"  # 3.8-3.13: the injector cannot go there, and gdb is missing
GDB_UNUSABLE = "gdb_unusable"  # ... and gdb cannot call into a process here (tried first)
TRACED = "traced"  # another tracer (a debugger, strace, py-spy) holds the process
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
            entry = parse_json(line)
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
    pid, p, here = _the_process(req)
    problem = permission_problem(pid)
    if problem is not None:
        raise RefusedError(PERMISSION, problem, pid=pid)
    other = ptrace.tracer(pid)
    if other:
        raise RefusedError(
            TRACED,
            f"pid {pid} is traced by pid {other} (a debugger, strace, py-spy): a process "
            "has one tracer at a time; detach that one, then attach",
            pid=pid,
        )
    ids = status_ids(pid)
    uid = ids.get("Uid", [os.geteuid()])[0]
    gid = ids.get("Gid", [os.getegid()])[0]
    maps = mapped_files(pid)
    py = _its_cpython(pid, p.comm, maps)
    argv = cmdline(pid)
    env = environ(pid)
    start = p.start
    _refuse_if_it_has_telemetry(pid, start, env, uid)
    asked = req.get("mechanism")
    mechanism, gdb, injector_problem = _mechanism(pid, py, argv, env, asked)
    if asked and asked != mechanism:  # the inject step: the way the person confirmed
        raise RefusedError(
            FAILED,
            f"pid {pid} can no longer be attached through {asked} "
            f"({injector_problem or 'its interpreter changed'}): nothing was done",
            status=FAILED,
            pid=pid,
        )
    evidence, why = training_evidence(pid, argv, maps)
    if evidence is False:
        raise RefusedError(NOT_TRAINER, f"pid {pid} is not a training: {why}", pid=pid)
    run_dir = req.get("run_dir") or default_run_dir(pid)
    run_dir = os.path.abspath(os.path.expanduser(str(run_dir)))
    _check_run_dir(run_dir, uid == os.geteuid())
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = None
    root = str(cache_dir(uid))
    key = attach_key(pid, start, here)
    _refuse_if_attached_before(pid, root, key)
    _refuse_if_gdb_cannot_call(pid, gdb, injector_problem)
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
        "gdb": gdb,
        "injector_problem": injector_problem,
        "argv": argv,
        "cwd": cwd,
        "run_dir": run_dir,
        "log_file": stdout_file(pid),
        "evidence": why,
        "speculators_seen": evidence is True,
        "files": root,
        "key": key,
        "torchrun": bool(env and env.get("TORCHELASTIC_RUN_ID")),
        "host": os.uname().nodename,
    }


def _the_process(req: dict[str, Any]) -> tuple[int, ProcStat, str | None]:
    """The request's process (the one training here when it names none), its stat and
    this boot's id; refused when it is gone or its PID is another process's now."""
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
    return pid, p, here


def _its_cpython(pid: int, comm: str, maps: list[str]) -> PythonInfo:
    """The process's interpreter; refused unless it is CPython 3.8 or later."""
    py = python_of(pid, maps)
    exe = exe_path(pid) or "?"
    if py is None or py.implementation != "cpython" or py.version is None:
        what = "PyPy: only CPython can be attached to" if py is not None else f"runs {exe}"
        if py is None and exe == "?":
            what = f"/proc/{pid}/exe cannot be read"
        raise RefusedError(
            NOT_PYTHON, f"pid {pid} ({comm}) is not a CPython process: {what}", pid=pid
        )
    if py.version < MIN_VERSION:
        raise RefusedError(
            UNSUPPORTED,
            f"pid {pid} runs Python {py.version[0]}.{py.version[1]}: attach needs CPython 3.8 "
            "or later",
            pid=pid,
        )
    return py


def _refuse_if_it_has_telemetry(pid: int, start: int, env: dict[str, str] | None, uid: int) -> None:
    """Refused (``already``) when the process was launched with telemetry or its run
    is registered already."""
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


def _mechanism(
    pid: int,
    py: PythonInfo,
    argv: list[str],
    env: dict[str, str] | None,
    asked: str | None = None,
) -> tuple[str, str | None, str | None]:
    """How the code gets in: ``ptrace`` (eagle3-tui's injector, CPython 3.8-3.13), else
    ``gdb`` (its path; why the injector cannot go there), or ``remote_exec`` (3.14+);
    refused when no way is open. ``asked`` = ``gdb`` takes gdb where both could (to
    compare them). Whether gdb can call into a process is tried last
    (:func:`_refuse_if_gdb_cannot_call`)."""
    assert py.version is not None  # _its_cpython
    if py.version >= REMOTE_EXEC_VERSION:
        problem = remote_debug_problem(pid, argv, env)
        if problem is None and build_allows_remote_debug(_runnable_exe(pid, py)) is False:
            problem = (
                f"{py.exe} was built without remote debugging (--without-remote-debug): "
                "sys.remote_exec cannot reach it"
            )
        if problem is not None:
            raise RefusedError(REMOTE_DEBUG_OFF, problem, pid=pid)
        return "remote_exec", None, None
    injector_problem = ptrace.problem(pid, py.libpython)
    if injector_problem is None and asked != "gdb":
        return "ptrace", None, None
    gdb = shutil.which("gdb")
    if gdb is None:
        why = injector_problem or "gdb was asked for"
        raise RefusedError(
            NO_GDB,
            f"{why}; gdb, the other way in, is not on PATH on this host "
            f"({os.environ.get('PATH', '')}): install it (apt-get install gdb, dnf install gdb)",
            pid=pid,
        )
    return "gdb", gdb, injector_problem


def _refuse_if_gdb_cannot_call(pid: int, gdb: str | None, injector_problem: str | None) -> None:
    """The last check, the costliest (~0.7 s): gdb calls a function in a throwaway
    process first, so a gdb that would break the trainer's registers never reaches it."""
    if gdb is None:
        return
    problem = gdb_call_problem(gdb)
    if problem is not None:
        if injector_problem is not None:
            problem = f"{injector_problem}; and {problem}"
        raise RefusedError(GDB_UNUSABLE, problem, pid=pid)


def _refuse_if_attached_before(pid: int, root: str, key: str) -> None:
    """Refused when this process was attached to already, or an attach is queued."""
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


def _runnable_exe(pid: int, py: PythonInfo) -> str:
    return py.exe if os.path.exists(py.exe) else f"/proc/{pid}/exe"


# ---- the injection ------------------------------------------------------------------


def first_metric(run_dir: str, since: float, timeout: float) -> dict[str, Any] | None:
    """The first training step written to ``run_dir/metrics.jsonl`` after ``since``."""
    path = os.path.join(run_dir, "metrics.jsonl")
    deadline = time.monotonic() + timeout
    offset = 0
    pending = b""
    while True:
        try:
            with open_file(path) as f:  # never a FIFO or a device
                f.seek(offset)
                data = f.read(16 << 20)
        except OSError:
            data = b""
        offset += len(data)
        lines = (pending + data).split(b"\n")
        pending = lines.pop()
        for line in lines:
            if b'"train"' not in line:
                continue
            try:
                rec = parse_json(line)
            except ValueError:
                continue
            if rec.get("kind") == "train" and float(rec.get("ts", 0)) >= since:
                return {"step": rec.get("step"), "ts": rec.get("ts")}
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def invoked_python(pid: int, argv0: str, exe: str) -> str:
    """The interpreter as process ``pid`` was started, for a command line whose
    ``argv[0]`` is relative (``python``): looked up in the process's own ``PATH`` and
    working directory, where that finds the same binary as ``exe`` (its
    ``/proc/PID/exe``). A virtual environment's ``python`` is a link to the base
    interpreter: run through the link, the environment is its; through the resolved
    ``exe`` it is not (its packages are gone: a resume of it failed at its first
    import). ``exe`` where nothing else is found."""
    if not argv0 or os.path.isabs(argv0):
        return exe
    where = cwd(pid)
    if where is None:
        return exe
    if "/" in argv0:
        found = [os.path.join(where, argv0)]
    else:
        path = (environ(pid) or {}).get("PATH", "")
        found = [os.path.join(where, d, argv0) for d in path.split(":")[:64]]
    for candidate in found:
        try:
            if os.access(candidate, os.X_OK) and os.path.samefile(candidate, exe):
                return os.path.normpath(candidate)
        except OSError:
            continue
    return exe


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
    if info["torchrun"]:  # the agent's command, every rank under the bootstrap
        parent = proc_stat(pid)
        agent = cmdline(parent.ppid) if parent is not None else []
        resume = torchrun_resume_command(agent, info["argv"], lib_dir, run_dir) or agent or None
    else:
        exe = invoked_python(pid, info["argv"][0] if info["argv"] else "", python["exe"])
        resume = resume_command(info["argv"], lib_dir, run_dir, python=exe)
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
        ready = as_user(uid, gid, prepare, root, info["key"], sources, request)
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
    done = _queue(info, ready["entry"])
    base = {
        "stopped_ms": done.get("stopped_ms"),
        "registers": done.get("restored"),
        "tool_s": done.get("tool_s"),
        "result_file": ready["result"],
        "lib": ready["lib"],
    }
    if not done["queued"]:
        reason = done.get("reason", FAILED)
        raise RefusedError(
            reason,
            str(done.get("problem")),
            status="refused" if reason in (PERMISSION, GONE) else FAILED,
            output=done.get("output"),
            **base,
        )
    as_user(uid, gid, mark_injected, ready["dir"])
    deadline = time.monotonic() + float(req.get("wait_s", RESULT_WAIT_S))
    result = None
    tries = 1
    while result is None and time.monotonic() < deadline:
        result = as_user(uid, gid, read_json_file, ready["result"])
        if result is None:
            if proc_stat(pid) is None:
                raise RefusedError(
                    GONE, f"pid {pid} exited before the attach ran", status="refused"
                )
            failed = as_user(uid, gid, take_failure, failed_file(ready["entry"]))
            if failed is not None:  # it ran and stopped before the entry's own code
                if tries >= ENTRY_TRIES:
                    raise RefusedError(
                        FAILED,
                        f"the attach code failed in pid {pid} {tries} times, the last "
                        f"with {failed}: nothing was changed in the trainer",
                        status=FAILED,
                        **base,
                    )
                tries += 1
                time.sleep(ENTRY_RETRY_S)  # e.g. it landed inside one of the trainer's imports
                again = _queue(info, ready["entry"])
                if not again["queued"]:
                    raise RefusedError(
                        again.get("reason", FAILED), str(again.get("problem")), status=FAILED
                    )
                base["tries"] = tries
                continue
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


def _queue(info: dict[str, Any], entry: str) -> dict[str, Any]:
    """The entry file's line queued into the trainer by the chosen mechanism."""
    pid = int(info["pid"])
    python = info["python"]
    if info["mechanism"] == "ptrace":
        return inject_ptrace(pid, entry, python.get("libpython"))
    if info["mechanism"] == "gdb":
        return inject_gdb(str(info["gdb"]), pid, entry, python.get("libpython"))
    exe = python["exe"] if os.path.exists(python["exe"]) else f"/proc/{pid}/exe"
    return inject_remote_exec(exe, pid, entry)


def take_failure(path: str) -> str | None:
    """The exception the injected line wrote (:func:`debugger.python_line`), as one
    printable line, and the file removed; None when there is none. Written by the
    trainer's process: read as text, cut, never trusted further."""
    try:
        with open(path, "rb") as f:
            raw = f.read(4096)
        os.unlink(path)
    except OSError:
        return None
    text = raw.decode("utf-8", "replace")
    text = "".join(c if c.isprintable() else " " for c in text).strip()
    return (text[:300] + "…" if len(text) > 300 else text) or "an exception"


def op_attach(req: dict[str, Any]) -> int:
    """``step``: ``plan`` (checks and what would happen) or ``inject`` (do it)."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a dropped connection must not cut gdb short
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    step = req.get("step") or "plan"
    try:
        info = plan(req)
        if step == "plan":
            emit(EV_RESULT, op=OP_ATTACH, status="plan", **info)
            return 0
        if step != "inject":
            raise RefusedError(FAILED, f"unknown step {step!r}", status=FAILED)
        result = inject(info, req)
        emit(EV_RESULT, op=OP_ATTACH, plan=info, **result)
    except RefusedError as r:
        emit(
            EV_RESULT,
            op=OP_ATTACH,
            status=r.status,
            reason=r.reason,
            message=str(r),
            **r.fields,
        )
    return 0
