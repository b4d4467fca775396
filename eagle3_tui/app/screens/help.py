"""``?``: the keys and what each panel shows."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from eagle3_tui.app.widgets.plots import TAU_MIN_HEIGHT

KEYS = (
    (
        "k",
        "kill the run: confirm, a stop at its next step boundary (else SIGTERM), "
        "checkpoint saved, then verified",
    ),
    ("r", "resume a stopped or dead run from its latest complete checkpoint; new PID"),
    ("a", "attach telemetry to this training when it has none (metrics into its dir)"),
    ("", "a key that cannot act now is dimmed (a: hidden); pressed, it says why"),
    ("c", "compare with a previous run on the same host; there: a changes the axis"),
    ("", "(step, tokens, time), o picks another run, c or Esc goes back"),
    ("l", "log scale for the loss (points ≤ 0 are left out and counted)"),
    ("s", "smoothing: off / 0.6 / 0.9 / 0.99 (EMA weight per step, as TensorBoard)"),
    ("[ ]", "halve / double the step window (the last N steps)"),
    ("0", "the whole run"),
    ("", "the plots' titles show the window, the smoothing and the log scale"),
    ("p", "pause the view (data is still read; shows how far behind it is)"),
    ("e", "export the window's step columns as CSV: a local run's exports/ folder,"),
    ("", "else ~/.local/share/eagle3-tui/exports; the full path is shown"),
    ("m", "every log message and event, whole lines, scrollable"),
    ("F", "the fleet: every live and recent run of this host, one row each (Enter opens"),
    ("", "one here, and F or q there comes back; Esc or F in the fleet comes back to"),
    ("", "this run); this run goes on"),
    ("?", "this help"),
    ("ctrl+p", "command palette: every action by name"),
)
QUIT_KEEPS_RUN = ("q", "quit; the run goes on")
QUIT_STOPS_RUN = ("q", "quit and stop the demo's run (checkpoint saved; takes a few seconds)")

PANELS = (
    ("loss", "train loss per step, raw (grey) and smoothed; per TTT step k (dim, coloured"),
    ("", "as in acceptance); ◆ validation loss per epoch"),
    ("acceptance", "full accuracy per TTT step (bright), conditional (dim); τ in a strip"),
    ("", f"underneath where the panel has {TAU_MIN_HEIGHT} rows (always in the TTT table)"),
    ("TTT table", "latest loss, full and conditional accuracy per TTT step; τ and its trend"),
    ("progress", "epoch, step, steps/s, tokens/s, ETA, checkpoints (a save in progress)"),
    ("GPUs", "utilisation and memory bars, power, temperature, utilisation sparkline"),
    ("data", "bytes and files read per second, per worker, latest files, data starvation;"),
    ("", "without telemetry, the training's processes: CPU, memory, reads, stuck states"),
    ("log", "the trainer's messages and lifecycle events; malformed / lost record counts"),
)


def help_text(quit_stops_run: bool = False) -> Table:
    """The keys (``q`` as it behaves in this session) and the panels."""
    table = Table(box=None, show_header=False, padding=(0, 2, 0, 0))
    table.add_column(style="bold #5fd7ff", no_wrap=True)
    table.add_column()
    for key, what in (*KEYS, QUIT_STOPS_RUN if quit_stops_run else QUIT_KEEPS_RUN):
        table.add_row(key, what)
    table.add_row("", "")
    for name, what in PANELS:
        table.add_row(Text(name, style="bold"), what)
    return table


class HelpScreen(ModalScreen[None]):
    """The keys and the panels."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,question_mark,q", "dismiss", "Close"),
    ]

    def compose(self) -> ComposeResult:
        box = VerticalScroll(id="help")
        box.border_title = "eagle3-tui · keys and panels"
        with box:
            yield Static(help_text(bool(getattr(self.app, "quit_stops_run", False))))

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
