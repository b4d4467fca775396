"""``watch HOST`` over the real sshd (issue 30): a handler-less speculators training
started on the host *after* the watcher is found, and each change of its verdict
reaches a real HTTP server on loopback once — silent (with the attach command), the
link down past its threshold while the host's sshd stops answering and recovered once
it answers again, stalled when the training hangs, dead when it is SIGKILLed — and a
restarted watcher sends nothing again."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import need_training, wait_until
from tests.test_watch import Hook
from tests.transport.sshd import ALIAS, Sshd, comm

pytestmark = pytest.mark.slow


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    yield h
    h.close()


def start_watcher(sshd: Sshd, hook: Hook, state: Path, log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "eagle3_tui", "watch", *sshd.args(), ALIAS]
    argv += ["--notify", hook.url, "--interval", "2", "--hold", "4", "--gap", "5"]
    argv += ["--link-down", "8", "-o", "ServerAliveInterval=1", "-o", "ServerAliveCountMax=2"]
    argv += ["-o", "ConnectTimeout=2"]
    argv += ["--state", str(state)]
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    wait_until(lambda: "following" in log.read_text(), 60, lambda: log.read_text())
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    proc.wait(60)


def test_a_training_started_later_is_silent_then_stalled_then_dead_once_each(
    private_sshd: Sshd, hook: Hook, tmp_path: Path
) -> None:
    need_training()
    sshd = private_sshd
    state, log = tmp_path / "watch-state.json", tmp_path / "watch.log"
    work = tmp_path / "work"
    work.mkdir()
    control = work / "control"
    watcher = start_watcher(sshd, hook, state, log)
    pid = None
    try:
        # the training starts after the watcher, as in the story: nohup, no handler
        started = time.monotonic()
        script = (
            f"cd {work} || exit 1; nohup {sys.executable} -m eagle3_tui.train.tiny --run-dir "
            f"{work}/run --no-telemetry --epochs 40 --step-delay 0.3 "
            f"--debug-control {control} > train.log 2>&1 < /dev/null & echo $!"
        )
        pid = int(sshd.ssh(script).stdout.strip())

        def kinds() -> list[str]:
            return [p["kind"] for _, p in hook.posts]

        def said() -> str:
            return f"{kinds()}\n{log.read_text()[-3000:]}"

        wait_until(lambda: "silent" in kinds(), 300, said, 1.0)
        silent_after = time.monotonic() - started
        alert = hook.posts[-1][1]
        assert alert["pid"] == pid and alert["host"] == ALIAS, alert
        assert alert["command"].startswith(f"eagle3-tui attach {ALIAS} --pid {pid}"), alert
        assert "no handler" in alert["reason"], alert["reason"]
        assert alert["run"] == f"{ALIAS} pid {pid}", alert

        # the link goes down for 20 s (every sshd of the host stops answering; the
        # training goes on): one link_down past the threshold, one recovered, nothing else
        frozen = [p for p in sshd.session_tree() if comm(p) == "sshd"]
        down_at = time.monotonic()
        for p in frozen:
            os.kill(p, signal.SIGSTOP)
        try:
            wait_until(lambda: "link_down" in kinds(), 60, said, 0.5)
            time.sleep(max(0.0, 20 - (time.monotonic() - down_at)))
        finally:
            for p in frozen:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGCONT)
        wait_until(lambda: "recovered" in kinds(), 90, said, 0.5)
        assert kinds() == ["silent", "link_down", "recovered"], said()

        control.write_text("hang 0\n")  # its training loop blocks for good
        wait_until(lambda: "stalled" in kinds(), 240, said, 1.0)
        assert hook.posts[-1][1]["command"].startswith(f"eagle3-tui kill {ALIAS} --pid {pid}")

        sshd.ssh(f"kill -9 {pid}")
        wait_until(lambda: "dead" in kinds(), 120, said, 1.0)
        assert "SIGKILL" in hook.posts[-1][1]["reason"], hook.posts[-1][1]
        assert kinds() == ["silent", "link_down", "recovered", "stalled", "dead"], said()

        # a restarted watcher neither repeats what it sent nor misses anything new
        stop(watcher)
        watcher = start_watcher(sshd, hook, state, log)
        time.sleep(12)  # six looks
        assert kinds() == ["silent", "link_down", "recovered", "stalled", "dead"], said()
        print(f"silent alert {silent_after:.0f} s after the training started")
    finally:
        stop(watcher)
        if pid is not None:
            sshd.ssh(f"kill -9 {pid} 2>/dev/null")
