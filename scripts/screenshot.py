"""The README's screenshot, drawn by the monitor itself from a real recorded run.

    python scripts/screenshot.py           # writes docs/screenshot.svg
    python scripts/screenshot.py --check   # exit 1: docs/screenshot.svg is not what the app draws
    python scripts/screenshot.py --record  # records a new run first (the real tiny training)

The recording (``docs/screenshot-run.jsonl.gz``) is the ``metrics.jsonl`` of the real
tiny training (``train/tiny.py``: the speculators Trainer on the CPU), whose GPU
sampler read the recorded 8×H200 NVML readings
(``tests/telemetry/fixtures/nvml_8x_h200.json``) instead of a driver; it was cut at a
line boundary while the run was live. The monitor replays it at 120×40 with its clock
frozen just after the last record, so the picture changes only when the app does
(``tests/app/test_screenshot.py`` fails when the committed SVG is stale).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORDING = ROOT / "docs" / "screenshot-run.jsonl.gz"
SCREENSHOT = ROOT / "docs" / "screenshot.svg"
NVML_READINGS = ROOT / "tests" / "telemetry" / "fixtures" / "nvml_8x_h200.json"
SIZE = (120, 40)
LABEL = "runs/tiny-demo"
"""The run as the header names it (the recording's own directory was a temporary one)."""
RECORD_STEPS = 110
"""Where the recording is cut: in epoch 5 of 6, after four checkpoints and validations."""


def draw(recording: Path = RECORDING, size: tuple[int, int] = SIZE) -> str:
    """The monitor's picture of the recorded run, as SVG."""
    sys.path.insert(0, str(ROOT))
    from eagle3_tui.app.app import make_app
    from eagle3_tui.app.widgets.plots import MetricPlot
    from eagle3_tui.transport.replay import ReplayTransport

    data = gzip.decompress(recording.read_bytes())
    last = json.loads(data.rstrip(b"\n").rsplit(b"\n", 1)[-1])
    now = float(last["ts"]) + 0.5
    os.environ["TZ"] = "UTC"  # clock times in the panels: the same picture anywhere
    time.tzset()
    app = make_app(
        ReplayTransport([data], label=LABEL),
        clock=lambda: now,
        refresh_interval=0.02,
        status_interval=3600,
    )
    svg = ""

    async def run() -> None:
        nonlocal svg
        async with app.run_test(size=size) as pilot:
            deadline = time.monotonic() + 60
            while not (
                app.pipeline.generation
                and app.is_current
                and all(p.is_current for p in app.query(MetricPlot))
            ):
                if time.monotonic() > deadline:
                    raise SystemExit("screenshot: the monitor did not settle within 60 s")
                await pilot.pause(0.05)
            await pilot.pause(0.2)
            svg = app.export_screenshot(title="eagle3-tui")

    asyncio.run(run())
    return svg


def record(out: Path = RECORDING, steps: int = RECORD_STEPS) -> None:
    """Run the real tiny training with the recorded NVML readings and keep its records
    up to ``steps`` training steps (whole lines only)."""
    run_dir = Path(tempfile.mkdtemp(prefix="eagle3-screenshot-")) / "run"
    env = dict(
        os.environ,
        EAGLE3_TUI_NVML_FIXTURE=str(NVML_READINGS),
        XDG_STATE_HOME=str(run_dir.parent / "state"),  # not the user's index of runs
    )
    command = [sys.executable, "-m", "eagle3_tui.train.tiny", "--run-dir", str(run_dir)]
    command += ["--epochs", "6", "--workers", "2", "--step-delay", "0.3"]
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    metrics = run_dir / "metrics.jsonl"
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"screenshot: the training exited ({proc.returncode}) early")
            data = metrics.read_bytes() if metrics.exists() else b""
            data = data[: data.rfind(b"\n") + 1]
            if data.count(b'"kind":"train"') >= steps:
                break
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    out.write_bytes(gzip.compress(data, mtime=0))
    shutil.rmtree(run_dir.parent, ignore_errors=True)
    print(f"recorded {len(data):,} bytes ({out.stat().st_size:,} compressed) into {out}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare with the committed SVG")
    p.add_argument("--record", action="store_true", help="record a new run first")
    p.add_argument("--out", type=Path, default=SCREENSHOT)
    ns = p.parse_args()
    if ns.record:
        record()
    svg = draw()
    if ns.check:
        if not ns.out.exists() or ns.out.read_text(encoding="utf-8") != svg:
            print(f"{ns.out} is stale: run python scripts/screenshot.py", file=sys.stderr)
            return 1
        return 0
    ns.out.write_text(svg, encoding="utf-8")
    print(f"wrote {ns.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
