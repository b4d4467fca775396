"""A kill of a trainer still starting up (no step logged since its process started): the
agent sends SIGTERM at once, asking nothing (``stopping.ask_for_stop``), and what the kill
says of it matches what happened: "during start-up, before its first step", never
"mid-step" (a resumed trainer's kill said "SIGTERM'd mid-step: no step logged since the
process started" beside its own record "SIGTERM outside the training loop")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from eagle3_tui.agent.stopping import NOT_STARTED
from eagle3_tui.reports import format_kill, format_progress
from eagle3_tui.transport.calls import kill_run
from eagle3_tui.transport.channel import Event, LocalHost

LOADING_TRAINER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from eagle3_tui.telemetry import attach

    run_dir = Path(sys.argv[1])
    attach(run_dir, checkpoint_dir=run_dir / "checkpoints", samplers=False,
           resume_command=[sys.executable, *sys.argv])
    print("loading", flush=True)
    time.sleep(120)  # the model loads: no step yet
    """
)


def records(run_dir: Path) -> list[dict[str, object]]:
    rows = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def start(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """A trainer with telemetry (it stops at a step boundary when asked) that loads."""
    run_dir = tmp_path / "run"
    script = tmp_path / "loading_trainer.py"
    script.write_text(LOADING_TRAINER)
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    proc = subprocess.Popen(
        [sys.executable, str(script), str(run_dir)],
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
    )
    return proc, run_dir


async def test_a_kill_during_start_up_says_start_up_not_mid_step(tmp_path: Path) -> None:
    proc, run_dir = start(tmp_path)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"loading\n"
        manifest = json.loads((run_dir / "run.json").read_text())
        assert isinstance(manifest.get("stop"), dict), manifest  # it offers the stop
        progress: list[Event] = []
        t0 = time.monotonic()
        result = await kill_run(LocalHost(), str(run_dir), 20.0, on_progress=progress.append)
        assert proc.wait(10) is not None
        assert time.monotonic() - t0 < 30  # not the 60 s wait for a step boundary
        assert result.status == "stopped", format_kill(result)
        stop = result.stop
        assert stop is not None and stop.how == "sigterm", stop
        assert str(stop.reason).startswith(NOT_STARTED), stop
        said = format_kill(result)
        assert "SIGTERM'd during start-up, before its first step" in said, said
        assert "mid-step" not in said, said
        # the trainer's own record of it, which the result now agrees with
        # (a trainer SIGTERMed before its handler was in place, under load, writes none)
        ends = [r for r in records(run_dir) if r.get("event") == "interrupt"]
        assert all("outside the training loop" in str(e.get("error")) for e in ends), ends
        lines = [format_progress(e) for e in progress]
        assert any(
            line is not None and "logged no step since it started" in line for line in lines
        ), lines
        assert "no stop at a step boundary: SIGTERM" not in lines, lines
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
