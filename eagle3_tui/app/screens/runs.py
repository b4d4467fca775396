"""``c``: the runs registered on the run's host, to pick one to compare with."""

from __future__ import annotations

import posixpath
import time
from typing import ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from eagle3_tui.app.run_control import RunControl
from eagle3_tui.app.text import inert
from eagle3_tui.transport.replies import RunEntry

STATUS_WIDTH = len("interrupted")
"""The longest status a manifest has (running, finished, interrupted, crashed)."""


STATE_STYLE = {"gone": "dim", "running": "green", "dead": "red"}


def run_row(r: RunEntry) -> Text:
    started = r.started_at
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(started)) if started else "?"
    state = r.state
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f"{when}  ", style="dim")
    t.append_text(inert(f"{state:<{STATUS_WIDTH}}", style=STATE_STYLE.get(state, "")))
    t.append("  ")  # never run into the path, whatever the status's length
    t.append_text(inert(r.run_dir))
    return t


class RunPicker(ModalScreen[str | None]):
    """Lists the host's runs of the login user (newest first; ``a``: every user's), not
    those whose directory is gone; Enter picks one, Escape cancels."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel"),
        Binding("a", "all_users", "All users"),
    ]

    def __init__(
        self, control: RunControl, current: str | None, manifest: dict[str, object] | None = None
    ) -> None:
        super().__init__()
        self.control = control
        self.current = current
        self.manifest = manifest or {}
        """The shown run's manifest: its ``run_dir`` as the host resolved it and its
        ``run_id`` (the run is never offered to compare with itself, however the
        target spelt its directory)."""
        self.all_users = False
        self._runs: list[RunEntry] = []

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
            result = await self.control.runs(self.all_users)
        except Exception as e:  # shown in the dialog: an unreachable host, no index...
            if not self.is_attached:
                return
            status = self.query_one("#picker-status", Static)
            status.update(inert(f"cannot list runs: {e}", style="bold red"))
            return
        if not self.is_attached:
            return  # closed meanwhile
        status = self.query_one("#picker-status", Static)
        others = [r for r in result.runs if not self._is_current(r)]
        # a run whose directory was removed has nothing left to compare with
        runs = [r for r in others if r.state != "gone"]
        gone = len(others) - len(runs)
        hidden = f"; {gone} gone (its directory removed) hidden" if gone else ""
        if result.others:
            hidden += f"; {result.others} of other users hidden (a: show)"
        options = self.query_one(OptionList)
        options.clear_options()
        if not runs:
            whose = "" if self.all_users else " of yours"
            status.update(Text(f"No other run{whose} on this host{hidden}.", style="bold"))
            return
        where = result.host or "the host"
        status.update(inert(f"{len(runs)} run(s) on {where}{hidden}: Enter picks"))
        for r in runs:
            options.add_option(Option(run_row(r), id=None))
        self._runs = runs
        options.highlighted = 0
        options.focus()

    def _is_current(self, r: RunEntry) -> bool:
        run_id = self.manifest.get("run_id")
        if isinstance(run_id, str) and r.run_id == run_id:
            return True
        dirs = {self.current, self.manifest.get("run_dir")}
        return any(isinstance(d, str) and posixpath.normpath(d) == r.run_dir for d in dirs) or (
            r.run_dir in dirs
        )

    @on(OptionList.OptionSelected)
    def picked(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self._runs[event.option_index].run_dir)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_all_users(self) -> None:
        self.all_users = True
        self.load()
