"""Several live trainings on the host and no ``--pid``: pick one before the monitor opens."""

from __future__ import annotations

import time
from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.widgets import Footer, OptionList, Static
from textual.widgets.option_list import Option

from eagle3_tui.app.text import inert
from eagle3_tui.transport.replies import ChooseReply, ProcessRow


def live_row(r: ProcessRow) -> Text:
    """One live training: start, health, PID, telemetry, where, what."""
    started = r.started
    when = time.strftime("%m-%d %H:%M", time.localtime(started)) if started is not None else "?"
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f"{when}  ", style="dim")
    t.append_text(inert(f"{r.health or 'live':<8} ", style="bold"))
    t.append(f"pid {r.pid:<8} ")
    t.append("telemetry " if r.telemetry else "no telemetry ", style="dim")
    t.append_text(inert(r.run_dir or r.cwd or "?"))
    command = " ".join(r.command[1:])
    t.append("  ")
    t.append_text(inert(command, style="dim"))
    return t


class LiveChooser(App[ProcessRow | None]):
    """Lists the live trainings; Enter opens one, Escape or q quits."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q", "quit_chooser", "Quit"),
    ]
    CSS = """
    #chooser { padding: 1 2; }
    #chooser-note { margin-bottom: 1; }
    """

    def __init__(self, result: ChooseReply) -> None:
        super().__init__()
        self.rows: list[ProcessRow] = list(result.runs)
        self.host = result.host or "the host"
        self.note_text = result.note

    def compose(self) -> ComposeResult:
        box = Vertical(id="chooser")
        box.border_title = inert(f"live trainings on {self.host}")
        with box:
            yield Static(
                inert(f"{self.note_text}: Enter opens one (or run with --pid PID)"),
                id="chooser-note",
            )
            yield OptionList(*(Option(live_row(r)) for r in self.rows), id="live")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        options.highlighted = 0
        options.focus()

    @on(OptionList.OptionSelected)
    def picked(self, event: OptionList.OptionSelected) -> None:
        self.exit(self.rows[event.option_index])

    def action_quit_chooser(self) -> None:
        self.exit(None)


async def choose_live(result: ChooseReply) -> ProcessRow | None:
    """The training picked among ``result.runs``, or None when the user quit."""
    return await LiveChooser(result).run_async()
