"""The README's screenshot is what the monitor draws now from the recorded run."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_screenshot_is_current() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "screenshot.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_recording_is_a_real_run_with_eight_recorded_gpus() -> None:
    """Small, and from the telemetry of the real tiny training: its writer's records,
    the sidecar's samples of the recorded 8×H200 readings, speculators' own messages."""
    path = ROOT / "docs" / "screenshot-run.jsonl.gz"
    assert path.stat().st_size < 100_000
    data = gzip.decompress(path.read_bytes())
    assert data.endswith(b"\n")
    assert b'"kind":"hparams"' in data and b'"kind":"val"' in data
    assert b'"name":"NVIDIA H200"' in data and b'"index":7' in data
    assert b"Checkpoint saved to" in data  # the library's logger, through the handler
