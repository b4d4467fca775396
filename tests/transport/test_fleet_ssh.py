"""The fleet over two real sshd hosts (issue 32), each a host of its own (private PID
namespaces), five real tiny speculators runs in every state a fleet must tell apart:
on host A one running and one finished (named as a run target), on host B one stalled
(its loop hung), one silent (no handler) and one stopped (SIGTERM: speculators saves and
exits). The fleet's rows are read while it follows them (live: a running row moves on); then host A
stops answering (its sshd frozen): its rows are marked, host B's go on. Last, the screen
in a real terminal (tmux) shows the five."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from eagle3_tui.fleet import Fleet, FleetRow
from eagle3_tui.following import WatchTarget
from eagle3_tui.transport.target import SshOptions, SshTarget
from tests.app.test_tmux import Tmux
from tests.conftest import need, need_training, wait_until
from tests.transport.conftest import cli
from tests.transport.sshd import ALIAS, Sshd, have_pid_namespaces

pytestmark = pytest.mark.slow

HOST_A = "fleet-a"


class Following:
    """A :class:`Fleet` following in a thread of its own (as the screen's worker does)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.loop = asyncio.new_event_loop()
        self.stop_event = asyncio.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.fleet.run(self.stop_event))

    def rows(self) -> dict[str, FleetRow]:
        return {r.run: r for r in list(self.fleet.rows.values())}

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.stop_event.set)
        self.thread.join(60)


def launch(sshd: Sshd, run_dir: Path, args: str) -> int:
    """``nohup python -m eagle3_tui.train.tiny … > LOG 2>&1 &`` on the host: its PID."""
    line = (
        f"nohup {sys.executable} -m eagle3_tui.train.tiny --run-dir {run_dir} {args} "
        f"> {run_dir}.log 2>&1 < /dev/null & echo $!"
    )
    return int(sshd.ssh(line).stdout.strip())


def stepped(run_dir: Path) -> bool:
    path = run_dir / "metrics.jsonl"
    return path.exists() and b'"kind":"train"' in path.read_bytes()


@contextlib.contextmanager
def second_host(tmp_path: Path) -> Iterator[Sshd]:
    need(have_pid_namespaces(), "unshare --pid --mount-proc is not permitted here")
    host = Sshd(tmp_path / "host-a", private=True, alias=HOST_A).start()
    try:
        yield host
    finally:
        host.stop()


def test_two_hosts_five_runs_every_state_then_one_host_down(
    private_sshd: Sshd, tiny_run: Path, tmp_path: Path
) -> None:
    need_training()
    b = private_sshd
    with second_host(tmp_path) as a, contextlib.ExitStack() as cleanup:
        config = tmp_path / "ssh_config"  # both hosts, as a user's ~/.ssh/config has them
        config.write_text(a.ssh_config.read_text() + b.ssh_config.read_text())
        opts = SshOptions(config=(str(config),), keepalive_interval=1, keepalive_count_max=2)
        opts = opts.with_option("ConnectTimeout=2")
        work = tmp_path / "runs"
        work.mkdir()
        control = tmp_path / "control"
        runs = {name: work / name for name in ("a1", "a2", "b1", "b2", "b3")}
        # a2: a real run that finished (the session's tiny run, copied onto host A and
        # named as a run target: a target may be one run as well as a host)
        shutil.copytree(tiny_run, runs["a2"])
        pids = {
            "a1": launch(a, runs["a1"], "--epochs 40 --step-delay 0.4"),
            "b1": launch(b, runs["b1"], f"--epochs 40 --step-delay 0.3 --debug-control {control}"),
            "b2": launch(b, runs["b2"], "--epochs 40 --step-delay 0.3 --no-telemetry"),
            "b3": launch(b, runs["b3"], "--epochs 40 --step-delay 0.3"),
        }
        for name, pid in pids.items():  # whatever happens: host B is shared by later tests
            host = a if name.startswith("a") else b
            cleanup.callback(host.ssh, f"kill -9 {pid} 2>/dev/null")
        finished = f"{HOST_A}:{runs['a2']}"
        fleet = Fleet(
            [
                WatchTarget(HOST_A, SshTarget(HOST_A, options=opts), discover=True),
                WatchTarget(finished, SshTarget(HOST_A, None, str(runs["a2"]), opts), False),
                WatchTarget(ALIAS, SshTarget(ALIAS, options=opts), discover=True),
            ],
            interval_s=1.0,
        )
        following = Following(fleet)
        try:

            def said() -> str:
                return "\n".join(
                    f"{r.host} {r.run} {r.health} step {r.step}: {r.reason}"
                    for r in following.rows().values()
                ) + "".join(f"\n{h.text}: {h.problem}" for h in fleet.hosts_state.values())

            wait_until(lambda: stepped(runs["b1"]) and stepped(runs["b3"]), 240, said)
            control.write_text("hang 0\n")  # b1's training loop blocks for good
            b.ssh(f"kill -TERM {pids['b3']}")  # speculators saves interrupted/ and exits

            def health_of(name: str) -> str | None:
                key = f"pid {pids[name]}" if name == "b2" else str(runs[name])
                r = following.rows().get(key)
                return r.health if r is not None else None

            want = {
                "a1": "running",
                "a2": "finished",
                "b1": "stalled",
                "b2": "silent",
                "b3": "stopped",
            }
            wait_until(lambda: {n: health_of(n) for n in want} == want, 240, said, 1.0)
            rows = following.rows()
            a1, a2 = rows[str(runs["a1"])], rows[str(runs["a2"])]
            b1, b2 = rows[str(runs["b1"])], rows[f"pid {pids['b2']}"]
            assert (a1.host, a2.host, b1.host, b2.host) == (HOST_A, HOST_A, ALIAS, ALIAS)
            assert a2.step == a2.total_steps and a2.step is not None and a2.checkpoint
            assert a1.opens == (f"{HOST_A}:{runs['a1']}",) and b2.opens == (
                ALIAS,
                "--pid",
                str(pids["b2"]),
            )
            assert "no handler" in b2.reason and b2.observed, b2
            assert b1.reason.startswith("No metric for "), b1  # the monitor's own words
            step = a1.step or 0
            wait_until(lambda: (following.rows()[str(runs["a1"])].step or 0) > step, 60, said)

            # host A stops answering: its rows are marked, host B's are still looked at
            frozen = a.freeze_sessions()
            try:
                wait_until(lambda: following.rows()[str(runs["a1"])].link_down, 60, said, 0.5)
                seen = following.rows()[str(runs["b1"])].looked_at
                wait_until(
                    lambda: following.rows()[str(runs["b1"])].looked_at > seen, 30, said, 0.5
                )
                assert following.rows()[str(runs["b1"])].health == "stalled"
                assert not following.rows()[str(runs["b1"])].link_down
            finally:
                for pid in frozen:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
        finally:
            following.stop()

        # runs HOST HOST: each host's listing in turn, one connection each
        listed = cli("runs", "-F", str(config), HOST_A, ALIAS, timeout=60)
        assert listed.returncode == 0, listed.stderr
        first, second = listed.stdout.split(f"== {ALIAS} ==")
        assert first.startswith(f"== {HOST_A} ==") and str(runs["a1"]) in first, listed.stdout
        assert str(runs["b1"]) in second and str(runs["a1"]) not in second, listed.stdout

        # the screen, in a real terminal: the five rows and their verdicts
        screen_targets = [HOST_A, finished, ALIAS]
        screen = tmux_screen(
            tmp_path,
            [sys.executable, "-m", "eagle3_tui", "fleet", "-F", str(config), *screen_targets],
            lambda text: (
                all(str(runs[n]) in text for n in ("a1", "a2", "b1", "b3"))
                and f"pid {pids['b2']}" in text
                and all(h.upper() in text for h in want.values())
            ),
        )
        assert "not reached" not in screen, screen


def tmux_screen(tmp_path: Path, argv: list[str], done: Callable[[str], bool]) -> str:
    """``argv`` in a tmux window of 170×30 until ``done(screen)``; then q; the screen."""
    need(shutil.which("tmux") is not None, "tmux is not installed (apt-get install tmux)")
    tmux = Tmux(tmp_path / "tmux.sock")
    # COLUMNS/LINES (set under pytest) would override the pane's size
    command = "env -u COLUMNS -u LINES TERM=xterm-256color " + shlex.join(argv)
    try:
        tmux.run("new-session", "-d", "-x", "170", "-y", "30", command)
        screen = tmux.wait(done, 60, "every run on the fleet screen")
        tmux.keys("q")
        return screen
    finally:
        tmux.run("kill-server")
