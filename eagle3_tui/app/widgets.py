"""The panels. Each reads a Snapshot handed down by the app and draws it.

Widgets never touch the transport or the run state, and never query siblings.
"""

from __future__ import annotations

import math

from rich.table import Table
from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static
from textual_plotext import PlotextPlot

from eagle3_tui.model.health import Health
from eagle3_tui.model.snapshot import EMPTY, Line, Snapshot
from eagle3_tui.transport.base import Link, LinkChanged


def fmt(x: float | None, digits: int = 4) -> str:
    """A metric value for a cell: fixed width-friendly, non-finite spelled out."""
    if x is None:
        return "–"
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+inf" if x > 0 else "-inf"
    if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e5):
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}f}"


HEALTH_STYLE = {
    Health.WAITING: "dim",
    Health.RUNNING: "bold green",
    Health.FINISHED: "bold cyan",
    Health.SILENT: "bold white on red",
    Health.STALLED: "bold white on dark_orange3",
    Health.DEAD: "bold white on red",
    Health.DIVERGED: "bold white on magenta",
}


class StatusLine(Static):
    """Run, link state, health, step and epoch in one line."""

    snapshot: reactive[Snapshot] = reactive(EMPTY, layout=False)
    """The latest picture of the run."""
    link: reactive[LinkChanged] = reactive(LinkChanged(Link.CONNECTING))
    """Where the data comes from, and whether it flows."""

    def __init__(self, target: str, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.target = target

    def render(self) -> Text:
        snap = self.snapshot
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(" eagle3-tui ", style="bold reverse")
        text.append(f" {self.target} ", style="bold")
        text.append(f"[{self.link.link.value}] ", style="cyan")
        health = snap.health
        text.append(f" {health.value.upper()} ", style=HEALTH_STYLE[health])
        text.append(f"  step {snap.global_step if snap.global_step is not None else '–'}")
        text.append(f"  epoch {snap.epoch if snap.epoch is not None else '–'}")
        return text


class MetricsTable(Static):
    """Latest loss and per-TTT-step full/conditional acceptance, and tau."""

    snapshot: reactive[Snapshot] = reactive(EMPTY, layout=True)
    """The latest picture of the run."""

    def render(self) -> Table:
        snap = self.snapshot
        table = Table(expand=True, box=None, padding=(0, 1))
        table.add_column("metric", style="bold")
        table.add_column("value", justify="right")
        table.add_row("loss", fmt(snap.latest.get("train/loss")))
        for k in range(snap.ttt_steps):
            table.add_row(f"full_acc_{k}", fmt(snap.latest.get(f"train/full_acc_{k}")))
            table.add_row(f"cond_acc_{k}", fmt(snap.latest.get(f"train/cond_acc_{k}")))
        table.add_row("τ (tokens/cycle)", fmt(snap.tau, 3))
        return table


class SeriesPlot(PlotextPlot):
    """A plotext chart of some of the snapshot's lines (loss or acceptance)."""

    snapshot: reactive[Snapshot] = reactive(EMPTY, layout=False)
    """The latest picture of the run."""

    def __init__(self, title: str, which: str, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.title = title
        self.which = which

    def lines(self) -> tuple[Line, ...]:
        return self.snapshot.loss_lines if self.which == "loss" else self.snapshot.acc_lines

    def watch_snapshot(self, snap: Snapshot) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(self.title)
        for line in self.lines():
            pts = [(x, y) for x, y in zip(line.x, line.y, strict=True) if math.isfinite(y)]
            if pts:
                xs, ys = zip(*pts, strict=True)
                plt.plot(list(xs), list(ys), label=line.label, marker="braille")
        self.refresh()
