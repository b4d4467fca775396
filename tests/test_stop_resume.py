"""A kill stops a run with telemetry at a step boundary, and a resume redoes no step.

The real tiny speculators training (``train/tiny.py``) with telemetry, killed with
``eagle3-tui kill`` in the middle of an epoch and resumed with ``eagle3-tui resume``:
its records hold every global step once, it ends where an undisturbed run of the same
seed ends, its losses are that run's exactly up to the stop, and after the resume they
differ from that run's by less than 1e-3 (the weights and optimizer state go through
the library's checkpoint; the difference is printed). A trainer that reaches no step
boundary in time, and a telemetry that does not offer the stop, take today's SIGTERM
path, and the report says what a restart will redo.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.telemetry.manifest import launch_env
from tests.conftest import LiveRun, live_training, read_jsonl, run_tiny, wait_until
from tests.transport.conftest import cli

pytestmark = pytest.mark.slow

STEPS_PER_EPOCH = 24
"""The tiny training's steps per epoch (48 training rows, two per batch)."""


def _env(tmp_path: Path, run_dir: Path) -> dict[str, str]:
    return dict(
        os.environ,
        **launch_env(run_dir),
        XDG_STATE_HOME=str(tmp_path / "state"),
        PYTHONUNBUFFERED="1",
    )


def _losses(run_dir: Path) -> dict[int, float]:
    out = {}
    for r in read_jsonl(run_dir / "metrics.jsonl"):
        if r.get("kind") == "train":
            out[int(r["step"])] = float(r["train"]["loss"])
    return out


def _steps(run_dir: Path) -> list[int]:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():  # the trainer is still starting
        return []
    return [int(r["step"]) for r in read_jsonl(metrics) if r["kind"] == "train"]


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "lifecycle"]


def _logged(run: LiveRun, step: int) -> bool:
    """The training has logged ``step`` (it fails at once if the trainer ended)."""
    assert run.proc.poll() is None, run.log()
    return any(s >= step for s in _steps(run.run_dir))


def _kill(run: LiveRun, env: dict[str, str], *more: str) -> dict[str, Any]:
    killed = cli("kill", str(run.run_dir), "--json", *more, env=env, timeout=240)
    assert killed.returncode == 0, killed.stdout + killed.stderr + run.log()
    report: dict[str, Any] = json.loads(killed.stdout)
    return report


def test_a_kill_stops_at_a_step_boundary_and_the_resume_redoes_nothing(tmp_path: Path) -> None:
    args = ("--epochs", "2", "--checkpoint-freq", "0.5")
    undisturbed = tmp_path / "undisturbed"
    done = run_tiny(undisturbed, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "run"
    env = _env(tmp_path, run_dir)
    with live_training(run_dir, (*args, "--step-delay", "0.15"), env) as run:
        ckpt = run_dir / "checkpoints"
        # past the epoch's mid-epoch save (at its step 12): 0/ is a save the stop must keep
        wait_until(lambda: _logged(run, 14), 240, run.log)
        assert json.loads((ckpt / "0" / "training_state.json").read_text())["local_step"] == 12
        report = _kill(run, env)
        stop = report["stop"]
        assert stop["how"] == "step_boundary", report
        g = stop["global_step"]
        assert 14 < g < STEPS_PER_EPOCH and stop["local_step"] == g
        assert stop["epoch"] == 1  # the first epoch (--json counts epochs from 1)
        trainer = next(p for p in report["processes"] if p["pid"] == run.proc.pid)
        assert trainer["signals"] == [] and trainer["ended"] == "exit status 0", report
        assert not report["signalled_trainer"] and report["status"] == "stopped"
        # interrupted/ became the checkpoint the library resumes from mid-epoch
        state = json.loads((ckpt / "0" / "training_state.json").read_text())
        assert state == {"epoch": 0, "local_step": g, "global_step": g}
        assert not (ckpt / "interrupted").exists()
        assert os.readlink(ckpt / f"epoch0_step{g}") == "0"
        assert not (ckpt / "epoch0_step12").exists()  # the library keeps one link an epoch
        moved = Path(stop["checkpoint"]["moved_aside"])  # the mid-epoch save, kept
        assert moved.parent == ckpt and moved.name.startswith("0.before-stop-")
        assert json.loads((moved / "training_state.json").read_text())["local_step"] == 12
        redo = {k: stop["redo"][k] for k in ("checkpoint_step", "steps", "exact", "last_step")}
        # (--json: last_step counts from 1, as shown: the g-th step)
        assert redo == {"checkpoint_step": g, "steps": 0, "exact": True, "last_step": g}
        events = _events(run_dir)
        stopped = next(e for e in events if e["event"] == "stop")
        assert (stopped["step"], stopped["global_step"]) == (g - 1, g)
        assert events[-1]["event"] == "interrupt" and events[-1]["step"] == g
        manifest = json.loads((run_dir / "run.json").read_text())
        assert manifest["status"] == "interrupted"
        # its save is named where the kill put it (its records say interrupted/)
        [note] = manifest["stop_saves"]
        assert (note["from"], note["path"]) == (str(ckpt / "interrupted"), str(ckpt / "0"))
        told = json.loads(cli("summary", str(run_dir), "--json", env=env).stdout)
        assert told["checkpoint"]["path"] == str(ckpt / "0"), told["checkpoint"]
        assert not (run_dir / "stop-request.json").exists()
        text = cli("kill", str(run_dir), env=env)  # nothing to stop: says so, plain text
        assert text.returncode == 0, text.stdout + text.stderr

        resumed = cli("resume", str(run_dir), "--json", env=env, timeout=120)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        again = json.loads(resumed.stdout)
        run.started.append(int(again["pid"]))
        assert again["checkpoint"]["global_step"] == g and again["redo"]["steps"] == 0

        def finished() -> bool:
            ends = [e["event"] for e in _events(run_dir)]
            assert "crash" not in ends, run.log()
            return bool(ends[-1] == "finish")

        wait_until(finished, 240, run.log)
    steps = _steps(run_dir)
    assert steps == list(range(2 * STEPS_PER_EPOCH)), steps  # every step once, in order
    # the resumed trainer's manifest keeps the note
    assert json.loads((run_dir / "run.json").read_text())["stop_saves"] == [note]
    summary = json.loads(cli("summary", str(run_dir), "--json", env=env).stdout)
    assert summary["redone_steps"] == [] and summary["global_step"] == 2 * STEPS_PER_EPOCH - 1
    assert _events(run_dir)[-1]["step"] == _events(undisturbed)[-1]["step"]
    mine, theirs = _losses(run_dir), _losses(undisturbed)
    assert max(abs(mine[s] - theirs[s]) for s in range(g)) == 0.0  # the same run until the stop
    after = max(abs(mine[s] - theirs[s]) for s in range(g, 2 * STEPS_PER_EPOCH))
    print(f"max |loss difference| after the resume at step {g}: {after:.3g}")
    assert after < 1e-3  # bfloat16 checkpoints (the library's save), not another run


def test_a_kill_without_a_step_boundary_in_time_falls_back_to_sigterm(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = _env(tmp_path, run_dir)
    # the 6th forward blocks for good: steps 0-4 are logged, then no step boundary comes
    with live_training(run_dir, ("--epochs", "2", "--debug-hang-at-step", "5"), env) as run:
        wait_until(lambda: _logged(run, 4), 240, run.log)
        report = _kill(run, env, "--stop-wait", "3")
        stop = report["stop"]
        assert stop["how"] == "sigterm", report
        assert stop["reason"] == "no step boundary within 3 s (the request was withdrawn)"
        assert 3.0 <= stop["waited_s"] < 30.0
        trainer = next(p for p in report["processes"] if p["pid"] == run.proc.pid)
        assert trainer["signals"][0] == "SIGTERM" and report["signalled_trainer"]
        assert not (run_dir / "stop-request.json").exists()  # withdrawn, never taken
        assert not (run_dir / "stop-state.json").exists()
        assert report["checkpoints"]["interrupted"]["new"], report  # the library's SIGTERM save
        # no numbered checkpoint: a restart starts over and redoes the 5 steps logged
        assert stop["redo"]["checkpoint_step"] == 0 and stop["redo"]["steps"] == 5
        shown = cli("kill", str(run_dir), env=env).stdout
        assert shown.startswith("nothing to stop: the run is not running"), shown


def test_a_telemetry_that_does_not_offer_the_stop_is_never_asked(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = _env(tmp_path, run_dir)
    with live_training(run_dir, ("--epochs", "40", "--step-delay", "0.1"), env) as run:
        wait_until(lambda: _logged(run, 2), 240, run.log)
        manifest = json.loads((run_dir / "run.json").read_text())
        del manifest["stop"]  # as an older eagle3-tui wrote it
        (run_dir / "run.json").write_text(json.dumps(manifest))
        report = _kill(run, env)
        stop = report["stop"]
        assert stop["how"] == "sigterm" and "older eagle3-tui" in stop["reason"], report
        assert stop["waited_s"] == 0.0 and report["signalled_trainer"]
        assert not (run_dir / "stop-state.json").exists()
        assert stop["redo"]["steps"] == stop["redo"]["last_step"]  # no checkpoint: all of them
