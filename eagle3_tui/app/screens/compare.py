"""``c``: this run against a previous one, at the same point (model: ``model/compare.py``).

The app builds the :class:`Comparison` (off the UI thread, from both runs' models)
and hands it down; this screen only draws it: overlaid loss, acceptance and τ
lines per run, the table of values at the furthest common point with deltas, the
verdict, both runs' validation per epoch and the recipe differences.
"""

from __future__ import annotations

import math
from typing import ClassVar

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Static
from textual_plotext import PlotextPlot

from eagle3_tui.app.text import inert, num
from eagle3_tui.app.widgets.plots import (
    TTT,
    dim,
    finite_points,
    hex_of,
    nice_ticks,
    step_label,
    step_ticks,
)
from eagle3_tui.model.compare import AXES, DELTA_DIGITS, Comparison, fmt_x
from eagle3_tui.model.derived import step_number
from eagle3_tui.model.snapshot import Line

A_COLOR = (95, 215, 255)
B_COLOR = (255, 175, 95)


class ComparePlot(PlotextPlot):
    """Lines of both runs: this run bright, the previous one dim."""

    comparison: reactive[Comparison | None] = reactive(None, layout=False)
    """What to draw (None: still loading)."""

    def __init__(self, title: str, which: str, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.border_title = title
        self.which = which

    def _lines(self, c: Comparison) -> tuple[Line, ...]:
        return c.loss_lines if self.which == "loss" else c.acc_lines + c.tau_lines

    def watch_comparison(self, c: Comparison | None) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.frame(False)
        plt.yfrequency(4)
        if c is None:
            self.refresh()
            return
        xs_all: list[float] = []
        for line in self._lines(c):
            this = line.label.endswith(f"· {c.a.label}")
            if line.label.startswith("full_acc_"):
                k = int(line.label.split("_")[2].split(" ")[0])
                color = TTT[k % len(TTT)]
            elif line.label.startswith("τ"):
                color = (255, 255, 255)
            else:
                color = A_COLOR if this else B_COLOR
            if not this:
                color = dim(color)
            xs, ys, _ = finite_points(line, False)
            if xs:
                xs_all += [xs[0], xs[-1]]
                side = "right" if line.label.startswith("τ") else "left"
                plt.plot(xs, ys, marker="braille", color=color, yside=side)
        if xs_all:
            lo, hi = min(xs_all), max(xs_all)
            if c.axis == "step":
                plt.xticks(*step_ticks(lo, hi, 4))
            else:
                ticks = nice_ticks(lo, hi, 4)
                plt.xticks(ticks, [step_label(t) for t in ticks])
        if c.at is not None:
            plt.vline(c.at, color=(255, 255, 0))
        self.refresh()


def rows_table(c: Comparison, width: int = 80) -> Table:
    """Both runs' values at the same point and the deltas; ``width`` < 50: compact
    headers and bare ▲/▼ marks, so the numbers keep their digits."""
    narrow = width < 50
    table = Table(box=None, padding=(0, 1), expand=True, show_edge=False)
    table.add_column("metric", style="bold", no_wrap=True, overflow="ellipsis")
    table.add_column("this", justify="right", no_wrap=True, min_width=6)
    table.add_column("prev" if narrow else "previous", justify="right", no_wrap=True, min_width=6)
    table.add_column("Δ", justify="right", no_wrap=True, min_width=7)
    table.add_column("", no_wrap=True, min_width=1 if narrow else 6)
    for r in c.rows:
        better = r.better
        mark = Text("")
        if better == "a":
            mark = Text("▲" if narrow else "▲ this", style="green")
        elif better == "b":
            mark = Text("▼" if narrow else "▼ prev", style="red")
        delta = (
            "–" if r.delta is None or not math.isfinite(r.delta) else f"{r.delta:+.{DELTA_DIGITS}f}"
        )
        table.add_row(inert(r.metric), num(r.a), num(r.b), delta, mark)
    return table


def side_text(c: Comparison) -> RenderableType:
    parts: list[RenderableType] = []
    for side, rows, color in ((c.a, c.val_a, A_COLOR), (c.b, c.val_b, B_COLOR)):
        head = Text(no_wrap=True, overflow="ellipsis")
        head.append("━ ", style=hex_of(color))
        head.append_text(inert(side.label, style="bold"))
        shown = step_number(side.last_step)
        end = f" step {shown:,}" if shown is not None else " no step"
        ttt = f"{side.ttt_steps} TTT steps" if side.ttt_steps else "TTT steps not known"
        head.append(f"{end} · τ {num(side.tau_end, 3)} · {ttt}", style="dim")
        parts.append(head)
        for v in rows[-4:]:
            parts.append(
                Text(
                    f"  val e{v.epoch + 1}: loss {num(v.values.get('loss_epoch'))}"
                    f"  acc0 {num(v.values.get('full_acc_0_epoch'), 3)}",
                    no_wrap=True,
                )
            )
    if c.hparam_diff:
        parts.append(Text("what differs (this | previous):", style="bold"))
        for key, va, vb in c.hparam_diff:  # all of it, as the CLI: the panel scrolls
            t = Text("  ", no_wrap=True, overflow="ellipsis")
            t.append_text(inert(key, style="bold"))
            t.append(": ")
            t.append_text(inert(va))
            t.append(" | ", style="dim")
            t.append_text(inert(vb))
            parts.append(t)
    return Group(*parts)


class CompareScreen(Screen[None]):
    """The comparison of two runs, kept up to date by the app."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,c", "app.pop_screen", "Back"),
        Binding("a", "axis", "Axis"),
        Binding("o", "app.pick_compared", "Other"),  # another run to compare with
        Binding("q", "app.quit", "Quit"),
    ]

    comparison: reactive[Comparison | None] = reactive(None)
    """The latest comparison built by the app."""
    axis: reactive[str] = reactive("step")
    """step, tokens or time: what the runs are aligned on."""

    def __init__(self, label_b: str) -> None:
        super().__init__()
        self.label_b = label_b
        self._told: str | None = None
        """The axis asked for whose fallback to steps was said (once per ``a``)."""

    def compose(self) -> ComposeResult:
        yield Static(Text("Reading the previous run…", style="dim"), id="verdict")
        with Horizontal(id="cmp-plots"):
            yield ComparePlot("loss", "loss", id="cmp-loss").data_bind(CompareScreen.comparison)
            yield ComparePlot("acceptance · τ →", "acc", id="cmp-acc").data_bind(
                CompareScreen.comparison
            )
        # both halves scroll inside the screen's lower half: a long recipe diff stays
        # on the screen (wheel, or Tab then ↑↓) instead of running off its bottom
        rows, sides = VerticalScroll(id="cmp-rows"), VerticalScroll(id="cmp-sides")
        rows.border_title, sides.border_title = "at the same point", "runs"
        with Horizontal(id="cmp-text"):
            with rows:
                yield Static(id="cmp-rows-text")
            with sides:
                yield Static(id="cmp-sides-text")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.watch_comparison(self.comparison)  # one handed down before the screen mounted

    def watch_comparison(self, c: Comparison | None) -> None:
        if c is None or not self.query("#cmp-sides-text"):  # not composed yet: on_mount draws
            return
        verdict = Text(no_wrap=False)
        verdict.append(" COMPARE ", style="bold reverse")
        verdict.append(" ")
        verdict.append_text(inert(c.verdict))
        self.query_one("#verdict", Static).update(verdict)
        rows_box = self.query_one("#cmp-rows")
        rows_box.border_subtitle = f"aligned by {c.axis_label} (a: axis)"
        # each value is its run's mean over the window (the runs panel says the last)
        rows_box.border_title = (
            f"mean over {fmt_x(c.axis, c.window[0])} – {fmt_x(c.axis, c.window[1])}"
            if c.window is not None
            else "at the same point"
        )
        if c.axis_note and c.axis != self.axis and self._told != self.axis:
            self._told = self.axis  # asked for tokens, aligned by step: say why
            self.notify(c.axis_note, title="axis", severity="warning")
        width = self.query_one("#cmp-rows").size.width or self.app.size.width // 2
        stepless = c.a.last_step is None or c.b.last_step is None  # (it will never have one)
        none = "a run logged no step: nothing to compare" if stepless else "no common range yet"
        rows = rows_table(c, width) if c.rows else Text(none, style="dim")
        self.query_one("#cmp-rows-text", Static).update(rows)
        self.query_one("#cmp-sides-text", Static).update(side_text(c))

    def action_axis(self) -> None:
        self.axis = AXES[(AXES.index(self.axis) + 1) % len(AXES)]
        self._told = None
