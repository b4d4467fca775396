"""The agent's ``status`` op: whether a run's trainer lives (PID, start time, boot id)
and its manifest; what the monitor probes every few seconds."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from eagle3_tui.telemetry import manifest as mf
from eagle3_tui.transport.base import TargetError
from eagle3_tui.transport.calls import run_status
from eagle3_tui.transport.channel import LocalHost
from tests.transport.fakes import dead_pid, fake_manifest


async def test_status_alive_gone_and_reused(tmp_path: Path) -> None:
    host = LocalHost()
    sleeper = subprocess.Popen(["sleep", "60"])  # noqa: ASYNC220 - started at once
    try:
        run_dir = tmp_path / "alive"
        fake_manifest(run_dir, sleeper.pid, f"st-{os.getpid()}")
        status = await run_status(host, str(run_dir))
        assert status.alive is True and status.problem is None
        assert status.manifest["pid"] == sleeper.pid and status.run_dir == str(run_dir)
        assert status.host == os.uname().nodename and status.now is not None and status.now > 0

        reused = tmp_path / "reused"
        m = fake_manifest(reused, sleeper.pid, f"st2-{os.getpid()}")
        # the run's trainer was older: this PID belongs to another process now
        mf.update_manifest(reused / "run.json", start_ticks=int(m["start_ticks"]) - 1)
        status = await run_status(host, str(reused))
        assert status.alive is False and "belongs to another process" in str(status.problem)
    finally:
        sleeper.kill()
        sleeper.wait()
    gone = tmp_path / "gone"
    fake_manifest(gone, dead_pid(), f"st3-{os.getpid()}")
    status = await run_status(host, str(gone))
    assert status.alive is False


async def test_status_without_a_manifest_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(TargetError, match=r"no run\.json here"):
        await run_status(LocalHost(), str(tmp_path))
