"""``kill`` reports only what it produced, and what outlives a dead trainer is named
(issue 13, items 5 and 6): real processes, the real agent, this machine."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from eagle3_tui.agent.names import NVML_FIXTURE_ENV, RUN_ID_ENV
from eagle3_tui.api.reading import apply_status
from eagle3_tui.model.health import diagnose
from eagle3_tui.model.verdict import Health
from eagle3_tui.reports import format_kill
from eagle3_tui.transport.calls import kill_run, run_status
from eagle3_tui.transport.channel import LocalHost
from tests.conftest import wait_until
from tests.model.test_health import T0, state_of
from tests.records import Lines
from tests.transport.fakes import alive, dead_pid, fake_manifest, write_checkpoint

HOLD = 48 * 2**20
"""What the leftover worker holds in memory (bytes)."""


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _worker(run_id: str) -> subprocess.Popen[bytes]:
    """A dataloader-like helper of the run: it carries the run's marker, holds memory."""
    env = dict(os.environ, **{RUN_ID_ENV: run_id})
    code = f"import time\nx = bytearray({HOLD})\nx[::4096] = b'1' * len(x[::4096])\ntime.sleep(300)"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    wait_until(lambda: _rss(proc.pid) >= HOLD, 30, "the worker to start")
    return proc


async def test_status_names_what_outlived_the_trainer_and_kill_ends_it(
    tmp_path: Path, monkeypatch: object
) -> None:
    run_id = f"leftover-{os.getpid()}-{time.time_ns()}"
    run_dir = tmp_path / "run"
    worker = _worker(run_id)
    try:
        fake_manifest(run_dir, dead_pid(), run_id)  # the trainer was SIGKILLed
        # NVML (recorded readings) sees the worker holding 5 GiB on device 3
        devices = [{"index": i, "name": "NVIDIA H200", "processes": []} for i in range(4)]
        devices[3]["processes"] = [{"pid": worker.pid, "used_memory": 5 * 2**30}]
        fixture = tmp_path / "nvml.json"
        fixture.write_text(json.dumps({"devices": devices}))
        os.environ[NVML_FIXTURE_ENV] = str(fixture)  # the agent's environment
        try:
            status = await run_status(LocalHost(), str(run_dir))
        finally:
            del os.environ[NVML_FIXTURE_ENV]
        assert status.alive is False
        left = {x.pid: x for x in status.leftovers}
        assert list(left) == [worker.pid]
        assert (left[worker.pid].rss_bytes or 0) >= HOLD and left[worker.pid].comm == "python"
        assert left[worker.pid].gpu_bytes == 5 * 2**30 and left[worker.pid].gpus == [3]

        # the dead diagnosis names them
        lines = Lines(t0=T0)
        state = state_of(b"".join(lines.train(s, 1.0) for s in range(20)))
        apply_status(state, status, lines.ts)
        d = diagnose(state, lines.ts)
        assert d.health == Health.DEAD
        assert f"pid {worker.pid} python" in d.reason and "5.0 GiB on GPU 3" in d.reason
        assert "Left behind, still alive" in d.reason and "k ends them" in d.reason

        # and k ends them
        result = await kill_run(LocalHost(), str(run_dir), grace_s=5.0)
        assert result.status == "stopped", result
        assert [p.pid for p in result.processes] == [worker.pid]
        worker.wait(timeout=10)
        assert not alive(worker.pid)
        after = await run_status(LocalHost(), str(run_dir))
        assert after.leftovers == []
    finally:
        worker.kill()
        worker.wait()


KILLED_WHILE_STARTING = (
    "import time\ntime.sleep(300)  # still importing torch: no handler yet, SIGTERM ends it as is\n"
)
SAVES_ON_SIGTERM = (
    "import signal, sys, time\n"
    "from pathlib import Path\n"
    "def on_term(*_):\n"
    "    d = Path(sys.argv[1])\n"
    "    d.mkdir(parents=True, exist_ok=True)\n"
    "    (d / 'model.safetensors').write_bytes(b'new')\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, on_term)\n"
    "Path(sys.argv[2]).write_text('ready')\n"
    "time.sleep(300)\n"
)


async def test_kill_reports_only_the_checkpoint_it_produced(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    ckpt = run_dir / "checkpoints"
    write_checkpoint(ckpt / "0")
    write_checkpoint(ckpt / "interrupted")  # the previous process's stop
    old = time.time() - 3600
    for f in (ckpt / "interrupted").iterdir():
        os.utime(f, (old, old))
    run_id = f"kill-report-{os.getpid()}-{time.time_ns()}"
    env = dict(os.environ, **{RUN_ID_ENV: run_id})

    # a resumed trainer killed during its start-up: it writes nothing
    starting = subprocess.Popen([sys.executable, "-c", KILLED_WHILE_STARTING], env=env)  # noqa: ASYNC220
    try:
        fake_manifest(run_dir, starting.pid, run_id, checkpoint_dir=str(ckpt))
        result = await kill_run(LocalHost(), str(run_dir), grace_s=10.0)
    finally:
        starting.kill()
        starting.wait()
    assert result.status == "stopped"
    assert result.checkpoints.interrupted is not None
    assert result.checkpoints.interrupted.new is False
    text = format_kill(result)
    assert "interrupted: nothing written by this kill" in text
    assert "still starting" in text and "is an earlier stop's" in text
    assert "(step 20, epoch 1)" in text  # where a resume continues from, 1-based

    # a trainer that saves on SIGTERM: that one is its result
    ready = tmp_path / "ready"
    saving = subprocess.Popen(  # noqa: ASYNC220 - started at once
        [sys.executable, "-c", SAVES_ON_SIGTERM, str(ckpt / "interrupted"), str(ready)], env=env
    )
    try:
        while not ready.exists():  # noqa: ASYNC110 - a file another process writes
            await asyncio.sleep(0.02)
        fake_manifest(run_dir, saving.pid, run_id, checkpoint_dir=str(ckpt))
        result = await kill_run(LocalHost(), str(run_dir), grace_s=10.0)
    finally:
        saving.kill()
        saving.wait()
    assert result.checkpoints.interrupted is not None
    assert result.checkpoints.interrupted.new is True
    assert "nothing written" not in format_kill(result)
    assert "interrupted: " + str(ckpt / "interrupted") in format_kill(result)
