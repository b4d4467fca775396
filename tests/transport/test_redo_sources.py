"""The resume plan names where the number of the run's last step came from: the real
agent's ``resume --plan`` on a stopped run's files (metrics.jsonl, its log, a complete
numbered checkpoint), as ``r`` shows it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.reports import format_resume_plan
from eagle3_tui.telemetry import procs
from eagle3_tui.transport.calls import resume_run
from eagle3_tui.transport.channel import LocalHost
from tests.records import Lines

CHECKPOINT_STEP = 48
"""Steps done at the checkpoint (its ``global_step``): the plan's "step 48"."""


def metric_line(step: int) -> str:
    """A line of a user's own handler in the log (0-based ``global_step``)."""
    return f"2026-12-07 16:00:00 INFO {{'train': {{'loss': 1.0}}, 'global_step': {step}}}\n"


def stopped_run(tmp_path: Path, manifest: dict[str, Any], log: str, steps: range) -> Path:
    """A stopped run: its manifest (its trainer gone), a complete numbered checkpoint
    holding step 48, its log, and metrics.jsonl with training steps ``steps``."""
    work = tmp_path / "work"
    ckpt = work / "checkpoints" / "0"
    ckpt.mkdir(parents=True)
    header = json.dumps({"__metadata__": {}}).encode()
    (ckpt / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    (ckpt / "config.json").write_text("{}")
    with zipfile.ZipFile(ckpt / "optimizer_state_dict.pt", "w") as z:
        z.writestr("data.pkl", b"x")
    state = {"global_step": CHECKPOINT_STEP, "epoch": 0, "local_step": CHECKPOINT_STEP}
    (ckpt / "training_state.json").write_text(json.dumps(state))
    (work / "train.log").write_text(log)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    run_dir = work / "eagle3-runs" / "r1"
    run_dir.mkdir(parents=True)
    lines = Lines(t0=1_800_000_000.0)
    (run_dir / "metrics.jsonl").write_bytes(b"".join(lines.train(s, 2.0) for s in steps))
    m = {
        "schema": 1,
        "run_id": "r1",
        "run_dir": str(run_dir),
        "pid": gone.pid,
        "start_ticks": 1,
        "boot_id": procs.boot_id(),
        "argv": [sys.executable, "train.py"],
        "cwd": str(work),
        "python": sys.executable,
        "checkpoint_dir": str(work / "checkpoints"),
        "resume_command": [sys.executable, "train.py"],
        "metrics_file": "metrics.jsonl",
        "log_file": str(work / "train.log"),
        "status": "interrupted",
        **manifest,
    }
    (run_dir / "run.json").write_text(json.dumps(m))
    os.chmod(run_dir / "run.json", 0o600)
    return run_dir


def redo_said(run_dir: Path) -> str:
    plan = asyncio.run(resume_run(LocalHost(), str(run_dir), 5.0, plan=True))
    assert plan.status == "plan", plan
    (line,) = [x for x in format_resume_plan(plan).splitlines() if x.startswith("redo")]
    return line


RESTARTED = {"restart": {"of": {"pid": 1}, "stopped": {"at": 0.0, "pace": None}}}
"""A training started without eagle3-tui: its kill recorded its restart."""


@pytest.mark.parametrize(
    ("manifest", "log"),
    [
        (RESTARTED, "step\n" + metric_line(49)),  # its log's last metric: step 50
        ({"attached": {"at": 0.0}}, "no metric line at all\n"),  # attached, then stopped
    ],
)
def test_the_last_step_from_metrics_jsonl_is_said_to_be_metrics_jsonls(
    tmp_path: Path, manifest: dict[str, Any], log: str
) -> None:
    """It said ``the run's last was 57 (its log's metric line)``: 57 was metrics.jsonl's
    last step (the log's last metric line was step 50; on an attached run the log had no
    metric line at all)."""
    run_dir = stopped_run(tmp_path, manifest, log, range(40, 57))
    said = redo_said(run_dir)
    assert said.endswith(
        "9 step(s): the checkpoint holds step 48, the run's last was 57 "
        "(metrics.jsonl's last training step)"
    ), said
    assert "log" not in said, said


def test_the_last_step_from_the_logs_metric_line_is_said_to_be_the_logs(tmp_path: Path) -> None:
    """No step in metrics.jsonl: the log's last metric line tells, and it is named."""
    run_dir = stopped_run(tmp_path, RESTARTED, metric_line(49) + "Traceback\n", range(0))
    said = redo_said(run_dir)
    assert said.endswith(
        "2 step(s): the checkpoint holds step 48, the run's last was 50 "
        "(its log's last metric line)"
    ), said
