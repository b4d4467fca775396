"""Keys only where they can act (issue 28, item 6): every key pressed in each state (a
live run with telemetry, a finished one, a stopped one, one without telemetry) either
acts or says in one line why not; the footer dims or hides what cannot act."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import OptionList
from textual.widgets._footer import FooterKey

from eagle3_tui.app.app import MonitorApp
from eagle3_tui.app.run_control import RunControl
from eagle3_tui.app.screens.attach import AttachDialog
from eagle3_tui.app.screens.compare import CompareScreen
from eagle3_tui.app.screens.kill_resume import ControlDialog
from eagle3_tui.app.screens.runs import RunPicker
from eagle3_tui.app.widgets.header import RunHeader
from eagle3_tui.model.verdict import Health
from eagle3_tui.transport.channel import LocalHost
from eagle3_tui.transport.replay import ReplayTransport
from eagle3_tui.transport.replies import KillReport, ProcessRow, ResumeReport, RunEntry, decode
from eagle3_tui.transport.target import LocalTarget
from tests.app.conftest import T0, FakeControl, text_of, training
from tests.app.test_pilot import NOW, app_with
from tests.conftest import until
from tests.records import Lines
from tests.transport.fakes import dead_pid, fake_manifest, register


def said(app: MonitorApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


def footer_keys(app: MonitorApp) -> dict[str, bool]:
    """The footer's keys, each with whether it is shown enabled."""
    return {k.key: not k.has_class("-disabled") for k in app.screen.query(FooterKey)}


def finished_run() -> list[bytes]:
    lines, data = training(40)
    return [data, lines.event("finish", step=40)]


async def test_resume_on_a_finished_run_says_why_not_and_is_dimmed() -> None:
    """``r`` on a finished run relaunched it (it exited at once): now refused, dimmed."""
    app, _ = app_with(finished_run(), control=FakeControl(alive=False))
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.health == Health.FINISHED, what="finished")
        await pilot.pause(0.1)
        await says_why(app, pilot, "r", "finished: nothing to resume")
        assert footer_keys(app).get("r") is False  # listed, dimmed


async def says_why(app: MonitorApp, pilot: Any, key: str, words: str) -> None:
    """``key`` opens no dialog and says ``words`` in a notice."""
    await pilot.press(key)
    await pilot.pause(0.1)
    assert not isinstance(app.screen, ControlDialog)
    assert any(words in m for m in said(app)), said(app)


async def test_resume_on_a_running_run_says_it_runs() -> None:
    lines, data = training(40)
    app, _ = app_with(data, control=FakeControl(alive=True), now=[lines.ts])
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.health == Health.RUNNING, what="running")
        await says_why(app, pilot, "r", "still alive (running): nothing to resume")


async def test_resume_on_a_stopped_run_with_a_checkpoint_acts() -> None:
    lines, data = training(250)  # a checkpoint at step 199
    app, _ = app_with([data, lines.event("interrupt", step=250)], control=FakeControl(alive=False))
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.health == Health.STOPPED, what="stopped")
        await pilot.pause(0.1)
        assert footer_keys(app).get("r") is True
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ControlDialog), what="the dialog")


async def test_kill_on_a_finished_run_says_it_ended() -> None:
    app, _ = app_with(finished_run(), control=FakeControl(alive=False))
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.health == Health.FINISHED, what="finished")
        await says_why(app, pilot, "k", "finished: nothing to kill")


async def test_attach_on_a_run_with_telemetry_offers_nothing() -> None:
    """``a`` on a run that writes telemetry offered the host's other processes (another
    user's job) to attach into its directory: now it says there is nothing to attach."""
    lines, data = training(40)
    app, _ = app_with(data, control=FakeControl(alive=True), now=[lines.ts])
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.health == Health.RUNNING, what="running")
        await pilot.pause(0.1)
        await pilot.press("a")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, AttachDialog)
        assert any("already writes telemetry" in m for m in said(app)), said(app)
        assert "a" not in footer_keys(app)


def observed_run() -> tuple[list[bytes], RunControl]:
    """A live training without telemetry, as the agent describes it."""
    started = NOW - 600
    obs = Lines(writer="obs", t0=started, dt=0.0)
    data = [obs.at(NOW - 10 + i).proc(started=started) for i in range(10)]
    row = ProcessRow(pid=4242, started=started, command=["python", "train.py"], mine=True)
    return data, RunControl(LocalHost(), None, "pid 4242", process=row)


async def test_the_footer_lists_attach_on_a_run_without_telemetry() -> None:
    data, control = observed_run()
    app, _ = app_with(data, control=control)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.observed is not None, what="observed")
        await pilot.pause(0.1)
        assert footer_keys(app).get("a") is True, footer_keys(app)


async def test_the_picker_hides_gone_runs_and_a_comparison_can_be_picked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``c`` picker listed runs whose directory is gone; once one was picked, ``c``
    reopened it for good: now ``o`` on the comparison picks another."""
    state_home = tmp_path / "state"  # an index of its own: other tests' gone runs are not counted
    monkeypatch.setenv("XDG_STATE_HOME", str(state_home))
    current, gone, one, two = (tmp_path / n for n in ("cur", "gone", "one", "two"))
    fake_manifest(current, dead_pid(), f"cur-{os.getpid()}")
    for d in (gone, one, two):
        fake_manifest(d, dead_pid(), f"{d.name}-{os.getpid()}", status="finished")
        register(state_home, f"{d.name}-{os.getpid()}", d)
    (gone / "run.json").unlink()
    gone.rmdir()
    _, previous = training(100)
    app, _ = app_with(training(300)[1], control=RunControl.for_target(LocalTarget(current)))
    app.open_run = lambda run_dir: ReplayTransport([previous], label=run_dir)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, RunPicker), what="the picker")
        picker = app.screen
        assert isinstance(picker, RunPicker)
        runs = picker.query_one("#runs", OptionList)
        await until(pilot, lambda: runs.option_count > 0, what="runs")
        listed = [r.run_dir for r in picker._runs]
        assert str(gone) not in listed and str(one) in listed, listed
        assert "1 gone (its directory removed) hidden" in str(
            picker.query_one("#picker-status").render()
        )
        runs.highlighted = listed.index(str(one))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, CompareScreen), what="compared")
        await pilot.press("o")
        await until(pilot, lambda: isinstance(app.screen, RunPicker), what="picked again")
        picker = app.screen
        assert isinstance(picker, RunPicker)
        runs = picker.query_one("#runs", OptionList)
        await until(pilot, lambda: runs.option_count > 0, what="runs again")
        listed = [r.run_dir for r in picker._runs]
        runs.highlighted = listed.index(str(two))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, CompareScreen), what="the other")
        assert app.compare_label == str(two)


async def test_the_token_axis_says_why_it_stays_on_steps() -> None:
    """``a`` on the comparison silently stayed on the step axis when the previous run
    had no token counts: now it says so."""
    _, data = training(100)
    lines = Lines(t0=T0)
    previous = b"".join(
        lines.make("train", step=s, global_step=s, epoch=0, train={"loss": 2.0}) for s in range(80)
    )
    app, _ = app_with(data)
    app._start_compare(ReplayTransport([previous], label="/runs/exp6"))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, CompareScreen), what="compared")
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        await until(pilot, lambda: screen.comparison is not None, what="a comparison")
        await pilot.press("a")
        await until(
            pilot,
            lambda: any("the previous run has no token counts" in m for m in said(app)),
            what="why it stays on steps",
        )
        assert any("aligned by global step" in m for m in said(app)), said(app)
        assert not any("attach" in m for m in said(app)), said(app)  # a is the screen's here


async def test_resume_is_offered_as_soon_as_a_kill_saw_the_run_stop() -> None:
    """``r`` right after ``k`` stopped a training without telemetry said "the run is
    running": the stream's word that the trainer exited comes a round later than the
    kill's. A kill that found the processes gone offers ``r`` at once (the host decides)."""
    data, control = observed_run()
    app, _ = app_with(data, control=control)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.observed is not None, what="observed")
        await pilot.pause(0.1)
        await pilot.press("r")
        await pilot.pause(0.1)
        assert any("is still alive (silent): nothing to resume" in m for m in said(app)), said(app)
        stopped = decode(KillReport, {"op": "kill", "status": "stopped", "message": "stopped"})
        app.post_message(ControlDialog.Finished("kill", stopped))
        await pilot.pause(0.1)
        assert app.snapshot.observed is not None and app.snapshot.observed.alive  # not yet said
        assert footer_keys(app).get("r") is True
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ControlDialog), what="the dialog")
        dialog = app.screen
        assert isinstance(dialog, ControlDialog)
        # the host's answer (no restart recorded for this made-up process), then closed
        await until(pilot, lambda: dialog.state != "asking", what="the host's answer", timeout=60)
        await pilot.press("escape")


async def test_attach_offers_only_the_observed_training_itself() -> None:
    """``a`` on a run without telemetry asked the host for *any* training (another
    user's job, a training of another directory) to attach into this directory: now it
    asks about the observed process alone (here a process that is no training)."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(60)")
    try:
        row = ProcessRow(pid=proc.pid, command=[sys.executable], mine=True)
        control = RunControl(LocalHost(), None, f"pid {proc.pid}", process=row)
        plan = await control.attach_plan(None)
        assert plan.pid == proc.pid, plan
    finally:
        proc.kill()
        await proc.wait()


async def test_export_of_a_run_without_steps_writes_nothing_and_says_why(tmp_path: Path) -> None:
    """``e`` on a training without telemetry wrote an empty CSV ("0 steps written"): its
    per-step metrics are not available, so nothing is written and it says so."""
    data, control = observed_run()
    app, _ = app_with(data, control=control, export_dir=tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.observed is not None, what="observed")
        await pilot.press("e")
        await pilot.pause(0.2)
        assert any("no per-step metrics without telemetry" in m for m in said(app)), said(app)
    assert os.listdir(tmp_path) == []  # no folder, no file


async def test_the_command_palette_says_why_an_action_cannot_act() -> None:
    """The palette (ctrl+p) lists every action: one that cannot act now did nothing,
    silently; now it says why, as its key does."""
    app, _ = app_with(finished_run(), control=FakeControl(alive=False))
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.health == Health.FINISHED, what="finished")
        commands = app.get_system_commands(app.screen)
        resume = next(c for c in commands if c.title.startswith("Resume"))
        picked = resume.callback()  # what Enter on the palette's entry runs
        if picked is not None:
            await picked
        await pilot.pause(0.1)
        assert not isinstance(app.screen, ControlDialog)
        assert any("finished: nothing to resume" in m for m in said(app)), said(app)


KEYS = ("k", "r", "a", "c", "l", "s", "left_square_bracket", "right_square_bracket", "0",
        "p", "e", "m", "question_mark")  # fmt: skip
"""Every key of the monitor but q."""


async def every_key_acts_or_says_why(app: MonitorApp, ready: Callable[[], bool]) -> list[str]:
    """Each key of the monitor pressed once (a screen it opens closed again): the keys
    that did nothing visible: no screen, no change of the view, no notice."""
    silent = []
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, ready, what="the state")
        await pilot.pause(0.1)
        for key in KEYS:
            screen, view, notices = app.screen, app.view, len(app._notifications)
            await pilot.press(key)
            for _ in range(100):  # up to ~5 s on a busy machine: an export is a worker
                if app.screen is not screen or app.view != view:
                    break
                if len(app._notifications) != notices:
                    break
                await pilot.pause(0.05)
            else:
                silent.append(key)
            if app.screen is not screen:
                await pilot.press("escape")
                await until(pilot, lambda: len(app.screen_stack) == 1, what=f"{key} closed")
    return silent


async def test_every_key_on_a_live_run_acts_or_says_why(tmp_path: Path) -> None:
    lines, data = training(40)
    app, _ = app_with(data, control=FakeControl(alive=True), now=[lines.ts], export_dir=tmp_path)
    ready = lambda: app.snapshot.health == Health.RUNNING  # noqa: E731
    assert await every_key_acts_or_says_why(app, ready) == []


async def test_every_key_on_a_finished_run_acts_or_says_why(tmp_path: Path) -> None:
    app, _ = app_with(finished_run(), control=FakeControl(alive=False), export_dir=tmp_path)
    ready = lambda: app.snapshot.health == Health.FINISHED  # noqa: E731
    assert await every_key_acts_or_says_why(app, ready) == []


async def test_every_key_on_a_run_without_telemetry_acts_or_says_why(tmp_path: Path) -> None:
    data, control = observed_run()
    app, _ = app_with(data, control=control, export_dir=tmp_path)
    ready = lambda: app.snapshot.observed is not None  # noqa: E731
    assert await every_key_acts_or_says_why(app, ready) == []


async def test_every_key_without_a_host_acts_or_says_why(tmp_path: Path) -> None:
    lines, data = training(40)
    app, _ = app_with(data, now=[lines.ts], export_dir=tmp_path)
    ready = lambda: app.snapshot.global_step == 39  # noqa: E731
    assert await every_key_acts_or_says_why(app, ready) == []


async def test_window_keys_say_when_they_change_nothing() -> None:
    """``]`` and ``0`` while the whole run is shown, ``[`` at the narrowest window did
    nothing, silently: now each says so."""
    lines, data = training(40)
    app, _ = app_with(data, now=[lines.ts])
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.global_step == 39, what="step 40")
        await pilot.press("right_square_bracket", "0")
        await pilot.pause(0.1)
        assert sum("the whole run is shown already" in m for m in said(app)) == 2, said(app)
        await pilot.press(*["left_square_bracket"] * 4)
        await pilot.pause(0.1)
        assert app.view.window == 10
        assert any("narrowest window: 10 steps" in m for m in said(app)), said(app)


def test_the_picker_never_offers_the_run_shown() -> None:
    """``c`` offered the run shown itself (its directory spelt otherwise than the
    index's: relative, a trailing slash), and Enter compared it with itself (every Δ
    +0.0000). Never listed: not by the host's resolved directory, nor by its run id."""
    control = RunControl(LocalHost(), "runs/r2/", "runs/r2")
    picker = RunPicker(control, "runs/r2/", {"run_dir": "/data/runs/r2", "run_id": "abc"})
    assert picker._is_current(RunEntry(run_dir="/data/runs/r2"))
    assert picker._is_current(RunEntry(run_dir="/moved/r2", run_id="abc"))
    assert not picker._is_current(RunEntry(run_dir="/data/runs/r1", run_id="def"))
    bare = RunPicker(control, "/data/runs/r2/", None)  # no manifest yet: its spelling
    assert bare._is_current(RunEntry(run_dir="/data/runs/r2"))
    assert not bare._is_current(RunEntry(run_dir="/data/runs/r1"))


async def test_the_run_plots_keys_on_the_comparison_say_they_are_not_its() -> None:
    """On the comparison the footer offered ``l`` and ``s`` (nothing changed there) and
    ``[`` (it cut this run's line only, from its own end). Dimmed there, each says why;
    back on the run's plots they act again."""
    _, previous = training(100)
    app, _ = app_with(training(300)[1], control=FakeControl(alive=False))
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.global_step is not None, what="the run")
        app._start_compare(ReplayTransport([previous], label="previous"))
        app.push_screen(CompareScreen("previous"))
        await until(pilot, lambda: isinstance(app.screen, CompareScreen), what="compared")
        await until(pilot, lambda: "l" in footer_keys(app), what="the comparison's footer")
        keys = footer_keys(app)
        assert keys.get("l") is False and keys.get("s") is False, keys
        assert keys.get("left_square_bracket") is False, keys
        log_scale = app.view.log_scale
        await pilot.press("l")
        await pilot.pause(0.1)
        assert any("the comparison's plots are linear" in m for m in said(app)), said(app)
        assert app.view.log_scale == log_scale
        await pilot.press("left_square_bracket")
        await pilot.pause(0.1)
        assert any("the comparison shows both runs whole" in m for m in said(app)), said(app)
        assert app.view.window is None
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, CompareScreen), what="back")
        await until(pilot, lambda: footer_keys(app).get("l") is True, what="l offered again")
        await pilot.press("l")
        await pilot.pause(0.1)
        assert app.view.log_scale != log_scale


def test_the_kill_dialog_counts_the_wait_for_a_step_boundary_on_one_line() -> None:
    """The agent tells its wait for a step boundary every few seconds, each time the
    same sentence: the dialog showed it once, standing still for minutes (or eight
    times over). One line now, its time counting; the next phase a line of its own."""
    from eagle3_tui.transport.channel import Event

    class Control:
        where, nodes = "gpu-box:runs/exp7", ()

    dialog = ControlDialog("kill", Control())  # type: ignore[arg-type]
    for t in (0.0, 5.0, 10.0):
        asked = {"step": "stop", "phase": "asked", "elapsed": t, "wait_s": 60.0}
        dialog._on_progress(Event("progress", asked))
    dialog._on_progress(Event("progress", {"step": "stop", "phase": "step_boundary"}))
    assert dialog.progress == [
        "asked the trainer to stop at its next step boundary (SIGTERM after 60 s without "
        "one) · 10 s so far",
        "stopped at a step boundary: speculators saves interrupted/",
    ]


async def test_after_attaching_a_run_without_telemetry_the_monitor_follows_its_metrics() -> None:
    """``a`` on a training without telemetry attached it: its metrics went to the run
    directory the attach made, while the screen stayed on the view from outside (SILENT,
    "no metric has been logged") until the run ended. It follows that run now."""
    from eagle3_tui.transport.replies import AttachResult

    data, control = observed_run()
    app, _ = app_with(data, control=control)
    lines = Lines(t0=NOW - 5)
    attached = ReplayTransport(
        [b"".join(lines.train(s, 2.0 - s * 0.01) for s in range(40, 45))],
        label="/work/eagle3-runs/attached-4242",
    )
    opened: list[str] = []

    def open_run(run_dir: str) -> ReplayTransport:
        opened.append(run_dir)
        return attached

    app.open_run = open_run
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.observed is not None, what="observed")
        result = AttachResult(
            status="attached", pid=4242, run_dir="/work/eagle3-runs/attached-4242"
        )
        app.post_message(AttachDialog.Finished(result))
        await until(pilot, lambda: app.snapshot.global_step == 44, what="its metrics")
        assert opened == ["/work/eagle3-runs/attached-4242"]
        assert app.snapshot.observed is None and app.snapshot.health is Health.RUNNING
        assert app.control is not None and not app.control.observed
        # a local run's CSV goes where its records are (it went to ~/.local/share)
        assert app.export_dir == Path("/work/eagle3-runs/attached-4242/exports")
        header = app.query_one(RunHeader)
        assert "telemetry attached: pid 4242" in text_of(header)
        # resumed after a kill: the header names the process followed now, not the gone one
        resumed = ResumeReport(status="started", pid=5151, run_dir=result.run_dir)
        app.post_message(ControlDialog.Finished("resume", resumed))
        await until(pilot, lambda: "resumed: pid 5151" in text_of(header), what="its new pid")
        assert "pid 4242" not in text_of(header)


async def test_r_on_a_live_trainer_says_how_it_is_not_that_it_runs() -> None:
    """``r`` on a stalled run whose trainer is held stopped (a SIGSTOP) said "the run is
    running: nothing to resume" under the header's STALLED, held stopped."""
    from eagle3_tui.transport.replies import Status

    lines, data = training(100)
    now = [lines.ts + 5]
    app, _ = app_with(data, control=FakeControl(alive=True), now=now)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.health == Health.RUNNING, what="running")
        live = "resume: its trainer is still alive (running): nothing to resume (k stops it first)"
        assert app.refusal("resume") == live
        await app.pipeline.set_status(Status(alive=True, state="T", now=lines.ts + 900), now[0])
        now[0] = lines.ts + 900
        await until(pilot, lambda: app.snapshot.health == Health.STALLED, what="stalled")
        assert app.refusal("resume") == (
            "resume: its trainer is still alive (held stopped): nothing to resume (k stops it "
            "first)"
        )


async def test_telemetry_attached_from_elsewhere_is_followed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A view of a training without telemetry kept saying SILENT ("the logger has no
    handler") after ``eagle3-tui attach`` from another terminal had attached it, its
    metrics flowing into the attach's run directory; ``a`` then said "pid has telemetry
    already". It now asks the host while it says the training logs nothing, and follows
    the run directory the training's telemetry writes to."""
    import eagle3_tui.app.app as app_module
    from eagle3_tui.transport.replies import Status

    monkeypatch.setattr(app_module, "TELEMETRY_LOOK_S", 0.2)
    data, control = observed_run()
    asked: list[str] = []

    class Attached(RunControl):
        async def status(self, plan: bool = False) -> Status:
            asked.append("status")
            row = ProcessRow(
                pid=4242,
                command=["python", "train.py"],
                mine=True,
                telemetry=True,
                run_dir="/work/eagle3-runs/attached-4242",
            )
            return Status(alive=True, row=row, run_dir=row.run_dir)

    assert control.process is not None
    watched = Attached(LocalHost(), None, "pid 4242", process=control.process)
    app, _ = app_with(data, control=watched)
    lines = Lines(t0=NOW - 5)
    attached = ReplayTransport(
        [b"".join(lines.train(s, 2.0 - s * 0.01) for s in range(40, 45))],
        label="/work/eagle3-runs/attached-4242",
    )
    opened: list[str] = []

    def open_run(run_dir: str) -> ReplayTransport:
        opened.append(run_dir)
        return attached

    app.open_run = open_run
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.global_step == 44, what="its metrics")
        assert opened == ["/work/eagle3-runs/attached-4242"] and asked
        assert app.snapshot.observed is None and app.snapshot.health is Health.RUNNING
        assert "telemetry found" in text_of(app.query_one(RunHeader))
