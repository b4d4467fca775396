"""The text panels: acceptance per TTT step and τ, progress and checkpoints, GPUs, data.

Over 600 lines: one small class per panel sharing the ``Panel`` base (what to repaint,
kept lines); splitting them file by file would only spread one pattern.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace

from rich.console import Console, Group, OverflowMethod, RenderableType
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import DEFAULT_OVERFLOW, Text
from textual._context import active_app
from textual.css.styles import RulesMap
from textual.geometry import Region, Size
from textual.reactive import var
from textual.strip import Strip
from textual.style import Style as VisualStyle
from textual.visual import RenderOptions, Visual, visualize
from textual.widgets import Static

from eagle3_tui.app.text import bar, clock_time, duration, inert, num, rate, size, sparkline
from eagle3_tui.model.anomalies import Anomaly, Gap, NonFinite, Resume, Spike
from eagle3_tui.model.derived import tau_of
from eagle3_tui.model.events import CkptEvent
from eagle3_tui.model.observed import Member
from eagle3_tui.model.snapshot import EMPTY, GpuView, IoView, Snapshot

STARVED = 0.3
"""A step that waits this share of its time for data is starved (shown in colour)."""


def one_line(text: str, style: str = "") -> Text:
    """A line of the panel's own words, cut with an ellipsis where the panel is narrow
    (as every line of a panel is: a panel counts one screen line per line)."""
    return Text(text, style=style, no_wrap=True, overflow="ellipsis")


class TextLines(Visual):
    """Lines of text, each one line on screen (``no_wrap``, cut to the width as its
    ``overflow`` says): what a Rich ``Group`` of such ``Text`` shows, drawn without
    Rich's layout pass. Textual draws a Group through ``RichVisual``: a console render
    (wrap, justify, join) then a split of the segments back into lines, about 0.5 ms a
    panel; each line here is cut and rendered alone, and styled as ``RichVisual``
    styles it (the widget's style under each segment's). :func:`lines_of` decides
    which Groups qualify; ``tests/app/test_panels_fast.py`` checks the pictures are
    the same, cell for cell."""

    def __init__(self, lines: list[Text]) -> None:
        self.lines = lines

    def __rich__(self) -> Group:
        """The lines as the Group they stand for (a Rich console prints that)."""
        return Group(*self.lines)

    def render_strips(
        self, width: int, height: int | None, style: VisualStyle, options: RenderOptions
    ) -> list[Strip]:
        app = active_app.get()
        console = app.console
        default = app.console_options.overflow or DEFAULT_OVERFLOW
        base = style.rich_style
        strips = []
        drawn = _LINE_STRIPS
        for line in self.lines[:height]:
            key = (line.plain, tuple(line.spans), line.style, line.overflow, width, base, default)
            strip = drawn.get(key)
            if strip is None:
                strip = _line_strip(line, width, base, default, console)
                if len(drawn) >= LINE_STRIPS_KEPT:
                    drawn.clear()
                drawn[key] = strip
            strips.append(strip)
        return strips

    def get_optimal_width(self, rules: RulesMap, container_width: int) -> int:
        return max((line.cell_len for line in self.lines), default=0)

    def get_height(self, rules: RulesMap, width: int) -> int:
        return len(self.lines)


LINE_STRIPS_KEPT = 512
"""Lines drawn lately, kept by what they show (text, spans, style, width): most of a
panel's lines are the same from one second to the next (labels, column names, a
figure that did not move), and a Strip is immutable."""
_LINE_STRIPS: dict[object, Strip] = {}


def _line_strip(
    line: Text, width: int, base: Style, default: OverflowMethod, console: Console
) -> Strip:
    """One line of text as the screen shows it, cut to ``width``, under ``base``."""
    if line.cell_len > width:
        line = line.copy()
        line.truncate(width, overflow=line.overflow or default)
    if line.spans or not line.style:
        segments = line.render(console)
    else:  # a Text without spans renders without its own style; joined into the
        # Group's lines (what Rich shows) its style becomes a span
        segments = [Segment(line.plain, console.get_style(line.style))]
    return Strip([Segment(t, base + st if st else base) for t, st, _ in segments])


def lines_of(drawn: RenderableType) -> TextLines | None:
    """The Group's lines as :class:`TextLines` when each is a ``Text`` of one line
    that cannot wrap, needs no justifying, and carries no link or other meta (whose
    styles Textual would treat apart); else None (drawn as Rich draws it)."""
    parts = drawn.renderables if isinstance(drawn, Group) else [drawn]
    if active_app.get().console_options.justify not in (None, "default"):
        return None  # each line would be padded to the width
    lines: list[Text] = []
    for part in parts:
        if not (
            isinstance(part, Text)
            and part.no_wrap
            and part.justify in (None, "default")
            and part.overflow in (None, "ellipsis", "crop", "fold")
            and part.end == "\n"
            and "\n" not in part.plain
            and "\t" not in part.plain
            and not _has_meta(part)
        ):
            return None
        lines.append(part)
    return TextLines(lines)


def _has_meta(text: Text) -> bool:
    styles = [text.style, *(span.style for span in text.spans)]
    parsed = (Style.parse(st) if isinstance(st, str) else st for st in styles)  # cached
    return any(st.link or st._meta for st in parsed)


NO_OPTIONS = RenderOptions(lambda _: VisualStyle(), RulesMap())
"""What :meth:`TextLines.render_strips` is handed outside ``Visual.to_strips`` (it
reads none of it)."""


class KeptLines(Static):
    """A Static whose lines are drawn once per change and kept (Textual's line API:
    :meth:`render_line` hands out the kept strips).

    :meth:`repaint_changed` draws at once and repaints only the lines that differ from
    the kept ones: Textual re-styles (border, padding, background) and re-composites
    each repainted line, ~25 µs a line, and most of a panel's lines are the same from one
    second to the next. Any other repaint (a resize, a style change, a reactive that
    repaints) draws the whole widget again at its next line, as a Static does.
    """

    _kept: tuple[Strip, ...] = ()
    _kept_size: Size | None = None
    _stale = True
    """The kept lines no longer show what :meth:`render` would draw."""
    _partial = False
    """Set while :meth:`repaint_changed` asks for its own lines to be repainted."""

    def refresh(
        self,
        *regions: Region,
        repaint: bool = True,
        layout: bool = False,
        recompose: bool = False,
    ) -> KeptLines:
        if repaint and not self._partial:
            self._stale = True
        super().refresh(*regions, repaint=repaint, layout=layout, recompose=recompose)
        return self

    def notify_style_update(self) -> None:
        self._stale = True
        super().notify_style_update()

    def repaint_changed(self) -> None:
        """What :meth:`render` draws changed: repaint the lines that differ."""
        if self._stale or self._kept_size != self.size or not self.size:
            self.refresh()  # drawn whole at the next line asked for
            return
        old = self._kept
        new = self._draw_lines()
        if len(new) != len(old):
            self.refresh()
            return
        width = self.size.width
        pairs = enumerate(zip(old, new, strict=True))
        changed = [Region(0, y, width, 1) for y, (a, b) in pairs if a != b]
        if changed:
            self._partial = True
            try:
                self.refresh(*changed)
            finally:
                self._partial = False

    def _draw_lines(self) -> tuple[Strip, ...]:
        size, style = self.size, self.visual_style
        visual = visualize(self, self.render(), markup=False)
        if isinstance(visual, TextLines) and self.styles.content_align == ("left", "top"):
            # what Visual.to_strips makes of these lines, without its per-call lookups
            # (link style, selection, the screen): no link, no selection, nothing to align
            strips = visual.render_strips(size.width, size.height, style, NO_OPTIONS)
        else:
            strips = Visual.to_strips(self, visual, size.width, size.height, style)
        self._kept = tuple(strips)
        self._kept_size, self._stale = size, False
        return self._kept

    def render_line(self, y: int) -> Strip:
        if self.text_selection is not None:  # Textual draws the selection over its own
            return super().render_line(y)
        if self._stale or self._kept_size != self.size:
            self._draw_lines()
        if y < len(self._kept):
            return self._kept[y]
        return Strip.blank(self.size.width, self.visual_style.rich_style)


class Panel(KeptLines):
    """A bordered panel that draws the snapshot it is handed.

    A new snapshot repaints the panel only when what the panel shows of it changed
    (:meth:`inputs`): most snapshots change a few figures, and Textual re-renders and
    re-composites every widget that is refreshed, changed or not.
    """

    snapshot: var[Snapshot] = var(EMPTY)
    """The picture of the run being shown (no repaint by itself: see :meth:`inputs`)."""

    def __init__(self, title: str, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.border_title = title
        self._inputs: object = None
        self.renders = 0
        """How many times the panel was rendered (tests check that unchanged panels are not)."""

    def inputs(self, snap: Snapshot) -> object:
        """What of ``snap`` the panel shows, as the text shows it: equal inputs, the
        same picture. Subclasses narrow it; by default the whole snapshot."""
        return snap

    def watch_snapshot(self, snap: Snapshot) -> None:
        key = self.inputs(snap)
        if key != self._inputs:
            self._inputs = key
            self.repaint_changed()

    def render(self) -> RenderableType | Visual:
        self.renders += 1
        drawn = self.draw()
        return lines_of(drawn) or drawn

    def draw(self) -> RenderableType:
        raise NotImplementedError

    @property
    def rows(self) -> int:
        return max(1, self.content_size.height)

    @property
    def cols(self) -> int:
        return max(10, self.content_size.width)


def spread(total: int, weights: list[int]) -> list[int]:
    """``total`` cells shared out in proportion to ``weights``, rounding up in turn (as
    Rich shares an expanding table's spare width among its columns)."""
    out: list[int] = []
    left = sum(weights)
    for w in weights:
        part = math.ceil(w * total / left) if left > 0 else total
        out.append(part)
        left -= w
        total -= part
    return out


def rich_table(header: list[str], rows: list[list[str]]) -> Table:
    """The borderless, expanding Rich ``Table`` that :func:`table_lines` draws as
    lines: the first column left-aligned and bold, the others right-aligned."""
    table = Table(box=None, padding=(0, 1), expand=True, show_edge=False)
    table.add_column(header[0], style="bold", no_wrap=True)
    for name in header[1:]:
        table.add_column(name, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    return table


def table_lines(header: list[str], rows: list[list[str]], width: int) -> list[Text] | None:
    """A table as lines of text: the first column left-aligned and bold, the others
    right-aligned, one space either side of each cell, the columns widened in
    proportion to fill ``width``: what a borderless, expanding Rich ``Table`` draws,
    cell for cell, at a quarter of its cost (it measures and lays out every cell of
    every render). None when the cells do not fit in ``width`` (the caller's Table
    then wraps or crops them as Rich does)."""
    widths = [max(len(r[i]) for r in (header, *rows)) + 2 for i in range(len(header))]
    if sum(widths) > width:
        return None
    widths = [
        w + extra for w, extra in zip(widths, spread(width - sum(widths), widths), strict=True)
    ]
    lines = []
    for n, row in enumerate((header, *rows)):
        line = Text(no_wrap=True, overflow="ellipsis", style="bold" if n == 0 else "")
        first, *rest = row
        line.append(f" {first.ljust(widths[0] - 2)} ", style="bold")
        line.append(
            "".join(f" {cell.rjust(w - 2)} " for cell, w in zip(rest, widths[1:], strict=True))
        )
        lines.append(line)
    return lines


class AcceptanceTable(Panel):
    """Loss, full and conditional accuracy per TTT step, τ and its trend, last validation."""

    def inputs(self, snap: Snapshot) -> object:
        last_val = snap.val_rows[-1:]
        return (
            snap.observed is None,
            snap.ttt_steps,
            snap.latest,
            snap.tau,
            snap.tau_line,
            last_val,
        )

    def draw(self) -> RenderableType:
        snap = self.snapshot
        if snap.observed is not None and snap.ttt_steps == 0:
            return self._validation_only(snap)
        latest = snap.latest
        budget = self.rows - 2  # header and τ
        k_rows = snap.ttt_steps if snap.ttt_steps <= budget else max(0, budget - 1)
        cells = [
            [
                str(k),
                num(latest.get(f"train/loss_{k}")),
                num(latest.get(f"train/full_acc_{k}"), 3),
                num(latest.get(f"train/cond_acc_{k}"), 3),
            ]
            for k in range(k_rows)
        ]
        if k_rows < snap.ttt_steps:
            cells.append(["…", f"+{snap.ttt_steps - k_rows} more", "", ""])
        table = self._table(["k", "loss", "full", "cond"], cells)
        tau = Text(no_wrap=True, overflow="ellipsis")
        tau.append("τ ", style="bold")
        tau.append(num(snap.tau, 3), style="bold #ffffff")
        change = snap.tau_line.trend() if snap.tau_line is not None else None
        if change is not None:
            delta, steps = change
            arrow, style = ("→", "dim")
            if abs(delta) > 1e-3:
                arrow, style = ("↑", "green") if delta > 0 else ("↓", "red")
            tau.append(f" {arrow} {delta:+.3f}", style=style)
            tau.append(f" in {steps:,} step{'' if steps == 1 else 's'}", style="dim")
        parts: list[RenderableType] = [*table, tau]
        used = 1 + len(cells) + 1  # the table's header and rows, τ
        if self.rows > used and snap.val_rows:  # room for one more: the last validation
            v = snap.val_rows[-1]
            val = Text(no_wrap=True, overflow="ellipsis", style="dim")
            val.append(f"val e{v.epoch + 1} loss {num(v.values.get('loss_epoch'))}")
            acc0 = v.values.get("full_acc_0_epoch")
            if acc0 is not None:
                val.append(f" acc0 {num(acc0, 3)}")
            parts.append(val)
        return Group(*parts)

    def _table(self, header: list[str], cells: list[list[str]]) -> list[RenderableType]:
        lines = table_lines(header, cells, self.cols)
        if lines is not None:
            return list(lines)
        return [rich_table(header, cells)]

    def _validation_only(self, snap: Snapshot) -> RenderableType:
        """A run without telemetry: no per-step values; the last validation from the
        checkpoints (``val_metrics.json``) where there is one."""
        note = Text(
            "per step: not available without telemetry",
            style="bold #d7af5f",
            no_wrap=True,
            overflow="ellipsis",
        )
        if not snap.val_rows:
            return Group(note, one_line("no validation saved yet", style="dim"))
        v = snap.val_rows[-1]
        cells = []
        k = 0
        while f"full_acc_{k}_epoch" in v.values and k < max(1, self.rows - 3):
            cells.append(
                [
                    str(k),
                    num(v.values.get(f"loss_{k}_epoch")),
                    num(v.values.get(f"full_acc_{k}_epoch"), 3),
                    num(v.values.get(f"cond_acc_{k}_epoch"), 3),
                ]
            )
            k += 1
        table = self._table(["k", "val loss", "full", "cond"], cells)
        tau = tau_of(v.values, prefix="", suffix="_epoch")  # every TTT step, shown or not
        foot = Text(no_wrap=True, overflow="ellipsis")
        foot.append("τ ", style="bold")
        foot.append(num(tau, 3), style="bold #ffffff")
        foot.append(f"  validation, epoch {v.epoch + 1}", style="dim")
        return Group(note, *table, foot)


def _ckpt_name(path: str) -> str:
    parts = [p for p in path.split(os.sep) if p]
    return os.sep.join(parts[-2:]) if parts else "?"


def checkpoint_rows(events: tuple[CkptEvent, ...]) -> list[Text]:
    """Newest first: one line per checkpoint saved (time, where, size, how long, marks).

    A save on a signal is told twice (``save_finished``, then ``interrupted`` for the
    same directory): one line, with the save's duration. A directory saved again
    later (``interrupted/`` at each stop) is listed at its latest save."""
    # checkpoint_best points at one checkpoint: the one its latest move named
    best = {next((e.path for e in reversed(events) if e.event == "best"), None)} - {None}
    rows: list[Text] = []
    shown: set[str] = set()
    for i in range(len(events) - 1, -1, -1):
        e = events[i]
        if e.event not in ("save_finished", "interrupted") or e.path in shown:
            continue
        shown.add(e.path)
        if e.event == "interrupted" and e.duration_s is None:  # its save_finished has it
            saved = (p for p in reversed(events[:i]) if p.path == e.path)
            prior = next((p for p in saved if p.event == "save_finished"), None)
            if prior is not None:
                e = replace(prior, event="interrupted")
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(clock_time(e.when) + " ", style="dim")
        t.append_text(inert(_ckpt_name(e.path)))
        t.append(f"  {size(e.bytes)}")
        if e.duration_s is not None:
            t.append(f" in {e.duration_s:.1f} s", style="dim")
        if e.event == "interrupted" or "interrupted" in e.path:
            t.append("  interrupted", style="bold #d7af5f")
        if e.path in best:
            t.append("  ★ best", style="bold green")
        if e.complete is False:
            t.append("  incomplete", style="bold red")
        rows.append(t)
    return rows


HISTORY_ORDER = (NonFinite, Spike, Resume, Gap)
"""Which anomaly of a run's history the progress panel names first."""


def history_line(anomalies: tuple[Anomaly, ...]) -> Text:
    """One line of what happened on the way (``model/anomalies.py``, oldest first): the
    kind that matters most (non-finite loss, then a spike, a resume, steps not logged),
    its newest (the second resume is the one the run goes on from, not the first), and
    how many others ``summary`` lists before and after it."""
    kind = min(HISTORY_ORDER.index(type(a)) for a in anomalies)
    at = max(i for i, a in enumerate(anomalies) if HISTORY_ORDER.index(type(a)) == kind)
    first = anomalies[at]
    line = Text(no_wrap=True, overflow="ellipsis")
    line.append("hist  ", style="dim")
    bad = isinstance(first, NonFinite | Spike)
    line.append(first.said, style="bold #d7af5f" if bad else "")
    later = len(anomalies) - 1 - at
    others = [f"{n} {word}" for n, word in ((at, "earlier"), (later, "later")) if n]
    if others:
        line.append(f" · {', '.join(others)} in summary", style="dim")
    return line


class ProgressPanel(Panel):
    """Epoch, step, pace, ETA, and the checkpoints (a save in progress first)."""

    def inputs(self, snap: Snapshot) -> object:
        p = snap.progress
        return (
            (p.epoch, p.epochs_total, p.step, p.total_steps),
            (rate(p.steps_per_s), rate(p.tokens_per_s), p.pace_over),
            (duration(p.eta_epoch_s), duration(p.eta_run_s), duration(p.elapsed_s), p.ended_at),
            snap.saving,
            snap.checkpoints,
            snap.anomalies,
        )

    def draw(self) -> RenderableType:
        snap = self.snapshot
        p = snap.progress
        lines: list[Text] = []
        head = Text(no_wrap=True, overflow="ellipsis")
        epoch = "–" if p.epoch is None else str(p.epoch)
        head.append("epoch ", style="dim")
        head.append(f"{epoch}/{p.epochs_total or '?'}", style="bold")
        head.append("  step ", style="dim")
        head.append("–" if p.step is None else f"{p.step:,}", style="bold")
        if p.total_steps:
            head.append(f"/{p.total_steps:,}")
        frac = None
        if p.step is not None and p.total_steps:
            frac = p.step / p.total_steps
        width = max(4, min(30, self.cols - head.cell_len - 6))
        head.append(f" {bar(frac, width)}", style="#5fafd7")
        head.append("" if frac is None else f" {frac:.0%}")
        lines.append(head)
        pace = Text(no_wrap=True, overflow="ellipsis")
        pace.append("pace  ", style="dim")
        pace.append(f"{rate(p.steps_per_s)} steps/s · {rate(p.tokens_per_s)} tok/s")
        eta = Text(no_wrap=True, overflow="ellipsis")
        if p.ended_at is None:
            eta.append("ETA   ", style="dim")
            eta.append(f"epoch {duration(p.eta_epoch_s)} · run {duration(p.eta_run_s)}")
            eta.append(f" · up {duration(p.elapsed_s)}", style="dim")
        else:  # over: nothing is current; how long it ran, at what average
            average = "its average" if p.pace_over == "run" else "its last epoch's average"
            pace.append(f" · {average}", style="dim")
            if p.ended_by is None:
                eta.append("ended ", style="dim")
                eta.append(clock_time(p.ended_at), style="bold")
                eta.append(f" · ran {duration(p.elapsed_s)}", style="dim")
            else:  # found gone by a later look: between the two, the least it ran
                eta.append("ended ", style="dim")
                eta.append(f"{clock_time(p.ended_at)}–{clock_time(p.ended_by)}", style="bold")
                eta.append(f" · ran ≥{duration(p.elapsed_s)}", style="dim")
        lines += [pace, eta]
        if snap.anomalies:
            lines.append(history_line(snap.anomalies))
        if snap.saving is not None:
            growing = next(
                (e.bytes for e in reversed(snap.checkpoints) if e.event == "save_progress"), None
            )
            save = Text(no_wrap=True, overflow="ellipsis", style="bold #ffd75f")
            save.append("⟳ saving ")
            save.append_text(inert(_ckpt_name(snap.saving)))
            save.append(f"  {size(growing)}…" if growing is not None else "  …")
            lines.append(save)
        ckpts = checkpoint_rows(snap.checkpoints)
        room = self.rows - len(lines)
        if ckpts and room > 0:
            shown = ckpts[: max(0, room)]
            for i, row in enumerate(shown):
                prefix = one_line("ckpt  " if i == 0 else "      ", style="dim")
                lines.append(prefix + row)
        elif room > 0:
            lines.append(one_line("ckpt  none saved yet", style="dim"))
        return Group(*lines[: self.rows])


def gpu_row(g: GpuView, cols: int) -> Text:
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append_text(inert(f"{g.host}:{g.index} " if g.host else f"{g.index} ", style="bold"))
    wide = cols >= 70
    if wide:
        t.append_text(inert(g.name.replace("NVIDIA ", "")[:10].ljust(10), style="dim"))
        t.append(" ")
    bw = 8 if wide else 4
    util = g.util
    t.append(bar(None if util is None else util / 100, bw), style="#5fd75f")
    t.append(f"{'–' if util is None else f'{util:.0f}%':>4} ")
    mem = g.mem_used / g.mem_total if g.mem_used is not None and g.mem_total else None
    t.append(bar(mem, bw), style="#5fafff")
    if wide and g.mem_used is not None and g.mem_total:
        t.append(f" {g.mem_used / 2**30:.0f}/{g.mem_total / 2**30:.0f}G")
    else:
        t.append(f"{'–' if mem is None else f'{mem:.0%}':>4}")
    t.append(f" {'–' if g.power_w is None else f'{g.power_w:.0f}W':>5}")
    t.append(f" {'–' if g.temp_c is None else f'{g.temp_c:.0f}°C':>5} ")
    room = cols - t.cell_len
    if room > 1:
        t.append(sparkline(g.spark, room, top=100.0), style="#5fd75f")
    return t


class GpuPanel(Panel):
    """One row per device: utilisation and memory bars, power, temperature, a sparkline;
    once the run ended, its border says the rows are its last sample, not the present."""

    def inputs(self, snap: Snapshot) -> object:
        return (snap.gpu_status, snap.gpu_error, snap.gpus)

    def watch_snapshot(self, snap: Snapshot) -> None:
        at = snap.gpus_at if snap.gpus else None
        down = snap.diagnosis.link_down_since
        note = ""
        if at is not None and snap.progress.ended_at is not None:
            note = f"the run ended; sampled {clock_time(at)}"
        elif at is not None and down is not None:  # nothing can arrive: the last that did
            note = f"link down; sampled {clock_time(at)}"
        elif at is not None and snap.samples_stale(at):
            note = f"no sample since {clock_time(at)}"  # the sidecar held, or gone
        if note != (self.border_subtitle or ""):  # a border set repaints, same or not
            self.border_subtitle = note
        super().watch_snapshot(snap)

    def draw(self) -> RenderableType:
        snap = self.snapshot
        # The sampler's message names the cause and the fix (telemetry/nvml.py): one line.
        if snap.gpu_status == "no_driver":
            why = snap.gpu_error or ""
            if "driver" not in why:  # an older writer's message, e.g. NVML's own words
                why = "no NVIDIA driver on the training host" + (f": {why}" if why else "")
            return Group(inert(why, style="bold #d7af5f"))  # in a Group: one line, never wrapped
        if snap.gpu_status == "error" and not snap.gpus:
            return Group(inert(snap.gpu_error or "GPU sampling failed", "bold red"))
        if not snap.gpus:
            return one_line("no GPU samples yet", style="dim")
        half = (self.cols - 1) // 2
        if len(snap.gpus) > self.rows and half >= 30:  # two devices per line
            narrow = [gpu_row(g, half) for g in snap.gpus]
            rows: list[Text] = []
            for i in range(0, len(narrow), 2):
                line = narrow[i].copy()
                line.pad_right(half - line.cell_len)
                line.truncate(half)
                if i + 1 < len(narrow):
                    line.append(" ")
                    line.append_text(narrow[i + 1])
                rows.append(line)
        else:
            rows = [gpu_row(g, self.cols) for g in snap.gpus]
        if len(rows) > self.rows:
            rest = len(rows) - self.rows + 1
            busy = sum(1 for g in snap.gpus[self.rows - 1 :] if (g.util or 0) >= 10)
            more = one_line(f"… {rest} more ({busy} busy)", style="dim")
            rows = [*rows[: self.rows - 1], more]
        return Group(*rows)


PROC_STATE = {"D": "in I/O wait", "T": "stopped", "t": "traced", "Z": "exited"}
"""A process state worth a word in the tree (R and S are a working process's)."""


class DataPanel(Panel):
    """Bytes and files read per second, per worker, the latest files, data starvation."""

    def inputs(self, snap: Snapshot) -> object:
        wait = snap.progress.fetch_frac
        shown = None if wait is None else (f"{wait:.0%}", wait >= STARVED)
        tree = snap.observed.members if snap.observed is not None else None
        return (snap.io, shown, snap.progress.ended_at is None, tree)

    def watch_snapshot(self, snap: Snapshot) -> None:
        """A training without telemetry: its process tree is listed here (CPU, memory and
        reads of each process), and the border says so."""
        title = "data · processes" if snap.observed is not None else "data"
        if title != self.border_title:
            self.border_title = title
        down = snap.diagnosis.link_down_since
        live = snap.io is not None and snap.progress.ended_at is None
        # nothing can arrive while the link is down: the rates are the last that did
        note = f"link down since {clock_time(down)}; the last read" if down and live else ""
        at = snap.io_at
        if not note and live and at is not None and snap.samples_stale(at):
            # no sample for a while (the sidecar held, or gone): these are not current
            note = f"no sample since {clock_time(at)}; the last read"
        if note != (self.border_subtitle or ""):
            self.border_subtitle = note
        super().watch_snapshot(snap)

    def _tree_rows(self, members: tuple[Member, ...], io: IoView | None) -> list[Text]:
        """One row per process of the observed run: PID, role, CPU, memory, reads/s."""
        reads = {w.pid: w for w in io.workers} if io is not None else {}
        ended = self.snapshot.progress.ended_at is not None
        rows = []
        for m in members:
            row = Text(no_wrap=True, overflow="ellipsis")
            row.append(f"  {m.pid:>7} ", style="bold")
            row.append_text(inert((m.role or m.comm)[:8].ljust(8), style="dim"))
            row.append(f" {m.cpu_pct:>4.0f}%" if m.cpu_pct is not None else "    –%")
            row.append(f" {size(m.rss):>9}" if m.rss is not None else "         –", style="dim")
            w = reads.get(m.pid)
            if w is not None and w.bytes_per_s is not None and not ended:
                row.append(f"  {size(w.bytes_per_s)}/s")
            if m.state in ("D", "T", "t", "Z"):
                row.append(f"  {PROC_STATE[m.state]}", style="bold #d7af5f")
            rows.append(row)
        return rows

    def draw(self) -> RenderableType:
        snap = self.snapshot
        io = snap.io
        lines: list[Text] = []
        wait = snap.progress.fetch_frac
        starve = Text(no_wrap=True, overflow="ellipsis")
        starve.append("wait  ", style="dim")
        if wait is None:
            starve.append("–", style="dim")
        else:
            style = "bold #ff8700" if wait >= STARVED else ""
            starve.append(f"{wait:.0%} of step time waiting for data", style=style)
            if wait >= STARVED:
                starve.append(" (starved)", style="bold #ff8700")
        members = snap.observed.members if snap.observed is not None else ()
        if io is None:
            tree = self._tree_rows(members, None)
            lines = [one_line("no read samples yet", style="dim"), starve, *tree]
            return Group(*lines[: self.rows])
        head = Text(no_wrap=True, overflow="ellipsis")
        head.append("read  ", style="dim")
        if snap.progress.ended_at is not None:  # its reads are over: no current rate
            head.append("none now: the run ended ", style="dim")
        else:
            head.append(f"{size(io.bytes_per_s)}/s", style="bold")
            head.append(f" · {rate(io.files_per_s)} files/s ")
        room = self.cols - head.cell_len
        if room > 3:
            head.append(sparkline(io.spark, room), style="#5fafff")
        lines += [head, starve]
        if members:  # the process tree, each with its reads: every process, not readers only
            lines += self._tree_rows(members, io)
        for w in io.workers if not members else ():
            row = Text(no_wrap=True, overflow="ellipsis")
            if io.ranks > 1:  # torchrun: whose reads
                row.append(f"  r{w.rank}", style="dim")
            row.append(f" {w.pid:>7} " if io.ranks > 1 else f"  {w.pid:>7} ", style="bold")
            row.append_text(inert(w.role[:8].ljust(8), style="dim"))
            if w.bytes_per_s is not None:
                row.append(f" {size(w.bytes_per_s)}/s")
            if w.read_total is not None:
                row.append(f"  total {size(w.read_total)}", style="dim")
            lines.append(row)
        room_rows = self.rows - len(lines)
        if (io.workers or members) and room_rows < 1:
            lines = lines[: self.rows]
        for f in reversed(io.recent_files[-max(0, room_rows) :] if room_rows > 0 else ()):
            row = Text("  ↳ ", style="dim", no_wrap=True, overflow="ellipsis")
            row.append_text(inert(os.path.basename(f) or f))
            lines.append(row)
        return Group(*lines[: self.rows])
