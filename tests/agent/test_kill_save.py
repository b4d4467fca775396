"""A kill waits for a checkpoint save in progress before its first signal.

speculators' SIGTERM handler raises wherever the trainer is, so a signal in the middle
of an epoch's save tears that checkpoint (agent/saving.py). The trainer here is a real
process with real telemetry: it logs speculators' own "Saving checkpoint to" and
"Checkpoint saved to" messages, which the telemetry's checkpoint sampler turns into
``ckpt`` records, and notes when its save ends and when SIGTERM arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.agent import saving
from eagle3_tui.reports import format_kill
from eagle3_tui.transport.calls import kill_run
from eagle3_tui.transport.channel import Event, LocalHost
from tests.conftest import interruptible
from tests.records import Lines
from tests.transport.fakes import alive

SAVING_TRAINER = textwrap.dedent(
    """
    import json, logging, signal, sys, time
    from pathlib import Path
    from eagle3_tui.telemetry import attach

    run_dir, save_s = Path(sys.argv[1]), float(sys.argv[2])
    ckpt = run_dir / "checkpoints"
    attach(run_dir, checkpoint_dir=ckpt, samplers=["ckpt"], interval=0.2,
           resume_command=[sys.executable, *sys.argv])
    log = logging.getLogger("speculators.train.checkpointer")
    log.setLevel(logging.INFO)
    notes = run_dir / "notes.jsonl"

    def note(what):
        with open(notes, "a") as f:
            f.write(json.dumps({"what": what, "t": time.time()}) + "\\n")

    def on_term(*_):
        note("SIGTERM")
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    # a worker that outlives the trainer (a dataloader worker's leftover)
    import subprocess
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    target = ckpt / "1"
    log.info(f"Saving checkpoint to {target}")
    note("save_started")
    target.mkdir(parents=True)
    for i in range(int(save_s / 0.1)):  # the weights, growing
        with open(target / "model.safetensors", "ab") as f:
            f.write(b"\\0" * 4096)
        time.sleep(0.1)
    log.info(f"Checkpoint saved to {target}")
    note("save_finished")
    while True:
        time.sleep(0.1)
    """
)


def start(tmp_path: Path, save_s: float) -> tuple[subprocess.Popen[bytes], Path]:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    script = tmp_path / "saving_trainer.py"
    script.write_text(SAVING_TRAINER)
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    proc = subprocess.Popen(
        [sys.executable, str(script), str(run_dir), str(save_s)],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while saving.save_in_progress(run_dir / "metrics.jsonl") is None:
        assert proc.poll() is None, "the trainer died"
        assert time.monotonic() < deadline, "no save_started record"
        time.sleep(0.05)
    return proc, run_dir


def notes(run_dir: Path) -> dict[str, float]:
    rows = [json.loads(x) for x in (run_dir / "notes.jsonl").read_text().splitlines()]
    return {r["what"]: r["t"] for r in rows}


async def test_a_kill_in_the_middle_of_a_save_signals_once_it_is_saved(tmp_path: Path) -> None:
    proc, run_dir = start(tmp_path, save_s=3.0)
    try:
        progress: list[Event] = []
        t0 = time.time()
        result = await kill_run(LocalHost(), str(run_dir), 20.0, on_progress=progress.append)
        proc.wait(10)
        seen = notes(run_dir)
        assert result.status == "stopped", format_kill(result)
        assert seen["SIGTERM"] >= seen["save_finished"], seen  # the save was whole first
        wait = result.save_wait
        assert wait is not None and wait.finished and wait.path.endswith("checkpoints/1")
        assert 0.5 < wait.waited_s <= time.time() - t0
        assert any(e.get("step") == "save" for e in progress)
        assert "to finish first" in format_kill(result)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


async def test_a_save_that_outlasts_the_wait_is_signalled_and_said(tmp_path: Path) -> None:
    proc, run_dir = start(tmp_path, save_s=60.0)
    try:
        request_wait = 1.0
        result = await kill_run(LocalHost(), str(run_dir), 20.0, save_wait_s=request_wait)
        proc.wait(10)
        seen = notes(run_dir)
        assert "save_finished" not in seen and "SIGTERM" in seen
        wait = result.save_wait
        assert wait is not None and not wait.finished and wait.waited_s >= request_wait
        assert "may be left incomplete" in format_kill(result)
        assert not alive(proc.pid)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


# ---- which save is in progress, from the records ---------------------------------------


def write(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(lines))
    return path


def ckpt(lines: Lines, event: str, path: str, **fields: Any) -> bytes:
    return lines.make("ckpt", event=event, path=path, **fields)


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ([], None),
        ([("save_started", "/c/1")], "/c/1"),
        ([("save_started", "/c/1"), ("save_progress", "/c/1")], "/c/1"),
        ([("save_started", "/c/1"), ("save_finished", "/c/1")], None),
        ([("save_progress", "/c/2")], "/c/2"),  # its start is before the tail read
        ([("save_started", "/c/1"), ("save_finished", "/c/1"), ("save_started", "/c/2")], "/c/2"),
        ([("save_started", "/c/1"), ("lifecycle", "resume")], None),  # an earlier life's
        ([("save_started", "/c/1"), ("lifecycle", "crash")], None),
        ([("save_started", "/c/1"), ("best", "/c/1"), ("completed", "/c/1")], "/c/1"),
        # a step logged after the save began: the save (in the training loop) is over,
        # though the record of its end never came (the kill waited minutes for it)
        ([("save_started", "/c/1"), ("train", "")], None),
        ([("save_started", "/c/1"), ("train", ""), ("save_started", "/c/2")], "/c/2"),
    ],
)
def test_the_save_in_progress_is_the_one_started_and_not_finished(
    tmp_path: Path, events: list[tuple[str, str]], expected: str | None
) -> None:
    lines = Lines()
    out = [lines.train(0, 1.0)]
    for event, arg in events:
        if event == "lifecycle":
            out.append(lines.make("lifecycle", event=arg))
        elif event == "train":
            out.append(lines.train(1, 1.0))
        else:
            out.append(ckpt(lines, event, arg))
    found = saving.save_in_progress(write(tmp_path / "m.jsonl", out))
    assert (found or {}).get("path") == expected


def test_bad_lines_and_a_cut_tail_do_not_make_or_end_a_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = Lines()
    started = ckpt(lines, "save_started", "/c/1")
    fake_finish = b'{"kind": "ckpt", "event": "save_finished", "path": "/c/1"'  # torn
    junk = [b"not json ckpt\n", b'["ckpt"]\n', b'{"kind": "ckpt", "path": 7}\n', fake_finish]
    path = write(tmp_path / "m.jsonl", [started, *junk])
    assert (saving.save_in_progress(path) or {}).get("path") == "/c/1"
    # the tail read starts inside a record: that record is skipped, not misread
    filler = [lines.train(s, 1.0) for s in range(50)]
    path = write(tmp_path / "m2.jsonl", [started, *filler])
    monkeypatch.setattr(saving, "TAIL_BYTES", sum(map(len, filler)) + len(started) // 2)
    assert saving.save_in_progress(path) is None
    assert saving.save_in_progress(tmp_path / "missing.jsonl") is None


def test_the_wait_ends_when_the_trainer_does(tmp_path: Path) -> None:
    lines = Lines()
    path = write(tmp_path / "m.jsonl", [ckpt(lines, "save_started", "/c/1")])
    clock = [0.0]
    ticks = [0]

    def sleep(s: float) -> None:
        clock[0] += s
        ticks[0] += 1

    def alive() -> bool:
        return ticks[0] < 4

    def wall() -> float:  # just after the record (Lines' clock starts at 1e6)
        return 1_000_001.0 + clock[0]

    result = saving.wait_for_save(
        path, alive, 100.0, clock=lambda: clock[0], sleep=sleep, wall=wall
    )
    assert result == {"path": "/c/1", "waited_s": 2.0, "finished": False}
    assert saving.wait_for_save(path, lambda: True, 0.0, wall=wall) == {
        "path": "/c/1",
        "waited_s": 0.0,
        "finished": False,
    }


def test_a_save_gone_still_is_not_waited_for(tmp_path: Path) -> None:
    """A save whose records stopped (its sampler is gone) and whose files do not change
    is not waited for; one whose files still change is, records or not."""
    ckpt_dir = tmp_path / "c1"
    ckpt_dir.mkdir()
    (ckpt_dir / "model.safetensors").write_bytes(b"x")
    lines = Lines(t0=time.time() - 3 * saving.STALE_S)
    path = write(tmp_path / "m.jsonl", [ckpt(lines, "save_started", str(ckpt_dir))])
    old = time.time() - 2 * saving.STALE_S
    os.utime(ckpt_dir / "model.safetensors", (old, old))
    os.utime(ckpt_dir, (old, old))
    assert saving.wait_for_save(path, lambda: True, 100.0) is None
    (ckpt_dir / "model.safetensors").write_bytes(b"xy")  # written now: a save going on
    clock = [0.0]
    result = saving.wait_for_save(
        path,
        lambda: clock[0] < 3,
        100.0,
        clock=lambda: clock[0],
        sleep=lambda s: clock.__setitem__(0, clock[0] + s),
    )
    assert result == {"path": str(ckpt_dir), "waited_s": 3.0, "finished": False}


async def test_a_save_its_dead_trainer_left_unfinished_is_not_waited_for(tmp_path: Path) -> None:
    proc, run_dir = start(tmp_path, save_s=60.0)
    try:
        os.kill(proc.pid, signal.SIGKILL)  # died mid-save (the OOM killer): its sidecar lives
        proc.wait(10)
        t0 = time.monotonic()
        result = await kill_run(LocalHost(), str(run_dir), 20.0)
        assert result.save_wait is None, format_kill(result)
        assert time.monotonic() - t0 < 15  # the leftovers killed without a save wait
        assert result.status == "stopped", format_kill(result)
        # the worker; and the sidecar, where it had not yet seen its trainer gone (it
        # exits by itself about a second after it; a slow machine finds it still there)
        roles = sorted(p.label or p.role for p in result.processes)  # (sidecar: by label)
        assert roles in (["marked"], ["marked", "sidecar"]), format_kill(result)
        assert {p.outcome for p in result.processes} == {"exited"}, format_kill(result)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_ctrl_c_during_the_save_wait_leaves_the_kill_to_the_host(tmp_path: Path) -> None:
    proc, run_dir = start(tmp_path, save_s=60.0)
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    cli = subprocess.Popen(
        [sys.executable, "-m", "eagle3_tui", "kill", str(run_dir), "--save-wait", "10"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,
    )
    try:
        assert cli.stderr is not None
        line = cli.stderr.readline()  # the first progress line: the wait has begun
        assert "a checkpoint save is in progress" in line, line
        cli.send_signal(signal.SIGINT)
        _, err = cli.communicate(timeout=30)
        assert cli.returncode == 130
        assert "the host goes on with the kill" in err
        proc.wait(30)  # the agent waited out its 10 s, then signalled
        assert "SIGTERM" in notes(run_dir) and "save_finished" not in notes(run_dir)
    finally:
        for p in (cli, proc):
            if p.poll() is None:
                p.kill()
        proc.wait(10)
        cli.wait(10)


async def test_the_kill_dialog_closes_while_it_waits_and_the_result_is_said(
    tmp_path: Path,
) -> None:
    """In the monitor: ``k``, ``y`` while the run saves; the dialog shows the wait and
    Esc closes it (a wait may take minutes); the kill goes on, and its result comes as a
    notification once the save is whole and the trainer signalled."""
    from eagle3_tui.app.screens.kill_resume import ControlDialog
    from tests.app.conftest import local_app, open_dialog, text_of
    from tests.conftest import until

    proc, run_dir = start(tmp_path, save_s=5.0)
    try:
        app = local_app(run_dir)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.snapshot.saving is not None, 30, "the save seen")
            dialog = await open_dialog(app, pilot, "k")
            plan = text_of(dialog.query_one("#plan"), 300)
            assert "checkpoints/1 now: the signal waits for that save" in plan, plan
            await pilot.press("y")
            await until(
                pilot,
                lambda: "checkpoint save is in progress" in text_of(dialog.query_one("#outcome")),
                timeout=30,
                what="the save wait shown",
            )
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, ControlDialog), what="closed")
            assert "save_finished" not in notes(run_dir)  # closed while the kill still waits

            def said() -> bool:
                return any("stopped: all" in str(n.message) for n in app._notifications)

            await until(pilot, said, timeout=60, what="the kill's result, notified")
        proc.wait(10)
        seen = notes(run_dir)
        assert seen["SIGTERM"] >= seen["save_finished"], seen
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_a_restart_without_a_checkpoint_directory_is_not_offered() -> None:
    """A kill of a training without telemetry whose checkpoints were found nowhere said
    "r, or eagle3-tui resume --pid N: relaunches it from its latest complete
    checkpoint", and that resume was refused ("the manifest names no checkpoint_dir")."""
    from eagle3_tui.reports import restart_lines
    from eagle3_tui.transport.replies import RestartRecord

    found = RestartRecord(run_dir="/w/eagle3-runs/restart-7", telemetry=True, env_vars=3)
    said = "\n".join(restart_lines(found, 7))
    assert "a resume is refused" in said and "relaunches" not in said, said
    found.checkpoint_dir = "/data/exp7/checkpoints"
    said = "\n".join(restart_lines(found, 7))
    assert "resume --pid 7: relaunches it from its latest complete checkpoint in " in said
    assert "/data/exp7/checkpoints" in said, said


async def test_a_copy_of_a_run_never_acts_on_the_runs_processes(tmp_path: Path) -> None:
    """``cp -r run copy``: the copy's manifest names the run's trainer and its marker.
    The copy's status listed the run's live processes as its own leftovers ("k ends
    them") and ``kill copy`` signalled them. A copy now refuses the kill, saying whose
    they are, and lists none; the run itself still finds its leftover."""
    from eagle3_tui.agent.frames import AgentError
    from eagle3_tui.agent.runs import status_of
    from eagle3_tui.transport.base import TargetError

    proc, run_dir = start(tmp_path, save_s=60.0)
    try:
        os.kill(proc.pid, signal.SIGKILL)  # its worker outlives it
        proc.wait(10)
        copy = tmp_path / "copy"
        shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("*.sock", ".*.tmp"))
        deadline = time.monotonic() + 30
        while not [x for x in status_of(str(run_dir))["leftovers"] if x.get("pid")]:
            assert time.monotonic() < deadline, status_of(str(run_dir))
            await asyncio.sleep(0.2)
        assert status_of(str(copy))["leftovers"] == []
        with pytest.raises((TargetError, AgentError)) as caught:
            await kill_run(LocalHost(), str(copy), 20.0)
        assert f"is a copy of the run in {run_dir}" in str(caught.value)
        assert status_of(str(run_dir))["leftovers"], "the run's worker was signalled"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its worker, in its session


async def test_a_trainer_held_stopped_is_continued_before_it_is_asked_to_stop(
    tmp_path: Path,
) -> None:
    """``kill -STOP`` on the trainer, then ``kill``: a stopped process takes no stop
    request and acts on no SIGTERM until continued. The kill waited for a step boundary
    in vain, then for the SIGTERM in vain (its grace), then SIGKILLed it: no save, its
    steps since the last checkpoint lost, four minutes. It is continued first now (the
    report says SIGCONT), and its SIGTERM handler runs."""
    proc, run_dir = start(tmp_path, save_s=0.2)
    try:
        deadline = time.monotonic() + 30
        while "save_finished" not in notes(run_dir):
            assert time.monotonic() < deadline, notes(run_dir)
            await asyncio.sleep(0.1)
        os.kill(proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        result = await kill_run(LocalHost(), str(run_dir), 20.0, stop_wait_s=1.0)
        took = time.monotonic() - t0
        trainer = next(p for p in result.processes if p.pid == proc.pid)
        assert trainer.signals[:2] == ["SIGCONT", "SIGTERM"], format_kill(result)
        assert "SIGKILL" not in trainer.signals and "SIGTERM" in notes(run_dir)
        assert took < 15, (took, format_kill(result))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


STEPPING_TRAINER = textwrap.dedent(
    """
    import logging, sys, time
    from pathlib import Path
    from eagle3_tui.telemetry import attach

    attach(Path(sys.argv[1]), samplers=[], resume_command=[sys.executable, *sys.argv])
    metrics = logging.getLogger("speculators.metrics")
    for step in range(100000):
        metrics.info({"train": {"loss": 2.0 - step * 1e-4}}, extra={"step": step})
        time.sleep(0.05)
    """
)


def test_a_copy_of_a_live_run_is_judged_as_a_copy_not_as_a_stalled_run(tmp_path: Path) -> None:
    """``cp -r run copy`` while it trains: nothing writes the copy, while the manifest's
    trainer (the first run's) lives on. The copy read "STALLED: No metric for 2 min"
    (the probe found that trainer alive, its records stopped). It is judged as of its
    last record and said to be a copy, of which run, whose trainer still runs there."""
    from eagle3_tui import api
    from eagle3_tui.model.health import diagnose
    from eagle3_tui.model.verdict import Health

    run_dir = tmp_path / "run"
    script = tmp_path / "stepping_trainer.py"
    script.write_text(STEPPING_TRAINER)
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    proc = subprocess.Popen(
        [sys.executable, str(script), str(run_dir)], env=env, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 60
        while b'"train"' not in _read(run_dir / "metrics.jsonl"):
            assert proc.poll() is None and time.monotonic() < deadline, "no step logged"
            time.sleep(0.1)
        copy = tmp_path / "copy"
        shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("*.sock", ".*.tmp"))
        opened = api.open_run(str(copy))
        later = diagnose(opened.state, opened.now + 600)  # ten minutes on: still a copy
        original = api.open_run(str(run_dir))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert later.health is Health.COPY, later.reason
    assert later.reason.startswith(f"A copy of {run_dir} (its records end "), later.reason
    assert f"where its trainer (pid {proc.pid}) still runs" in later.reason
    assert f"(eagle3-tui {run_dir}). When it was copied: running at step " in later.reason
    assert original.health == "running" and "copy" not in original.reason


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def test_a_kill_whose_run_finished_while_it_waited_says_so(tmp_path: Path) -> None:
    """A kill during the last step's validation: the trainer finished by itself before a
    step boundary came. The report said "no trainer was running to save it" and "a
    restart redoes nothing: it continues at step 97" (of 96; resume then refused: the
    run finished). It says the training finished first, with nothing to resume."""
    from eagle3_tui.agent.stopping import after_stop
    from eagle3_tui.reports import format_kill
    from eagle3_tui.transport.replies import KillReport, decode

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "2").mkdir(parents=True)
    lines = Lines()
    data = b"".join(lines.train(s, 1.0) for s in range(96)) + lines.event("finish", step=96)
    (run_dir / "metrics.jsonl").write_bytes(data)
    m = {"pid": 4242, "run_dir": str(run_dir), "checkpoint_dir": str(run_dir / "checkpoints")}
    (run_dir / "run.json").write_text(json.dumps({**m, "status": "finished"}))
    stop = {"how": "exited", "waited_s": 3.0, "state": None, "reason": "ended first"}
    report = after_stop(stop, m, run_dir, None)
    assert report["how"] == "finished" and report.get("redo") is None, report
    result = decode(
        KillReport,
        {
            "op": "kill",
            "status": "stopped",
            "message": "all 1 process(es) of the run are gone",
            "processes": [],
            "stop": report,
            "signalled_trainer": False,
            "checkpoints": {"dir": str(run_dir / "checkpoints")},
        },
    )
    text = format_kill(result)
    assert "not stopped by the kill: the training finished by itself first" in text, text
    assert "continues at step" not in text and "no trainer was running" not in text, text
    # a trainer that ended otherwise (no finish): as before, what a restart redoes
    (run_dir / "run.json").write_text(json.dumps({**m, "status": "running"}))
    again = after_stop({"how": "exited", "state": None, "reason": "x"}, m, run_dir, None)
    assert again["how"] == "exited"
