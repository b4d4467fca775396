"""Values plotext itself cannot put on an axis (a range of ~1e-309: its tick labels
overflow; ±1e308: NaN ticks) leave the app running, and the next drawable step is
drawn as any other."""

from __future__ import annotations

from eagle3_tui.app.app import MonitorApp
from eagle3_tui.app.widgets.panels import AcceptanceTable
from eagle3_tui.app.widgets.plots import LossPlot
from tests.app.conftest import T0
from tests.app.test_pilot import app_with
from tests.app.test_refresh_cost import settled
from tests.records import Lines

BRAILLE = ("\u2800", "\u28ff")


def text_of(plot: LossPlot) -> str:
    return "\n".join("".join(seg.text for seg in strip) for strip in plot.frame())


def table_of(app: MonitorApp) -> str:
    table = app.query_one(AcceptanceTable)
    return "\n".join("".join(seg.text for seg in table.render_line(y)) for y in range(6))


async def test_ranges_plotext_cannot_draw_leave_the_app_drawing() -> None:
    lines = Lines(t0=T0)
    phases = [
        [2.2e-309] * 4,  # a constant below the smallest normal float
        [0.0, 2.2e-309] * 2,  # a range of one subnormal
        [1e308, -1e308] * 2,  # a range past the largest float
    ]
    app, source = app_with(b"")
    step = 0
    async with app.run_test(size=(120, 40)) as pilot:
        plot = app.query_one(LossPlot)
        for losses in phases:
            source.push(b"".join(lines.train(step + i, v) for i, v in enumerate(losses)))
            step += len(losses)
            await settled(app, pilot, step - 1)
            assert len(plot.frame()) == plot.size.height  # a picture, whatever it holds
        source.push(lines.train(step, 1.5))  # then a step that can be drawn
        await settled(app, pilot, step)
        drawn = text_of(plot)
        assert "1.50" in drawn and any(BRAILLE[0] < ch <= BRAILLE[1] for ch in drawn), drawn
        assert " 0      0.5000" in table_of(app)  # its per-position loss, 1.5 / 3
        await pilot.press("l")  # the same values on the log scale
        await settled(app, pilot, step)
        assert app.is_running and "log" in str(plot.border_title)
