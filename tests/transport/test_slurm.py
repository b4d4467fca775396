"""Slurm jobs as targets, end to end: a real Slurm of one node (Debian's munged,
slurmctld and slurmd, tests/slurm.py), a real tiny speculators training submitted with
``sbatch``, and eagle3-tui reaching the login host over a real sshd (``HOST:job/ID``).

Listed with the pending one's reason, read, stopped through Slurm at a step boundary
with its checkpoint saved, the job's state from the scheduler, requeued and resumed from
that step; a pending job waits, then is cancelled; a job Slurm does not know is one
line."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.agent.slurm import parse_show_job
from eagle3_tui.transport import calls
from eagle3_tui.transport.replies import SlurmJob
from eagle3_tui.transport.target import LocalTarget, SshOptions, SshTarget, parse_target
from tests.app.test_tmux import Tmux
from tests.conftest import need, need_training, read_jsonl, wait_until
from tests.slurm import Slurm, have_slurm
from tests.transport.conftest import cli
from tests.transport.sshd import ALIAS, Sshd, have_sshd

pytestmark = pytest.mark.slow


def test_scontrol_lines_and_job_targets_are_read_as_written() -> None:
    line = (
        "JobId=12 JobName=e3 tiny UserId=alice(1001) JobState=PENDING Reason=Dependency "
        "Command=/w/train.sh --lr=3e-4 two words WorkDir=/w x StdOut=/w/out-12.log Power="
    )
    fields = parse_show_job(line)
    assert fields["JobName"] == "e3 tiny"
    assert fields["Command"] == "/w/train.sh --lr=3e-4 two words"
    assert fields["WorkDir"] == "/w x"
    assert fields["Power"] == ""
    assert parse_target("login:job/12") == SshTarget("login", job="12")
    assert parse_target("bob@login:job/12_3") == SshTarget("login", "bob", job="12_3")
    assert parse_target("job/7") == LocalTarget(Path("."), job="7")
    assert parse_target("login:job/x").job is None  # a directory named so
    pending = SlurmJob(id="5", state="PENDING", reason="Resources")
    assert pending.state_text() == "PENDING (Resources)"
    failed = SlurmJob(id="6", state="FAILED", exit_code=[143, 0], nodes=["gpu01"])
    assert failed.state_text() == "FAILED (exit 143)"
    assert SlurmJob(id="7", state="RUNNING", nodes=["a", "b"]).state_text() == "RUNNING on a +1"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    need(have_slurm(), "Slurm is not installed (apt-get install slurmctld slurmd munge)")
    need(os.geteuid() == 0, "the test Slurm runs its daemons and jobs as root")
    server = Slurm(tmp_path_factory.mktemp("slurm")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def login(tmp_path_factory: pytest.TempPathFactory, slurm: Slurm) -> Iterator[Sshd]:
    """The login host: a real sshd whose sessions find this Slurm (SLURM_CONF)."""
    need(have_sshd(), "OpenSSH sshd is not installed (apt-get install openssh-server)")
    server = Sshd(tmp_path_factory.mktemp("login"), set_env={"SLURM_CONF": str(slurm.conf)})
    server.start()
    yield server
    server.stop()


def eagle(login: Sshd, *args: str) -> Any:
    return cli(*args, "-F", str(login.ssh_config), timeout=240)


async def jobs_shown(login: Sshd) -> str | None:
    from eagle3_tui.cli.monitor import slurm_jobs_shown

    host = calls.open_host(SshTarget(ALIAS, options=SshOptions(config=(str(login.ssh_config),))))
    try:
        return await slurm_jobs_shown(host)
    finally:
        await host.close()


def flat(screen: str) -> str:
    """A screen's words on one line, a dialog's borders left out."""
    return " ".join(re.sub(r"[│┃║▌▐█▀▄]", " ", screen).split())


def train_steps(run_dir: Path) -> list[dict[str, Any]]:
    try:
        return [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    except (OSError, ValueError):
        return []


def test_a_job_listed_read_stopped_through_slurm_and_requeued_from_its_step(
    tmp_path: Path, slurm: Slurm, login: Sshd, capsys: pytest.CaptureFixture[str]
) -> None:
    need_training()
    work = tmp_path / "work"
    work.mkdir()
    run_dir = work / "run"
    script = work / "train.sbatch"
    command = [sys.executable, "-m", "eagle3_tui.train.tiny", "--run-dir", str(run_dir)]
    command += ["--epochs", "40", "--step-delay", "0.25", "--checkpoint-freq", "1"]
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH -o {work}/slurm-%j.out\n"
        f"cd {shlex.quote(str(work))}\n"
        f"{shlex.join(command)}\n"
    )
    env = {"XDG_STATE_HOME": str(login.state_home)}  # the index the login's agent reads
    job = slurm.sbatch(script, "-J", "e3-tiny", env=env)
    held = slurm.sbatch(script, "-J", "e3-held", "--hold", env=env)
    target = f"{ALIAS}:job/{job}"
    try:
        # listed from the login host: the training running, the held one with its reason
        wait_until(lambda: slurm.state(job) == "RUNNING", 60, lambda: slurm.state(job))
        listed = eagle(login, "runs", ALIAS)
        assert listed.returncode == 0, listed.stderr
        rows = {line.split()[0]: line for line in listed.stdout.splitlines() if line[:1].isdigit()}
        assert "RUNNING on" in rows[job] and "e3-tiny" in rows[job], listed.stdout
        assert "PENDING (JobHeldUser)" in rows[held], listed.stdout
        assert f"{work}/slurm-{job}.out" in rows[job]
        # the login host alone, where no training of the user's runs on it: its jobs to
        # pick from (what `eagle3-tui LOGIN` prints; here the job runs on the login host
        # itself, and other tests' trainings may too, so the monitor would open one)
        picked = asyncio.run(jobs_shown(login))
        shown = capsys.readouterr().out
        assert picked == "", shown  # two jobs: listed, none opened
        assert "PENDING (JobHeldUser)" in shown and f"{ALIAS}:job/ID" in shown, shown

        wait_until(lambda: len(train_steps(run_dir)) >= 6, 120, lambda: slurm.state(job))
        read = eagle(login, "summary", "--json", target)
        assert read.returncode == 0, read.stderr
        summary = json.loads(read.stdout)
        assert summary["health"] == "running", summary["reason"]
        assert summary["slurm"]["job"] == job and summary["slurm"]["state"] == "RUNNING"
        assert f"Slurm job {job} (e3-tiny): RUNNING on" in read.stderr

        # k: stopped at a step boundary (its checkpoint saved), then Slurm ends the job
        stopped = eagle(login, "kill", target)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert f"slurm    job {job} (e3-tiny)" in stopped.stdout, stopped.stdout
        assert "stopped at a step boundary" in stopped.stdout + stopped.stderr
        assert slurm.state(job) in ("COMPLETED", "CANCELLED"), slurm.state(job)
        assert slurm.run("scontrol", "listpids", job).returncode != 0  # nothing of it left
        last = train_steps(run_dir)[-1]["step"]
        after = json.loads(eagle(login, "summary", "--json", target).stdout)
        assert after["health"] == "stopped", after["reason"]
        assert after["slurm"]["state"] == slurm.state(job)
        assert after["slurm"]["exit_code"] is not None
        # its run directory alone is not relaunched outside Slurm: the job has ended
        outside = eagle(login, "resume", f"{ALIAS}:{run_dir}")
        assert outside.returncode != 0, outside.stdout
        assert f"this run was Slurm job {job}, which has ended" in outside.stderr + outside.stdout
        watched = eagle(login, "watch", target, "--once", "--state", str(tmp_path / "w.json"))
        assert watched.returncode == 7, watched.stdout + watched.stderr  # the job's run: stopped

        # r: requeued through Slurm; the library continues after the stop's step
        resumed = eagle(login, "resume", target)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert f"job {job} (e3-tiny) requeued (scontrol requeue)" in resumed.stdout
        assert slurm.state(job) == "RUNNING"

        def resumed_steps() -> list[int]:
            recs = read_jsonl(run_dir / "metrics.jsonl")
            starts = [
                i
                for i, r in enumerate(recs)
                if r["kind"] == "lifecycle" and r["event"] in ("start", "resume")
            ]
            after_it = recs[starts[-1] :] if len(starts) > 1 else []
            return [r["step"] for r in after_it if r["kind"] == "train"]

        steps = wait_until(resumed_steps, 120, lambda: slurm.state(job))
        assert steps[0] == last + 1, (steps[:3], last)  # nothing redone, nothing skipped
        again = json.loads(eagle(login, "summary", "--json", target).stdout)
        assert again["slurm"]["restarts"] == 1 and again["health"] == "running"

        # the monitor on the job: k stops it and ends the job, r requeues it
        steps_before = len(train_steps(run_dir))
        wait_until(lambda: len(train_steps(run_dir)) > steps_before + 2, 60, "steps")
        tmux = Tmux(tmp_path / "tmux.sock")
        monitor = [sys.executable, "-m", "eagle3_tui", target, "-F", str(login.ssh_config)]
        shell = "env -u COLUMNS -u LINES TERM=xterm-256color " + shlex.join(monitor)
        tmux.run("new-session", "-d", "-x", "120", "-y", "40", f"{shell}; sleep 600")
        try:
            tmux.wait(lambda s: "RUNNING" in s and "k Kill" in s, 60, "the job's run")
            tmux.keys("k")
            tmux.wait(lambda s: f"Then Slurm: job {job} (e3-tiny)" in flat(s), 30, "kill plan")
            tmux.keys("y")
            done = f"slurm job {job} (e3-tiny)"
            tmux.wait(lambda s: done in flat(s) and "now " in flat(s), 120, "kill report")
            assert slurm.state(job) in ("COMPLETED", "CANCELLED"), slurm.state(job)
            tmux.keys("Escape")
            time.sleep(0.5)
            tmux.keys("r")
            tmux.wait(lambda s: f"requeue job {job} (e3-tiny)" in flat(s), 30, "requeue plan")
            tmux.keys("y")
            tmux.wait(lambda s: "requeued (scontrol requeue)" in flat(s), 90, "requeued")
            assert slurm.state(job) in ("RUNNING", "PENDING"), slurm.state(job)
        finally:
            tmux.run("kill-server")

        # a pending job: waiting with the scheduler's reason, then cancelled by k
        waiting = eagle(login, "summary", f"{ALIAS}:job/{held}")
        assert waiting.returncode == 0, waiting.stderr
        assert "waiting: Slurm job" in waiting.stdout and "JobHeldUser" in waiting.stdout
        cancelled = eagle(login, "kill", f"{ALIAS}:job/{held}")
        assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
        assert "cancelled through the scheduler" in cancelled.stdout
        assert slurm.state(held) == "CANCELLED"

        unknown = eagle(login, "summary", f"{ALIAS}:job/987654")
        assert unknown.returncode != 0
        assert "knows no job 987654" in unknown.stderr and "Traceback" not in unknown.stderr
    finally:
        slurm.run("scancel", job, held)
