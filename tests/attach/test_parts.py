"""The pieces of a live attach that need no process to inject into: command lines, the
gdb script, gdb's answers, the 3.14 path's arguments and refusals, the package written
on the host, the stack record from telemetry to the diagnosis."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.agent import attach as at
from eagle3_tui.agent import debugger, processes, pyprocess, userfiles
from eagle3_tui.model.health import diagnose
from eagle3_tui.model.run import Run
from eagle3_tui.model.summary import summarize
from eagle3_tui.model.verdict import Health
from eagle3_tui.reports import ATTACH_EXIT, attach_exit_status, format_attach, format_attach_plan
from eagle3_tui.telemetry import procs, rerun, stacks
from eagle3_tui.transport.bundle import telemetry_library
from eagle3_tui.transport.replies import AttachPlan, AttachResult
from tests.conftest import wait_until
from tests.records import Lines

T0 = 1_800_000_000.0

# ---- command lines -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "head", "program"),
    [
        (["python", "train.py", "-x", "1"], ["python"], ["train.py", "-x", "1"]),
        (["py", "-u", "-X", "dev", "t.py"], ["py", "-u", "-X", "dev"], ["t.py"]),
        (["py", "-Wignore", "-m", "pkg.mod", "a"], ["py", "-Wignore"], ["-m", "pkg.mod", "a"]),
        (["py", "-mpkg", "a"], ["py"], ["-m", "pkg", "a"]),
        (["py", "-uc", "print(1)", "z"], ["py", "-u"], ["-c", "print(1)", "z"]),
        (["py", "-OO", "-uXfaulthandler", "t.py"], ["py", "-OO", "-u", "-Xfaulthandler"], ["t.py"]),
        (["py", "--check-hash-based-pycs", "never", "t.py"],
         ["py", "--check-hash-based-pycs", "never"], ["t.py"]),
    ],
)  # fmt: skip
def test_python_command_lines_split_into_interpreter_and_program(
    argv: list[str], head: list[str], program: list[str]
) -> None:
    assert rerun.split_python_argv(argv) == (head, program)


@pytest.mark.parametrize("argv", [["python"], ["python", "-u"], ["python", "-"], ["py", "-c"]])
def test_no_program_no_resume_command(argv: list[str]) -> None:
    assert rerun.split_python_argv(argv) is None
    assert rerun.resume_command(argv, "/lib", "/run") is None


def test_the_resume_command_wraps_the_same_command_line() -> None:
    cmd = rerun.resume_command(
        ["python3", "-u", "train.py", "--lr", "1"], "/c/lib", "/runs/x", python="/usr/bin/py3"
    )
    assert cmd == [
        "/usr/bin/py3",
        "-u",
        "-c",
        rerun.BOOTSTRAP,
        "/c/lib",
        "/runs/x",
        "--",
        "train.py",
        "--lr",
        "1",
    ]


# ---- gdb -----------------------------------------------------------------------------


def test_the_python_line_is_valid_and_survives_the_c_string() -> None:
    entry = "/home/a b/.cache/eagle3-tui/attach/x-1-2/entry.py"
    line = debugger.python_line(entry)
    compile(line, "<attach>", "exec")
    literal = debugger.c_string(line)
    assert literal.startswith('"') and "\n" not in literal and '"' not in literal[1:-1]
    # gdb reads octal escapes as C does: the same bytes come out
    assert literal[1:-1].encode().decode("unicode_escape").encode("latin-1") == line.encode()
    weird = "/tmp/é\"'\\$(x)\n.py"
    assert debugger.c_string(weird)[1:-1].encode().decode("unicode_escape").encode(
        "latin-1"
    ) == weird.encode("utf-8")


def test_the_gdb_script_loads_two_libraries_and_guards_the_page() -> None:
    script = debugger.gdb_script(4242, "pass\n", "/usr/lib/libpython3.11.so.1.0")
    lines = script.splitlines()
    assert lines.index("set auto-solib-add off") < lines.index("attach 4242")
    assert "sharedlibrary libpython3\\.11\\.so\\.1\\.0" in lines
    assert "set unwindonsignal on" in lines
    guard = lines.index("if (long) $buf == -1 || (long) $buf == 0")
    assert lines[guard + 3].strip().startswith("call (void) strcpy($buf, ")
    assert lines[-2] == "detach"
    assert "sharedlibrary libpython" not in debugger.gdb_script(1, "pass\n", None)  # a static build
    cmd = debugger.gdb_command("/usr/bin/gdb", "/tmp/s.gdb")
    assert cmd[:3] == ["/usr/bin/gdb", "-nx", "-batch"] and cmd[-2:] == ["-x", "/tmp/s.gdb"]
    assert "set auto-load off" in cmd and "set debuginfod enabled off" in cmd


@pytest.mark.parametrize(
    ("output", "queued", "reason", "problem"),
    [
        ("EAGLE3_T0=10.000\n$1 = 0\nEAGLE3_T1=10.250\n", True, None, None),
        ("ptrace: Operation not permitted.\n", False, "permission", "SYS_PTRACE"),
        ("EAGLE3_MMAP_FAILED\n", False, None, "mmap failed"),
        ('No symbol "Py_AddPendingCall" in current context.\n', False, None, "does not export"),
        ("$1 = -1\n", False, None, "returned -1"),
        ("something else\n", False, None, "did not queue"),
    ],
)
def test_gdb_answers(output: str, queued: bool, reason: str | None, problem: str | None) -> None:
    out = debugger.parse_gdb(output)
    assert out["queued"] is queued
    assert out.get("reason") == reason
    if problem is not None:
        assert problem in out["problem"]
    if queued:
        assert out["stopped_ms"] == 250.0


# ---- CPython 3.14: sys.remote_exec (untested against a real 3.14 here) ---------------


def test_remote_exec_is_run_by_the_targets_interpreter() -> None:
    cmd = debugger.remote_exec_command("/opt/py314/bin/python3.14", 77, "/c/entry.py")
    assert cmd[:3] == ["/opt/py314/bin/python3.14", "-I", "-S"]
    assert cmd[-2:] == ["77", "/c/entry.py"]
    assert "sys.remote_exec(int(sys.argv[1]), sys.argv[2])" in cmd[4]


@pytest.mark.parametrize(
    ("argv", "env", "why"),
    [
        (["python3.14", "-X", "disable_remote_debug", "t.py"], {}, "-X disable_remote_debug"),
        (["python3.14", "-Xdisable_remote_debug", "t.py"], {}, "-Xdisable_remote_debug"),
        (["python3.14", "t.py"], {"PYTHON_DISABLE_REMOTE_DEBUG": "1"}, "PYTHON_DISABLE_REMOTE"),
        (["python3.14", "t.py", "-X", "disable_remote_debug"], {}, None),  # the script's args
        (["python3.14", "-u", "t.py"], {"PYTHON_DISABLE_REMOTE_DEBUG": ""}, None),
    ],
)
def test_remote_debugging_disabled_in_the_target(
    argv: list[str], env: dict[str, str], why: str | None
) -> None:
    problem = pyprocess.remote_debug_problem(9, argv, env)
    if why is None:
        assert problem is None
    else:
        assert problem is not None and why in problem


def test_an_interpreter_without_remote_exec_says_so() -> None:
    # 3.11 has no sys.is_remote_debug_enabled: unknown, not "disabled"
    assert pyprocess.build_allows_remote_debug(sys.executable) is None


# ---- permission rules -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("uids", "cap", "scope", "expect"),
    [
        ([1000, 1000, 1000, 1000], False, None, None),
        ([1000, 1000, 1000, 1000], False, 0, None),
        ([0, 0, 0, 0], False, None, "without CAP_SYS_PTRACE"),
        ([0, 0, 0, 0], True, None, None),
        ([1000, 1000, 1000, 1000], False, 1, "sudo sysctl kernel.yama.ptrace_scope=0"),
        ([1000, 1000, 1000, 1000], True, 1, None),
        ([1000, 1000, 1000, 1000], False, 2, "only a process with CAP_SYS_PTRACE"),
        ([1000, 1000, 1000, 1000], True, 3, "until it reboots"),
    ],
)
def test_ptrace_permission_rules(
    monkeypatch: pytest.MonkeyPatch,
    uids: list[int],
    cap: bool,
    scope: int | None,
    expect: str | None,
) -> None:
    monkeypatch.setattr(pyprocess, "status_ids", lambda pid: {"Uid": uids})
    monkeypatch.setattr(pyprocess, "has_ptrace_capability", lambda: cap)
    monkeypatch.setattr(pyprocess, "ptrace_scope", lambda: scope)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    problem = pyprocess.permission_problem(4242)
    if expect is None:
        assert problem is None
    else:
        assert problem is not None and expect in problem


def test_own_capabilities_are_read() -> None:
    caps = pyprocess.own_capabilities()
    if os.geteuid() == 0:
        assert caps != 0  # root here has a capability set (CapEff)


# ---- which interpreter ----------------------------------------------------------------


def _sleeper(exe: str, code: str = "import time; time.sleep(60)") -> subprocess.Popen[bytes]:
    return subprocess.Popen([exe, "-c", code], stdin=subprocess.DEVNULL)


def _wait_exec(proc: subprocess.Popen[bytes], name: str) -> None:
    wait_until(
        lambda: name in (pyprocess.exe_path(proc.pid) or ""), 10, f"the exec of {name}", 0.01
    )


@pytest.mark.parametrize("exe", [sys.executable, "/usr/bin/python3.11"])
def test_python_version_from_libpython_or_the_binary(exe: str) -> None:
    if not os.path.exists(exe):
        pytest.skip(f"{exe} is not here")
    proc = _sleeper(exe)
    try:
        _wait_exec(proc, "python")
        time.sleep(0.3)  # libraries mapped
        py = pyprocess.python_of(proc.pid)
        assert py is not None and py.implementation == "cpython"
        assert py.version == sys.version_info[:2] or py.version == (3, 11)
        assert py.how in ("libpython", "name")
        maps = pyprocess.mapped_files(proc.pid)
        assert pyprocess.training_evidence(proc.pid, ["python", "-c", "x"], maps)[0] is False
    finally:
        proc.kill()
        proc.wait()


def test_a_non_python_process_is_not_python() -> None:
    proc = subprocess.Popen(["sleep", "60"])
    try:
        _wait_exec(proc, "sleep")
        assert pyprocess.python_of(proc.pid) is None
    finally:
        proc.kill()
        proc.wait()


# ---- the package on the host ----------------------------------------------------------


def test_the_package_is_written_once_privately_and_imports(tmp_path: Path) -> None:
    sources = telemetry_library()
    assert "attach" in sources["eagle3_tui/telemetry/__init__.py"]  # the real one, not empty
    assert "eagle3_tui/telemetry/inject.py" in sources
    assert not any("agent" in name or "model" in name for name in sources)
    lib = Path(userfiles.write_lib(tmp_path, sources))
    assert stat.S_IMODE(lib.stat().st_mode) == 0o700
    assert userfiles.write_lib(tmp_path, sources) == str(lib)  # same content: same directory
    assert len(list((tmp_path / "lib").iterdir())) == 1
    changed = dict(sources, **{"eagle3_tui/telemetry/extra.py": "x = 1\n"})
    assert userfiles.write_lib(tmp_path, changed) != str(lib)
    with pytest.raises(ValueError, match="bad file name"):
        userfiles.write_lib(tmp_path, {"../evil.py": ""})
    code = "from eagle3_tui.telemetry import attach, inject; print(inject.__file__)"
    out = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(lib)!r}); {code}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.startswith(str(lib))


# ---- exit statuses and reports -------------------------------------------------------


def test_each_refusal_has_its_exit_status() -> None:
    assert attach_exit_status(AttachResult(status="attached")) == 0
    assert attach_exit_status(AttachPlan(pid=1)) == 0
    assert attach_exit_status(AttachResult(status="already", reason="already")) == 31
    assert attach_exit_status(AttachResult(status="queued")) == 32
    for reason in (at.GONE, at.REUSED, at.PERMISSION, at.NOT_PYTHON, at.UNSUPPORTED):
        refused = AttachResult(status="refused", reason=reason)
        assert attach_exit_status(refused) == ATTACH_EXIT[reason]
    assert attach_exit_status(AttachResult(status="no_trainer", reason=at.NOT_TRAINER)) == 33
    assert attach_exit_status(AttachResult(status="failed", reason=at.FAILED)) == 35
    codes = {ATTACH_EXIT[r] for r in (at.GONE, at.PERMISSION, at.NOT_TRAINER, at.NO_GDB)}
    assert len(codes) == 4
    assert ATTACH_EXIT[at.TRACED] == ATTACH_EXIT[at.PERMISSION] == 21
    assert ATTACH_EXIT[at.GDB_UNUSABLE] == ATTACH_EXIT[at.NO_GDB] == 34


@pytest.mark.parametrize(
    ("mechanism", "stopped_ms", "registers", "said"),
    [
        ("ptrace", 1.43, "verified", "main thread stopped 1.4 ms by eagle3-tui's injector, "
         "registers given back and checked"),
        ("ptrace", 12.6, "differs", "main thread stopped 13 ms by eagle3-tui's injector, "
         "registers read back DIFFERENT"),
        ("gdb", 212.4, None, "process stopped 212 ms by gdb"),
    ],
)  # fmt: skip
def test_the_report_shows_the_pause_and_the_first_metric(
    mechanism: str, stopped_ms: float, registers: str | None, said: str
) -> None:
    text = format_attach(
        AttachResult(
            status="attached",
            message="telemetry attached after step 7",
            global_step=7,
            total_steps=72,
            epochs=3,
            run_dir="/r",
            stopped_ms=stopped_ms,
            registers=registers,
            pause_ms=38.9,
            first_step=7,  # the record's 0-based step: the 8th step
            first_metric_s=0.61,
            plan=AttachPlan(pid=1, mechanism=mechanism),
        )
    )
    assert said in text and "attach for 39 ms" in text
    assert "metrics of step 8 0.6 s after the attach" in text  # numbered as every view


@pytest.mark.parametrize(
    ("mechanism", "injector_problem", "said"),
    [
        ("ptrace", None, "eagle3-tui's injector (ptrace)"),
        ("gdb", "pid 9 uses musl libc (ld-musl-x86_64.so.1): eagle3-tui's injector supports "
         "glibc only", "gdb: Py_AddPendingCall"),
        ("remote_exec", None, "sys.remote_exec (PEP 768)"),
    ],
)  # fmt: skip
def test_the_plan_names_the_way_in(mechanism: str, injector_problem: str | None, said: str) -> None:
    plan = AttachPlan(pid=9, mechanism=mechanism, injector_problem=injector_problem)
    how = next(ln for ln in format_attach_plan(plan).splitlines() if ln.startswith("  how"))
    assert said in how
    if injector_problem:
        assert "not eagle3-tui's injector: pid 9 uses musl libc" in how


# ---- stacks: from telemetry to the diagnosis ----------------------------------------


def blocked_in_a_known_function(ready: threading.Event, release: threading.Event) -> None:
    ready.set()
    release.wait()


def test_the_stack_of_a_blocked_thread_names_the_function() -> None:
    ready, release = threading.Event(), threading.Event()
    t = threading.Thread(target=blocked_in_a_known_function, args=(ready, release))
    t.start()
    ready.wait()
    try:
        assert t.ident is not None
        payload = stacks.capture(main_ident=t.ident)
        funcs = [f["func"] for f in payload["frames"]]
        assert "blocked_in_a_known_function" in funcs
        mine = payload["frames"][funcs.index("blocked_in_a_known_function")]
        assert mine["file"] == __file__ and mine["origin"] == "user"
        assert payload["frames"][0]["origin"] == "stdlib"  # Event.wait, innermost
    finally:
        release.set()
        t.join()


def test_a_stack_is_written_only_when_the_steps_stop() -> None:
    clock = [0.0]
    step: list[int | None] = [None]
    written: list[dict[str, Any]] = []
    watch = stacks.StallWatch(lambda: step[0], written.append, clock=lambda: clock[0])
    clock[0] = 100.0
    assert not watch.tick() and not written  # a long start-up is not a stall
    for s in range(20):  # a step per second
        clock[0] = float(s)
        step[0] = s
        assert not watch.tick()
    assert watch.limit() == stacks.STACK_MIN_QUIET_S  # 5 x 1 s is less than the floor
    clock[0] = 19.0 + stacks.STACK_MIN_QUIET_S - 1
    assert not watch.tick() and not written
    clock[0] = 19.0 + stacks.STACK_MIN_QUIET_S + 0.5
    assert watch.tick() and written[0]["step"] == 19 and written[0]["frames"]
    clock[0] += 1
    assert not watch.tick()  # not looked at again before RECHECK_S
    clock[0] += stacks.RECHECK_S
    watch.tick()
    assert len(written) <= 2  # again only if the stack moved
    step[0] = 20
    clock[0] += 1
    assert not watch.tick()  # it moves again: quiet starts over
    slow = stacks.StallWatch(lambda: step[0], written.append, clock=lambda: clock[0])
    for s in range(21, 30):  # a step every 10 s
        clock[0] += 10
        step[0] = s
        slow.tick()
    assert slow.limit() == 50.0


def stalled_run(stack_ts: float) -> Run:
    lines = Lines(t0=T0, dt=1.0)
    data = b"".join(lines.train(s, 2.0) for s in range(30))
    data += lines.at(T0 + 29).io(0.0) + lines.at(T0 + 40).io(0.0)
    frames = [
        {"func": "Condition.wait", "file": "/usr/lib/python3.11/threading.py", "line": 331,
         "origin": "stdlib"},
        {"func": "wait_for_a_lost_rank", "file": "/home/u/train.py", "line": 97,
         "origin": "user"},
        {"func": "Module._call_impl", "file": "/v/site-packages/torch/nn/modules/module.py",
         "line": 1784, "origin": "library"},
        {"func": "Trainer.train_epoch", "file": "/v/site-packages/speculators/train/trainer.py",
         "line": 512, "origin": "library"},
    ]  # fmt: skip
    data += lines.at(stack_ts).make("stack", step=29, quiet_s=21.0, thread="MainThread",
                                    frames=frames, threads=[])  # fmt: skip
    run = Run()
    run.feed(0, data)
    run.state.liveness.set_process(True, T0 + 100)
    return run


def test_a_stalled_run_says_where_it_is_stuck() -> None:
    run = stalled_run(T0 + 50)
    d = diagnose(run.state, T0 + 100)
    where = (
        "Condition.wait (threading.py:331) ← wait_for_a_lost_rank (train.py:97) "
        "← Trainer.train_epoch (trainer.py:512)"
    )
    assert d.health == Health.STALLED and f"stuck in {where}" in d.reason
    summary = summarize(run.state, T0 + 100)
    assert summary["stuck"]["where"] == where
    assert summary["stuck"]["frames"][1]["file"] == "/home/u/train.py"
    json.dumps(summary)


def test_a_stack_from_before_the_last_step_is_not_shown() -> None:
    run = stalled_run(T0 + 10)  # taken during an earlier pause: steps came after it
    assert "stuck in" not in diagnose(run.state, T0 + 100).reason
    assert summarize(run.state, T0 + 100)["stuck"] is None


def test_a_bad_stack_record_moves_nothing() -> None:
    lines = Lines(t0=T0, dt=1.0)
    run = Run()
    run.feed(0, lines.make("stack", frames="not a list") + lines.make("stack", frames=[{"x": 1}]))
    assert run.state.samplers.stack is None
    assert run.state.malformed_count == 0


# ---- an injected line that stopped before the entry's own code ----------------------


def test_the_lines_failure_is_read_as_one_cut_printable_line(tmp_path: Path) -> None:
    """Written by the trainer's process: untrusted text, cut, the file taken."""
    entry = str(tmp_path / "entry.py")
    failed = Path(debugger.failed_file(entry))
    failed.write_bytes(b"ModuleNotFoundError: No module named 'os.path'\x1b[2J\n\x00" + b"x" * 5000)
    said = at.take_failure(str(failed))
    assert said is not None and said.startswith("ModuleNotFoundError: No module named 'os.path'")
    assert "\x1b" not in said and "\x00" not in said and len(said) <= 301
    assert not failed.exists()
    assert at.take_failure(str(failed)) is None
    # the line writes it with builtins only, and compiles
    line = debugger.python_line(entry)
    compile(line, "<attach>", "exec")
    assert repr(str(failed)) in line and "import" not in line.split("except BaseException")[1]


IN_A_TRAINER = """
import json, sys, _thread
e, f = "the trainer's e", "the trainer's f"  # names a training script may have
line, marker, failed = sys.argv[1], sys.argv[2], sys.argv[3]
boot = sys.modules["_frozen_importlib"]
locks = boot._blocking_on
said = {"plain_dict": type(locks) is dict, "runpy_before": "runpy" in sys.modules}
if said["plain_dict"]:  # as inside _ModuleLock.acquire, where the CI run's line landed
    locks[_thread.get_ident()] = object()
exec(line, globals())
said["ran_in_lock"] = __import__("os").path.exists(marker)
said["failed_in_lock"] = open(failed).read() if __import__("os").path.exists(failed) else None
said["runpy_in_lock"] = "runpy" in sys.modules
locks.pop(_thread.get_ident(), None)
exec(line, globals())
said["ran_after"] = __import__("os").path.exists(marker)
open(sys.argv[4], "w").write("raise ValueError('the entry failed')\\n")
exec(sys.argv[5], globals())  # a line whose entry raises: the failure path
said["failed_entry"] = open(sys.argv[6]).read()
said["names"] = [e, f, "__eagle3_tui_error" in globals()]
print(json.dumps(said))
"""


def test_the_line_waits_out_an_import_lock_and_leaves_the_trainers_names(
    tmp_path: Path,
) -> None:
    """Seen in CI: a line queued while the interpreter was still importing ``site`` ran
    inside ``_ModuleLock.acquire``; its own import deleted the outer import's entry in
    ``_blocking_on`` and the process died (``KeyError`` out of ``import site``). Inside
    a lock's acquire the line now says so and is tried again; and neither its failure
    path nor its check touches the trainer's own globals (``e``, ``f``)."""
    entry, raising = tmp_path / "entry.py", tmp_path / "raising.py"
    marker = tmp_path / "ran"
    entry.write_text(f"open({str(marker)!r}, 'w').close()\n")
    failed = debugger.failed_file(str(entry))
    proc = subprocess.run(
        [
            *(sys.executable, "-c", IN_A_TRAINER, debugger.python_line(str(entry))),
            *(str(marker), failed, str(raising), debugger.python_line(str(raising))),
            debugger.failed_file(str(raising)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    said = json.loads(proc.stdout)
    if said["plain_dict"]:  # Python 3.11 and older: not run inside the lock, said why
        assert not said["ran_in_lock"], said
        assert said["failed_in_lock"].startswith("ImportError: the trainer was taking"), said
        assert said["runpy_in_lock"] == said["runpy_before"], said
    assert said["ran_after"], said
    assert said["failed_entry"] == "ValueError: the entry failed", said
    assert said["names"] == ["the trainer's e", "the trainer's f", False], said


def test_an_attach_whose_line_failed_may_be_tried_again(tmp_path: Path) -> None:
    """Injected, then the line failed (``.failed``): not "queued" for ever."""
    sources = {"eagle3_tui/__init__.py": "__version__ = '0'\n"}
    me = processes.proc_stat(os.getpid())
    assert me is not None
    key = userfiles.attach_key(os.getpid(), me.start, processes.boot_id())  # a live process
    first = userfiles.prepare(str(tmp_path), key, sources, {"pid": 1})
    assert first["state"] == "ready"
    userfiles.mark_injected(first["dir"])
    assert userfiles.prepare(str(tmp_path), key, sources, {"pid": 1})["state"] == "queued"
    Path(debugger.failed_file(first["entry"])).write_text("AttributeError: half made")
    again = userfiles.prepare(str(tmp_path), key, sources, {"pid": 1})
    assert again["state"] == "ready"
    assert not Path(debugger.failed_file(first["entry"])).exists()


def test_the_python_a_process_was_started_with_keeps_its_virtual_environment(
    tmp_path: Path,
) -> None:
    """A training started as ``python train.py`` from an activated virtual environment:
    its ``/proc/PID/exe`` is the base interpreter the environment's ``python`` links to,
    and a resume through that lost the environment's packages (its first import failed).
    The relaunch takes the ``python`` its own PATH found, where it is that same binary."""
    from eagle3_tui.agent.attach import invoked_python

    env_bin = tmp_path / "venv" / "bin"
    env_bin.mkdir(parents=True)
    base = os.path.realpath(sys.executable)
    (env_bin / "python").symlink_to(base)
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "python").write_text("#!/bin/sh\n")  # another binary of that name, first
    (decoy / "python").chmod(0o755)
    path = f"{decoy}:{env_bin}:/usr/bin:/bin"
    proc = subprocess.Popen(
        ["python", "-c", "import time; time.sleep(30)"],
        executable=str(env_bin / "python"),
        env={"PATH": path},
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 10
        while "time.sleep" not in " ".join(procs.cmdline(proc.pid) or []):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        exe = os.path.realpath(f"/proc/{proc.pid}/exe")
        assert exe == base
        assert invoked_python(proc.pid, "python", exe) == str(env_bin / "python")  # not decoy
        assert invoked_python(proc.pid, "./venv/bin/python", exe) == str(env_bin / "python")
        assert invoked_python(proc.pid, "/abs/python", exe) == exe  # absolute: as it is
        assert invoked_python(proc.pid, "python3.99", exe) == exe  # nothing found
    finally:
        proc.kill()
        proc.wait(10)
