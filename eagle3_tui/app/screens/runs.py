"""``c``: the runs registered on the run's host, to pick one to compare with."""

from __future__ import annotations

import time
from typing import Any, ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from eagle3_tui.app.control import RunControl
from eagle3_tui.app.text import inert


def run_row(r: dict[str, Any]) -> Text:
    started = r.get("started_at")
    when = (
        time.strftime("%Y-%m-%d %H:%M", time.localtime(float(started)))
        if isinstance(started, int | float)
        else "?"
    )
    if not r.get("exists"):
        status, style = "gone", "dim"
    elif r.get("alive"):
        status, style = "running", "green"
    elif r.get("status") == "running":
        status, style = "dead", "red"
    else:
        status, style = str(r.get("status") or "unknown"), ""
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f"{when}  ", style="dim")
    t.append(f"{status:<11}", style=style)
    t.append_text(inert(r.get("run_dir", "?")))
    return t


class RunPicker(ModalScreen[str | None]):
    """Lists the host's runs (newest first); Enter picks one, Escape cancels."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, control: RunControl, current: str | None) -> None:
        super().__init__()
        self.control = control
        self.current = current

    def compose(self) -> ComposeResult:
        box = Vertical(id="picker", classes="dialog")
        box.border_title = "compare with a previous run"
        with box:
            yield Static(Text("Listing the runs on the host…", style="dim"), id="picker-status")
            yield OptionList(id="runs")

    def on_mount(self) -> None:
        self.load()

    @work(exclusive=True, group="runs", exit_on_error=False)
    async def load(self) -> None:
        try:
            result = await self.control.runs()
        except Exception as e:  # shown in the dialog: an unreachable host, no index...
            if not self.is_attached:
                return
            status = self.query_one("#picker-status", Static)
            status.update(inert(f"cannot list runs: {e}", style="bold red"))
            return
        if not self.is_attached:
            return  # closed meanwhile
        status = self.query_one("#picker-status", Static)
        runs = [r for r in result.get("runs") or [] if r.get("run_dir") != self.current]
        if not runs:
            status.update(Text("No other run is registered on this host.", style="bold"))
            return
        status.update(Text(f"{len(runs)} run(s) on {result.get('host', 'the host')}: Enter picks"))
        options = self.query_one(OptionList)
        for r in runs:
            options.add_option(Option(run_row(r), id=None))
        self._runs = runs
        options.highlighted = 0
        options.focus()

    @on(OptionList.OptionSelected)
    def picked(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(str(self._runs[event.option_index]["run_dir"]))

    def action_cancel(self) -> None:
        self.dismiss(None)
