"""What a refresh costs: a panel whose inputs did not change is not rendered again, the
screen is not laid out again for new data, charts rebuild at most every
``DATA_REDRAW_S`` for data alone, and a new step still reaches the screen at once.

Counted through the real app (Pilot): renders of each panel, plotext builds, layouts."""

from __future__ import annotations

import subprocess
import sys
import time
from functools import partial
from typing import Any

import pytest
from rich.style import Style as RichStyle
from textual.geometry import Region
from textual.screen import Screen
from textual.strip import Strip
from textual.visual import Visual, visualize
from textual_plotext import PlotextPlot

from eagle3_tui.app import app as app_module
from eagle3_tui.app.app import MonitorApp, make_app
from eagle3_tui.app.widgets import plots
from eagle3_tui.app.widgets.header import RunHeader
from eagle3_tui.app.widgets.log import LogPanel
from eagle3_tui.app.widgets.panels import (
    AcceptanceTable,
    DataPanel,
    GpuPanel,
    KeptLines,
    ProgressPanel,
)
from eagle3_tui.app.widgets.plots import AcceptancePlot, LossPlot, MetricPlot
from eagle3_tui.model.verdict import Health
from eagle3_tui.transport.replay import ReplayTransport
from tests.app.conftest import T0, FakeControl, text_of, training
from tests.app.test_pilot import NOW, app_with
from tests.conftest import until
from tests.records import Lines


def renders(app: MonitorApp) -> dict[str, int]:
    counts = {"RunHeader": app.query_one(RunHeader).renders}
    for panel in (AcceptanceTable, ProgressPanel, GpuPanel, DataPanel, LogPanel):
        counts[panel.__name__] = app.query_one(panel).renders
    for cls in (LossPlot, AcceptancePlot):
        counts[cls.__name__] = app.query_one(cls).draws
    return counts


async def settled(app: MonitorApp, pilot: Any, step: int) -> None:
    await until(pilot, lambda: app.snapshot.global_step == step, what=f"step {step}")
    plots_ = (app.query_one(LossPlot), app.query_one(AcceptancePlot))
    await until(
        pilot,
        lambda: app.lines_current and all(p.is_current for p in plots_),
        what="the plots drawn with every step read",
    )
    await pilot.pause(0.1)


@pytest.fixture
def layouts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times a screen was laid out again."""
    count = [0]
    layout = Screen._refresh_layout

    def counted(self: Screen[Any], *args: Any, **kwargs: Any) -> None:
        count[0] += 1
        layout(self, *args, **kwargs)

    monkeypatch.setattr(Screen, "_refresh_layout", counted)
    return count


async def test_rebuilds_without_new_data_render_nothing(
    monkeypatch: pytest.MonkeyPatch, layouts: list[int]
) -> None:
    monkeypatch.setattr(app_module, "CLOCK_REFRESH_S", 0.05)  # a rebuild every few ticks
    _, data = training(300)
    app, _ = app_with(data)  # the clock is frozen: the same picture each time
    async with app.run_test(size=(120, 40)) as pilot:
        await settled(app, pilot, 299)
        before, laid_out, shown = renders(app), layouts[0], app.snapshot
        await until(pilot, lambda: app.snapshot is not shown, what="a rebuild")
        await pilot.pause(0.3)  # several more
        assert app.snapshot is not shown
        assert renders(app) == before
        assert layouts[0] == laid_out


async def test_a_gpu_sample_repaints_the_gpu_panel_alone(layouts: list[int]) -> None:
    lines, data = training(300)  # its last step at T0 + 149.5: running at T0 + 151
    app, source = app_with(data, now=[T0 + 151.0])
    async with app.run_test(size=(120, 40)) as pilot:
        await settled(app, pilot, 299)
        assert app.snapshot.health == Health.RUNNING
        before, laid_out = renders(app), layouts[0]
        source.push(lines.at(T0 + 150.5).gpu(12.0, devices=8))
        gpus = app.query_one(GpuPanel)
        await until(pilot, lambda: " 12%" in text_of(gpus), what="the new sample")
        await pilot.pause(0.2)
        after = renders(app)
        assert after["GpuPanel"] > before["GpuPanel"]
        assert {k: v for k, v in after.items() if k != "GpuPanel"} == {
            k: v for k, v in before.items() if k != "GpuPanel"
        }
        assert layouts[0] == laid_out  # new data is never a layout of the screen


async def test_a_new_step_is_on_screen_with_the_snapshot_that_has_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(plots, "DATA_REDRAW_S", 3.0)
    monkeypatch.setattr(plots, "DATA_REDRAW_MAX_S", 3.0)
    lines = Lines(t0=T0)
    app, source = app_with([lines.train(s, 2.0 - s * 0.01) for s in range(5)])
    async with app.run_test(size=(120, 40)) as pilot:
        await settled(app, pilot, 4)
        header, progress = app.query_one(RunHeader), app.query_one(ProgressPanel)
        loss, acc = app.query_one(LossPlot), app.query_one(AcceptancePlot)
        draws = loss.draws, acc.draws
        for s in range(5, 15):  # faster than the charts redraw for data alone (3 s here)
            source.push(lines.train(s, 2.0 - s * 0.01))
            await until(
                pilot, partial(lambda n: app.snapshot.global_step == n, s), what=f"step {s}"
            )
            await pilot.pause()  # the frame after the snapshot: its text is there
            assert f"step {s + 1}" in text_of(header)
            assert f"step {s + 1}" in text_of(progress)
        # ten steps within the charts' interval: one drawing at most, pending
        assert loss.draws - draws[0] <= 1 and acc.draws - draws[1] <= 1
        # the pending drawing comes without more data, and shows the last step
        await until(
            pilot,
            lambda: loss.is_current and acc.is_current and max(loss.snapshot.loss_lines[0].x) == 14,
            what="the last step",
        )


async def test_a_key_redraws_a_chart_at_once() -> None:
    _, data = training(300)
    app, _ = app_with(data)
    async with app.run_test(size=(120, 40)) as pilot:
        await settled(app, pilot, 299)
        loss = app.query_one(LossPlot)
        draws = loss.draws
        await pilot.press("l")
        await pilot.pause()
        assert loss.draws == draws + 1 and "log" in str(loss.border_subtitle)
        await pilot.press("left_square_bracket")  # a new window: new lines, drawn at once
        await until(pilot, lambda: app.is_current, what="the window's snapshot")
        await pilot.pause()
        assert loss.is_current and loss.draws == draws + 2


async def test_the_periodic_probe_waits_while_steps_arrive() -> None:
    lines = Lines(t0=T0)
    control = FakeControl()
    source = ReplayTransport([lines.train(0, 2.0)], label="gpu-box:/runs/exp7")
    app = make_app(  # the interval's ticks are called by hand, at chosen times
        source, control=control, clock=lambda: NOW, refresh_interval=0.02, status_interval=5.0
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: control.calls.count("status") == 1, what="the first probe")
        t = time.monotonic()
        asked: list[int] = []
        for s in range(1, 31):  # a step every 2.5 s for 75 s, a probe tick after each
            source.push(lines.train(s, 2.0))
            await until(
                pilot, partial(lambda n: app.pipeline.global_step == n, s), what=f"step {s}"
            )
            app._probe_tick(t + 2.5 * s)
            await pilot.pause()
            asked.append(control.calls.count("status"))
        # the trainer writes steps: it lives; asked again only after STATUS_BUSY_S (60 s)
        assert app_module.STATUS_BUSY_S == 60.0
        assert asked[-1] == 2 and asked.index(2) == 23, asked
        t += 2.5 * 30
        for dt in (5.0, 10.0, 15.0):  # no step for two intervals: every tick asks
            app._probe_tick(t + dt)
            await pilot.pause()
        assert control.calls.count("status") == 4  # not at 5 s, at 10 and 15 s


async def test_new_data_waits_a_tick_and_a_key_does_not() -> None:
    lines = Lines(t0=T0)
    source = ReplayTransport([lines.train(s, 2.0) for s in range(100)], label="run")
    app = make_app(source, clock=lambda: NOW, refresh_interval=60.0)  # ticks by hand
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.pipeline.global_step == 99, what="read")
        await app._tick()
        assert app.snapshot.global_step == 99
        source.push(lines.train(100, 1.5))
        await until(pilot, lambda: app.pipeline.global_step == 100, what="step 100")
        await app._tick()  # the tick right after a picture: new data waits
        assert app.snapshot.global_step == 99
        await pilot.press("left_square_bracket")  # a key: the next tick shows it
        await app._tick()
        assert app.snapshot.global_step == 100 and app.is_current
        source.push(lines.train(101, 1.4))
        await until(pilot, lambda: app.pipeline.global_step == 101, what="step 101")
        app._built_at -= app_module.DATA_TICKS * app.refresh_interval  # two ticks later
        await app._tick()
        assert app.snapshot.global_step == 101


def cells(strips: list[Strip]) -> list[list[tuple[str, RichStyle | None]]]:
    """Each cell's character and style (colours, weight, and the selection offset
    Textual gives the run of text it starts)."""
    return [[(ch, seg.style) for seg in strip for ch in seg.text] for strip in strips]


def plotext_picture(plot: MetricPlot) -> list[Strip]:
    """The chart as textual-plotext draws it: plotext's ANSI text through Rich and
    Textual's own conversion (what the cached frame replaces)."""
    text = PlotextPlot.render(plot)
    width, height = plot.size
    return Visual.to_strips(plot, visualize(plot, text), width, height, plot.visual_style)


async def test_a_chart_frame_is_what_plotext_draws_and_follows_its_data() -> None:
    lines, data = training(300)
    app, source = app_with(data)
    async with app.run_test(size=(120, 40)) as pilot:
        await settled(app, pilot, 299)
        charts: tuple[MetricPlot, ...] = (app.query_one(LossPlot), app.query_one(AcceptancePlot))
        for chart in charts:
            assert cells(chart.frame()) == cells(plotext_picture(chart))
        before = [cells(chart.frame()) for chart in charts]
        draws = [chart.draws for chart in charts]
        for _ in range(3):  # repaints without new data: the same frame, not rebuilt
            for chart in charts:
                chart.refresh()
            await pilot.pause()
        assert [chart.draws for chart in charts] == draws
        assert [cells(chart.frame()) for chart in charts] == before
        _, more = training(100, lines=lines, start=300, worse=1.0)  # the lines jump
        source.push(more)
        await settled(app, pilot, 399)
        assert all(chart.draws > n for chart, n in zip(charts, draws, strict=True))
        for chart, old in zip(charts, before, strict=True):
            shown = cells(chart.frame())
            assert shown != old and shown == cells(plotext_picture(chart))
        await pilot.press("l")  # the log axis: drawn at once, as plotext draws it
        await pilot.pause()
        assert cells(charts[0].frame()) == cells(plotext_picture(charts[0]))


async def test_the_collector_is_tuned_once_after_the_first_picture_in_the_apps_own_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tuned: list[int] = []
    monkeypatch.setattr(app_module, "tune_collector", lambda: tuned.append(1))
    _, data = training(50)
    for owns in (False, True):
        app, _ = app_with(data)
        app.owns_process = owns
        async with app.run_test(size=(120, 40)) as pilot:
            await settled(app, pilot, 49)
            first = len(tuned)
            await pilot.pause(0.5)  # more pictures
            await pilot.pause(0.3)
        assert len(tuned) == first == (1 if owns else 0)


def test_tune_collector_freezes_the_start_and_collects_young_objects_less_often() -> None:
    code = (
        "import gc; from eagle3_tui.app.app import tune_collector;"
        "from eagle3_tui.heap import YOUNG_OBJECTS;"
        "assert gc.get_freeze_count() == 0; tune_collector();"
        "print(gc.get_freeze_count() > 1000, gc.get_threshold()[0] == YOUNG_OBJECTS)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]


async def test_a_new_step_repaints_only_the_lines_it_changed() -> None:
    """A panel repaints the lines whose drawing differs, and no other; what the screen
    then shows is what a repaint of every widget shows."""
    lines, data = training(300)
    app, source = app_with(data, now=[T0 + 151.0])
    async with app.run_test(size=(120, 40)) as pilot:
        await settled(app, pilot, 299)
        asked: dict[str, list[tuple[Region, ...]]] = {}
        kept: dict[str, list[Strip]] = {}
        for widget in app.query(KeptLines):
            name = type(widget).__name__
            asked[name], kept[name] = [], list(widget._kept)

            def spy(*regions: Region, _own: Any = widget.refresh, _to: Any = asked[name]) -> Any:
                _to.append(regions)
                return _own(*regions)

            widget.refresh = spy  # type: ignore[method-assign,assignment]
        source.push(lines.at(T0 + 150.5).train(300, 0.45, acc=(0.7, 0.62, 0.7)))
        await until(pilot, lambda: app.snapshot.global_step == 300, what="step 300")
        await pilot.pause(0.2)
        table = app.query_one(AcceptanceTable)
        pairs = zip(kept["AcceptanceTable"], table._kept, strict=True)
        changed = [y for y, (a, b) in enumerate(pairs) if a != b]
        assert 0 < len(changed) < len(table._kept)  # the column names stay as they were
        width = table.size.width
        assert asked["AcceptanceTable"] == [tuple(Region(0, y, width, 1) for y in changed)]
        assert asked["GpuPanel"] == []  # no new GPU sample: nothing drawn
        shown = app.export_screenshot()
        for widget in app.query(KeptLines):
            del widget.refresh  # the class's again
            widget.refresh()
        await pilot.pause(0.2)
        assert app.export_screenshot() == shown
