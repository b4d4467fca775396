"""The trainer's messages and the run's lifecycle events, newest at the bottom."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from eagle3_tui.app.text import clock_time, inert
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


def log_lines(snap: Snapshot, n: int) -> list[Text]:
    """The last ``n`` messages and events, oldest first, as inert text."""
    items: list[tuple[float, int, Text]] = []
    for i, line in enumerate(snap.logs[-n:]):
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(clock_time(line.ts) + " ", style="dim")
        level = line.level.upper()
        t.append(f"{level[:4]:<4} ", style=LEVEL_STYLE.get(level, "bold") or "dim")
        t.append_text(inert(line.msg, style=LEVEL_STYLE.get(level, "")))
        items.append((line.ts, i, t))
    for i, ev in enumerate(snap.events[-n:]):
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(clock_time(ev.ts) + " ", style="dim")
        style = EVENT_STYLE.get(ev.event, "bold")
        t.append("▶ ", style=style)
        t.append_text(inert(ev.event, style=style))
        if ev.step is not None:
            t.append(f" at step {ev.step:,}")
        if ev.pid is not None:
            t.append(f" (pid {ev.pid})", style="dim")
        if ev.error:
            t.append(": ")
            t.append_text(inert(ev.error.splitlines()[0] if ev.error.splitlines() else "", style))
        items.append((ev.ts, 10_000 + i, t))
    items.sort(key=lambda it: (it[0], it[1]))
    return [t for _, _, t in items[-n:]]


def counts(snap: Snapshot) -> Text:
    t = Text(no_wrap=True)
    t.append(f"{snap.warnings} warn", style="bold #ffd75f" if snap.warnings else "dim")
    for label, value in (
        ("malformed", snap.malformed),
        ("lost", snap.lost + snap.dropped_by_writer),
        ("dup", snap.duplicates),
    ):
        t.append(" · ", style="dim")
        t.append(f"{value} {label}", style="bold #ff8700" if value else "dim")
    return t


class LogPanel(Panel):
    """Messages of the speculators loggers, lifecycle events, and what was lost."""

    def watch_snapshot(self, snap: Snapshot) -> None:
        self.border_subtitle = counts(snap)

    def render(self) -> RenderableType:
        snap = self.snapshot
        lines = log_lines(snap, self.rows)
        if snap.malformed and snap.malformed_last and len(lines) >= self.rows:
            lines = lines[1:]
        if snap.malformed and snap.malformed_last:
            bad = Text("malformed ", style="bold #ff8700", no_wrap=True, overflow="ellipsis")
            bad.append_text(inert(snap.malformed_last, style="#ff8700"))
            lines.append(bad)
        if not lines:
            return Text("no messages yet", style="dim")
        return Group(*lines)
