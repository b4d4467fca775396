"""``eagle3-tui summary`` says only what is true when it is shown: a stack of a run that
went on and finished is no ``stuck`` line (and a shown one names the Trainer's phase),
a SIGKILLed trainer's surviving dataloader workers are counted as such, and a last
checkpoint the host no longer has is not shown as if it were there.

Each test failed on the code before the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from eagle3_tui.agent import processes
from eagle3_tui.model.health import diagnose
from eagle3_tui.model.run import Run
from eagle3_tui.model.summary import format_text, summarize
from eagle3_tui.model.verdict import Health
from eagle3_tui.telemetry import manifest as mf
from tests.records import Lines
from tests.transport.fakes import dead_pid

T0 = 1_700_000_000.0
SITE = "/v/lib/python3.11/site-packages"

VALIDATING = [  # the tiny training's main thread in its final validation, innermost first
    {"func": "Linear.forward", "file": f"{SITE}/torch/nn/modules/linear.py", "line": 134,
     "origin": "library"},
    {"func": "Module._call_impl", "file": f"{SITE}/torch/nn/modules/module.py", "line": 1784,
     "origin": "library"},
    {"func": "Eagle3DraftModel.forward", "file": f"{SITE}/speculators/models/eagle3/core.py",
     "line": 310, "origin": "library"},
    {"func": "Trainer.val_epoch", "file": f"{SITE}/speculators/train/trainer.py", "line": 650,
     "origin": "library"},
    {"func": "Trainer.run_training", "file": f"{SITE}/speculators/train/trainer.py",
     "line": 760, "origin": "library"},
    {"func": "main", "file": "/home/u/eagle3_tui/train/tiny.py", "line": 406, "origin": "user"},
    {"func": "<module>", "file": "/home/u/train.py", "line": 9, "origin": "user"},
]  # fmt: skip
WHERE = "Linear.forward (linear.py:134) ← Trainer.val_epoch (trainer.py:650) ← main (tiny.py:406)"


def _validating(finished: bool) -> tuple[Run, float, int]:
    """30 steps, then the final validation quiet for 20 s (a stack record), then (if
    ``finished``) its result and the run's finish. Returns the run, the time after and
    the bytes fed."""
    lines = Lines(t0=T0, dt=1.0)
    data = b"".join(lines.train(s, 2.0) for s in range(30))
    stack_ts = T0 + 29 + 20.0
    data += lines.at(stack_ts).make(
        "stack", step=29, quiet_s=20.0, thread="MainThread", frames=VALIDATING, threads=[]
    )
    if finished:
        data += lines.at(stack_ts + 5).val(30, 0, 1.5)
        data += lines.at(stack_ts + 6).event("finish", step=30)
    run = Run()
    run.feed(0, data)
    return run, stack_ts + 10, len(data)


def test_a_finished_runs_last_validation_stack_is_no_stuck_line() -> None:
    run, now, _ = _validating(finished=True)
    assert diagnose(run.state, now).health == Health.FINISHED
    s = summarize(run.state, now)
    assert s["stuck"] is None, s["stuck"]
    text = format_text(s)
    assert "stuck" not in text, text
    # kept for history, named so
    assert s["stack_before_end"]["where"] == WHERE
    assert s["stack_before_end"]["quiet_s"] == 20.0
    json.dumps(s)


def test_a_run_that_ended_otherwise_has_no_current_stall_either() -> None:
    run, _, fed = _validating(finished=False)
    lines = Lines(t0=T0 + 60, dt=1.0)
    lines.seq = 1000
    run.feed(fed, lines.event("interrupt", step=30))
    s = summarize(run.state, T0 + 70)
    assert s["health"] == "stopped" and s["stuck"] is None
    assert "stuck" not in format_text(s)


def test_a_current_stall_names_the_trainers_phase() -> None:
    """Where a script's own ``main`` calls ``run_training``, the innermost two frames
    alone said nothing of the loop: the Trainer's method is kept."""
    run, now, fed = _validating(finished=False)
    s = summarize(run.state, now)
    assert s["stuck"] is not None and s["stuck"]["where"] == WHERE
    assert s["stack_before_end"] is None
    assert f"stuck    {WHERE}" in format_text(s)
    # a step logged after it: not current
    lines = Lines(t0=now + 1, dt=1.0)
    lines.seq = 1000
    run.feed(fed, lines.train(30, 1.9))
    assert summarize(run.state, now + 2)["stuck"] is None


def test_a_user_frame_inside_the_loop_is_said_as_before() -> None:
    """The README's example: the training's own code called by the Trainer's loop."""
    frames = [
        {"func": "Condition.wait", "file": "/usr/lib/python3.11/threading.py", "line": 331,
         "origin": "stdlib"},
        {"func": "wait_for_a_lost_rank", "file": "/home/u/train.py", "line": 97,
         "origin": "user"},
        {"func": "Module._call_impl", "file": f"{SITE}/torch/nn/modules/module.py",
         "line": 1784, "origin": "library"},
        {"func": "Trainer.train_epoch", "file": f"{SITE}/speculators/train/trainer.py",
         "line": 512, "origin": "library"},
    ]  # fmt: skip
    lines = Lines(t0=T0, dt=1.0)
    data = b"".join(lines.train(s, 2.0) for s in range(30))
    data += lines.at(T0 + 50).make(
        "stack", step=29, quiet_s=21.0, thread="MainThread", frames=frames, threads=[]
    )
    run = Run()
    run.feed(0, data)
    s = summarize(run.state, T0 + 60)
    assert s["stuck"]["where"] == (
        "Condition.wait (threading.py:331) ← wait_for_a_lost_rank (train.py:97) "
        "← Trainer.train_epoch (trainer.py:512)"
    )


# ---- a SIGKILLed trainer's surviving dataloader workers ------------------------------------


def _sigkilled_observed() -> dict[str, Any]:
    """A training without telemetry whose trainer was SIGKILLed: its 4 dataloader workers
    (first seen before torch named them: recorded as children) and its resource tracker
    alive when the look found it gone."""
    lines = Lines(t0=T0, dt=1.0)
    process = {
        "pid": 4242,
        "started": T0 - 100,
        "telemetry": False,
        "command": ["python", "train.py"],
        "cwd": "/work/exp7",
        "user": "alice",
        "log_file": "/work/exp7/train.log",
        "checkpoint_dir": "/work/exp7/checkpoints",
        "cpu_pct": None,
        "exit_status": -9,
        "ended_at": T0 + 5,
    }
    left = [
        {"pid": 4243 + i, "role": role, "comm": "pt_data_worker", "rss": 1e8}
        for i, role in enumerate(["child", "child", "spawned", "worker"])
    ]
    left.append({"pid": 4250, "role": "helper", "comm": "python3", "rss": 1e7})
    alive = lines.at(T0).make(
        "proc",
        alive=True,
        process={**process, "exit_status": None, "ended_at": None, "cpu_pct": 100.0},
        processes=[{"pid": 4242, "role": "trainer", "comm": "python", "state": "R"}],
    )
    gone = lines.at(T0 + 5).make("proc", alive=False, process=process, processes=left)
    run = Run()
    run.feed(0, alive + gone)
    return summarize(run.state, T0 + 10)


def test_the_workers_that_outlived_a_sigkilled_trainer_are_counted() -> None:
    s = _sigkilled_observed()
    text = format_text(s)
    assert "ended; 5 processes (4 dataloader workers) of it still alive then" in text, text
    # the JSON says the same, as the monitor's banner names them
    roles = {p["pid"]: p["role"] for p in s["observed"]["processes"]}
    assert [roles[4243 + i] for i in range(4)] == ["worker"] * 4 and roles[4250] == "helper"
    by_pid = {x["pid"]: x for x in s["leftovers"]}
    assert [by_pid[4243 + i]["role"] for i in range(4)] == ["worker"] * 4
    assert by_pid[4250]["role"] is None  # the client's row does not say: not made up
    for pid in range(4243, 4247):
        assert f"pid {pid} pt_data_worker" in s["reason"], s["reason"]


def test_the_agents_leftovers_say_which_are_dataloader_workers(tmp_path: Path) -> None:
    """A SIGKILLed trainer's workers are found by the run's marker (``marked``); named
    ``pt_data_worker`` by torch, the row says ``worker`` (what the banner shows)."""
    run_id = f"summary-truths-{os.getpid()}"
    env = dict(os.environ, **{mf.RUN_ID_ENV: run_id})
    worker = (
        "import time; open('/proc/self/comm', 'w').write('pt_data_worker'); "
        "open(__import__('sys').argv[1], 'w').write('ok'); time.sleep(60)"
    )
    other = "import sys, time; open(sys.argv[1], 'w').write('ok'); time.sleep(60)"
    started = []
    try:
        for i, code in enumerate((worker, other)):
            flag = tmp_path / f"ready{i}"
            started.append(subprocess.Popen([sys.executable, "-c", code, str(flag)], env=env))
            deadline = time.monotonic() + 30
            while not flag.exists():
                assert time.monotonic() < deadline, "the process did not start"
                time.sleep(0.02)
        m = mf.build_manifest(tmp_path / "run", run_id=run_id)
        m.update(pid=dead_pid(), start_ticks=None)
        rows = {x["pid"]: x for x in processes.leftovers(m)}
        assert rows[started[0].pid]["comm"] == "pt_data_worker"
        assert rows[started[0].pid]["role"] == "worker", rows
        assert rows[started[1].pid]["role"] == "marked", rows
    finally:
        for p in started:
            p.kill()
            p.wait()


# ---- a last checkpoint that is gone -----------------------------------------------------


def _stopped_with_a_checkpoint() -> Run:
    lines = Lines(t0=T0, dt=1.0)
    data = b"".join(lines.train(s, 2.0) for s in range(10))
    data += lines.ckpt("save_finished", "/work/exp7/checkpoints/1", bytes=100)
    data += lines.event("finish", step=10)
    run = Run()
    run.feed(0, data)
    return run


def test_a_last_checkpoint_the_host_no_longer_has_is_said_gone() -> None:
    run = _stopped_with_a_checkpoint()
    s = summarize(run.state, T0 + 30)
    assert s["checkpoint"]["present"] is None  # nothing said: as before
    assert "ckpt     /work/exp7/checkpoints/1\n" in format_text(s)
    run.state.liveness.set_checkpoints(False)  # the host found no numbered checkpoint
    s = summarize(run.state, T0 + 30)
    assert s["checkpoint"]["path"] == "/work/exp7/checkpoints/1"
    assert s["checkpoint"]["present"] is False
    assert (
        "ckpt     /work/exp7/checkpoints/1 (gone: no numbered checkpoint in its directory now)"
        in format_text(s)
    )
    run.state.liveness.set_checkpoints(True)
    assert summarize(run.state, T0 + 30)["checkpoint"]["present"] is None


def test_the_hosts_status_says_when_the_numbered_checkpoints_are_gone(tmp_path: Path) -> None:
    """``mv checkpoints elsewhere`` after a stop: ``summary`` still said "Resume continues
    from the last numbered checkpoint" while ``resume`` refused (none there)."""
    from eagle3_tui.agent.runs import status_of
    from eagle3_tui.api.reading import apply_status
    from eagle3_tui.transport.replies import Status, decode
    from tests.transport.fakes import fake_manifest

    run_dir, ckpt = tmp_path / "run", tmp_path / "run" / "checkpoints"
    (ckpt / "1").mkdir(parents=True)
    fake_manifest(run_dir, dead_pid(), f"gone-{tmp_path.name}", checkpoint_dir=str(ckpt))
    lines = Lines(t0=T0, dt=1.0)
    data = b"".join(lines.train(s, 2.0) for s in range(10))
    data += lines.ckpt("save_finished", str(ckpt / "1"), bytes=100)
    data += lines.event("interrupt", step=10)
    run = Run()
    run.feed(0, data)
    said = status_of(str(run_dir))
    assert said["checkpoints_present"] is True
    apply_status(run.state, decode(Status, {"op": "status", **said}), T0 + 30)
    assert (
        "Resume continues from the last numbered checkpoint" in diagnose(run.state, T0 + 30).reason
    )
    (ckpt / "1").rename(tmp_path / "moved")
    said = status_of(str(run_dir))
    assert said["checkpoints_present"] is False
    apply_status(run.state, decode(Status, {"op": "status", **said}), T0 + 30)
    reason = diagnose(run.state, T0 + 30).reason
    assert "holds no numbered checkpoint now: a resume would start over" in reason, reason
    assert "(gone: no numbered checkpoint" in format_text(summarize(run.state, T0 + 30))
