"""The fleet screen: one row per live or recent run of several hosts (``fleet.py``).

A Textual app of its own: a table kept current from the :class:`~eagle3_tui.fleet.Fleet`
(its following runs in a worker of this app), the selected row's cause in full beneath
it, the hosts that cannot be reached above it. Keys: ``s``/``S`` sort by the next
column / reverse, ``/`` filter (words of host, run, health or cause), space marks a run,
Enter opens the selected run in the monitor, ``c`` compares it with the marked one, ``k``
stops it and ``r`` resumes it (the monitor's own dialogs: the plan, a confirmation, the
verified result), ``q`` quits. Opening a run ends this app with :attr:`FleetApp.chosen`
set: the command line monitors it, then shows the fleet again.
"""

from __future__ import annotations

import asyncio
import time
from typing import ClassVar

from rich.text import Text
from textual import events, on
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Footer, Static
from textual.widgets.data_table import ColumnKey

from eagle3_tui.app.screens.kill_resume import ControlDialog
from eagle3_tui.app.text import inert
from eagle3_tui.fleet import COLUMNS, SORT_KEYS, Fleet, FleetRow, cells, matches, sort_rows
from eagle3_tui.model.inert import printable

HEALTH_STYLE = {
    "running": "bold green",
    "finished": "bold cyan",
    "waiting": "yellow",
    "stopped": "yellow",
    "silent": "bold #ff5f5f",
    "stalled": "bold #ff5f5f",
    "dead": "bold #ff5f5f",
    "diverged": "bold #ff5f5f",
    "disk_full": "bold #ff5f5f",
    "unreadable": "bold #ff5f5f",
    "copy": "dim",
}
REFRESH_S = 1.0


class FleetApp(App[None]):
    """The live table of a fleet; ``chosen`` is what to open after it ends (None: quit)."""

    CSS_PATH = "app.tcss"
    TITLE = "eagle3-tui fleet"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("enter", "open", "Open"),
        Binding("space", "mark", "Mark"),
        Binding("c", "compare", "Compare"),
        Binding("k", "kill", "Kill"),
        Binding("r", "resume", "Resume"),
        Binding("s", "sort", "Sort"),
        Binding("S", "sort_reverse", "Reverse", show=False),
        Binding("slash", "filter", "Filter"),
        Binding("escape", "back_to_run", "Back"),
        Binding("F", "back_to_run", "Back", show=False),
    ]

    def __init__(self, fleet: Fleet, back: list[str] | None = None) -> None:
        super().__init__()
        self.fleet = fleet
        self.chosen: list[str] | None = None
        self.back = back
        """Opened with ``F`` from a run's monitor: that monitor's arguments (Esc or ``F``
        goes back to it, as ``F`` or ``q`` there comes back here); None: no way back."""
        self.sort_key = "health"
        self.reverse = False
        self.filter = ""
        self.filtering = False
        """Keys type the filter (``/`` until Enter or Escape): no other key acts meanwhile."""
        self.marked: str | None = None
        self.shown: list[FleetRow] = []
        self._cells: dict[str, tuple[str | Text, ...]] = {}
        self._title_drawn: Text | None = None
        self._columns: list[ColumnKey] = []
        self._drawn: tuple[object, ...] = ()
        self._stop = asyncio.Event()

    def compose(self) -> ComposeResult:
        yield Static(id="fleet-title")
        yield DataTable(id="fleet-table", cursor_type="row", zebra_stripes=True)
        yield Static(id="fleet-cause")
        yield Static(id="fleet-filter")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        self._columns = table.add_columns(" ", *COLUMNS)
        self.query_one("#fleet-filter", Static).display = False
        self.run_worker(self.fleet.run(self._stop), name="fleet", exit_on_error=False)
        self.set_interval(REFRESH_S, self.redraw)
        self.redraw()
        table.focus()

    async def action_quit(self) -> None:
        self._stop.set()
        self.exit()

    def on_unmount(self) -> None:
        self._stop.set()

    # ---- drawing -----------------------------------------------------------------------
    def redraw(self) -> None:
        """The table from the fleet's rows when they, the order, the filter or the mark
        changed (or every 10 s: the checkpoints' ages): cells rewritten in place while
        the same runs stand in the same order (each column made as wide as its widest
        figure now: ``96/144`` becoming ``105/144`` was cut to ``105/14``), the table
        rebuilt otherwise."""
        now = time.time()
        rows = [r for r in self.fleet.rows.values() if matches(r, self.filter)]
        rows = sort_rows(rows, self.sort_key, self.reverse)
        state = (
            self.fleet.generation,
            self.sort_key,
            self.reverse,
            self.filter,
            self.marked,
            int(now // 10),  # ages ("saved 3 min ago") move on
        )
        self._title(rows)
        if state == self._drawn:
            return
        self._drawn = state
        table = self.query_one(DataTable)
        drawn = {r.key: self._row_cells(r, now) for r in rows}
        if [r.key for r in rows] == [r.key for r in self.shown]:
            for key, values in drawn.items():
                if values != self._cells.get(key):
                    for column, value in zip(self._columns, values, strict=True):
                        table.update_cell(key, column, value, update_width=True)
        else:
            selected = self.selected()
            table.clear()
            for key, values in drawn.items():
                table.add_row(*values, key=key)
            if selected is not None and selected.key in drawn:
                table.move_cursor(row=list(drawn).index(selected.key))
        self.shown, self._cells = rows, drawn
        self._cause()

    def _row_cells(self, r: FleetRow, now: float) -> tuple[str | Text, ...]:
        c = cells(r, now)
        health = Text(c[2], style=HEALTH_STYLE.get(r.health, ""))
        return ("●" if r.key == self.marked else " ", *c[:2], health, *c[3:])

    def _title(self, rows: list[FleetRow]) -> None:
        counts: dict[str, int] = {}
        for r in self.fleet.rows.values():
            counts[r.health] = counts.get(r.health, 0) + 1
        said = ", ".join(f"{n} {h}" for h, n in sorted(counts.items()))
        hosts = len(self.fleet.targets)
        line = Text(f"{len(self.fleet.rows)} run(s) on {hosts} target(s)", style="bold")
        if said:
            line.append(f" · {said}")
        line.append(f" · sorted by {self.sort_key}{' ↑' if self.reverse else ''}", style="dim")
        if self.filter:
            line.append(f" · filter: {printable(self.filter)} ({len(rows)} shown)", style="dim")
        for hs in self.fleet.hosts_state.values():
            if hs.problem:
                ago = "" if hs.since is None else f" for {int(time.time() - hs.since)} s"
                line.append(f"\nnot reached{ago}: ", style="bold #ff5f5f")
                line.append(printable(hs.said()))
        if line != self._title_drawn:  # said again only when it changed
            self._title_drawn = line
            self.query_one("#fleet-title", Static).update(line)

    def _cause(self) -> None:
        row = self.selected()
        cause = self.query_one("#fleet-cause", Static)
        if row is None:
            waiting = "Looking for runs…" if not self.fleet.rows else "No run matches the filter."
            cause.update(Text(waiting, style="dim"))
            return
        text = inert(f"{row.host} {row.run}: ", style="bold")
        text.append(printable(row.reason or row.health))
        problem = self.fleet.host_problem(row.host)
        if problem:
            text.append(f"\nhost not reached: {printable(problem)}", style="#ff5f5f")
        cause.update(text)

    @on(DataTable.RowSelected)
    def _selected(self, _event: DataTable.RowSelected) -> None:
        self.action_open()  # Enter on the table (which binds it to select a row)

    @on(DataTable.RowHighlighted)
    def _highlighted(self, _event: DataTable.RowHighlighted) -> None:
        self._cause()

    def selected(self) -> FleetRow | None:
        table = self.query_one(DataTable)
        if not self.shown or table.cursor_row < 0 or table.cursor_row >= len(self.shown):
            return None
        return self.shown[table.cursor_row]

    # ---- keys --------------------------------------------------------------------------
    def action_open(self) -> None:
        if self.filtering:
            self._end_filter()
            return
        row = self.selected()
        if row is None:
            return
        self.chosen = list(row.opens)
        self._stop.set()
        self.exit()

    def action_back_to_run(self) -> None:
        if self.back is not None:
            self.chosen = list(self.back)
            self._stop.set()
            self.exit()

    def action_mark(self) -> None:
        row = self.selected()
        if row is not None:
            self.marked = None if self.marked == row.key else row.key
            self.redraw()

    def action_compare(self) -> None:
        row = self.selected()
        other = self.fleet.rows.get(self.marked) if self.marked else None
        if row is None or other is None or other.key == row.key:
            self.notify("mark a run with space, select another, then c", timeout=5)
            return
        if row.opens[0] == "--pid" or other.opens[0] == "--pid" or "--pid" in other.opens:
            self.notify("a training without telemetry has no history to compare", timeout=5)
            return
        self.chosen = [*row.opens, "--compare", other.opens[0]]
        self._stop.set()
        self.exit()

    def action_kill(self) -> None:
        self._control("kill")

    def action_resume(self) -> None:
        self._control("resume")

    def _control(self, op: str) -> None:
        row = self.selected()
        if row is None:
            return
        control = self.fleet.control_of(row.key)
        if control is None:
            self.notify(f"{row.run}: cannot {op} it from here (open it: Enter)", timeout=5)
            return
        self.push_screen(ControlDialog(op, control))

    def action_sort(self) -> None:
        i = SORT_KEYS.index(self.sort_key)
        self.sort_key = SORT_KEYS[(i + 1) % len(SORT_KEYS)]
        self.redraw()

    def action_sort_reverse(self) -> None:
        self.reverse = not self.reverse
        self.redraw()

    def action_filter(self) -> None:
        self.filtering = True
        self._filter_line()
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """While the filter is typed, only Enter (its end) acts; letters are its text.
        Back only where the fleet was opened from a monitor."""
        if action == "back_to_run" and self.back is None:
            return False
        return not self.filtering or action == "open"

    def on_key(self, event: events.Key) -> None:
        if not self.filtering:
            return
        if event.key == "escape":
            self.filter = ""
            self._end_filter()
        elif event.key == "backspace":
            self.filter = self.filter[:-1]
        elif event.is_printable and event.character:
            self.filter += event.character
        else:
            return  # arrows and the like move in the table meanwhile
        event.stop()
        event.prevent_default()
        self._filter_line()
        self.redraw()

    def _filter_line(self) -> None:
        line = self.query_one("#fleet-filter", Static)
        line.display = self.filtering
        line.update(
            Text.assemble(("/", "bold"), printable(self.filter), ("█", "dim"))
            + Text("  Enter: keep it · Esc: clear it", style="dim")
        )

    def _end_filter(self) -> None:
        self.filtering = False
        self._filter_line()
        self.refresh_bindings()
        self.redraw()
