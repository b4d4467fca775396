"""Stop and restart: steps redone per kill and resume (goal 0), and how long each key takes.

    python benchmarks/bench_stop_resume.py [--trials 2] [--skip-handlerless]

The real tiny speculators training (24 steps an epoch, 2 epochs, a 0.1 s pace per step),
killed with ``eagle3-tui kill`` in the middle of an epoch, resumed with
``eagle3-tui resume``, run to its end; each trial kills at another step.

1. With telemetry (``train/tiny.py``): the kill as it is now (a stop at the next step
   boundary, its save the checkpoint the resume continues from) against the kill as it
   was (``--stop-wait 0``: the request withdrawn at once, SIGTERM mid-step, the
   resume from the last numbered checkpoint). Steps redone: train records of a step
   written twice; steps lost: a step of 0..47 never written.
2. Without telemetry (``tests/attach/silent_training.py``, a user's own script with no
   handler): ``kill --pid`` (attached first, then the same stop) and ``resume --pid``
   (relaunched under the telemetry bootstrap). Steps redone: training steps the script
   itself counted (one line per forward) beyond the 48 an undisturbed run makes.

Printed per trial: the step it was killed after, ``k`` -> every process gone (the kill
command's wall time), ``r`` -> the first new step's record (from the resume command's
start to that record's timestamp), steps redone; then the totals and the ratio of steps
redone before to now.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eagle3_tui.telemetry.manifest import launch_env
from tests.conftest import live_training, read_jsonl, wait_until

STEPS = 48
"""Two epochs of 24 steps."""
SCRIPT = Path(__file__).resolve().parent.parent / "tests" / "attach" / "silent_training.py"


def cli(*args: str, env: dict[str, str] | None = None) -> tuple[dict[str, Any], float]:
    """``eagle3-tui ARGS --json``: its report and its wall time."""
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "eagle3_tui", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=env,
    )
    took = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"eagle3-tui {' '.join(args)}: {done.returncode}\n{done.stderr}")
    report: dict[str, Any] = json.loads(done.stdout)
    return report, took


def records(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    metrics = run_dir / "metrics.jsonl"
    return [r for r in read_jsonl(metrics) if r["kind"] == kind] if metrics.exists() else []


def first_after_resume(run_dir: Path) -> dict[str, Any] | None:
    """The first train record after the run's last resume event."""
    recs = read_jsonl(run_dir / "metrics.jsonl")
    marks = [i for i, r in enumerate(recs) if r["kind"] == "lifecycle" and r["event"] == "resume"]
    if not marks:
        return None
    return next((r for r in recs[marks[-1] :] if r["kind"] == "train"), None)


def ended(run_dir: Path) -> bool:
    ends = [r["event"] for r in records(run_dir, "lifecycle")]
    if "crash" in ends:
        raise SystemExit(f"{run_dir}: the run crashed")
    return bool(ends) and ends[-1] == "finish"


def with_telemetry(root: Path, kill_at: int, before: bool) -> dict[str, float]:
    """One trial of scenario 1: killed after step ``kill_at`` (``before``: by SIGTERM)."""
    run_dir = root / f"run-{kill_at}-{'sigterm' if before else 'stop'}"
    env = dict(os.environ, **launch_env(run_dir), PYTHONUNBUFFERED="1")
    env["XDG_STATE_HOME"] = str(root / "state")
    args = ("--epochs", "2", "--step-delay", "0.1")
    with live_training(run_dir, args, env) as run:
        wait_until(
            lambda: any(r["step"] >= kill_at for r in records(run_dir, "train")), 300, run.log
        )
        extra = ("--stop-wait", "0") if before else ()
        report, k_s = cli("kill", str(run_dir), *extra, env=env)
        assert report["status"] == "stopped", report
        t_r = time.time()
        resumed, _ = cli("resume", str(run_dir), env=env)
        run.started.append(int(resumed["pid"]))
        first = wait_until(lambda: first_after_resume(run_dir), 300, run.log)
        wait_until(lambda: ended(run_dir), 600, run.log)
    steps = [int(r["step"]) for r in records(run_dir, "train")]
    return {
        "killed_after": float(kill_at),
        "k_s": k_s,
        "r_s": float(first["ts"]) - t_r,
        "redone": float(len(steps) - len(set(steps))),
        "lost": float(len(set(range(STEPS)) - set(steps))),
    }


def handlerless(root: Path, data: Path, kill_at: int) -> dict[str, float]:
    """One trial of scenario 2: a script with no handler, killed after ``kill_at``
    training steps, restarted with telemetry."""
    out = root / f"silent-{kill_at}"
    out.mkdir()
    times = out / "step-times"
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3_TUI_")}
    env["XDG_STATE_HOME"] = str(root / "state")
    argv = [sys.executable, str(SCRIPT), "--out", str(out), "--data", str(data)]
    argv += ["--epochs", "2", "--step-delay", "0.1", "--step-times", str(times)]
    with open(out / "train.log", "ab") as log:
        proc = subprocess.Popen(
            argv,
            cwd=out,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    started = [proc.pid]
    try:

        def forwards() -> int:
            return len(times.read_text().split()) if times.exists() else 0

        wait_until(lambda: proc.poll() is None and forwards() >= kill_at, 300, "steps")
        report, k_s = cli("kill", "--pid", str(proc.pid), env=env)
        assert report["status"] == "stopped", report
        proc.wait(30)
        first = report.get("attached_first") or {}
        t_r = time.time()
        resumed, _ = cli("resume", "--pid", str(proc.pid), env=env)
        started.append(int(resumed["pid"]))
        run_dir = Path(str(resumed["run_dir"]))
        new = wait_until(lambda: first_after_resume(run_dir), 300, "the first new step")
        wait_until(lambda: ended(run_dir), 600, "the restarted run's end")
    finally:
        for pid in started:
            with contextlib.suppress(OSError):
                os.killpg(pid, 9)
    return {
        "killed_after": float(kill_at),
        "attached": 1.0 if first.get("status") == "attached" else 0.0,
        "k_s": k_s,
        "r_s": float(new["ts"]) - t_r,
        "redone": float(forwards() - STEPS),
    }


def show(title: str, rows: list[dict[str, float]]) -> float:
    print(f"\n{title}")
    print(f"  {'killed after':>12}  {'k -> gone':>9}  {'r -> step':>9}  {'redone':>6}  lost")
    for r in rows:
        lost = f"{r['lost']:.0f}" if "lost" in r else "-"
        print(
            f"  {r['killed_after']:>12.0f}  {r['k_s']:>8.1f}s  {r['r_s']:>8.1f}s  "
            f"{r['redone']:>6.0f}  {lost}"
        )
    total = sum(r["redone"] for r in rows)
    print(f"  steps redone in all: {total:.0f} over {len(rows)} kill(s)")
    return total


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=2)
    p.add_argument("--skip-handlerless", action="store_true")
    a = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-stop-"))
    # mid-epoch steps of epoch 2: epoch 1's checkpoint is there for the SIGTERM path
    kills = [30 + 5 * i for i in range(a.trials)]
    now = [with_telemetry(root, k, before=False) for k in kills]
    was = [with_telemetry(root, k, before=True) for k in kills]
    redone_now = show("with telemetry, stop at a step boundary (now)", now)
    redone_was = show("with telemetry, SIGTERM mid-step (before: --stop-wait 0)", was)
    print(f"\nsteps redone, before / now: {redone_was:.0f} / {redone_now:.0f}", end="")
    print(f" (ratio {redone_was / redone_now:.1f}x)" if redone_now else " (now: none)")
    if not a.skip_handlerless:
        data = root / "tiny"
        subprocess.run(
            [
                sys.executable,
                str(SCRIPT),
                "--out",
                str(root),
                "--data",
                str(data),
                "--prepare-only",
            ],
            check=True,
        )
        rows = [handlerless(root, data, k) for k in kills]
        show("without telemetry: kill --pid (attached first), resume --pid", rows)
        print(f"  attached first: {sum(r['attached'] for r in rows):.0f} of {len(rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
