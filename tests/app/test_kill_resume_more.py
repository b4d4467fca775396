"""The ``k`` dialog and the header say what is true of the trainer now: a trainer still
starting up (no step logged since its process started) is said to get SIGTERM at once,
as the kill decides (``stopping.ask_for_stop``), not "asked, not signalled"; a second
``k`` while this monitor's kill runs says that kill is under way; the header names the
trainer a resume from the command line started, not the one the monitor resumed."""

from __future__ import annotations

import asyncio
from typing import Any

from eagle3_tui.app.run_control import RunControl
from eagle3_tui.app.screens.kill_resume import ControlDialog
from eagle3_tui.app.widgets.header import RunHeader
from eagle3_tui.transport.channel import ProgressCallback
from eagle3_tui.transport.replies import KillReport, Status, decode
from tests.app.conftest import MANIFEST, FakeControl, open_dialog, text_of, training
from tests.app.test_pilot import app_with
from tests.conftest import until
from tests.records import Lines

RESUMED = 5151
"""The trainer a resume started (the manifest's ``pid`` now)."""
STOP = {"version": 1, "request": "stop.request", "state": "stop.state"}


class StopControl(FakeControl):
    """A host whose run's telemetry stops at a step boundary (its manifest's ``stop``),
    its trainer the resumed one; ``hold``: a kill that runs until it is set."""

    def __init__(self) -> None:
        super().__init__(alive=True)
        self.hold: asyncio.Event | None = None

    async def status(self, plan: bool = False) -> Status:
        self.calls.append("status")
        m = {**MANIFEST, "pid": RESUMED, "stop": STOP}
        reply = {"op": "status", "alive": True, "manifest": m, "host": "gpu-box"}
        return decode(Status, reply)

    async def kill(self, on_progress: ProgressCallback | None = None) -> KillReport:
        return await RunControl.kill(self, on_progress)  # (counted as the real one is)

    async def _kill(self, on_progress: ProgressCallback | None = None) -> KillReport:
        if self.hold is not None:
            await self.hold.wait()
        reply = {"op": "kill", "status": "stopped", "message": "all 1 process(es) gone"}
        return decode(KillReport, reply)


def resumed_run(steps_since: int) -> tuple[list[bytes], float, Lines]:
    """40 steps, an interrupt, a resume by pid :data:`RESUMED`, then ``steps_since``
    steps of it; a clock just after, and the writer (for more of its records)."""
    lines, data = training(40)
    out = [data, lines.event("interrupt", step=40)]
    out.append(lines.event("resume", pid=RESUMED, global_step=40))
    for s in range(40, 40 + steps_since):
        out.append(lines.train(s, 1.0, epoch=0))
    return out, lines.ts + 1, lines


async def kill_plan_of(steps_since: int) -> str:
    data, now, _ = resumed_run(steps_since)
    app, _ = app_with(data, control=StopControl(), now=[now])
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.snapshot.records > 40, what="the records")
        await pilot.pause(0.1)
        dialog = await open_dialog(app, pilot, "k")
        plan = " ".join(text_of(dialog.query_one("#plan"), 400).split())
        await pilot.press("n")
        return plan


async def test_k_on_a_trainer_still_starting_says_it_gets_sigterm_at_once() -> None:
    """A resumed trainer before its first step: the dialog said "the trainer (pid N) is
    asked, not signalled … Only if no step boundary comes in time: SIGTERM", and the kill
    sent SIGTERM a second later (the rule: no step logged since it started)."""
    plan = await kill_plan_of(0)
    assert f"The trainer (pid {RESUMED}) has logged no step since it started" in plan, plan
    assert "it is sent SIGTERM, not asked to stop at a step boundary" in plan, plan
    assert "nothing of its own to save yet" in plan, plan
    assert "is asked, not signalled" not in plan, plan
    assert "Only if no step boundary comes in time" not in plan, plan
    # nor that speculators saves interrupted/: before its training loop nothing is saved
    assert "speculators then saves" not in plan, plan
    assert "before its training loop a SIGTERM ends it at once, nothing saved" in plan, plan


async def test_k_on_a_trainer_that_has_stepped_since_its_resume_is_asked() -> None:
    plan = await kill_plan_of(3)
    assert f"the trainer (pid {RESUMED}) is asked, not signalled" in plan, plan
    assert "has logged no step since it started" not in plan, plan
    assert "speculators then saves checkpoints/interrupted/ and exits" in plan, plan


async def test_a_second_k_while_a_kill_runs_says_that_kill_is_under_way() -> None:
    """The second ``k`` showed the whole plan again, nothing said of the kill running
    (the result then said it had waited for that kill and sent no signal)."""
    data, now, _ = resumed_run(3)
    control = StopControl()
    control.hold = asyncio.Event()
    app, _ = app_with(data, control=control, now=[now])
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.snapshot.records > 40, what="the records")
        first = await open_dialog(app, pilot, "k")
        assert "still under way" not in text_of(first.query_one("#plan"), 400)
        await pilot.press("y")
        await until(pilot, lambda: control.kills_under_way == 1, what="the kill running")
        await pilot.press("escape")  # it goes on
        await until(pilot, lambda: not isinstance(app.screen, ControlDialog), what="closed")
        second = await open_dialog(app, pilot, "k")
        plan = " ".join(text_of(second.query_one("#plan"), 400).split())
        assert "A kill of this run from this monitor is still under way" in plan, plan
        assert "waits for it to end and sends no signal of its own" in plan, plan
        await pilot.press("n")
        control.hold.set()
        await until(pilot, lambda: control.kills_under_way == 0, what="the kill's end")
        third = await open_dialog(app, pilot, "k")
        assert "still under way" not in text_of(third.query_one("#plan"), 400)
        await pilot.press("n")


def header_note(app: Any) -> str:
    return " ".join(text_of(app.query_one(RunHeader), 300).split())


async def test_the_header_names_the_trainer_a_later_resume_started() -> None:
    """The monitor resumed the run (pid 5151), then ``eagle3-tui resume`` from the command
    line started pid 6262: the header kept "resumed: pid 5151" (gone), while ``k`` rightly
    targeted 6262."""
    data, now, lines = resumed_run(3)
    clock = [now]
    app, source = app_with(data, control=FakeControl(), now=clock)
    async with app.run_test(size=(200, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.records > 40, what="the records")
        header = app.query_one(RunHeader)
        header.show_target("gpu-box:/runs/exp7", f"resumed: pid {RESUMED}")
        await pilot.pause(0.1)
        assert f"resumed: pid {RESUMED}" in header_note(app)
        # the next resume, from the command line: its records follow
        clock[0] = now + 10
        source.push(lines.at(now + 5).event("interrupt", step=43))
        source.push(lines.event("resume", pid=6262, global_step=43))
        await until(pilot, lambda: "resumed: pid 6262" in header_note(app), what="6262")
        assert f"pid {RESUMED}" not in header_note(app)


async def test_the_header_keeps_the_resumed_pid_before_its_records_come() -> None:
    """Right after ``r`` the new trainer's records have not come yet: the header names
    the pid resumed, not the newest process its records show (the one that exited)."""
    data, now, _ = resumed_run(3)
    app, _ = app_with(data, control=FakeControl(), now=[now])
    async with app.run_test(size=(200, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.records > 40, what="the records")
        app.query_one(RunHeader).show_target("gpu-box:/runs/exp7", "resumed: pid 7373")
        await pilot.pause(0.2)
        assert "resumed: pid 7373" in header_note(app)
        assert f"pid {RESUMED}" not in header_note(app)
