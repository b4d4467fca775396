"""The trainer's messages and the run's lifecycle events, newest at the bottom."""

from __future__ import annotations

import io

from rich.console import Console, Group, RenderableType
from rich.text import Text

from eagle3_tui.app.text import clock_time, inert, log_message
from eagle3_tui.app.widgets.panels import Panel
from eagle3_tui.model.snapshot import Snapshot

LEVEL_STYLE = {
    "DEBUG": "dim",
    "INFO": "",
    "WARNING": "bold #ffd75f",
    "ERROR": "bold #ff5f5f",
    "CRITICAL": "bold #ffffff on #d70000",
}
EVENT_STYLE = {
    "start": "bold #5fd7ff",
    "resume": "bold #5fd7ff",
    "finish": "bold #5fd75f",
    "interrupt": "bold #d7af5f",
    "crash": "bold #ff5f5f",
}
FILE_STYLE = "bold #ff8700"
"""What happened to metrics.jsonl and to the writes (a file replaced, a full disk)."""


def log_entries(snap: Snapshot, n: int) -> list[tuple[Text, Text]]:
    """The last ``n`` messages and events, oldest first: (time and level, what), inert."""
    items: list[tuple[float, int, Text, Text]] = []
    for i, line in enumerate(snap.logs[-n:]):
        head = Text(clock_time(line.ts) + " ", style="dim")
        level = line.level.upper()
        head.append_text(inert(f"{level[:4]:<4} ", LEVEL_STYLE.get(level, "bold") or "dim"))
        items.append((line.ts, i, head, log_message(line.msg, LEVEL_STYLE.get(level, ""))))
    for i, ev in enumerate(snap.events[-n:]):
        head = Text(clock_time(ev.ts) + " ", style="dim")
        style = EVENT_STYLE.get(ev.event, "bold")
        head.append("▶ ", style=style)
        body = inert(ev.event, style=style)
        if ev.shown_step:  # the steps done by then ("after step N", as the banner says it)
            body.append(f" after step {ev.shown_step:,}")
        if ev.pid is not None:
            body.append(f" (pid {ev.pid})", style="dim")
        if ev.error:
            body.append(": ")
            body.append_text(
                inert(ev.error.splitlines()[0] if ev.error.splitlines() else "", style)
            )
        items.append((ev.ts, 10_000 + i, head, body))
    for i, note in enumerate(snap.files[-n:]):  # what happened to metrics.jsonl
        ts = note.sort_ts or 0.0
        head = Text(clock_time(ts) + " " if note.sort_ts else "", style="dim")
        head.append("▶ ", style=FILE_STYLE)
        items.append((ts, 20_000 + i, head, inert(note.text, style=FILE_STYLE)))
    for i, gap in enumerate(snap.write_gaps[-n:]):  # a full disk's records, once space returned
        head = Text(clock_time(gap.until) + " ", style="dim")
        head.append("▶ ", style=FILE_STYLE)
        items.append((gap.until, 30_000 + i, head, inert(gap.sentence(), style=FILE_STYLE)))
    items.sort(key=lambda it: (it[0], it[1]))
    return [(head, body) for _, _, head, body in items[-n:]]


def wrapped(head: Text, body: Text, width: int) -> list[Text]:
    """One entry over as many rows as it needs, continuation rows indented under its
    text: a message is read whole, never cut with an ellipsis."""
    indent = head.cell_len if head.cell_len < width // 2 else 2
    room = max(8, width - indent)
    body = body.copy()
    body.no_wrap, body.overflow = False, "fold"
    rows: list[Text] = []
    for i, part in enumerate(body.wrap(_MEASURE, room, overflow="fold")):
        part.rstrip()
        row = head.copy() if i == 0 else Text(" " * indent)
        row.append_text(part)
        row.no_wrap, row.overflow = True, "crop"
        rows.append(row)
    return rows or [head.copy()]


_MEASURE = Console(width=1000, file=io.StringIO(), color_system=None, legacy_windows=False)
"""Only measures where text wraps (cell widths), never prints."""


def counts(snap: Snapshot) -> Text:
    t = Text(no_wrap=True)
    t.append(f"{snap.warnings} warn", style="bold #ffd75f" if snap.warnings else "dim")
    for label, value in (
        ("malformed", snap.malformed),
        ("lost", snap.lost),  # sequence gaps: a record a writer dropped is one (once)
        ("dup", snap.duplicates),
    ):
        t.append(" · ", style="dim")
        t.append(f"{value} {label}", style="bold #ff8700" if value else "dim")
    return t


class LogPanel(Panel):
    """Messages of the speculators loggers, lifecycle events, and what was lost."""

    def __init__(self, title: str, **kwargs: object) -> None:
        super().__init__(title, **kwargs)
        self._tally: object = None

    def inputs(self, snap: Snapshot) -> object:
        return (
            snap.logs,
            snap.events,
            snap.files,
            snap.write_gaps,
            snap.malformed,
            snap.malformed_last,
        )

    def watch_snapshot(self, snap: Snapshot) -> None:
        tally = (snap.warnings, snap.malformed, snap.lost, snap.duplicates)
        if tally != self._tally:  # a title set is a repaint, even when it is the same
            self._tally = tally
            self.border_subtitle = counts(snap)
        super().watch_snapshot(snap)

    def draw(self) -> RenderableType:
        """The newest entries, each whole (wrapped); only the oldest one shown is cut
        (with …) when the panel has no more rows."""
        snap = self.snapshot
        rows_left = self.rows
        bad: list[Text] = []
        if snap.malformed and snap.malformed_last:
            line = Text("malformed ", style="bold #ff8700", no_wrap=True, overflow="ellipsis")
            line.append_text(inert(snap.malformed_last, style="#ff8700"))
            bad, rows_left = [line], rows_left - 1
        shown: list[Text] = []
        for head, body in reversed(log_entries(snap, self.rows)):
            rows = wrapped(head, body, self.cols)
            if len(rows) > rows_left:  # its start, cut where the room ends
                cut = rows[: max(0, rows_left)]
                if cut:
                    cut[-1] = cut[-1].copy()
                    cut[-1].truncate(max(1, self.cols - 1))
                    cut[-1].append("…", style="dim")
                shown = cut + shown
                break
            shown = rows + shown
            rows_left -= len(rows)
        lines = shown + bad
        if not lines:
            return Text("no messages yet", style="dim")
        return Group(*lines[: self.rows])
