"""Live attach over a real sshd to real speculators trainings that were launched without
telemetry (a user's own script, ``tests/attach/silent_training.py``: no handler, no
import of eagle3_tui), detached with their output in a log, through eagle3-tui's own
injector (no gdb needed; on a CPU with AMX the gdb of Debian 12 / Ubuntu 22.04 cannot):

* a training started with ``nohup`` by a launcher script: attach → the next steps'
  metrics arrive; it ends with the same final global_step and exit status as an
  undisturbed run of the same configuration; a second attach says it is attached
  already;
* then ``kill`` and ``resume`` work on such a run, through the manifest attach wrote
  (the resumed process has telemetry from its first step);
* a training that hangs inside a known function: its name and file:line in
  ``summary --json`` and in the monitor's banner.

Other trainings may run on this machine: everything is found by the PIDs and
directories these tests created.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.agent import checkpoints, processes
from eagle3_tui.telemetry import manifest as mf
from eagle3_tui.telemetry.procs import cmdline
from tests.conftest import need_training, read_jsonl, wait_until, wait_until_async
from tests.transport.conftest import cli, remote_env
from tests.transport.sshd import ALIAS, Sshd

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).parents[1] / "attach" / "silent_training.py"
PACE = ("--step-delay", "0.15")


def hang_line() -> int:
    """The line of ``wait_for_a_lost_rank`` where the script blocks."""
    lines = SCRIPT.read_text().splitlines()
    start = lines.index("def wait_for_a_lost_rank() -> None:")
    return next(i + 1 for i in range(start, len(lines)) if ".wait()" in lines[i])


@dataclass
class Silent:
    """One launch of the user's script, detached, output to its log."""

    out: Path
    proc: subprocess.Popen[bytes]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ended(self) -> bool:
        return not self.alive()

    @property
    def log(self) -> str:
        return (self.out / "train.log").read_text(errors="replace")

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def run_dir(self) -> Path:
        return self.out / "eagle3"

    def wait_for(self, predicate: Callable[[], object], timeout: float, what: str) -> None:
        def holds() -> bool:
            assert self.alive() or what == "the end", f"exited:\n{self.log[-3000:]}"
            return bool(predicate())

        wait_until(holds, timeout, lambda: f"{what}:\n{self.log[-3000:]}", 0.1)

    def started(self) -> None:
        self.wait_for(lambda: "training started" in self.log, 240, "the training to start")

    def train_steps(self) -> list[int]:
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return []
        return [r["step"] for r in read_jsonl(path) if r["kind"] == "train"]

    def final_step(self) -> int:
        done = [ln for ln in self.log.splitlines() if ln.startswith("done global_step=")]
        assert done, self.log[-3000:]
        return int(done[-1].split("=")[1])


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    need_training()
    where = tmp_path_factory.mktemp("silent-data")
    subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(where), "--data", str(where), "--prepare-only"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return where


def user_env(sshd: Sshd) -> dict[str, str]:
    """The environment of a training started on the host, without eagle3-tui's marks."""
    env = remote_env(sshd)
    for key in (mf.RUN_ID_ENV, mf.RUN_DIR_ENV):
        env.pop(key, None)
    return env


@pytest.fixture
def started() -> Iterator[list[Silent]]:
    """The runs a test started; on leaving, killed, and only those: their sessions (the
    launcher's too) and the PIDs their manifests name."""
    runs: list[Silent] = []
    yield runs
    for run in runs:
        pids = [run.pid, run.proc.pid]
        with contextlib.suppress(OSError, ValueError):
            pids.append(int(json.loads((run.run_dir / "run.json").read_text())["pid"]))
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            run.proc.wait(30)


@pytest.fixture
def launch(sshd: Sshd, data: Path, tmp_path: Path, started: list[Silent]) -> Callable[..., Silent]:
    def start(name: str, *args: str) -> Silent:
        out = tmp_path / name
        out.mkdir()
        with open(out / "train.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, str(SCRIPT), "--out", str(out), "--data", str(data), *args],
                cwd=out,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=user_env(sshd),
                start_new_session=True,
            )
        run = Silent(out, proc)
        started.append(run)
        return run

    return start


LAUNCHER = """#!/bin/sh
# the user's launcher: the training in the background, immune to hangups, its output
# in a log, its exit status in a file; this script exits at once
cd "$1" || exit 1
shift
nohup sh -c '"$@"; echo $? > exit_status' sh "$@" > train.log 2>&1 &
echo $! > launcher.pid
"""


class Nohup(Silent):
    """The user's script started by :data:`LAUNCHER` (``nohup … &``): not a child of
    this test; its exit status comes from the launcher's file."""

    def __init__(self, out: Path, launcher: subprocess.Popen[bytes]) -> None:
        super().__init__(out, launcher)
        shell = int(wait_until(lambda: self.read("launcher.pid"), 30, "the launcher"))

        def training() -> int | None:
            kids = [p.pid for p in processes.all_procs().values() if p.ppid == shell]
            return kids[0] if kids and "silent_training" in " ".join(cmdline(kids[0])) else None

        self.training_pid = wait_until(training, 30, "the nohup'd training")

    def read(self, name: str) -> str:
        try:
            return (self.out / name).read_text().strip()
        except OSError:
            return ""

    @property
    def pid(self) -> int:
        return self.training_pid

    def alive(self) -> bool:
        return not self.read("exit_status")

    def exit_status(self) -> int:
        return int(self.read("exit_status"))


@pytest.fixture
def launch_nohup(
    sshd: Sshd, data: Path, tmp_path: Path, started: list[Silent]
) -> Callable[..., Nohup]:
    """The user's script started by a launcher script written here (:data:`LAUNCHER`)."""
    script = tmp_path / "launch.sh"
    script.write_text(LAUNCHER)
    script.chmod(0o755)

    def start(name: str, *args: str) -> Nohup:
        out = tmp_path / name
        out.mkdir()
        command = [sys.executable, str(SCRIPT), "--out", str(out), "--data", str(data), *args]
        launcher = subprocess.Popen(
            [str(script), str(out), *command],
            stdin=subprocess.DEVNULL,
            env=user_env(sshd),
            start_new_session=True,
        )
        assert launcher.wait(30) == 0
        run = Nohup(out, launcher)
        started.append(run)
        return run

    return start


def attach(sshd: Sshd, run: Silent, *extra: str) -> tuple[int, dict[str, Any]]:
    proc = cli(
        "attach", *sshd.args(), f"{ALIAS}:{run.run_dir}", "--pid", str(run.pid), "--yes",
        "--json", *extra, timeout=180,
    )  # fmt: skip
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_attach_over_ssh_then_the_run_ends_as_an_undisturbed_one(
    sshd: Sshd, launch_nohup: Callable[..., Nohup]
) -> None:
    """Two trainings started with ``nohup`` by a launcher script, one attached to through
    eagle3-tui's injector (its main thread stopped for milliseconds, every register
    given back), one left alone: both end with the same global_step and exit status."""
    undisturbed = launch_nohup("undisturbed", "--epochs", "3", *PACE)
    silent = launch_nohup("attached", "--epochs", "3", *PACE)
    silent.started()
    assert not silent.run_dir.exists()
    rc, out = attach(sshd, silent)
    assert rc == 0 and out["status"] == "attached", out
    at_step = out["global_step"]
    assert out["run_dir"] == str(silent.run_dir) and out["total_steps"] == 72
    assert out["plan"]["log_file"] == str(silent.out / "train.log")  # nohup's > train.log
    assert "/eagle3-tui/lib/" in out["telemetry_from"]  # shipped, not the installed package
    assert out["found_by"] == "frames" and out["pause_ms"] > 0
    assert out["plan"]["mechanism"] == "ptrace" and out["registers"] == "verified"
    assert 0 < out["stopped_ms"] < 1000  # the main thread only, for milliseconds
    silent.wait_for(lambda: len(silent.train_steps()) >= 3, 120, "the next steps' metrics")
    assert silent.train_steps()[0] in (at_step, at_step + 1)

    rc, again = attach(sshd, silent)
    assert rc == 31 and again["status"] == "already", again
    assert str(silent.run_dir) in again["message"]

    for run in (silent, undisturbed):
        run.wait_for(run.ended, 300, "the end")
    assert silent.exit_status() == undisturbed.exit_status() == 0
    assert silent.final_step() == undisturbed.final_step() == 72
    records = read_jsonl(silent.run_dir / "metrics.jsonl")
    steps = [r["step"] for r in records if r["kind"] == "train"]
    assert steps == list(range(steps[0], 72))  # every step from the attach on, once
    events = [r for r in records if r["kind"] == "lifecycle"]
    assert [e["event"] for e in events] == ["start", "attach", "finish"]
    assert events[0]["global_step"] == at_step and events[-1]["step"] == 72
    assert len([r for r in records if r["kind"] == "val"]) == 3
    manifest = json.loads((silent.run_dir / "run.json").read_text())
    assert manifest["status"] == "finished" and manifest["pid"] == silent.pid
    assert manifest["attached"]["mechanism"] == "ptrace"
    assert manifest["log_file"] == str(silent.out / "train.log")


def test_kill_and_resume_an_attached_run(sshd: Sshd, launch: Any) -> None:
    run = launch("killed", "--epochs", "30", "--step-delay", "0.1")
    run.started()
    rc, out = attach(sshd, run)
    assert rc == 0 and out["status"] == "attached", out
    target = f"{ALIAS}:{run.run_dir}"
    ckpt0 = run.out / "checkpoints" / "0" / "training_state.json"
    run.wait_for(ckpt0.exists, 240, "the first checkpoint")

    proc = cli("kill", *sshd.args(), target, "--json", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["status"] == "stopped"
    trainer = [p for p in report["processes"] if p["role"] == "trainer"]
    # the attached telemetry stops it at a step boundary: asked, not signalled
    assert trainer and trainer[0]["pid"] == run.pid and trainer[0]["signals"] == [], report
    assert report["stop"]["how"] == "step_boundary", report["stop"]
    assert run.proc.wait(30) == 0  # speculators' graceful exit
    family = [p for p in processes.all_procs().values() if p.pid == run.pid or p.ppid == run.pid]
    assert [p for p in family if not p.zombie] == []
    # its interrupt save became the numbered checkpoint the library resumes from mid-epoch
    latest = checkpoints.latest_numbered(run.out / "checkpoints")
    assert latest is not None and str(latest) == report["stop"]["checkpoint"]["path"]
    assert checkpoints.checkpoint_problems(latest) == []
    step = json.loads((latest / "training_state.json").read_text())["global_step"]
    assert step == report["stop"]["global_step"] and report["stop"]["redo"]["steps"] == 0

    proc = cli("resume", *sshd.args(), target, "--json", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    resumed = json.loads(proc.stdout)
    assert resumed["status"] == "started" and resumed["confirmed"], resumed
    pid = resumed["pid"]
    try:

        def after_resume() -> list[dict[str, Any]]:
            records = read_jsonl(run.run_dir / "metrics.jsonl")
            marks = [
                i for i, r in enumerate(records)
                if r["kind"] == "lifecycle" and r["event"] == "resume" and r["pid"] == pid
            ]  # fmt: skip
            return [r for r in records[marks[0] :] if r["kind"] == "train"] if marks else []

        def three_steps() -> bool:
            assert processes.proc_stat(pid) is not None, run.log[-3000:]
            return len(after_resume()) >= 3

        wait_until(three_steps, 240, lambda: f"three steps:\n{run.log[-3000:]}", 0.2)
        assert [r["step"] for r in after_resume()[:3]] == [step, step + 1, step + 2]
        manifest = json.loads((run.run_dir / "run.json").read_text())
        assert manifest["pid"] == pid and manifest["resumes"] == 1
        assert manifest["checkpoint_dir"] == str(run.out / "checkpoints")  # the Trainer, watched

        proc = cli("kill", *sshd.args(), target, "--json", timeout=240)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        report = json.loads(proc.stdout)
        assert report["status"] == "stopped"
        assert {p["pid"] for p in report["processes"] if p["role"] == "trainer"} == {pid}
    finally:
        if processes.proc_stat(pid) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


async def test_a_hung_training_says_where_it_hangs(sshd: Sshd, launch: Any) -> None:
    from eagle3_tui.app.widgets.header import HealthBanner
    from tests.app.conftest import local_app, text_of
    from tests.conftest import until

    hang = launch("hung", "--epochs", "3", *PACE, "--hang-when", "HANG")
    hang.started()
    rc, out = attach(sshd, hang)
    assert rc == 0 and out["status"] == "attached", out
    hang.wait_for(lambda: len(hang.train_steps()) >= 2, 120, "metrics")
    (hang.out / "HANG").touch()
    hang.wait_for(lambda: "hangs now" in hang.log, 60, "the hang")
    where = f"wait_for_a_lost_rank (silent_training.py:{hang_line()})"
    target = f"{ALIAS}:{hang.run_dir}"
    polls: list[tuple[int, dict[str, Any]]] = []

    def stalled() -> bool:
        proc = cli("summary", *sshd.args(), target, "--json", timeout=60)
        polls.append((proc.returncode, json.loads(proc.stdout)))
        return bool(polls[-1][1]["health"] == "stalled")

    await wait_until_async(stalled, 150, lambda: f"a stall: {polls[-1][1]}", 2)
    returncode, summary = polls[-1]
    assert returncode == 4
    assert where in summary["reason"] and "stuck in " in summary["reason"]
    assert where in summary["stuck"]["where"]
    frame = next(f for f in summary["stuck"]["frames"] if f["func"] == "wait_for_a_lost_rank")
    assert frame["file"] == str(SCRIPT) and frame["line"] == hang_line()
    assert "trainer.py:" in summary["stuck"]["where"]  # where speculators' loop called it

    run_dir = hang.run_dir
    app = local_app(run_dir, status_interval=1.0, refresh_interval=0.1)
    async with app.run_test(size=(160, 40)) as pilot:
        banner = app.query_one(HealthBanner)
        await until(pilot, lambda: banner.display and "STALLED" in text_of(banner), 30, "banner")
        assert where in text_of(banner, width=400).replace("\n", "")
    proc = cli("kill", *sshd.args(), target, "--grace", "3", "--json", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


async def test_the_a_key_attaches_and_the_waiting_view_comes_alive(sshd: Sshd, launch: Any) -> None:
    """The monitor opened over SSH on a directory with no metrics yet (waiting); ``a``,
    the host's training picked, ``y``: the metrics arrive in the same view."""
    from eagle3_tui.app.app import make_app
    from eagle3_tui.app.run_control import RunControl
    from eagle3_tui.app.screens.attach import AttachDialog
    from eagle3_tui.transport.base import Link
    from eagle3_tui.transport.ssh import SshHost, SshTransport
    from tests.conftest import until
    from tests.transport.conftest import ssh_target

    run = launch("viewed", "--epochs", "30", "--step-delay", "0.1")
    run.started()
    run.run_dir.mkdir()
    target = ssh_target(sshd, run.run_dir)
    host = SshHost(target)
    app = make_app(
        SshTransport(host, str(run.run_dir)),
        control=RunControl.for_target(target, host),
        refresh_interval=0.1,
    )
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.link.link == Link.WAITING, 60, "waiting for metrics")
            await pilot.press("a")
            await until(pilot, lambda: isinstance(app.screen, AttachDialog), 10, "the dialog")
            dialog = app.screen
            assert isinstance(dialog, AttachDialog)
            await until(
                pilot, lambda: dialog.state in ("choosing", "ready", "failed"), 60, "the plan"
            )
            if dialog.state == "choosing":  # other trainings run on this machine
                pids = [c.pid for c in dialog.choices]
                if run.pid not in pids:
                    pytest.skip("more than 9 trainings run here: ours is not offered")
                await pilot.press(str(pids.index(run.pid) + 1))
                await until(pilot, lambda: dialog.state in ("ready", "failed"), 60, "the plan")
            assert dialog.state == "ready" and dialog.plan is not None, dialog.plan
            assert dialog.plan.pid == run.pid, dialog.plan
            await pilot.press("y")
            await until(pilot, lambda: dialog.state in ("done", "failed"), 120, "the attach")
            assert dialog.state == "done"
            await pilot.press("escape")
            await until(
                pilot, lambda: app.snapshot.global_step is not None, 120, "metrics in the view"
            )
            assert app.link.link == Link.CONNECTED
    finally:
        await host.close()
    assert json.loads((run.run_dir / "run.json").read_text())["pid"] == run.pid
