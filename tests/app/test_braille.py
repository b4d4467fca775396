"""The charts' braille lines computed with numpy give plotext's own picture, cell for cell.

A chart hands plotext each line as its braille cells (``widgets/braille.py``); these
tests draw the same lines both ways, with plotext's own ``plot`` and as the chart
does, and compare every cell of the two matrices (character, colours) — over random
lines, sizes and axis limits, and through the real charts of a run.
"""

from __future__ import annotations

from typing import Any

import plotext._utility as ut
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from textual_plotext.plot import Plot

from eagle3_tui.app.widgets import plots
from eagle3_tui.app.widgets.braille import braille_cells, centres, dots
from eagle3_tui.app.widgets.plots import AcceptancePlot, LossPlot, MetricPlot, canvas_of, data_lim
from tests.app.conftest import training
from tests.app.test_pilot import app_with
from tests.app.test_refresh_cost import settled

Picture = tuple[list[list[str]], list[list[tuple[Any, Any, Any]]]]


def picture(fig: Any, width: int, height: int) -> Picture:
    fig.plotsize(width, height)
    fig._set_size(width, height)
    fig._set_sizes()
    fig._build_matrix()
    m = fig.monitor.matrix
    colours = [
        list(zip(*rows, strict=True))
        for rows in zip(m.fullground, m.style, m.background, strict=True)
    ]
    return [list(row) for row in m.marker], colours


def lines_strategy() -> st.SearchStrategy[list[tuple[list[float], list[float]]]]:
    def line(draw: Any) -> tuple[list[float], list[float]]:
        n = draw(st.integers(1, 150))
        scale = 10.0 ** draw(st.integers(-4, 4))
        if draw(st.booleans()):
            xs = [float(i) for i in range(n)]
        else:
            x = st.floats(-1e5, 1e5).map(lambda v: round(v, 6))  # (steps: no 1e-313)
            xs = sorted(draw(st.lists(x, min_size=n, max_size=n)))
        # 12 decimals: plotext's own tick labels (the reference picture) overflow on a
        # range of ~1e-308 (hypothesis found 0 and 2.2e-308, the smallest normal float;
        # and an x of 2.2e-313 alone)
        y = st.floats(-3, 3, allow_subnormal=False).map(lambda v: round(v, 12))
        ys = draw(st.lists(y, min_size=n, max_size=n))
        return xs, [y * scale for y in ys]

    return st.lists(st.composite(line)(), min_size=1, max_size=4)


@settings(max_examples=150, deadline=None)
@given(
    lines=lines_strategy(),
    width=st.integers(4, 120),
    height=st.integers(3, 40),
    cut=st.one_of(st.none(), st.tuples(st.floats(-0.3, 0.3), st.floats(-0.3, 0.3))),
)
def test_cells_draw_what_plotexts_line_draws(
    lines: list[tuple[list[float], list[float]]],
    width: int,
    height: int,
    cut: tuple[float, float] | None,
) -> None:
    colours = [(250, 10, 10), (10, 250, 10), (10, 10, 250), (200, 200, 10)]
    ys_all = [y for _, ys in lines for y in ys]
    lo, hi = min(ys_all), max(ys_all)
    ylim = None if cut is None or hi <= lo else (lo + (hi - lo) * cut[0], hi + (hi - lo) * cut[1])

    plain = Plot()
    plain.frame(False)
    for (xs, ys), colour in zip(lines, colours, strict=False):
        plain.plot(xs, ys, marker="braille", color=colour)
    if ylim is not None:
        plain.ylim(*ylim)
    want = picture(plain, width, height)
    cols, rows = canvas_of(plain)

    xlim = list(data_lim([x for xs, _ in lines for x in xs]))
    yl = list(ylim) if ylim is not None else list(data_lim(ys_all))
    cells = Plot()
    cells.frame(False)
    drawable = cols >= 2 and rows >= 2 and xlim[0] < xlim[1] and yl[0] < yl[1]
    if drawable:
        cells.xlim(*xlim)
        cells.ylim(*yl)
    elif ylim is not None:  # plotext's own line, on the same limits as the plain figure
        cells.ylim(*ylim)
    for (xs, ys), colour in zip(lines, colours, strict=False):
        cx, cy, chars = braille_cells(xs, ys, xlim, yl, cols, rows) if drawable else ([], [], [])
        if cx:
            marker: Any = chars  # one a point
            cells.scatter(
                centres(cx, xlim, cols), centres(cy, yl, rows), marker=marker, color=colour
            )
        else:
            cells.plot(xs, ys, marker="braille", color=colour)
    assert picture(cells, width, height) == want


@given(st.lists(st.floats(-1e6, 1e6), max_size=20))
def test_data_lim_is_plotexts_get_lim(values: list[float]) -> None:
    assert list(data_lim(values)) == ut.get_lim(values)


@settings(max_examples=300)
@example(values=[891695.6953125], lo=666084.3753311988, span=1e-06, bins=1000)  # far off
@given(
    values=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=30),
    lo=st.floats(-1e6, 1e6),
    span=st.floats(1e-6, 1e6),
    bins=st.integers(2, 1000),
)
def test_dots_are_plotexts_matrix_data(
    values: list[float], lo: float, span: float, bins: int
) -> None:
    lim = [lo, lo + span]
    if not lim[1] > lim[0]:
        return
    assert dots(values, lim, bins).tolist() == ut.get_matrix_data(values, lim, bins)
    # values on the edges between cells: where plotext's rounding decides
    edges = [lim[0] + (k + 0.5) * (lim[1] - lim[0]) / (bins - 1) for k in range(min(bins, 50))]
    assert dots(edges, lim, bins).tolist() == ut.get_matrix_data(edges, lim, bins)


def plain_frame(plot: MetricPlot) -> list[list[tuple[str, object]]]:
    """The chart's frame drawn with plotext's own lines (no cells)."""
    saved = plot._canvas
    plot._canvas = {}
    plot._emitted = True  # compose anew
    plot._frame = None
    try:
        return cells_of(plot)
    finally:
        plot._canvas = saved
        plot._frame = None


def cells_of(plot: MetricPlot) -> list[list[tuple[str, object]]]:
    return [[(ch, seg.style) for seg in strip for ch in seg.text] for strip in plot.frame()]


async def test_the_charts_of_a_run_are_plotexts_pictures(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = [0]
    real = braille_cells

    def counted(*args: Any) -> tuple[list[int], list[int], list[str]]:
        calls[0] += 1
        return real(*args)

    monkeypatch.setattr(plots, "braille_cells", counted)
    _, data = training(600)
    app, _ = app_with(data)
    async with app.run_test(size=(120, 40)) as pilot:
        await settled(app, pilot, 599)
        for key in ("", "l", "s", "left_square_bracket"):  # and the log scale, raw, a window
            if key:
                await pilot.press(key)
                await settled(app, pilot, 599)
            for cls in (LossPlot, AcceptancePlot):
                plot = app.query_one(cls)
                plot.redraw(force=True)
                plot._frame = None
                before = calls[0]
                drawn = cells_of(plot)
                assert calls[0] > before, f"{cls.__name__} drawn from cells"
                assert drawn == plain_frame(plot), f"{cls.__name__} after {key!r}"
                assert any("\u2800" < ch <= "\u28ff" for row in drawn for ch, _ in row)
