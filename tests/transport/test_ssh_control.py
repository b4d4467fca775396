"""Process control over a real sshd on fake runs: a reused PID, a kill that outlives its
connection, and a hostile run directory name that must stay data."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.telemetry import manifest as mf
from eagle3_tui.telemetry import procs
from eagle3_tui.transport.base import Chunk, TargetError
from eagle3_tui.transport.calls import kill_run, list_runs
from eagle3_tui.transport.channel import AgentFailedError, Event
from eagle3_tui.transport.ssh import SshHost, SshTransport
from tests.records import Lines
from tests.transport.conftest import cli, remote_env, ssh_target
from tests.transport.fakes import (
    RESUMED,
    alive,
    dead_pid,
    fake_manifest,
    marker_processes,
    register,
    start_fake_trainer,
    write_checkpoint,
)
from tests.transport.sshd import ALIAS, Sshd

pytestmark = pytest.mark.slow

HOSTILE = "run $(touch PWNED1) ;touch PWNED2; x`touch PWNED3` 'q\"\nz & | > PWNED4 \\"


def test_kill_over_ssh_refuses_a_reused_pid(sshd: Sshd, tmp_path: Path) -> None:
    other = subprocess.Popen(["sleep", "300"])
    try:
        run_dir = tmp_path / "run"
        fake_manifest(run_dir, other.pid, f"reused-{time.time_ns()}")
        ticks = procs.start_ticks(other.pid)
        assert ticks is not None
        mf.update_manifest(run_dir / "run.json", start_ticks=ticks + 7)  # another process's
        proc = cli("kill", *sshd.args(), f"{ALIAS}:{run_dir}", "--json")
        assert proc.returncode == 9, proc.stdout + proc.stderr
        result = json.loads(proc.stdout)
        assert result["status"] == "refused" and f"pid {other.pid} now belongs" in result["message"]
        assert other.poll() is None  # not signalled
    finally:
        other.kill()
        other.wait()


async def test_a_kill_finishes_on_the_host_when_its_connection_drops(
    sshd: Sshd, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    trainer = start_fake_trainer(run_dir, remote_env(sshd))
    escaped = int((tmp_path / "escaped.pid").read_text())
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    host = SshHost(ssh_target(sshd))

    def drop_after_sigterm(ev: Event) -> None:
        if ev.get("step") == "signal" and ev.get("signal") == "SIGTERM":
            sshd.kill_sessions()

    try:
        with pytest.raises(TargetError, match="connection lost during kill"):
            await kill_run(host, str(run_dir), 20.0, on_progress=drop_after_sigterm)
        await host.close()
        # the agent carries on alone: the escaped worker gets SIGTERM, then SIGKILL
        deadline = time.monotonic() + 30
        while marker_processes(run_id) or alive(trainer.pid):
            assert time.monotonic() < deadline, f"left behind: {marker_processes(run_id)}"
            await asyncio.sleep(0.1)
        proc = cli("kill", *sshd.args(), f"{ALIAS}:{run_dir}")
        assert proc.returncode == 0 and proc.stdout.startswith("nothing to stop"), proc.stdout
    finally:
        for pid in (trainer.pid, escaped):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        trainer.wait(10)
        await host.close()


def pwned(tree: Path, *dirs: Path) -> set[Path]:
    """Files a shell would have created: anywhere under ``tree``, or in ``dirs``."""
    return set(tree.rglob("PWNED*")).union(*(set(d.glob("PWNED*")) for d in dirs))


async def test_a_hostile_run_directory_name_is_data_never_code(sshd: Sshd, tmp_path: Path) -> None:
    run_dir = tmp_path / HOSTILE
    dirs = (Path.home(), Path.cwd(), sshd.root, Path("/tmp"), Path("/"))
    before = pwned(tmp_path, *dirs)
    lines = Lines()
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_bytes(
        b"".join(lines.train(i, 2.0) for i in range(6)) + lines.event("interrupt", step=5)
    )
    script = tmp_path / "resumed.py"
    script.write_text(RESUMED)
    run_id = f"hostile-{time.time_ns()}"
    fake_manifest(
        run_dir,
        dead_pid(),
        run_id,
        checkpoint_dir=str(run_dir / "checkpoints"),
        resume_command=[sys.executable, str(script), str(run_dir)],
        cwd=str(run_dir),
        env={mf.RUN_ID_ENV: run_id},
    )
    write_checkpoint(run_dir / "checkpoints" / "0", global_step=6)
    register(sshd.state_home, run_id, run_dir)
    target = f"{ALIAS}:{run_dir}"

    host = SshHost(ssh_target(sshd))
    got = b""
    try:
        async with asyncio.timeout(60):
            async for ev in SshTransport(host, str(run_dir)).stream(0):
                if isinstance(ev, Chunk):
                    got += ev.data
                    if got.count(b"\n") == 7:
                        break
    finally:
        await host.close()
    assert got == (run_dir / "metrics.jsonl").read_bytes()

    summary = cli("summary", *sshd.args(), target, "--json")
    assert summary.returncode == 7, summary.stdout + summary.stderr  # stopped (interrupted)
    assert json.loads(summary.stdout)["global_step"] == 5
    runs = cli("runs", *sshd.args(), ALIAS, "--json")
    assert runs.returncode == 0 and json.loads(runs.stdout)["runs"][0]["run_dir"] == str(run_dir)
    killed = cli("kill", *sshd.args(), target)
    assert killed.returncode == 0 and killed.stdout.startswith("nothing to stop"), killed.stdout
    resumed = cli("resume", *sshd.args(), target, "--json")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    pid = json.loads(resumed.stdout)["pid"]
    try:
        seen = json.loads((run_dir / "resumed.json").read_text())
        assert seen["pid"] == pid and seen["cwd"] == str(run_dir) and seen["marker"] == run_id
        killed = cli("kill", *sshd.args(), target, "--json")
        assert killed.returncode == 0, killed.stdout + killed.stderr
        report = json.loads(killed.stdout)
        assert report["status"] == "stopped" and [p["pid"] for p in report["processes"]] == [pid]
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    local = cli("kill", str(run_dir))  # the same through the local path
    assert local.returncode == 0 and local.stdout.startswith("nothing to stop")
    assert pwned(tmp_path, *dirs) == before, "a hostile name was executed"


def test_the_remote_interpreter_option_is_quoted_too(sshd: Sshd, tmp_path: Path) -> None:
    before = pwned(tmp_path, Path.home(), Path("/"))
    proc = cli("runs", *sshd.args(), "--remote-python", "python3; touch PWNED", ALIAS)
    assert proc.returncode == 2 and "not found" in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1
    assert pwned(tmp_path, Path.home(), Path("/")) == before


async def test_an_interpreter_gone_before_its_request_is_named_not_a_lost_link(
    sshd: Sshd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A missing ``--remote-python`` can end its channel before the request is written
    (CI, once): the write's "Channel not open for sending" was reported as the link's
    failure. The command's own end (status 127, the shell's words) says why."""
    host = SshHost(ssh_target(sshd, remote_python="no-such-python3"))
    conn = await host.connect()
    real = conn.create_process

    async def ended_first(*args: Any, **kwargs: Any) -> Any:
        proc = await real(*args, **kwargs)
        await proc.wait_closed()  # the command has ended: its channel takes no more
        return proc

    monkeypatch.setattr(conn, "create_process", ended_first)
    try:
        with pytest.raises(AgentFailedError, match=r"no-such-python3 not found .*not found"):
            await list_runs(host)
    finally:
        await host.close()
