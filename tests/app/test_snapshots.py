"""Pictures of the screens at 120×40 and 80×24, with fixed data and a frozen clock.

Reviewed by eye before each ``--snapshot-update``: a changed picture is a changed
product. (The README's screenshot is drawn from a recorded real run instead:
``scripts/screenshot.py``, checked by ``test_screenshot.py``.)
"""

from __future__ import annotations

from typing import Any

from eagle3_tui.app.app import MonitorApp, make_app
from eagle3_tui.app.screens.compare import CompareScreen
from eagle3_tui.app.screens.kill_resume import ControlDialog
from eagle3_tui.app.widgets.plots import MetricPlot
from eagle3_tui.transport.replay import ReplayTransport
from tests.app.conftest import T0, FakeControl, training
from tests.conftest import until

NOW = T0 + 300.5 + 2


def main_app(control: FakeControl | None = None) -> MonitorApp:
    lines, data = training(600)
    lines.at(T0 + 250)
    data += lines.log("loss spike at step 498 [bold]ignored[/bold] \x1b[31m(clipped)", "WARNING")
    return make_app(
        ReplayTransport([data], label="gpu-box:/runs/exp7"),
        control=control,
        clock=lambda: NOW,
        refresh_interval=0.02,
        status_interval=3600,
    )


async def loaded(pilot: Any) -> None:
    app = pilot.app
    await until(pilot, lambda: app.snapshot.global_step == 599, what="the whole run")
    await until(pilot, lambda: app.is_current, what="a picture at the final width")
    plots = list(app.query(MetricPlot))
    await until(
        pilot,
        lambda: app.lines_current and all(p.is_current for p in plots),
        what="the plots drawn",
    )
    await pilot.pause()


def test_main_screen_120x40(snap_compare: Any) -> None:
    assert snap_compare(main_app(), terminal_size=(120, 40), run_before=loaded)


def test_main_screen_80x24(snap_compare: Any) -> None:
    assert snap_compare(main_app(), terminal_size=(80, 24), run_before=loaded)


def test_kill_confirmation_80x24(snap_compare: Any) -> None:
    """The dialog (over a run that has not logged yet: the dialog is the subject)."""
    app = make_app(
        ReplayTransport([], label="gpu-box:/runs/exp7"),
        control=FakeControl(),
        clock=lambda: NOW,
        refresh_interval=0.02,
        status_interval=3600,
    )

    async def confirm(pilot: Any) -> None:
        await pilot.press("k")
        await until(pilot, lambda: isinstance(pilot.app.screen, ControlDialog), what="dialog")
        await until(pilot, lambda: pilot.app.screen.state == "ready", what="the plan")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=confirm)


def comparison_app() -> MonitorApp:
    _, previous = training(400, worse=0.2)
    app = main_app()
    app.compare_source = ReplayTransport([previous], label="gpu-box:/runs/exp6")
    return app


def test_comparison_120x40(snap_compare: Any) -> None:
    assert snap_compare(comparison_app(), terminal_size=(120, 40), run_before=compared)


def test_comparison_80x24(snap_compare: Any) -> None:
    """Both text panels inside the screen (they scroll), compact table headers."""
    assert snap_compare(comparison_app(), terminal_size=(80, 24), run_before=compared)


async def compared(pilot: Any) -> None:
    await loaded(pilot)
    await pilot.press("c")
    await until(pilot, lambda: isinstance(pilot.app.screen, CompareScreen), what="screen")
    screen = pilot.app.screen
    await until(
        pilot,
        lambda: screen.comparison is not None and screen.comparison.at_step_b == 399,
        what="the comparison",
    )
    await pilot.pause()
