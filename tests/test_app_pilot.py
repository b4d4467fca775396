"""The app driven by Pilot over a replay transport."""

from __future__ import annotations

from eagle3_tui.app.app import MonitorApp
from eagle3_tui.app.widgets import MetricsTable, StatusLine
from eagle3_tui.transport.replay import ReplayTransport
from tests.conftest import until
from tests.records import Lines


def rendered(widget: object) -> str:
    from rich.console import Console

    console = Console(width=120, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(widget.render())  # type: ignore[attr-defined]
    return console.export_text()


async def test_latest_loss_is_rendered_and_follows_new_lines() -> None:
    lines = Lines()
    source = ReplayTransport([lines.train(step, 2.0 - step * 0.1) for step in range(5)])
    app = MonitorApp(source, refresh_interval=0.05)
    async with app.run_test(size=(120, 40)) as pilot:
        table = app.query_one(MetricsTable)
        await until(pilot, lambda: "1.6000" in rendered(table), what="step 4's loss 2.0 - 0.4")
        source.push(lines.train(5, 1.2345))
        await until(pilot, lambda: "1.2345" in rendered(table), what="step 5's loss")
        assert "step 5" in rendered(app.query_one(StatusLine))
