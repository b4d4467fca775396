"""eagle3-tui's injector (agent/ptrace.py) on real processes, no gdb anywhere:

* targets that check every result they compute (tests/attach/targets.py: SIMD math in
  numpy and torch, a thread pool, a 1 ms SIGALRM timer, the main thread blocked in
  read, select, sleep, a lock, waitpid), injected into 40 times each, together: no
  wrong result, no exception (EINTR, errno 512-516), no death, every line ran;
* signals that arrive while the main thread is stopped are delivered once each;
* a call that faults or never returns leaves the target as it was;
* what it refuses, with the reason (a process stopped by job control, an interpreter
  that does not export the functions, musl, another tracer).
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.agent import ptrace, pyprocess
from eagle3_tui.agent.debugger import python_line
from tests.conftest import interpreters, need, wait_until
from tests.transport.conftest import cli

TARGETS = Path(__file__).with_name("targets.py")
ROUNDS = 40


class Target:
    """A self-checking process of ``targets.py``, and the line that, injected, adds a
    line to its ``ran`` file."""

    def __init__(self, kind: str, root: Path) -> None:
        self.kind = kind
        self.dir = root / kind
        self.dir.mkdir()
        self.ran = self.dir / "ran"
        entry = self.dir / "entry.py"
        entry.write_text(
            f"import os\nwith open({str(self.ran)!r}, 'a') as f:\n"
            "    f.write(f'{os.getpid()}\\n')\n"
        )
        self.line = python_line(str(entry)).encode()
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            [sys.executable, str(TARGETS), kind, str(self.dir)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        self.libpython: str | None = None

    def ready(self) -> bool:
        assert self.proc.poll() is None, self.proc.communicate()[1].decode()[-2000:]
        if not (self.dir / "ready").exists():
            return False
        py = pyprocess.python_of(self.proc.pid)
        assert py is not None
        self.libpython = py.libpython
        return True

    def runs(self) -> int:
        """How many injected lines ran (each wrote its PID: it must be this process's)."""
        if not self.ran.exists():
            return 0
        pids = self.ran.read_text().split()
        assert set(pids) <= {str(self.proc.pid)}
        return len(pids)

    def has_run(self, n: int) -> bool:
        return self.runs() >= n

    def inject(self) -> dict[str, Any]:
        return ptrace.queue_line(self.proc.pid, self.line, self.libpython)

    def finish(self) -> dict[str, Any]:
        (self.dir / "stop").touch()
        out, err = self.proc.communicate(timeout=30)
        assert self.proc.returncode == 0, f"{self.kind} died: {err.decode()[-2000:]}"
        report: dict[str, Any] = json.loads(out)
        return report


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[Target]]:
    targets: list[Target] = []
    yield targets
    for t in targets:
        if t.proc.poll() is None:
            t.proc.kill()
            t.proc.communicate()


def start_all(kinds: list[str], root: Path, started: list[Target]) -> list[Target]:
    for kind in kinds:
        started.append(Target(kind, root))
    for t in started:
        wait_until(t.ready, 120, f"the {t.kind} target")
    return started


def inject_rounds(targets: list[Target], rounds: int) -> dict[str, list[dict[str, Any]]]:
    """``rounds`` injections into each target, round-robin; each line must run before
    the next round. The injector's outcomes, by target."""
    outcomes: dict[str, list[dict[str, Any]]] = {t.kind: [] for t in targets}
    for n in range(1, rounds + 1):
        for t in targets:
            out = t.inject()
            assert out["queued"] and out["restored"] == "verified", (t.kind, out)
            outcomes[t.kind].append(out)
        for t in targets:
            wait_until(partial(t.has_run, n), 30, f"{t.kind}: line {n} to run")
    return outcomes


def check_reports(targets: list[Target], rounds: int) -> list[dict[str, Any]]:
    reports = [t.finish() for t in targets]
    for t, report in zip(targets, reports, strict=True):
        assert report["errors"] == [], report
        assert report["wrong"] == 0, report
        assert report["iterations"] >= rounds, report
        assert t.runs() == rounds  # each line once
    return reports


BLOCKED = ["read", "select", "sleep", "lock", "waitpid"]
BUSY = ["numpy", "pool", "timer"]


@pytest.mark.slow
def test_forty_injections_into_busy_and_blocked_targets_change_nothing(
    tmp_path: Path, started: list[Target]
) -> None:
    """The main thread stopped in SIMD loops, waiting for a thread pool, under a 1 ms
    timer, and inside read/select/sleep/lock/waitpid (each syscall is interrupted by the
    stop and must restart as if nothing happened): 40 injections each, all at once."""
    targets = start_all(BUSY + BLOCKED, tmp_path, started)
    time.sleep(0.5)  # every target in its loop
    outcomes = inject_rounds(targets, ROUNDS)
    reports = check_reports(targets, ROUNDS)
    timer = next(r for r in reports if r["kind"] == "timer")
    # the timer kept firing throughout (deliveries coalesce when the CPUs are busy), and
    # SIGALRMs that came while its main thread was stopped were held and given back
    assert timer["ticks"] > timer["ms"] / 20, timer
    assert any("SIGALRM" in out["signals"] for out in outcomes["timer"])
    stops = [float(out["stopped_ms"]) for got in outcomes.values() for out in got]
    assert statistics.median(stops) < 50, sorted(stops)


@pytest.mark.slow
def test_forty_injections_into_torch_math(tmp_path: Path, started: list[Target]) -> None:
    need(importlib.util.find_spec("torch") is not None, "torch is not installed")
    targets = start_all(["torch"], tmp_path, started)
    time.sleep(0.5)
    inject_rounds(targets, ROUNDS)
    check_reports(targets, ROUNDS)


# ---- signals that arrive while the main thread is stopped -----------------------------

SIGNALLED = """
import json, os, signal, sys, time
r, w = os.pipe()
os.set_blocking(w, False)
os.set_blocking(r, False)
signal.set_wakeup_fd(w, warn_on_full_buffer=False)  # one byte per delivery, in C
for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGRTMIN):
    signal.signal(s, lambda s, f: None)
errors = []
open(sys.argv[1], "w").close()
while not os.path.exists(sys.argv[2]):
    try:
        t = time.monotonic()
        time.sleep(0.2)
        assert time.monotonic() - t >= 0.195
    except BaseException as e:
        errors.append(repr(e))
try:
    got = os.read(r, 1000)
except BlockingIOError:  # nothing delivered
    got = b""
counts = {signal.Signals(s).name: got.count(s) for s in set(got)}
print(json.dumps({"delivered": counts, "errors": errors}), flush=True)
"""


def test_signals_sent_while_stopped_are_each_delivered_after(tmp_path: Path) -> None:
    """SIGUSR1, SIGUSR2 and SIGRTMIN twice (sigqueue), sent while the injector holds the
    main thread stopped: the line is queued, the four signals are delivered once each
    (counted in the process by its signal wakeup fd), the sleep they interrupt goes on."""
    ready, stop = tmp_path / "ready", tmp_path / "stop"
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGNALLED, str(ready), str(stop)], stdout=subprocess.PIPE
    )
    try:
        wait_until(ready.exists, 30, "the target")
        time.sleep(0.3)
        py = pyprocess.python_of(proc.pid)
        assert py is not None
        where = ptrace.locate(proc.pid, py.libpython)
        traced = ptrace.Traced(proc.pid)
        traced.stop()  # single-threaded: a process-directed signal waits for this thread
        os.kill(proc.pid, signal.SIGUSR1)
        os.kill(proc.pid, signal.SIGUSR2)
        queue = ctypes.CDLL(None, use_errno=True).sigqueue
        queue.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        for value in (1, 2):
            assert queue(proc.pid, signal.SIGRTMIN, value) == 0
        ran = tmp_path / "ran"
        (tmp_path / "entry.py").write_text(f"open({str(ran)!r}, 'w').close()\n")
        out = ptrace.queue_in(traced, where, python_line(str(tmp_path / "entry.py")).encode())
        assert out["queued"] and out["restored"] == "verified", out
        assert sorted(out["signals"]) == ["SIGRTMIN", "SIGRTMIN", "SIGUSR1", "SIGUSR2"]
        wait_until(ran.exists, 10, "the line")
        time.sleep(0.5)
    finally:
        stop.touch()
        printed = proc.communicate(timeout=10)[0].decode()
    assert proc.returncode == 0
    seen = json.loads(printed)
    assert seen == {"delivered": {"SIGUSR1": 1, "SIGUSR2": 1, "SIGRTMIN": 2}, "errors": []}


# ---- a call that goes wrong leaves the target as it was --------------------------------

COUNTER = """
import sys, time
out = open(sys.argv[1], "ab", buffering=0)
while True:
    out.write(b"x")  # the file's size counts the loop's turns
    time.sleep(0.01)
"""


def counting(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    count = tmp_path / "count"
    proc = subprocess.Popen([sys.executable, "-c", COUNTER, str(count)])
    wait_until(lambda: count.exists() and count.stat().st_size, 30, "the counter")
    return proc, count


def goes_on(proc: subprocess.Popen[bytes], count: Path) -> None:
    before = count.stat().st_size
    time.sleep(0.3)
    assert proc.poll() is None
    assert count.stat().st_size > before + 5


@pytest.mark.parametrize("how", ["faults", "never_returns"])
def test_a_call_that_goes_wrong_gives_the_target_back_unharmed(tmp_path: Path, how: str) -> None:
    """The call pointed at an unmapped address (SIGSEGV inside the call) or at libc's
    ``pause`` (it never returns: past the limit the thread is stopped again): nothing
    queued, the saved registers back, the target counts on."""
    proc, count = counting(tmp_path)
    try:
        py = pyprocess.python_of(proc.pid)
        assert py is not None
        where = ptrace.locate(proc.pid, py.libpython)
        if how == "faults":
            where = where._replace(add_pending_call=0x10)
        else:
            maps = ptrace.mappings(proc.pid)
            libc = next(m.path for m in maps if m.path.endswith("libc.so.6"))
            mem = ptrace.Memory(proc.pid)
            try:
                pause = ptrace._symbols(mem, maps, libc, (b"pause",))[b"pause"]
            finally:
                mem.close()
            where = where._replace(add_pending_call=pause)
        traced = ptrace.Traced(proc.pid)
        traced.stop()
        out = ptrace.queue_in(traced, where, b"pass")
        assert not out["queued"] and out["restored"] == "verified", out
        expect = "SIGSEGV" if how == "faults" else "did not return"
        assert expect in out["problem"], out
        goes_on(proc, count)
    finally:
        proc.kill()
        proc.wait()


# ---- refusals ----------------------------------------------------------------------


def test_a_process_stopped_by_job_control_is_left_stopped(tmp_path: Path) -> None:
    proc, count = counting(tmp_path)
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        wait_until(lambda: ptrace._state(proc.pid) == "T", 10, "the stop")
        py = pyprocess.python_of(proc.pid)
        assert py is not None
        out = ptrace.queue_line(proc.pid, b"pass", py.libpython)
        assert not out["queued"] and "is stopped (SIGSTOP" in out["problem"], out
        assert f"kill -CONT {proc.pid}" in out["problem"]
        time.sleep(0.2)
        assert ptrace._state(proc.pid) == "T"  # as it was
        os.kill(proc.pid, signal.SIGCONT)
        goes_on(proc, count)
    finally:
        proc.kill()
        proc.wait()


def test_refusals_say_why(tmp_path: Path, python_without_the_call: str) -> None:
    """An interpreter without the function, one that maps a musl loader, one traced by
    someone else: each a refusal with its reason; an exited process is gone."""
    loop = "import time\nwhile True: time.sleep(0.01)\n"
    stripped = subprocess.Popen([python_without_the_call, "-c", loop])
    musl_file = tmp_path / "ld-musl-x86_64.so.1"
    musl_file.write_bytes(b"\0" * 4096)
    musl = subprocess.Popen(
        [sys.executable, "-c",
         f"import mmap, time\nf = open({str(musl_file)!r}, 'rb')\n"
         f"m = mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ)\n{loop}"],
    )  # fmt: skip
    plain = subprocess.Popen([sys.executable, "-c", loop])
    try:
        for p in (stripped, musl, plain):
            wait_until(partial(pyprocess.python_of, p.pid), 20, "python")
        time.sleep(0.3)
        problem = ptrace.problem(stripped.pid, None)
        assert problem is not None and "does not export Py_AddPendingCall" in problem
        assert "PyRun_SimpleString" not in problem  # that one is there
        problem = ptrace.problem(musl.pid, None)
        assert problem is not None and "musl" in problem and "glibc only" in problem
        traced = ptrace.Traced(plain.pid)
        traced.stop()
        try:
            out = ptrace.queue_line(plain.pid, b"pass", None)
            assert out["reason"] == "permission", out
            assert f"traced by pid {os.getpid()}" in out["problem"]
            proc = cli("attach", "--pid", str(plain.pid), "--yes", "--json")
            refused = json.loads(proc.stdout)
            assert proc.returncode == 21 and refused["reason"] == "traced", refused
            assert f"traced by pid {os.getpid()}" in refused["message"]
        finally:
            traced.detach()
        assert ptrace.problem(plain.pid, None) is None
    finally:
        for p in (stripped, musl, plain):
            p.kill()
            p.wait()
    out = ptrace.queue_line(plain.pid, b"pass", None)
    assert not out["queued"] and out.get("reason") == "gone", out


# ---- every CPython the agent supports ------------------------------------------------


def version_id(exe: str) -> str:
    return "3.11-ours" if exe == sys.executable else os.path.basename(exe)


@pytest.mark.parametrize("exe", interpreters(), ids=version_id)
def test_every_supported_interpreter(exe: str, tmp_path: Path) -> None:
    """The injector run by that interpreter (the agent may be any python3 of the host)
    into a loop of the same interpreter: queued, registers checked, the line ran."""
    loop = "import time\nwhile True: time.sleep(0.005)\n"
    proc = subprocess.Popen([exe, "-c", loop])
    try:
        wait_until(lambda: pyprocess.python_of(proc.pid) is not None, 20, "python")
        time.sleep(0.3)
        ran = tmp_path / "ran"
        (tmp_path / "entry.py").write_text(f"open({str(ran)!r}, 'w').close()\n")
        root = Path(__file__).resolve().parents[2]
        driver = (
            "import json, sys\n"
            f"sys.path.insert(0, {str(root)!r})\n"
            "from eagle3_tui.agent import ptrace, pyprocess\n"
            "from eagle3_tui.agent.debugger import python_line\n"
            f"py = pyprocess.python_of({proc.pid})\n"
            f"line = python_line({str(tmp_path / 'entry.py')!r}).encode()\n"
            f"print(json.dumps(ptrace.queue_line({proc.pid}, line, py.libpython)))\n"
        )
        done = subprocess.run([exe, "-I", "-c", driver], capture_output=True, timeout=60)
        out = json.loads(done.stdout)
        assert out["queued"] and out["restored"] == "verified", (out, done.stderr[-2000:])
        wait_until(ran.exists, 10, "the line")
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
