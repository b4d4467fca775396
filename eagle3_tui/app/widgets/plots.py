"""The two charts: loss, and acceptance with τ. Each owns its ``self.plt``.

They plot only what the Snapshot holds (already reduced to the plot's width) and
redraw only when what they would draw changed.

Over 600 lines: the two charts share the plotext drawing, axis and point code that
only they use; one base class and its two charts read best side by side.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import plotext._utility as plotext_utility
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Size
from textual.reactive import var
from textual.strip import Strip
from textual.timer import Timer
from textual.visual import Visual, visualize
from textual.widget import Widget
from textual_plotext import PlotextPlot

from eagle3_tui.app.view import ViewState
from eagle3_tui.app.widgets.braille import braille_cells, centres
from eagle3_tui.model.snapshot import EMPTY, Line, Snapshot

RGB = tuple[int, int, int]
RAW: RGB = (110, 110, 130)
SMOOTH: RGB = (95, 215, 255)
VAL: RGB = (255, 175, 0)
TAU: RGB = (255, 255, 255)
TTT: tuple[RGB, ...] = (
    (95, 215, 95),
    (95, 175, 255),
    (215, 135, 255),
    (255, 135, 95),
    (255, 215, 95),
    (95, 255, 215),
)
"""One colour per TTT step k: full accuracy in it, conditional in its dimmer shade."""


def hex_of(rgb: RGB) -> str:
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def dim(rgb: RGB) -> RGB:
    r, g, b = rgb
    return (r * 55 // 100, g * 55 // 100, b * 55 // 100)


def finite_points(line: Line, log: bool) -> tuple[list[float], list[float], int]:
    """The drawable points of ``line`` and how many were left out (≤ 0 on a log axis)."""
    xs: list[float] = []
    ys: list[float] = []
    dropped = 0
    for x, y in zip(line.x, line.y, strict=True):
        if not math.isfinite(y):
            continue
        if log and y <= 0:
            dropped += 1
            continue
        xs.append(x)
        ys.append(y)
    return xs, ys, dropped


def log_points(xs: list[float], ys: list[float]) -> tuple[list[float], list[float]]:
    """``ys`` as base-10 logarithms (all > 0 already, see :func:`finite_points`).

    The log axis is drawn as a linear axis of log10 values with labels of the real
    values: plotext's own ``yscale("log")`` takes the log of its stored data on every
    ``build()``, so a second render of the same figure took the log of a log and
    failed on the negative values (``math domain error``).
    """
    return xs, [math.log10(y) for y in ys]


def log_ticks(lo: float, hi: float, n: int) -> tuple[list[float], list[str]]:
    """Ticks for a log10 axis from ``lo`` to ``hi`` (log10 values): decades when the
    range spans several, else round values; labelled with the real value."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [], []
    if hi - lo >= 2:
        ticks = [float(t) for t in range(math.ceil(lo), math.floor(hi) + 1)]
    else:
        ticks = [math.log10(v) for v in nice_ticks(10**lo, 10**hi, n) if v > 0]
    return ticks, [f"{10**t:.3g}" for t in ticks]


def step_label(x: float) -> str:
    """An axis label for a step count: 950, 12k, 1.5M."""
    if abs(x) >= 1e6:
        return f"{x / 1e6:.3g}M"
    if abs(x) >= 1e4:
        return f"{x / 1e3:.3g}k"
    return f"{x:.0f}"


def step_ticks(lo: float, hi: float, n: int) -> tuple[list[float], list[str]]:
    """Ticks for an axis of speculators' ``global_step`` (0-based) labelled as every view
    shows a step (1-based: "step 100" is the 100th, at ``global_step`` 99), at round
    shown steps."""
    shown = nice_ticks(lo + 1, hi + 1, n)
    return [t - 1 for t in shown], [step_label(t) for t in shown]


def nice_ticks(lo: float, hi: float, n: int) -> list[float]:
    """About ``n`` round values between ``lo`` and ``hi`` (1, 2, 5 times a power of ten)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo or n < 2:
        return [lo] if math.isfinite(lo) else []
    raw = (hi - lo) / (n - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def legend(items: Sequence[tuple[str, RGB]]) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    for i, (label, rgb) in enumerate(items):
        if i:
            text.append(" ")
        text.append("━", style=hex_of(rgb))
        text.append(label)
    return text


NOT_AVAILABLE = "not available without telemetry"
"""What a chart of per-step metrics says for a run observed from outside."""


def without_metrics(snap: Snapshot, lines: tuple[Line, ...]) -> bool:
    """A run without telemetry whose output carries no metric: nothing per step to plot."""
    return snap.observed is not None and not any(line.kind != "val" for line in lines)


Cell = tuple[object, object, object]
"""A plotext cell's colours: (foreground, style, background), as its matrix holds them."""


Signal = tuple[Any, list[float], list[float], RGB, str | None]
"""What a chart plots, kept until its build: the figure (the chart's, or a subplot of
it), the points, their colour, and a marker for points alone (None: a braille line)."""


def data_lim(values: list[float]) -> tuple[float, float]:
    """plotext's ``get_lim`` for finite values, with the builtins' ``min``/``max``
    (its own filters each value through a Python test first): the extremes, or a
    range around a single value (``-1, 1`` around 0 and for no values)."""
    lo, hi = min(values, default=0), max(values, default=0)
    if lo != hi:
        return lo, hi
    return (0.5 * lo, 1.5 * lo) if lo != 0 else (-1, 1)


def limits(values: list[float], given: list[float | None]) -> list[float]:
    """An axis's limits as plotext's build settles them: the ones set, the data's
    extremes (plotext's own rule) for the rest."""
    found = data_lim(values)
    return [float(found[i] if given[i] is None else given[i]) for i in (0, 1)]  # type: ignore[arg-type]


def canvas_of(figure: Any) -> tuple[int, int]:
    """The cells of a built figure's plotting area (columns, rows)."""
    matrix = figure.monitor.matrix
    return len(matrix.Cols_canvas), len(matrix.Rows_canvas)


def cell_style(widget: Widget, cell: Cell) -> Style:
    """The Rich style that a cell of these colours gets on screen: found once per colour
    by sending one character of them through the way plotext's ANSI text would go
    (``Text.from_ansi``, then Textual's own conversion with the widget's style), so the
    cached frame looks exactly as that text would."""
    ansi = plotext_utility.colors_to_ansi(*cell)
    text = Text.from_ansi(f"{ansi}x{plotext_utility.ansi_end}")
    strips = Visual.to_strips(widget, visualize(widget, text), 1, 1, widget.visual_style)
    styles = [seg.style for seg in strips[0]] if strips else []
    found = next((st for st in styles if st is not None), Style.null())
    return found.clear_meta_and_links()  # the probe's offset: each run gets its own


def matrix_strips(
    markers: list[list[str]], colors: list[list[Cell]], style_of: dict[Cell, Style], width: int
) -> list[Strip]:
    """Rows of plotext's matrix (its bottom row first, as plotext keeps them) as Strips,
    top row first: one segment per run of cells of the same colours (as plotext's text
    has one colour code per run), each with the offset of its first cell, as Textual
    marks text for selection."""
    strips: list[Strip] = []
    for y, row in enumerate(range(len(markers) - 1, -1, -1)):
        marks, cells = markers[row][:width], colors[row][:width]
        segments: list[Segment] = []
        start = 0
        for col in range(1, len(cells) + 1):
            if col == len(cells) or cells[col] != cells[start]:
                style = style_of[cells[start]] + Style.from_meta({"offset": (start, y)})
                segments.append(Segment("".join(marks[start:col]), style))
                start = col
        strips.append(Strip(segments))
    return strips


DATA_REDRAW_S = 1.0
"""New data rebuilds a chart at most this often (a plotext build is the costliest thing a
refresh does); a key, a resize or a new window's lines draw at once."""
CHART_SHARE = 0.0005
"""New data alone may cost a chart about this share of a core, counting its build (plotext
and the cells: ``build_s``): a chart whose build takes 3 ms (this machine's at 120×40)
follows new data every 6 s, one of 10 ms every ``DATA_REDRAW_MAX_S``. A drawing costs the
process about 2.5 times its build (Textual re-styles, composites and writes every line of
the chart). Following a live run at 120×40 (``bench_follow.py --pairs 3``, medians): at
0.15 % a chart (a drawing every 2 s) 1.52 % of a core, at this share 1.25 %. The
header, the TTT table, the progress, GPU and data panels show each second's figures all
the same; a key, a resize or a new window's lines draw at once."""
DATA_REDRAW_MAX_S = 8.0
"""New data is drawn within this, however slow the build (TensorBoard reloads every 30 s)."""
TICK_SLACK_S = 0.5
"""A chart due within this draws with the snapshot at hand: its drawing goes out in the
frame that repaints the text panels for the same snapshot, not in a frame of its own
(a screen update costs ~5 ms here, whatever it repaints)."""
LATE_S = 1.5
"""A chart whose data waits is drawn by the next snapshot past its interval (they come
each second while data flows, every ``CLOCK_REFRESH_S`` without it); a timer draws it
only this long after that, when no snapshot came (paused, or the run went quiet)."""


class MetricPlot(PlotextPlot):
    """A chart of lines from the snapshot, redrawn when they (or the view) change."""

    snapshot: var[Snapshot] = var(EMPTY, init=False)
    """The picture of the run being shown (no repaint by itself: :meth:`redraw` decides)."""
    view: var[ViewState] = var(ViewState(), init=False)
    """Window, smoothing, log scale."""

    SHOWS_LOG = False
    """Whether the log scale applies to this chart (its title says so)."""

    def __init__(self, title: str, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.chart_name = title
        """What the chart shows; its title adds the view."""
        self.border_title = title
        self._drawn: object = None
        self.draws = 0
        """How many times the chart was rebuilt (tests check that idle frames are free)."""
        self._frame: tuple[object, list[Strip]] | None = None
        self._styles: dict[Cell, Style] = {}
        """The Rich style of each plotext cell colour seen (see :func:`cell_style`)."""
        self._styles_look: object = None
        """The theme and widget style those styles were found for."""
        self._drawn_view: ViewState | None = None
        """The view of the last drawing: lines for another view are drawn at once."""
        self._drawn_size = Size(0, 0)
        self._drawn_at = -math.inf
        self.build_s = 0.0
        self._redraw_s = 0.0
        """What a drawing of this chart costs (plotext calls, build, its text), smoothed."""
        self._later: Timer | None = None
        """The pending drawing of data that came within ``DATA_REDRAW_S`` of the last."""
        self._signals: list[Signal] = []
        """What :meth:`draw` plotted, handed to plotext at the build (:meth:`_emit`)."""
        self._emitted = False
        """Whether the figure holds the signals already (a second build composes anew)."""
        self._canvas: dict[int, tuple[int, int]] = {}
        """Each figure's plotting area at the last build (by its order in the signals):
        where the next build's braille cells go."""

    def key(self) -> object:
        """What the chart depends on: the same key, the same picture."""
        raise NotImplementedError

    def draw(self) -> None:
        raise NotImplementedError

    def _lines(self) -> tuple[Line, ...]:
        return ()

    def plot_line(self, figure: Any, xs: list[float], ys: list[float], color: RGB) -> None:
        """A braille line through the points on ``figure`` (the chart's or a subplot)."""
        self._signals.append((figure, xs, ys, color, None))

    def plot_points(
        self, figure: Any, xs: list[float], ys: list[float], marker: str, color: RGB
    ) -> None:
        """Points alone, each drawn as ``marker``."""
        self._signals.append((figure, xs, ys, color, marker))

    def on_mount(self) -> None:
        super().on_mount()
        self.border_title = self._title()
        self.redraw()

    def watch_snapshot(self) -> None:
        self.redraw(data=True)

    def watch_view(self) -> None:
        self.border_title = self._title()
        self.redraw()

    def _title(self) -> str:
        """The chart's name and the view it shows (window, smoothing, log): where the eye
        already is when a key changes it."""
        short = 0 < self.size.width < 50
        return f"{self.chart_name} · {self.view.title(log=self.SHOWS_LOG, short=short)}"

    def set_xticks(self, ticks: list[float], labels: list[str]) -> None:
        self.plt.xticks(ticks, labels)

    @property
    def is_current(self) -> bool:
        """Whether the figure shows the snapshot and view handed down, at this size."""
        return self._drawn == (self.key(), self.size)

    def on_resize(self) -> None:
        self.border_title = self._title()
        self.redraw()

    def _draw_later(self) -> None:
        self._later = None
        self.redraw()

    def frame(self) -> list[Strip]:
        """The figure as the screen's lines, built once per drawing: a repaint of an
        unchanged chart (another panel changed, the screen was exposed) reuses them."""
        key = (self.draws, self.size, self.app.theme, self.visual_style)
        if self._frame is None or self._frame[0] != key:
            t0 = time.perf_counter()
            self._frame = (key, self._build_frame(key[2:]))
            took = self._redraw_s + time.perf_counter() - t0
            self.build_s = took if not self.build_s else 0.7 * self.build_s + 0.3 * took
        return self._frame[1]

    def _build_frame(self, look: object) -> list[Strip]:
        """What ``PlotextPlot.render`` shows, without its detour through text: plotext
        builds its matrix of characters and colours, which becomes Strips directly
        (plotext's ANSI text of it and Rich's parse of that text cost about a quarter of
        a drawing). Each colour's style is found once (:func:`cell_style`)."""
        width, height = self.size
        plot = self.plt
        for attempt in range(3):
            if self._emitted:  # the figure holds an earlier build's data: compose anew
                self._compose_figure()
            plot.plotsize(width, height)
            plot._set_size(width, height)  # as PlotextPlot.render does (textual-plotext #5)
            plot.theme(self._get_plotext_theme_name(self.app.theme))
            used = self._emit(cells=attempt < 2)
            self._emitted = True
            figure: Any = plot  # plotext's figure: its build(), less its ANSI text
            figure._set_sizes()
            figure._build_matrix()
            built = {i: canvas_of(f) for i, f in enumerate(self._figures())}
            stale = any(used.get(i, area) != area for i, area in built.items())
            self._canvas = built
            if not stale:
                break
        matrix = figure.monitor.matrix
        colors = [
            [(fg, st, bg) for fg, st, bg in zip(*rows, strict=True)]
            for rows in zip(matrix.fullground, matrix.style, matrix.background, strict=True)
        ]
        if self._styles_look != look:  # a theme or the widget's own style changed
            self._styles_look, self._styles = look, {}
        styles = self._styles
        for row in colors:
            for cell in row:
                if cell not in styles:
                    styles[cell] = cell_style(self, cell)
        return matrix_strips(matrix.marker, colors, styles, width)[:height]

    def _figures(self) -> list[Any]:
        """The figures the signals go to, in the order they first appear."""
        out: list[Any] = []
        for figure, *_ in self._signals:
            if not any(figure is f for f in out):
                out.append(figure)
        return out

    def _emit(self, cells: bool = True) -> dict[int, tuple[int, int]]:
        """Hands the signals to plotext, in order: a line as its braille cells (one
        point a cell, its character the marker: :mod:`braille`) on the plotting area
        the last build had, with the axis limits plotext would settle (set, so that
        the cells' centres cannot move them); as plotext's own line where that area
        is not known yet (the first build) or too small, or ``cells`` is False. Returns
        the area each figure's cells were placed for: the build checks it."""
        used: dict[int, tuple[int, int]] = {}
        for i, figure in enumerate(self._figures()):
            mine = [sig for sig in self._signals if sig[0] is figure]
            xlim = limits([x for sig in mine for x in sig[1]], figure.monitor.xlim[0])
            ylim = limits([y for sig in mine for y in sig[2]], figure.monitor.ylim[0])
            area = self._canvas.get(i) if cells else None
            # (a constant below 0 gets reversed limits from plotext, which setting
            # them would sort: its own line there)
            if area is None or min(area) < 2 or xlim[0] >= xlim[1] or ylim[0] >= ylim[1]:
                area = None
            else:
                figure.xlim(*xlim)
                figure.ylim(*ylim)
                used[i] = area
            visible = self._visible_cells(mine, xlim, ylim, area) if area is not None else {}
            for k, (_, xs, ys, color, marker) in enumerate(mine):
                if marker is not None:
                    figure.scatter(xs, ys, marker=marker, color=color)
                elif area is None:
                    figure.plot(xs, ys, marker="braille", color=color)
                else:
                    cx, cy, chars = visible[k]
                    if cx:
                        vx, vy = centres(cx, xlim, area[0]), centres(cy, ylim, area[1])
                        figure.scatter(vx, vy, marker=chars, color=color)
                    elif not any(visible[j][0] for j in range(k + 1, len(mine)) if j in visible):
                        # all off the plotting area: plotext's line, which draws nothing
                        # but is data (a figure without data has no ticks)
                        figure.plot(xs, ys, marker="braille", color=color)
        return used

    @staticmethod
    def _visible_cells(
        signals: list[Signal], xlim: list[float], ylim: list[float], area: tuple[int, int]
    ) -> dict[int, tuple[list[int], list[int], list[str]]]:
        """Each braille line's cells (by its place in ``signals``), less those a later
        line draws over: plotext writes each point's cell whole (character, colour,
        style), so the last line in a cell is all that shows of it, and each point
        handed to plotext costs its build ~15 µs."""
        out: dict[int, tuple[list[int], list[int], list[str]]] = {}
        covered: set[tuple[int, int]] = set()
        for k in range(len(signals) - 1, -1, -1):
            _, xs, ys, _, marker = signals[k]
            if marker is not None:
                continue
            cx, cy, chars = braille_cells(xs, ys, xlim, ylim, *area)
            keep = [i for i, cell in enumerate(zip(cx, cy, strict=True)) if cell not in covered]
            if len(keep) < len(cx):
                cx, cy = [cx[i] for i in keep], [cy[i] for i in keep]
                chars = [chars[i] for i in keep]
            covered.update(zip(cx, cy, strict=True))
            out[k] = (cx, cy, chars)
        return out

    def _compose_figure(self) -> None:
        """The figure's settings from the snapshot and the view (plotext's state is
        rebuilt from nothing), and the signals to plot (:meth:`draw`)."""
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.frame(False)
        plt.yfrequency(3 if self.size.height < 12 else 5)
        self._signals = []
        self._emitted = False
        self.draw()
        xs = [x for line in self._lines() for x in (line.x[:1] + line.x[-1:])]
        if xs:
            self.set_xticks(*step_ticks(min(xs), max(xs), 3 if self.size.width < 50 else 5))

    def render_line(self, y: int) -> Strip:
        frame = self.frame()
        if y < len(frame):
            return frame[y]
        return Strip.blank(self.size.width, self.visual_style.rich_style)

    def render(self) -> Text:
        """The frame as Rich text: what the screen shows (for a test, or a copy)."""
        rows = [
            Text.assemble(*((seg.text, seg.style or "") for seg in strip)) for strip in self.frame()
        ]
        return Text("\n").join(rows)

    def data_wait(self) -> float:
        """Seconds until new data alone may be drawn (its interval since the last
        drawing); new data is drawn at once when this is within ``TICK_SLACK_S``."""
        return self._drawn_at + self.data_interval() - time.monotonic()

    def data_due(self) -> bool:
        """Whether new data would be drawn now: the app builds the lines of a snapshot
        only then."""
        return self.data_wait() <= TICK_SLACK_S

    def data_interval(self) -> float:
        """How long new data waits after a drawing: the build's cost over ``CHART_SHARE``."""
        return min(DATA_REDRAW_MAX_S, max(DATA_REDRAW_S, self.build_s / CHART_SHARE))

    def redraw(self, force: bool = False, data: bool = False) -> None:
        """Rebuild the figure if what it shows changed. ``data``: only new data came
        (the same view and size), drawn at most every ``DATA_REDRAW_S``; the rest at once."""
        key = (self.key(), self.size)  # tick density follows the size
        if key == self._drawn and not force:
            return
        same = self._drawn_view == self.view and self._drawn_size == self.size
        wait = self.data_wait()
        if data and not force and same and wait > TICK_SLACK_S:
            if self._later is None:  # the snapshot past ``wait`` draws it; this, if none comes
                self._later = self.set_timer(wait + LATE_S, self._draw_later, name="plot-later")
            return
        if self._later is not None:
            self._later.stop()
            self._later = None
        self._drawn = key
        self._drawn_view = self.view
        self._drawn_size = self.size
        t0 = self._drawn_at = time.monotonic()
        self._compose_figure()
        self.draws += 1
        self._redraw_s = time.monotonic() - t0  # its render adds the build
        self.refresh()


class LossPlot(MetricPlot):
    """Per-step train loss, raw and smoothed, and the validation loss per epoch."""

    SHOWS_LOG = True

    def key(self) -> object:
        snap = self.snapshot
        missing = without_metrics(snap, snap.loss_lines)
        return (snap.loss_lines, snap.ttt_loss_lines, self.view.log_scale, missing)

    def _lines(self) -> tuple[Line, ...]:
        return self.snapshot.loss_lines

    def draw(self) -> None:
        plt = self.plt
        log = self.view.log_scale
        dropped = 0
        items: list[tuple[str, RGB]] = []
        lines = self.snapshot.loss_lines
        smoothed = any(line.kind == "smoothed" for line in lines)
        span: list[float] = []

        def points(line: Line) -> tuple[list[float], list[float]]:
            nonlocal dropped
            xs, ys, n = finite_points(line, log)
            dropped += n
            if log:
                xs, ys = log_points(xs, ys)
            if ys:
                span.extend((min(ys), max(ys)))
            return xs, ys

        for k, line in enumerate(self.snapshot.ttt_loss_lines):  # under the loss, dim
            xs, ys = points(line)
            if xs:
                self.plot_line(plt, xs, ys, dim(TTT[k % len(TTT)]))
        if self.snapshot.ttt_loss_lines:
            items.append(("loss_k", dim(TTT[0])))
        for line in lines:
            xs, ys = points(line)
            if not xs:
                continue
            if line.kind == "val":
                self.plot_points(plt, xs, ys, "◆", VAL)
                items.append(("val", VAL))
            elif line.kind == "smoothed":
                self.plot_line(plt, xs, ys, SMOOTH)
                items.append(("smoothed", SMOOTH))
            else:
                color = RAW if smoothed else SMOOTH
                self.plot_line(plt, xs, ys, color)
                items.append(("raw", color))
        if log and span:
            ticks, labels = log_ticks(min(span), max(span), 3 if self.size.height < 12 else 5)
            if ticks:
                plt.yticks(ticks, labels)
        subtitle = legend(items)
        if log:
            subtitle.append(" · log", style="bold")
            if dropped:
                subtitle.append(f" ({dropped} pts ≤0 hidden)", style="bold #ffaf00")
        if without_metrics(self.snapshot, lines):
            plt.title(f"per-step loss: {NOT_AVAILABLE}")
        self.border_subtitle = subtitle


TAU_MIN_HEIGHT = 10
"""Below this many rows the acceptance chart has no room for τ's own strip (τ stays in
the TTT table)."""


def acc_top(lines: Sequence[Line]) -> float:
    """The top of the accuracy axis: a round value above the highest accuracy shown, so
    that low early accuracies use the height instead of its bottom quarter."""
    hi = max((y for line in lines for y in line.y if math.isfinite(y)), default=1.0)
    for top in (0.1, 0.2, 0.4, 0.6, 0.8):
        if hi <= top * 0.95:
            return top
    return 1.0


class AcceptancePlot(MetricPlot):
    """Full (bright) and conditional (dim) accuracy per TTT step k, on an axis that fits
    them; τ in its own strip underneath, with its own axis (on a shared right axis its
    range squeezed the accuracies)."""

    def __init__(self, title: str, **kwargs: object) -> None:
        super().__init__(title, **kwargs)
        self._tau_rows = 0
        """Rows of τ's strip in the figure being drawn (0: no strip)."""

    def key(self) -> object:
        snap = self.snapshot
        return (snap.acc_lines, snap.tau_line, without_metrics(snap, snap.acc_lines))

    def _lines(self) -> tuple[Line, ...]:
        return self.snapshot.acc_lines

    def set_xticks(self, ticks: list[float], labels: list[str]) -> None:
        plt = self.plt
        if self._tau_rows:
            plt.subplot(1, 1).xticks([], [])
            plt.subplot(2, 1).xticks(ticks, labels)
        else:
            plt.xticks(ticks, labels)

    def draw(self) -> None:
        plt = self.plt
        tau = self.snapshot.tau_line
        tau_pts = finite_points(tau, False)[:2] if tau is not None else ([], [])
        height = self.size.height
        self._tau_rows = max(5, height * 2 // 5) if tau_pts[0] and height >= TAU_MIN_HEIGHT else 0
        if self._tau_rows:
            plt.subplots(2, 1)
        acc = plt.subplot(1, 1) if self._tau_rows else plt
        if self._tau_rows:
            acc.plotsize(None, height - self._tau_rows)
            acc.frame(False)
        items: list[tuple[str, RGB]] = []
        # conditional (dim) first: where it equals the full accuracy (k = 0), full shows
        lines = sorted(self.snapshot.acc_lines, key=lambda line: line.label.startswith("full"))
        fulls = {(line.x, line.y) for line in lines if line.label.startswith("full")}
        for line in lines:
            name, _, k_text = line.label.rpartition("_")
            k = int(k_text) if k_text.isdigit() else 0
            base = TTT[k % len(TTT)]
            full = name.startswith("full")
            if not full and (line.x, line.y) in fulls:
                continue  # k = 0: the very points of a full accuracy, drawn over these
            xs, ys, _ = finite_points(line, False)
            if xs:
                self.plot_line(acc, xs, ys, base if full else dim(base))
                if full:
                    items.append((f"k={k}", base))
        top = acc_top(self.snapshot.acc_lines)
        acc.ylim(0.0, top)
        ticks = [0.0, top / 2, top]
        acc.yticks(ticks, [f"{t:.2f}" for t in ticks])
        sub = Text(no_wrap=True, overflow="ellipsis")
        if items:
            sub.append("full acc ", style="dim")
            sub.append_text(legend(items))
            sub.append(" (dim: cond)", style="dim")
        if self._tau_rows:
            self._draw_tau(*tau_pts)
            sub.append(" ")
            sub.append_text(legend([("τ", TAU)]))
        if without_metrics(self.snapshot, self.snapshot.acc_lines):
            plt.title(f"acceptance per step: {NOT_AVAILABLE}")
        self.border_subtitle = sub

    def _draw_tau(self, xs: list[float], ys: list[float]) -> None:
        strip = self.plt.subplot(2, 1)
        strip.plotsize(None, self._tau_rows)
        strip.frame(False)
        self.plot_line(strip, xs, ys, TAU)
        lo, hi = min(ys), max(ys)
        pad = max((hi - lo) * 0.1, 0.01)
        strip.ylim(lo - pad, hi + pad)
        strip.yticks([lo, hi], [f"{lo:.2f}", f"{hi:.2f}"])
