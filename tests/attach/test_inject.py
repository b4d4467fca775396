"""The injection for real, with eagle3-tui's injector and with gdb (where gdb can call
into a process on this machine), into live interpreters of every CPython version found
here (3.8-3.13), and every refusal this machine can produce for real: no way in (an
interpreter the injector cannot call, and gdb absent from PATH or unusable), another
user's process, a non-Python PID, an exited PID, a reused PID, Python that is not a
training (no PyTorch; PyTorch but no speculators), a call queued behind a main thread
blocked in C. No speculators training here: see test_ssh_attach.py for that."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.agent import BOOTSTRAP, debugger, ptrace, pyprocess, userfiles
from eagle3_tui.transport.calls import attach_plan, attach_run
from eagle3_tui.transport.channel import AGENT_TAG, LocalHost, agent_payload
from eagle3_tui.transport.replies import AttachPlan, AttachResult
from tests.conftest import gdb_call_problem_here, interpreters, need, need_gdb, useradd, wait_until
from tests.transport.conftest import cli

pytestmark = pytest.mark.slow

LOOP = (
    "import time\ntry:\n    open('loop-ready', 'w').close()\nexcept OSError:\n    pass\n"
    "ticks = 0\nwhile True:\n    ticks += 1\n    time.sleep(0.01)\n"
)
"""A plain loop; it says it runs (``loop-ready`` in its directory) once its
interpreter is up and its imports done: a line queued before then can land inside
the interpreter's own start-up imports (``test_a_line_queued_at_start_up_...``)."""


def start(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env
    )


def python_loop(
    cwd: Path, procs: list[subprocess.Popen[bytes]], exe: str = sys.executable
) -> subprocess.Popen[bytes]:
    """A plain Python loop (no PyTorch) started by ``exe`` in ``cwd``, its interpreter up."""
    (cwd / "loop.py").write_text(LOOP)
    proc = start([exe, "loop.py"], cwd)
    procs.append(proc)
    python_ready(proc, cwd / "loop-ready")
    return proc


def python_ready(proc: subprocess.Popen[bytes], ready: Path | None = None) -> None:
    """The interpreter is up (its libraries mapped; its main loop running when it writes
    ``ready``)."""
    wait_until(lambda: pyprocess.python_of(proc.pid) is not None, 20, "the interpreter")
    if ready is not None:
        wait_until(ready.exists, 30, "the loop")
    time.sleep(0.3)


def torch_process(
    cwd: Path, procs: list[subprocess.Popen[bytes]], body: str, exe: str = sys.executable
) -> subprocess.Popen[bytes]:
    """A Python process with PyTorch imported (no speculators) that then runs ``body``;
    another interpreter ``exe`` of our version imports our PyTorch."""
    try:
        import torch
    except ImportError:
        need(False, "torch is not installed")
    ready = cwd / "ready"
    (cwd / "torch_main.py").write_text(
        f"import time, torch\nopen({str(ready)!r}, 'w').close()\n{body}"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(torch.__file__).parents[1]))
    proc = start([exe, "torch_main.py"], cwd, env)
    procs.append(proc)
    wait_until(ready.exists, 60, "torch imported")
    return proc


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(10)


# ---- the mechanism, per version ----------------------------------------------------


def version_id(exe: str) -> str:
    return "3.11-ours" if exe == sys.executable else os.path.basename(exe)


def injector(mechanism: str) -> Callable[[int, str, str | None], dict[str, Any]]:
    """``inject(pid, entry, libpython)`` through ``mechanism`` (gdb: where it can call)."""
    if mechanism == "ptrace":
        return debugger.inject_ptrace
    return partial(debugger.inject_gdb, need_gdb())


def _mechanisms() -> list[str]:
    """The injector everywhere; gdb as well where it can call into a process here (on a
    CPU with AMX Debian's gdb 13.1 cannot: no gdb variant is made there, and
    ``test_the_gdb_check_agrees_with_a_call_into_a_live_interpreter`` shows the refusal)."""
    gdb = shutil.which("gdb")
    return ["ptrace"] + (["gdb"] if gdb and gdb_call_problem_here(gdb) is None else [])


@pytest.mark.parametrize("mechanism", _mechanisms())
@pytest.mark.parametrize("exe", interpreters(), ids=version_id)
def test_a_line_is_queued_into_a_live_interpreter(
    exe: str, mechanism: str, tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    inject = injector(mechanism)
    proc = python_loop(tmp_path, procs, exe)
    py = pyprocess.python_of(proc.pid)
    assert py is not None and py.version is not None
    out = tmp_path / "out.json"
    entry = tmp_path / "entry.py"
    entry.write_text(
        "import json, sys, threading\n"
        "main = sorted(vars(sys.modules['__main__']))\n"
        "json.dump({'version': list(sys.version_info[:2]), 'main': main,\n"
        f"           'thread': threading.current_thread().name}}, open({str(out)!r}, 'w'))\n"
    )
    bad = tmp_path / "raises.py"
    bad.write_text("raise RuntimeError('an error inside the injected code')\n")
    # an exception in the injected code stays there: the trainer's loop goes on
    done = inject(proc.pid, str(bad), py.libpython)
    assert done["queued"], done
    done = inject(proc.pid, str(entry), py.libpython)
    assert done["queued"], done
    assert 0 < done["stopped_ms"] < 30_000
    wait_until(out.exists, 20, "the injected code to run")
    time.sleep(0.1)
    seen = json.loads(out.read_text())
    assert tuple(seen["version"]) == py.version
    assert seen["thread"] == "MainThread"
    # nothing bound in the program's namespace (the loop's own names only)
    assert not [n for n in seen["main"] if "eagle3" in n or n in ("e", "runpy", "_thread")]
    assert proc.poll() is None


def test_a_call_waits_while_the_main_thread_is_in_c(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    asleep = tmp_path / "asleep"
    (tmp_path / "block.py").write_text(
        f"import time\nopen({str(asleep)!r}, 'w').write(repr(time.time()))\ntime.sleep(4)\n{LOOP}"
    )
    proc = start([sys.executable, "block.py"], tmp_path)
    procs.append(proc)
    python_ready(proc)
    wait_until(lambda: asleep.exists() and asleep.read_text(), 10, "the sleep")
    out = tmp_path / "ran"
    entry = tmp_path / "entry.py"
    entry.write_text(f"import time\nopen({str(out)!r}, 'w').write(repr(time.time()))\n")
    py = pyprocess.python_of(proc.pid)
    assert py is not None
    done = debugger.inject_ptrace(proc.pid, str(entry), py.libpython)
    assert done["queued"], done
    time.sleep(0.5)
    assert not out.exists()  # queued: time.sleep is C code
    wait_until(lambda: out.exists() and out.read_text(), 20, "the queued call")
    # it ran once the main thread was back in Python, not before
    assert float(out.read_text()) - float(asleep.read_text()) >= 3.9


def test_a_line_queued_at_start_up_is_never_lost_in_silence(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    """Right after the exec the interpreter is still importing its own start-up modules
    (``os``, ``collections.abc`` half made): measured, 12 of 100 lines queued then ran
    nothing and said nothing. Every one either runs or says why (``.failed``), and a
    line into an interpreter not yet initialized is held back until it is."""
    entry = tmp_path / "entry.py"
    failed = Path(debugger.failed_file(str(entry)))
    outcomes = []
    for i in range(12):
        out = tmp_path / f"ran-{i}"
        entry.write_text(f"open({str(out)!r}, 'w').close()\n")
        failed.unlink(missing_ok=True)
        proc = start([sys.executable, "-c", LOOP], tmp_path)
        procs.append(proc)
        wait_until(partial(pyprocess.python_of, proc.pid), 20, "the interpreter")
        py = pyprocess.python_of(proc.pid)
        assert py is not None
        done = debugger.inject_ptrace(proc.pid, str(entry), py.libpython)
        assert done["queued"], done
        wait_until(partial(_either, out, failed), 20, "the line to run or say why")
        outcomes.append("ran" if out.exists() else failed.read_text())
        assert proc.poll() is None  # the loop goes on either way
        proc.kill()
    assert "ran" in outcomes, outcomes


def _either(*paths: Path) -> bool:
    return any(p.exists() for p in paths)


def test_an_interpreter_that_is_exiting_is_not_queued_into(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In its finalization (here a ``__del__`` that sleeps) a queued line would never run:
    ``Py_IsInitialized`` says so first; nothing is queued, the registers go back."""
    exiting = tmp_path / "exiting"
    (tmp_path / "late.py").write_text(
        "import time\n"
        "class Late:\n"
        "    def __del__(self, sleep=time.sleep, open=open):\n"
        f"        open({str(exiting)!r}, 'w').close()\n"
        "        sleep(30)\n"
        "late = Late()\n"
    )
    proc = start([sys.executable, "late.py"], tmp_path)
    procs.append(proc)
    wait_until(exiting.exists, 20, "the interpreter's finalization")
    py = pyprocess.python_of(proc.pid)
    assert py is not None
    monkeypatch.setattr(ptrace, "READY_WAIT_S", 0.6)  # the forked injector inherits it
    done = debugger.inject_ptrace(proc.pid, str(tmp_path / "entry.py"), py.libpython)
    assert not done["queued"] and done["reason"] == ptrace.NOT_READY, done
    assert "not initialized" in done["problem"] and done["tries"] >= 2, done
    assert done["restored"] == "verified"
    assert proc.poll() is None


# ---- telemetry on the trainer's interpreter, whatever its version ----------------------

ONE_LINER = """
import logging, sys
from eagle3_tui.telemetry import attach
t = attach(sys.argv[1], samplers=["heartbeat"], sampler_host="thread")
logging.getLogger("speculators.metrics").info(
    {"train": {"loss": 1.5, "full_acc_0": 0.5}, "epoch": 0, "lr": 0.001, "global_step": 0},
    extra={"step": 0},
)
t.finish()
t.close()
"""


@pytest.mark.parametrize("exe", interpreters(), ids=version_id)
def test_telemetry_runs_on_every_supported_interpreter(exe: str, tmp_path: Path) -> None:
    lib = userfiles.write_lib(tmp_path / "cache", __import__(
        "eagle3_tui.transport.bundle", fromlist=["telemetry_library"]
    ).telemetry_library())  # fmt: skip
    env = dict(os.environ, PYTHONPATH=lib, XDG_STATE_HOME=str(tmp_path / "state"))
    run = tmp_path / "run"
    proc = subprocess.run(
        [exe, "-c", ONE_LINER, str(run)], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    kinds = [json.loads(line)["kind"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert "train" in kinds and kinds.count("lifecycle") == 2


# ---- refusals, for real ----------------------------------------------------------------


def attach_cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    proc = cli("attach", *args, "--yes", "--json", env=env)
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_refused_for_a_process_that_is_not_python(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    proc = start(["sleep", "300"], tmp_path)
    procs.append(proc)
    wait_until(lambda: "sleep" in (pyprocess.exe_path(proc.pid) or ""), 10, "sleep")
    rc, out = attach_cli("--pid", str(proc.pid))
    assert rc == 33 and out["reason"] == "not_python" and "sleep" in out["message"]


def test_refused_for_a_python_older_than_3_8(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    old = interpreters(range(6, 8))
    if not old:
        pytest.skip("no CPython 3.6 or 3.7 here")
    proc = python_loop(tmp_path, procs, old[-1])
    rc, out = attach_cli("--pid", str(proc.pid))
    assert rc == 33 and out["reason"] == "unsupported" and "3.8 or later" in out["message"]


def test_refused_for_an_exited_process(tmp_path: Path) -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    rc, out = attach_cli("--pid", str(proc.pid))
    assert rc == 22 and out["reason"] == "gone" and "exited" in out["message"]


def test_refused_for_python_without_pytorch(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    proc = python_loop(tmp_path, procs)
    rc, out = attach_cli("--pid", str(proc.pid))
    assert rc == 33 and out["reason"] == "not_trainer" and "no PyTorch" in out["message"]


def test_the_gdb_check_agrees_with_a_call_into_a_live_interpreter(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    """Whatever this machine's gdb can do, the check made on a throwaway process says
    so: where it finds no problem a real injection queues and the interpreter lives on;
    where it finds one, the same injection (into a throwaway interpreter) fails with
    gdb's reason."""
    gdb = shutil.which("gdb")
    need(gdb is not None, "gdb is not installed (apt-get install gdb)")
    assert gdb is not None
    problem = debugger.gdb_call_problem(gdb)
    proc = python_loop(tmp_path, procs)
    py = pyprocess.python_of(proc.pid)
    assert py is not None
    entry = tmp_path / "entry.py"
    entry.write_text("pass\n")
    done = debugger.inject_gdb(gdb, proc.pid, str(entry), py.libpython)
    if problem is None:
        assert done["queued"], done.get("output")
        time.sleep(0.5)
        assert proc.poll() is None
    else:
        assert not done["queued"] and "extended state" in done["problem"], done
        assert "extended state" in problem and "newer gdb" in problem


def test_a_gdb_that_cannot_call_is_refused_before_it_touches_the_trainer(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]], python_without_the_call: str
) -> None:
    """Where the injector cannot go (an interpreter that does not export the function),
    a gdb that fails the check (here a script in gdb's place that answers as Debian's
    gdb 13.1 does on a CPU with AMX) refuses the attach, exit 34, with both reasons,
    and gdb is never pointed at the process: only at the throwaway one."""
    proc = torch_process(tmp_path, procs, LOOP, python_without_the_call)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    gdb = bindir / "gdb"
    gdb.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {calls}\n'
        'case "$*" in *--version*) echo "GNU gdb (Debian 13.1-3) 13.1"; exit 0;; esac\n'
        'for a in "$@"; do [ -f "$a" ] && cat "$a" >> ' + str(calls) + "; done\n"
        'echo "Couldn\'t write extended state status: Bad address."\n'
        "exit 1\n"
    )
    gdb.chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    rc, out = attach_cli(str(tmp_path / "run"), "--pid", str(proc.pid), env=env)
    assert rc == 34 and out["reason"] == "gdb_unusable", out
    assert "gdb 13.1" in out["message"] and "newer gdb" in out["message"]
    assert "does not export Py_AddPendingCall" in out["message"]
    assert f"attach {proc.pid}" not in calls.read_text()
    assert proc.poll() is None


def test_no_way_in_without_the_injector_and_gdb(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]], python_without_the_call: str
) -> None:
    proc = python_loop(tmp_path, procs, python_without_the_call)
    env = dict(os.environ, PATH=str(tmp_path / "empty"))
    rc, out = attach_cli("--pid", str(proc.pid), env=env)
    assert rc == 34 and out["reason"] == "no_gdb", out
    assert "does not export Py_AddPendingCall" in out["message"]
    assert "apt-get install gdb" in out["message"]


async def test_the_injector_needs_no_gdb_and_the_plan_says_so(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    proc = torch_process(tmp_path, procs, LOOP)
    env = dict(os.environ, PATH=str(tmp_path / "empty"))
    proc_plan = cli("attach", str(tmp_path / "run"), "--pid", str(proc.pid), env=env)
    assert proc_plan.returncode == 2  # not confirmed (no terminal, no --yes): nothing done
    assert "eagle3-tui's injector (ptrace)" in proc_plan.stderr.replace("\n", " ")
    rc, out = attach_cli(str(tmp_path / "run"), "--pid", str(proc.pid), env=env)
    assert rc == 33 and out["status"] == "no_trainer", out  # injected; no Trainer inside
    assert out["plan"]["mechanism"] == "ptrace" and out["registers"] == "verified"
    assert 0 < out["stopped_ms"] < 1000


async def test_refused_when_the_pid_is_another_process_now(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    proc = python_loop(tmp_path, procs)
    plan = await attach_plan(LocalHost(), str(tmp_path / "run"), proc.pid)
    assert plan.status == "refused"  # no PyTorch; but the identity check comes first:
    confirmed = AttachPlan(pid=proc.pid, start_ticks=1, boot_id=None, run_dir=str(tmp_path))
    out = await attach_run(LocalHost(), confirmed)
    assert out.status == "refused" and out.reason == "reused"
    assert "nothing was done" in out.message


def test_torch_without_speculators_is_queued_then_not_a_trainer(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    """PyTorch loaded, speculators nowhere: the attach is injected, stays queued while
    the main thread sleeps in C, and inside finds no Trainer and changes nothing."""
    proc = torch_process(tmp_path, procs, f"time.sleep(6)\n{LOOP}")
    run_dir = tmp_path / "run"
    rc, out = attach_cli(str(run_dir), "--pid", str(proc.pid), "--wait", "0.5")
    assert rc == 32 and out["status"] == "queued", out
    assert "main thread next runs Python" in out["message"]
    rc, again = attach_cli(str(run_dir), "--pid", str(proc.pid))
    assert rc == 32 and again["reason"] == "queued"  # asking again: still queued, not re-injected
    result = Path(out["result_file"])
    wait_until(result.exists, 30, "the queued attach to run")
    inside = json.loads(result.read_text())
    assert inside["status"] == "no_trainer" and "nothing was changed" in inside["message"]
    assert not run_dir.exists()  # nothing written
    rc, third = attach_cli(str(run_dir), "--pid", str(proc.pid), "--wait", "10")
    assert rc == 33 and third["status"] == "no_trainer"  # a new try, answered at once
    assert third["pause_ms"] < 5000 and third["stopped_ms"] > 0


# ---- another user --------------------------------------------------------------------


@pytest.fixture
def other_user() -> Iterator[tuple[str, int, int]]:
    need(os.geteuid() == 0 and shutil.which("useradd") is not None, "root and useradd")
    name = f"e3att{uuid.uuid4().hex[:6]}"
    assert useradd("-m", "-s", "/bin/sh", name).returncode == 0
    import pwd

    entry = pwd.getpwnam(name)
    try:
        yield name, entry.pw_uid, entry.pw_gid
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], check=False, capture_output=True)
        subprocess.run(["userdel", "-r", name], check=False, capture_output=True)


def agent_as(
    user: str, request: dict[str, Any], python: str = "/usr/bin/python3"
) -> dict[str, Any]:
    """The real agent, run by ``user`` with the system's Python (what an SSH login as
    that user runs); its result event."""
    proc = subprocess.run(
        ["runuser", "-u", user, "--", python, "-c", BOOTSTRAP, AGENT_TAG],
        input=agent_payload(request),
        capture_output=True,
        timeout=60,
        cwd="/",
    )
    for line in proc.stdout.splitlines():
        if line.startswith(b"J "):
            event = json.loads(line[2:])
            if event.get("event") == "result":
                return dict(event)
    raise AssertionError(proc.stderr.decode(errors="replace")[-2000:])


def test_another_users_process_is_refused_and_root_may(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]], other_user: tuple[str, int, int]
) -> None:
    name, uid, gid = other_user
    need(os.path.exists("/usr/bin/python3"), "a system python3 the other user may run")
    mine = python_loop(tmp_path, procs)  # root's
    out = agent_as(name, {"op": "attach", "step": "plan", "pid": mine.pid})
    assert out["status"] == "refused" and out["reason"] == "permission", out
    assert "attach as root" in out["message"] and name in out["message"]
    # the other way round: root may trace the user's process, and writes as that user
    home = Path(f"/home/{name}")
    script = home / "loop.py"
    script.write_text(LOOP)
    os.chown(script, uid, gid)
    theirs = start(["runuser", "-u", name, "--", "/usr/bin/python3", str(script)], home)
    procs.append(theirs)

    def their_python() -> int | None:
        for line in subprocess.run(["pgrep", "-u", name, "-f", "loop.py"], capture_output=True,
                                   text=True).stdout.split():  # fmt: skip
            return int(line)
        return None

    wait_until(lambda: their_python() is not None, 20, "the user's python")
    pid = their_python()
    assert pid is not None
    plan = asyncio.run(attach_plan(LocalHost(), None, pid))
    assert isinstance(plan, AttachResult), plan
    assert plan.reason == "not_trainer", plan  # past the permission and Python checks
    written = userfiles.as_user(uid, gid, lambda: str(userfiles.cache_dir(uid)))
    assert written == str(home / ".cache" / "eagle3-tui")
    package = {"eagle3_tui/__init__.py": "x = 1\n"}
    lib = userfiles.as_user(uid, gid, userfiles.write_lib, Path(written), package)
    assert os.stat(lib).st_uid == uid and os.stat(Path(lib).parent).st_uid == uid
