"""``watch HOST`` over the real sshd (issue 30): handler-less speculators trainings
started on the host *after* the watcher are found, and each change of their verdicts
reaches a real HTTP server on loopback once — the long one silent (with the attach
command), the link down past its threshold while the host's sshd stops answering and
recovered once it answers again, stalled when the training hangs, dead when it is
SIGKILLed; the short one finished — and a restarted watcher sends nothing again."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    argv += ["--notify", hook.url, "--interval", "1", "--hold", "2", "--gap", "3"]
    argv += ["--link-down", "5", "-o", "ServerAliveInterval=1", "-o", "ServerAliveCountMax=2"]
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


def launch(sshd: Sshd, work: Path, name: str, args: str) -> int:
    """``nohup python -m eagle3_tui.train.tiny … > LOG 2>&1 &`` on the host, no handler:
    its PID (as the host numbers it)."""
    line = (
        f"cd {work} || exit 1; nohup {sys.executable} -m eagle3_tui.train.tiny --run-dir "
        f"{work}/{name} --no-telemetry {args} > {name}.log 2>&1 < /dev/null & echo $!"
    )
    return int(sshd.ssh(line).stdout.strip())


def test_trainings_started_later_are_each_said_once_per_change(
    private_sshd: Sshd, hook: Hook, tmp_path: Path
) -> None:
    need_training()
    sshd = private_sshd
    state, log = tmp_path / "watch-state.json", tmp_path / "watch.log"
    work = tmp_path / "work"
    work.mkdir()
    control = work / "control"
    watcher = start_watcher(sshd, hook, state, log)
    pids: list[int] = []
    try:
        # two trainings start after the watcher, as in the story (nohup, no handler): a
        # long one, and a short one that runs to its end (it may be called silent first)
        started = time.monotonic()
        long = launch(sshd, work, "long", f"--epochs 40 --step-delay 0.3 --debug-control {control}")
        # (it lives past two listings, 20 s apart: it is not a training to a listing
        # before torch and speculators are loaded, seconds on a busy machine)
        short = launch(sshd, work, "short", "--epochs 2 --step-delay 0.5")
        pids += [long, short]

        def kinds(pid: int | None = None) -> list[str]:
            return [p["kind"] for _, p in hook.posts if pid is None or p["pid"] == pid]

        def last(pid: int) -> dict[str, Any]:
            return [p for _, p in hook.posts if p["pid"] == pid][-1]

        def said() -> str:
            return f"{kinds()}\n{log.read_text()[-3000:]}"

        wait_until(lambda: "silent" in kinds(long), 300, said, 0.5)
        silent_after = time.monotonic() - started
        alert = last(long)
        assert alert["host"] == ALIAS and alert["run"] == f"{ALIAS} pid {long}", alert
        assert alert["command"].startswith(f"eagle3-tui attach {ALIAS} --pid {long}"), alert
        assert "no handler" in alert["reason"], alert["reason"]
        wait_until(lambda: "finished" in kinds(short), 240, said, 0.5)
        assert kinds(short) in (["finished"], ["silent", "finished"]), said()
        assert last(short)["command"].startswith("eagle3-tui summary "), last(short)

        # the link goes down for 12 s (every sshd of the host stops answering; the
        # training goes on): one link_down past the threshold, one recovered, no more
        frozen = [p for p in sshd.session_tree() if comm(p) == "sshd"]
        down_at = time.monotonic()
        for p in frozen:
            os.kill(p, signal.SIGSTOP)
        try:
            wait_until(lambda: "link_down" in kinds(long), 60, said, 0.5)
            time.sleep(max(0.0, 12 - (time.monotonic() - down_at)))
        finally:
            for p in frozen:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGCONT)
        wait_until(lambda: "recovered" in kinds(long), 90, said, 0.5)

        control.write_text("hang 0\n")  # its training loop blocks for good
        wait_until(lambda: "stalled" in kinds(long), 240, said, 0.5)
        assert last(long)["command"].startswith(f"eagle3-tui kill {ALIAS} --pid {long}")

        sshd.ssh(f"kill -9 {long}")
        wait_until(lambda: "dead" in kinds(long), 120, said, 0.5)
        assert "SIGKILL" in last(long)["reason"], last(long)
        assert kinds(long) == ["silent", "link_down", "recovered", "stalled", "dead"], said()

        # a restarted watcher repeats nothing it sent
        sent = len(hook.posts)
        stop(watcher)
        watcher = start_watcher(sshd, hook, state, log)
        time.sleep(6)  # six looks
        assert len(hook.posts) == sent, said()
        print(f"silent alert {silent_after:.0f} s after the training started")
    finally:
        stop(watcher)
        for pid in pids:
            sshd.ssh(f"kill -9 {pid} 2>/dev/null")
