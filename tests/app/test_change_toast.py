"""A change of the run's verdict while another screen covers the header (help, the
log, the comparison) is said there: a toast and, when it needs a human, the bell — as
``watch`` would alert it (issue 30: the monitor itself as a destination)."""

from __future__ import annotations

from eagle3_tui.app.screens.help import HelpScreen
from eagle3_tui.model.verdict import Health
from eagle3_tui.notify import ALARMS
from tests.app.conftest import training
from tests.app.test_pilot import app_with
from tests.conftest import until


async def test_a_verdict_that_changes_under_the_help_screen_is_a_toast_and_the_bell() -> None:
    lines, data = training(steps=120)
    now = [lines.ts + 1.0]
    app, _source = app_with(data, now=now)
    bells: list[int] = []
    app.bell = lambda: bells.append(1)  # type: ignore[method-assign]
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.health == Health.RUNNING, what="running")
        seen = len(list(app._notifications))
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
        now[0] += 900.0  # nothing more comes: 15 min later it is no longer running
        await until(pilot, lambda: app.snapshot.health.value in ALARMS, what="an alarm")
        await until(pilot, lambda: len(list(app._notifications)) > seen, what="a toast")
        toast = list(app._notifications)[-1]
        word = app.snapshot.diagnosis.label
        assert toast.title == f"the run: {word}" and toast.severity == "error", toast
        assert toast.message.startswith(app.snapshot.diagnosis.reason[:40]), toast.message
        assert bells == [1]
        # on the main screen the header says it: no toast, no bell
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, HelpScreen), what="help closed")
        count = len(list(app._notifications))
        now[0] += 3600.0
        await pilot.pause(0.5)
        assert len(list(app._notifications)) == count and bells == [1]
