"""An interrupt is never overwritten by finish (issue 13, item 3): the README's one-liner
(``telemetry.finish()`` after ``run_training()``) on a real tiny training stopped by
SIGTERM ends interrupted, in the file, in run.json and in ``summary``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3_tui.cli import main
from tests.conftest import need_training, read_jsonl, wait_for_a_training_step

pytestmark = pytest.mark.slow


def test_sigterm_with_the_readme_one_liner_ends_interrupted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    need_training()
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "eagle3_tui.train.tiny", "--run-dir", str(run_dir)),
            *("--epochs", "3", "--step-delay", "0.2", "--one-liner", "--log", "none"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    try:
        wait_for_a_training_step(run_dir, proc, 240)
        assert json.loads((run_dir / "run.json").read_text())["pid"] == proc.pid
        os.kill(proc.pid, signal.SIGTERM)  # as `kill PID` or a scheduler's preemption
        assert proc.wait(timeout=180) == 0  # speculators saves interrupted/ and returns
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (run_dir / "checkpoints" / "interrupted").is_dir()
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["status"] == "interrupted"
    events = [
        r["event"] for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("kind") == "lifecycle"
    ]
    assert events[-1] == "interrupt" and "finish" not in events
    assert main(["summary", str(run_dir)]) == 7
    assert "Interrupted after step" in capsys.readouterr().out
