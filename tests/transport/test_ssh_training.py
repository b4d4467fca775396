"""The real thing over a real sshd: a live tiny speculators training with two dataloader
workers is streamed (through a killed session), killed (checkpoint saved, no process
left) and resumed (the step count continues). One training, started once per module:
the tests run in order, and each prepares what it needs if run alone."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from eagle3_tui.agent import checkpoints, processes
from eagle3_tui.transport.base import Link
from eagle3_tui.transport.calls import kill_run
from eagle3_tui.transport.channel import LocalHost
from eagle3_tui.transport.openssh import OpenSshHost, find_ssh
from eagle3_tui.transport.ssh import SshHost
from eagle3_tui.transport.target import SshTarget
from tests.conftest import LiveRun, live_training, read_jsonl, wait_until
from tests.transport.conftest import cli, remote_env, ssh_target
from tests.transport.fakes import marker_processes
from tests.transport.sshd import ALIAS, Sshd
from tests.transport.test_ssh_stream import Follower

pytestmark = pytest.mark.slow
TRAINING = ("--epochs", "40", "--workers", "2", "--step-delay", "0.05")  # stopped, never done


def wait_for(predicate: Callable[[], object], timeout: float, what: str, run: LiveRun) -> None:
    wait_until(predicate, timeout, lambda: f"{what}:\n{run.log()}", interval=0.2)


@pytest.fixture(scope="module")
def live(sshd: Sshd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveRun]:
    """A tiny training launched on "the host" as a user would: detached, output to its log,
    many epochs (it is stopped by the tests, never finished)."""
    with live_training(tmp_path_factory.mktemp("live") / "run", TRAINING, remote_env(sshd)) as run:
        yield run


def monitor_stream_host(target: SshTarget) -> SshHost | OpenSshHost:
    """What the monitor streams through: the ssh binary where installed, else asyncssh."""
    return OpenSshHost(target) if find_ssh() else SshHost(target)


def train_steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("kind") == "train"]


async def test_stream_a_live_training_through_a_killed_session(sshd: Sshd, live: LiveRun) -> None:
    host = monitor_stream_host(ssh_target(sshd))
    f = Follower.ssh(host, live.run_dir)

    def trains() -> int:
        return sum(1 for r in f.records if r.kind == "train")

    try:
        await f.until(lambda: trains() >= 4, timeout=240, what="the first train records")
        seen = trains()
        assert sshd.kill_sessions() >= 1
        await f.until(lambda: trains() >= seen + 6, timeout=120, what="records after the kill")
    finally:
        await f.close()
        await host.close()
    assert f.count(Link.RECONNECTING) >= 1
    by_writer: dict[str, list[int]] = {}
    for r in f.records:
        by_writer.setdefault(r.w, []).append(r.seq)
    for w, seqs in by_writer.items():  # every record exactly once, per writer
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"writer {w}: {seqs}"
    steps = [r.step for r in f.records if r.kind == "train"]
    assert steps == sorted(set(steps))  # no step twice, none out of order


def test_kill_a_real_training_leaves_a_checkpoint_and_no_process(sshd: Sshd, live: LiveRun) -> None:
    ckpt0 = live.run_dir / "checkpoints" / "0" / "training_state.json"
    wait_for(ckpt0.exists, 240, "the first checkpoint", live)
    assert live.proc.poll() is None, live.log()
    run_id = str(live.manifest()["run_id"])
    procs = processes.all_procs()
    family = {p: procs[p].start for p in processes.descendants(live.proc.pid, procs)}
    workers = [p for p in family if procs[p].comm == "pt_data_worker"]
    assert len(workers) == 2, {p: procs[p].comm for p in family}

    proc = cli("kill", *sshd.args(), f"{ALIAS}:{live.run_dir}", "--json", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    by_pid = {p["pid"]: p for p in report["processes"]}
    assert report["status"] == "stopped"
    assert by_pid[live.proc.pid]["role"] == "trainer"
    assert by_pid[live.proc.pid]["signals"] == []  # asked to stop at a step boundary
    assert report["stop"]["how"] == "step_boundary", report["stop"]
    assert by_pid[live.proc.pid]["outcome"] == "exited"
    assert set(workers) <= set(by_pid)
    assert all(p["outcome"] in ("exited", "killed") for p in report["processes"])

    assert live.proc.wait(30) == 0  # speculators' graceful exit
    for pid, start in family.items():  # independently of the report: nothing remains
        p = processes.proc_stat(pid)
        assert p is None or p.start != start or p.zombie, f"{pid} ({procs[pid].comm}) remains"
    assert marker_processes(run_id) == []
    # its interrupt save, now the numbered checkpoint a resume continues from: whole
    saved = Path(report["stop"]["checkpoint"]["path"])
    assert saved.parent == live.run_dir / "checkpoints" and saved.name.isdigit()
    assert checkpoints.checkpoint_problems(saved) == []  # whole weights and optimizer state
    assert report["checkpoints"]["latest"]["problems"] == []
    events = [
        r["event"] for r in read_jsonl(live.run_dir / "metrics.jsonl") if r["kind"] == "lifecycle"
    ]
    assert events[-1] == "interrupt"


async def test_resume_continues_the_step_count(sshd: Sshd, live: LiveRun) -> None:
    if live.proc.poll() is None:  # run alone: stop it first, once a checkpoint exists
        ckpt0 = live.run_dir / "checkpoints" / "0" / "training_state.json"
        wait_for(ckpt0.exists, 240, "the first checkpoint", live)
        killed = await kill_run(LocalHost(), str(live.run_dir), 200.0)
        assert killed.status == "stopped"
    latest = checkpoints.latest_numbered(live.run_dir / "checkpoints")
    assert latest is not None
    step = json.loads((latest / "training_state.json").read_text())["global_step"]
    before = len(train_steps(live.run_dir))
    assert step > 0 and max(train_steps(live.run_dir)) >= step - 1  # saved after step - 1

    proc = cli("resume", *sshd.args(), f"{ALIAS}:{live.run_dir}", "--json", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    pid = result["pid"]
    live.started.append(pid)
    assert result["status"] == "started" and result["checkpoint"]["global_step"] == step

    host = monitor_stream_host(ssh_target(sshd))
    f = Follower.ssh(host, live.run_dir)
    try:
        await f.until(
            lambda: sum(1 for r in f.records if r.kind == "train") >= before + 3,
            timeout=240,
            what="train records of the resumed run",
        )
    finally:
        await f.close()
        await host.close()
    resumed = [r for r in f.records if r.kind == "lifecycle" and r.event == "resume"]
    assert resumed and resumed[-1].pid == pid
    after = [r.step for r in f.records[f.records.index(resumed[-1]) :] if r.kind == "train"]
    assert after[:3] == [step, step + 1, step + 2]  # continues from the checkpoint, not 0

    proc = cli("kill", *sshd.args(), f"{ALIAS}:{live.run_dir}", "--json", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["status"] == "stopped"
    assert {p["pid"] for p in report["processes"] if p["role"] == "trainer"} == {pid}
    assert marker_processes(str(live.manifest()["run_id"])) == []
