"""End to end, as a user meets it: a real tiny speculators training, the monitor opened
on its run directory over a real loopback sshd in a real terminal (tmux), loss and
accuracy values appearing and changing on screen, then ``k``, the confirmation, the
run reported stopped and every process of it gone."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from eagle3_tui.agent import processes
from tests.conftest import need, need_training
from tests.transport.conftest import remote_env, sshd  # noqa: F401 - the session's sshd
from tests.transport.fakes import alive, marker_processes
from tests.transport.sshd import ALIAS, Sshd

pytestmark = pytest.mark.slow
TRAINING = ("--epochs", "20", "--step-delay", "0.3", "--workers", "2")  # stopped by the test
# the k = 0 row of the TTT table: loss, full and conditional accuracy
TTT_ROW = re.compile(r"^\W{0,2}0\s+(\d+\.\d{4})\s+(\d\.\d{3})\s+(\d\.\d{3})\s", re.M)


class Tmux:
    """A private tmux server (its own socket) running one command in a 120×40 pane."""

    def __init__(self, socket: Path) -> None:
        self.socket = str(socket)

    def run(self, *args: str) -> str:
        proc = subprocess.run(
            ["tmux", "-S", self.socket, *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        return proc.stdout

    def screen(self) -> str:
        return self.run("capture-pane", "-p")

    def keys(self, *keys: str) -> None:
        self.run("send-keys", *keys)

    def wait(self, predicate: Callable[[str], object], timeout: float, what: str) -> str:
        """Poll the pane until ``predicate(screen)`` holds; returns that screen."""
        deadline = time.monotonic() + timeout
        shown = ""
        while time.monotonic() < deadline:
            shown = self.screen()
            if predicate(shown):
                return shown
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}; screen:\n{shown}")


@pytest.fixture
def training(sshd: Sshd, tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:  # noqa: F811
    need_training()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with open(run_dir / "train.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "eagle3_tui.train.tiny", "--run-dir", str(run_dir), *TRAINING],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=remote_env(sshd),
            start_new_session=True,
        )
    yield run_dir, proc
    run_id = ""
    with contextlib.suppress(OSError, ValueError, KeyError):
        run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    with contextlib.suppress(ProcessLookupError):
        if alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    for pid in marker_processes(run_id) if run_id else []:
        os.kill(pid, signal.SIGKILL)
    proc.wait(30)


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    need(shutil.which("tmux") is not None, "tmux is not installed (apt-get install tmux)")
    t = Tmux(tmp_path / "tmux.sock")
    yield t
    t.run("kill-server")


def test_monitor_a_real_training_over_ssh_then_kill_it(
    sshd: Sshd,  # noqa: F811
    training: tuple[Path, subprocess.Popen[bytes]],
    tmux: Tmux,
) -> None:
    run_dir, proc = training
    monitor = [sys.executable, "-m", "eagle3_tui", *sshd.args(), f"{ALIAS}:{run_dir}"]
    # COLUMNS/LINES (set under pytest) would override the pane's size
    command = "env -u COLUMNS -u LINES TZ=UTC TERM=xterm-256color " + shlex.join(monitor)
    tmux.run("new-session", "-d", "-x", "120", "-y", "40", command)

    def ttt_row(screen: str) -> tuple[str, str, str] | None:
        m = TTT_ROW.search(screen)
        return None if m is None else (m.group(1), m.group(2), m.group(3))

    first = tmux.wait(ttt_row, 240, "the first loss and accuracies")
    assert "connected" in first
    values = ttt_row(first)
    tmux.wait(lambda s: ttt_row(s) not in (None, values), 120, "the values to change")
    shown = tmux.wait(lambda s: "RUNNING" in s and "connected" in s, 60, "running, connected")
    assert "per TTT step" in shown and "GPUs" in shown and "log" in shown

    ckpt0 = run_dir / "checkpoints" / "0" / "training_state.json"
    deadline = time.monotonic() + 240  # a checkpoint to resume from later exists
    while not ckpt0.exists():
        assert time.monotonic() < deadline and proc.poll() is None, "no first checkpoint"
        time.sleep(0.2)
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    procs = processes.all_procs()
    family = {p: procs[p].start for p in processes.descendants(proc.pid, procs)} | {
        proc.pid: procs[proc.pid].start
    }
    assert sum(1 for p in family if procs[p].comm == "pt_data_worker") == 2

    tmux.keys("k")
    plan = tmux.wait(lambda s: "SIGTERM the trainer, pid" in s, 60, "the kill confirmation")
    assert f"pid {proc.pid}" in plan
    tmux.keys("y")
    report = tmux.wait(lambda s: "stopped: all" in s, 200, "the verified result")
    assert str(proc.pid) in report and "exited" in report

    assert proc.wait(30) == 0  # speculators' graceful exit (it saved interrupted/)
    for pid, start in family.items():
        p = processes.proc_stat(pid)
        assert p is None or p.start != start or p.zombie, f"{pid} remains"
    assert marker_processes(run_id) == []

    tmux.keys("Escape")
    tmux.wait(lambda s: "kill the run ·" not in s, 30, "the dialog to close")
    tmux.wait(lambda s: "STOPPED" in s and "Interrupted after step" in s, 60, "STOPPED banner")
    tmux.keys("q")
    tmux.wait(lambda s: "eagle3-tui" not in s, 30, "the app to quit")
