"""``m``: the trainer's messages and the run's events, every line whole, scrollable.

The log panel shows the newest entries wrapped in the rows it has (at 80×24: two);
this screen shows all the snapshot keeps (the last 300 messages, 50 events) at the
full width, newest at the bottom, and follows new ones while scrolled to the end.
"""

from __future__ import annotations

from typing import ClassVar

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from eagle3_tui.app.widgets.log import log_entries, wrapped
from eagle3_tui.model.snapshot import EMPTY, Snapshot

FOLLOW_S = 0.5
"""How often the screen looks for a newer snapshot."""


class LogScreen(ModalScreen[None]):
    """Every message and event the snapshot holds, wrapped at the screen's width."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,m,q", "dismiss", "Close"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._shown: tuple[Snapshot, int] | None = None

    def compose(self) -> ComposeResult:
        box = VerticalScroll(id="messages")
        box.border_title = "messages and events · ↑↓ PgUp PgDn scroll · Esc closes"
        with box:
            yield Static(id="messages-text")

    def on_mount(self) -> None:
        self.follow()
        self.set_interval(FOLLOW_S, self.follow)

    def follow(self) -> None:
        """Redraw for a newer snapshot or width; stay at the end when there already."""
        snap: Snapshot = getattr(self.app, "snapshot", EMPTY)
        box = self.query_one("#messages", VerticalScroll)
        width = max(20, box.scrollable_content_region.width or self.app.size.width - 8)
        if self._shown is not None and self._shown[0] is snap and self._shown[1] == width:
            return
        at_end = self._shown is None or box.scroll_y >= box.max_scroll_y
        self._shown = (snap, width)
        entries = log_entries(snap, len(snap.logs) + len(snap.events))
        rows = [row for head, body in entries for row in wrapped(head, body, width)]
        shown = Group(*rows) if rows else Text("no messages yet", style="dim")
        self.query_one("#messages-text", Static).update(shown)
        if at_end:
            self.call_after_refresh(box.scroll_end, animate=False)

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
