"""Shared fixtures: the real tiny training, run once per session.

Tests that need a real part (speculators, sshd, tmux) skip with a reason when it
is missing here, and fail instead when EAGLE3_TUI_REQUIRE_ALL=1 (as in .ci/run),
so CI can never pass by skipping them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import glob
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

REQUIRE_ALL = os.environ.get("EAGLE3_TUI_REQUIRE_ALL") == "1"


@pytest.fixture(scope="session", autouse=True)
def _private_state_dirs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The suite never writes into the user's own index of runs, export folder or cache:
    its trainings register their runs in a private ``XDG_STATE_HOME``, exports go to a
    private ``XDG_DATA_HOME`` and the agents' code cache (transport/bundle.py) and
    attach's files to a private ``XDG_CACHE_HOME``, inherited by every process the
    tests start."""
    root = tmp_path_factory.mktemp("xdg")
    names = {
        "XDG_STATE_HOME": root / "state",
        "XDG_DATA_HOME": root / "data",
        "XDG_CACHE_HOME": root / "cache",
    }
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update({name: str(path) for name, path in names.items()})
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


MYPY_TEST = "tests/test_lint.py::test_mypy_strict"
_mypy: dict[str, Any] = {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files with real trainings (a ``slow`` test) first, each file's tests in their
    order: with ``-n 2 --dist loadfile`` a file is handed to a worker as a whole, in this
    order, and a two-minute file handed out last kept one worker busy minutes after the
    other had finished (the suite's wall time is what CI is allowed)."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)  # stable: the rest keeps its order


def pytest_collection_finish(session: pytest.Session) -> None:
    """mypy (strict) takes about a minute of one core; most of the suite waits on real
    trainings with a core to spare, so mypy starts once the tests are collected, at the
    lowest priority, and its test reads the result."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # every worker collects the suite: the one that runs the test starts mypy
    if any(item.nodeid == MYPY_TEST for item in session.items):
        start_mypy()


def start_mypy() -> None:
    out = tempfile.TemporaryFile()  # noqa: SIM115 (read back by the test)
    nice = ["nice", "-n", "19"] if shutil.which("nice") else []
    proc = subprocess.Popen(
        [*nice, sys.executable, "-m", "mypy"],
        cwd=Path(__file__).resolve().parent.parent,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    _mypy.update(proc=proc, out=out)


def mypy_result(timeout: float) -> tuple[int, str]:
    """The exit status and output of the mypy run started for the suite (started now if
    the test was not collected with the rest, e.g. run alone by ``-k``)."""
    if not _mypy:
        start_mypy()
    proc, out = _mypy["proc"], _mypy["out"]
    try:
        status = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    out.seek(0)
    return status, out.read().decode(errors="replace")


def need(condition: bool, reason: str) -> None:
    """Skip (or, under EAGLE3_TUI_REQUIRE_ALL=1, fail) when a real part is missing."""
    if condition:
        return
    if REQUIRE_ALL:
        pytest.fail(f"required for this run: {reason}")
    pytest.skip(reason)


def interpreters(minors: range = range(8, 14)) -> list[str]:
    """One CPython binary per minor version (3.8-3.13) found here (PATH, pyenv), and ours."""
    ours = f"{sys.version_info[0]}.{sys.version_info[1]}"
    found: dict[str, str] = {ours: sys.executable} if sys.version_info[1] in minors else {}
    roots = [os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")]
    for minor in minors:
        v = f"3.{minor}"
        if v in found:
            continue
        candidates = sorted(glob.glob(f"{roots[0]}/versions/{v}.*/bin/python{v}"))
        on_path = shutil.which(f"python{v}")
        if on_path and "shims" not in on_path:
            candidates.append(on_path)
        if candidates:
            found[v] = candidates[-1]
    return [found[v] for v in sorted(found, key=lambda v: int(v.split(".")[1]))]


class _LazyModule:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):  # (what collection asks of a module's names)
            raise AttributeError(attr)
        return getattr(pytest.importorskip(self._name), attr)


def lazy_module(name: str) -> Any:
    """A module imported when a test first uses it (skipped there if it is missing), not
    while the suite is collected: each worker collects every file, and torch,
    speculators or wandb imported at a test module's top cost each worker seconds
    of a core before its first test."""
    return _LazyModule(name)


def skip_module_without(name: str) -> None:
    """At a test module's top: skip it where ``name`` is not installed, without importing it."""
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not installed", allow_module_level=True)


def need_training() -> None:
    have = all(importlib.util.find_spec(m) is not None for m in ("torch", "speculators"))
    need(have, "torch and speculators are not installed (scripts/install.sh)")


def need_gdb() -> str:
    """gdb, installed (else skip, or fail under EAGLE3_TUI_REQUIRE_ALL) and able to call
    into a process here. A gdb that cannot give a process back its registers after a
    call (Debian's gdb 13.1 on a CPU with AMX) is a fact of the machine, not something
    to install: only the gdb variants of the injection tests skip with gdb's reason;
    every other real injection goes through eagle3-tui's injector, and the tests of
    the refusal itself run."""
    gdb = shutil.which("gdb")
    need(gdb is not None, "gdb is not installed (apt-get install gdb)")
    assert gdb is not None
    problem = gdb_call_problem_here(gdb)
    if problem is not None:
        pytest.skip(f"gdb cannot call into a process on this machine: {problem}")
    return gdb


@functools.cache
def gdb_call_problem_here(gdb: str) -> str | None:
    from eagle3_tui.agent.debugger import gdb_call_problem

    return gdb_call_problem(gdb)


TINY = (sys.executable, "-m", "eagle3_tui.train.tiny")
"""The tiny training's command line (``train/tiny.py``)."""


def run_tiny(run_dir: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run the real tiny training to completion; its output is returned."""
    need_training()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [*TINY, "--run-dir", str(run_dir), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


@dataclass
class LiveRun:
    """A real tiny speculators training with telemetry, launched as a user would."""

    run_dir: Path
    proc: subprocess.Popen[bytes]
    started: list[int] = field(default_factory=list)
    """Every trainer PID (each its own session), for the cleanup."""

    def manifest(self) -> dict[str, Any]:
        m: dict[str, Any] = json.loads((self.run_dir / "run.json").read_text())
        return m

    def log(self) -> str:
        return (self.run_dir / "train.log").read_text(errors="replace")[-3000:]


@contextlib.contextmanager
def live_training(run_dir: Path, args: Sequence[str], env: dict[str, str]) -> Iterator[LiveRun]:
    """A tiny training that runs until the tests stop it: detached (a session of its
    own), its output in ``run_dir/train.log``. On leaving, what the tests started is
    killed, and only that: each trainer's session (a resumed one's PID is appended to
    ``started``), then the processes marked with the run's id."""
    from tests.transport.fakes import alive, marker_processes

    need_training()
    run_dir.mkdir()
    with open(run_dir / "train.log", "ab") as log:
        proc = subprocess.Popen(
            [*TINY, "--run-dir", str(run_dir), *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    run = LiveRun(run_dir, proc, [proc.pid])
    try:
        yield run
    finally:
        run_id = ""
        with contextlib.suppress(OSError, ValueError, KeyError):
            run_id = str(run.manifest()["run_id"])
        for pid in run.started:
            with contextlib.suppress(ProcessLookupError):
                if alive(pid) and os.getsid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
        for pid in marker_processes(run_id) if run_id else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(30)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file; a last line without its newline is one still
    being written (a live writer's torn line): left for the next read."""
    text = path.read_text()
    lines = text.split("\n")
    torn = lines.pop()  # "" when the file ends with a newline
    out = [json.loads(line) for line in lines if line.strip()]
    if torn.strip():
        with contextlib.suppress(ValueError):
            out.append(json.loads(torn))
    return out


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny training (3 epochs) with telemetry: its run directory. One a
    worker: a test finds it in this worker's index of runs (its private
    ``XDG_STATE_HOME``, where the training registered it)."""
    run_dir = tmp_path_factory.mktemp("tiny") / "run"
    proc = run_tiny(run_dir, "--epochs", "3")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run_dir


class _Deadline:
    """The end of a wait: :meth:`check` fails once it has passed, saying what was awaited."""

    def __init__(self, timeout: float, what: str | Callable[[], str]) -> None:
        self.timeout, self.what = timeout, what
        self.at = time.monotonic() + timeout

    def check(self) -> None:
        if time.monotonic() > self.at:
            said = self.what() if callable(self.what) else self.what
            raise AssertionError(f"timed out after {self.timeout:g} s waiting for {said}")


def wait_until(
    predicate: Callable[[], T | None],
    timeout: float,
    what: str | Callable[[], str],
    interval: float = 0.05,
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    Past ``timeout`` seconds it fails with ``timed out after N s waiting for WHAT``
    (``what`` may be a function, called then: a log's tail). The predicate may
    assert on its own (a process that died fails at once, not at the deadline).
    """
    deadline = _Deadline(timeout, what)
    while not (got := predicate()):
        deadline.check()
        time.sleep(interval)
    return got


async def wait_until_async(
    predicate: Callable[[], T | None],
    timeout: float,
    what: str | Callable[[], str],
    interval: float = 0.05,
) -> T:
    """:func:`wait_until` in a coroutine: the event loop runs while it waits."""
    deadline = _Deadline(timeout, what)
    while not (got := predicate()):
        deadline.check()
        await asyncio.sleep(interval)
    return got


def interruptible() -> None:
    """``preexec_fn`` for a child the test will Ctrl-C: SIGINT as a terminal's foreground job
    has it. A test run started in the background (``… &`` in a script, as CI may be) inherits
    SIGINT ignored, and so would every child: the SIGINT the test sends would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for_a_training_step(run_dir: Path, proc: subprocess.Popen[Any], timeout: float) -> None:
    """Until ``run_dir``'s metrics.jsonl holds a training step; fails at once if
    ``proc`` (the training) ends first."""
    metrics = run_dir / "metrics.jsonl"

    def logged() -> bool:
        assert proc.poll() is None, f"the training ended ({proc.returncode}) before its first step"
        return metrics.exists() and b'"kind":"train"' in metrics.read_bytes()

    wait_until(logged, timeout, "a training step", interval=0.2)


async def until(
    pilot: Any, predicate: Callable[[], object], timeout: float = 10.0, what: str = "condition"
) -> None:
    """Let the app run until ``predicate()`` holds (no fixed sleeps in UI tests)."""
    deadline = _Deadline(timeout, what)
    while not predicate():
        deadline.check()
        await pilot.pause(0.02)


# ---- a second user on the same machine (issue 24) ----------------------------------------

SYSTEM_PYTHON = "/usr/bin/python3"
"""The interpreter every user may run (the suite's own lives in root's home)."""


@dataclass(frozen=True)
class OtherUser:
    """A user made for one test: unprivileged, with a home of its own."""

    name: str
    uid: int
    gid: int
    home: Path

    def argv(self, *cmd: str) -> list[str]:
        """``cmd`` run as this user (``runuser``: no password, no terminal)."""
        return ["runuser", "-u", self.name, "--", *cmd]

    def run(self, *cmd: str, timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*cmd), capture_output=True, text=True, timeout=timeout, check=False, **kw
        )

    def popen(self, *cmd: str, **kw: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.argv(*cmd), **kw)


def useradd(*args: str) -> subprocess.CompletedProcess[bytes]:
    """``useradd ARGS``, again while the user database is locked (two test files run at
    once, each making its user); the last attempt's result."""
    for _ in range(20):
        made = subprocess.run(["useradd", *args], capture_output=True, check=False)
        if made.returncode not in (1, 10) or b"lock" not in made.stderr:  # 1, 10: cannot lock
            return made
        time.sleep(0.5)
    return made


@pytest.fixture
def other_user() -> Iterator[OtherUser]:
    """A second, unprivileged user (made with ``useradd``, removed with every process it
    still has); needs root."""
    need(os.geteuid() == 0 and shutil.which("useradd") is not None, "root and useradd")
    import pwd
    import uuid

    name = f"e3o{uuid.uuid4().hex[:8]}"
    useradd("-m", "-U", "-s", "/bin/sh", name)
    entry = pwd.getpwnam(name)
    try:
        yield OtherUser(name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], check=False, capture_output=True)
        time.sleep(0.1)
        subprocess.run(["userdel", "-r", name], check=False, capture_output=True)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user may write (mode 1777, like /tmp), reachable by every
    user (the suite's tmp_path is root's alone); removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="e3shared-", dir="/tmp"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# ---- a real small filesystem, to fill ----------------------------------------------------


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` (``64k``) mounted at ``where``, made for it (needs root;
    unmounted on leaving)."""
    need(os.geteuid() == 0, "root (mount -t tmpfs)")
    where.mkdir()
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    need(mount.returncode == 0, f"mount -t tmpfs refused: {mount.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill_filesystem(path: Path) -> None:
    """Take every free byte of the filesystem ``path`` is on, in the new file ``path``."""
    with open(path, "wb", buffering=0) as f:
        for chunk in (b"\0" * 4096, b"\0"):
            with contextlib.suppress(OSError):
                while True:
                    f.write(chunk)
