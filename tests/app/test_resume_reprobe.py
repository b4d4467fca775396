"""``r`` after a kill the monitor did not make (``eagle3-tui kill`` from the command line):
refused on the last probe's word that the trainer lives ("its trainer is still alive:
nothing to resume") while ``ps`` showed nothing; the host is asked again first."""

from __future__ import annotations

from eagle3_tui.app.screens.kill_resume import ControlDialog
from eagle3_tui.model.verdict import Health
from tests.app.conftest import FakeControl, training
from tests.app.test_pilot import app_with
from tests.conftest import until


async def test_r_after_a_kill_elsewhere_asks_the_host_before_it_refuses() -> None:
    lines, data = training(250)  # a checkpoint saved at step 200
    control = FakeControl(alive=True)
    app, _ = app_with(data, control=control, now=[lines.ts + 1])
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.health == Health.RUNNING, what="running")
        await until(
            pilot,
            lambda: app.pipeline.run.unsettled.liveness.process_alive is True,
            what="the probe's word",
        )
        control.alive = False  # killed from the command line: no probe since
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ControlDialog), what="the dialog")
        said = [str(n.message) for n in app._notifications]
        assert not any("still alive" in m for m in said), said
        await pilot.press("escape")


async def test_r_on_a_trainer_the_host_still_says_alive_is_refused() -> None:
    lines, data = training(250)
    control = FakeControl(alive=True)
    app, _ = app_with(data, control=control, now=[lines.ts + 1])
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.health == Health.RUNNING, what="running")
        await until(
            pilot,
            lambda: app.pipeline.run.unsettled.liveness.process_alive is True,
            what="the probe's word",
        )
        probes = control.calls.count("status")
        await pilot.press("r")
        await until(
            pilot,
            lambda: any("still alive" in str(n.message) for n in app._notifications),
            what="the refusal",
        )
        assert control.calls.count("status") == probes + 1  # asked again, then refused
        assert not isinstance(app.screen, ControlDialog)
