"""The monitor: one screen of live panels over one run.

Data flows one way. Workers move the transport's chunks into the model
(:class:`~eagle3_tui.app.pipeline.Pipeline`); a timer builds a frozen Snapshot in a
worker thread when the data or the view changed, or every ``CLOCK_REFRESH_S``
(health depends on time), and assigns it; panels bound to it draw. Keys change
the :class:`ViewState` or open a screen; they never block.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

from textual import on
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer
from textual.worker import Worker, WorkerState

from eagle3_tui.app.control import RunControl
from eagle3_tui.app.pipeline import Pipeline, Source, export_name
from eagle3_tui.app.screens.control import ControlDialog
from eagle3_tui.app.screens.help import HelpScreen
from eagle3_tui.app.screens.runs import RunPicker
from eagle3_tui.app.text import clean
from eagle3_tui.app.view import ViewState
from eagle3_tui.app.widgets.header import HealthBanner, RunHeader
from eagle3_tui.app.widgets.log import LogPanel
from eagle3_tui.app.widgets.panels import AcceptanceTable, DataPanel, GpuPanel, ProgressPanel
from eagle3_tui.app.widgets.plots import AcceptancePlot, LossPlot
from eagle3_tui.model.snapshot import EMPTY, Snapshot
from eagle3_tui.transport.base import Link, LinkChanged

CLOCK_REFRESH_S = 2.0
"""Rebuild at least this often without new data: silence is judged against the clock."""


class MonitorApp(App[None]):
    """Live view of one EAGLE-3 training run."""

    CSS_PATH = "app.tcss"
    TITLE = "eagle3-tui"
    # Screen classes for the stylesheet (App declares these as plain attributes).
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]  # noqa: RUF012
    VERTICAL_BREAKPOINTS = [(0, "-short"), (32, "-tall")]  # noqa: RUF012
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("k", "kill", "Kill"),
        Binding("r", "resume", "Resume"),
        Binding("c", "compare", "Compare"),
        Binding("l", "log_scale", "Log"),
        Binding("s", "smoothing", "Smooth"),
        Binding("left_square_bracket", "narrower", "½", key_display="["),
        Binding("right_square_bracket", "wider", "×2", key_display="]"),
        Binding("0", "whole_run", "All"),
        Binding("p", "pause", "Pause"),
        Binding("e", "export", "CSV"),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("q", "quit", "Quit"),
    ]

    snapshot: reactive[Snapshot] = reactive(EMPTY, always_update=True)
    """The picture of the run the panels show (frozen while paused)."""
    link: reactive[LinkChanged] = reactive(LinkChanged(Link.CONNECTING))
    """Whether data flows from where the run lives."""
    view: reactive[ViewState] = reactive(ViewState())
    """Step window, smoothing, log scale, pause."""

    def __init__(
        self,
        source: Source,
        *,
        control: RunControl | None = None,
        clock: Callable[[], float] = time.time,
        refresh_interval: float = 0.5,
        status_interval: float = 5.0,
        export_dir: Path | None = None,
    ) -> None:
        super().__init__()
        self.source = source
        self.control = control
        self.clock = clock
        self.refresh_interval = refresh_interval
        self.status_interval = status_interval
        self.export_dir = export_dir
        self.pipeline = Pipeline()
        self._shown: tuple[int, object] | None = None
        self._built_at = 0.0
        self._building = False
        self._probe_ok = True
        self._loss_plot = LossPlot("loss", id="loss")

    # ---- layout -----------------------------------------------------------------
    def compose(self) -> ComposeResult:
        bound = (MonitorApp.snapshot,)
        yield RunHeader(self.source.label).data_bind(*bound, MonitorApp.link, MonitorApp.view)
        yield HealthBanner().data_bind(*bound, MonitorApp.link)
        with Horizontal(id="plots"):
            yield self._loss_plot.data_bind(*bound, MonitorApp.view)
            yield AcceptancePlot("acceptance", id="acc").data_bind(*bound, MonitorApp.view)
        with Horizontal(id="middle"):
            yield AcceptanceTable("per TTT step", id="ttt").data_bind(*bound)
            yield ProgressPanel("progress", id="progress").data_bind(*bound)
        with Horizontal(id="bottom"):
            yield GpuPanel("GPUs", id="gpus").data_bind(*bound)
            yield DataPanel("data", id="data").data_bind(*bound)
        yield LogPanel("log", id="log").data_bind(*bound)
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.run_worker(
            self.pipeline.pump(self.source, self._link_changed),
            name="stream",
            group="stream",
            exclusive=True,
            exit_on_error=False,
        )
        self.run_worker(
            self.pipeline.ingest(),
            name="ingest",
            group="ingest",
            exclusive=True,
            exit_on_error=False,
        )
        self.set_interval(self.refresh_interval, self._tick, name="refresh")
        if self.control is not None:
            self.probe()
            self.set_interval(self.status_interval, self.probe, name="status")

    def _link_changed(self, event: LinkChanged) -> None:
        self.link = event

    # ---- refresh ----------------------------------------------------------------
    def _columns(self) -> int:
        return self._loss_plot.content_size.width or 100

    async def _tick(self) -> None:
        """Build and show a new snapshot when the data or the view changed, or the clock
        matters; while paused, only count how far behind the picture is."""
        if self._building:
            return
        view = self.view
        if view.paused:
            shown = self.snapshot.global_step or 0
            behind = max(0, (self.pipeline.global_step or 0) - shown)
            if behind != view.behind:
                self.view = replace(view, behind=behind)
            if self._shown is not None and self._shown[1] == self._view_key(view):
                return
        params = view.params(self._columns())
        key = (self.pipeline.generation, self._view_key(view))
        fresh = time.monotonic() - self._built_at < CLOCK_REFRESH_S
        if key == self._shown and fresh:
            return
        self._building = True
        try:
            snap, generation = await self.pipeline.snapshot(self.clock(), params)
        finally:
            self._building = False
        self._built_at = time.monotonic()
        self._shown = (generation, self._view_key(view))
        self.snapshot = snap

    def _view_key(self, view: ViewState) -> object:
        return (view.params(self._columns()),)

    def probe(self) -> None:
        """Ask the host whether the trainer lives (and for its manifest)."""
        if self.control is not None and self._probe_ok:
            self.run_worker(
                self._probe(),
                name="status",
                group="status",
                exclusive=True,
                exit_on_error=False,
            )

    async def _probe(self) -> None:
        assert self.control is not None
        from eagle3_tui.transport.base import TargetError

        try:
            status = await self.control.status()
        except TargetError as e:
            if "no run.json" in str(e) or "not a run manifest" in str(e):
                self._probe_ok = False  # a run without a manifest: judged from its records
            return  # unreachable for now: the stream's link state says so
        await self.pipeline.set_status(status, self.clock())

    @on(ControlDialog.Finished)
    def _control_finished(self, event: ControlDialog.Finished) -> None:
        self._probe_ok = True
        self.probe()

    @on(Worker.StateChanged)
    def _worker_failed(self, event: Worker.StateChanged) -> None:
        """Every worker error of the app ends here: shown, never a traceback."""
        if event.state != WorkerState.ERROR or event.worker.error is None:
            return
        err = event.worker.error
        message = clean(f"{type(err).__name__}: {err}")
        if event.worker.group == "stream":
            self.link = LinkChanged(Link.REFUSED, message)
        self.notify(f"{event.worker.name}: {message}", severity="error", timeout=10)

    # ---- actions ----------------------------------------------------------------
    def action_log_scale(self) -> None:
        self.view = replace(self.view, log_scale=not self.view.log_scale)

    def action_smoothing(self) -> None:
        self.view = self.view.next_smoothing()

    def action_narrower(self) -> None:
        steps = (self.pipeline.global_step or 0) + 1
        self.view = self.view.narrower(steps)

    def action_wider(self) -> None:
        steps = (self.pipeline.global_step or 0) + 1
        self.view = self.view.wider(steps)

    def action_whole_run(self) -> None:
        self.view = self.view.whole_run()

    def action_pause(self) -> None:
        paused = not self.view.paused
        self.view = replace(self.view, paused=paused, behind=0)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def _need_control(self, what: str) -> RunControl | None:
        if self.control is None:
            self.notify(f"{what}: this view has no run host to act on", severity="warning")
        return self.control

    def action_kill(self) -> None:
        control = self._need_control("kill")
        if control is not None:
            self.push_screen(ControlDialog("kill", control))

    def action_resume(self) -> None:
        control = self._need_control("resume")
        if control is not None:
            self.push_screen(ControlDialog("resume", control))

    def action_compare(self) -> None:
        control = self._need_control("compare")
        if control is None:
            return

        def picked(run_dir: str | None) -> None:
            if run_dir is not None:
                self.notify(
                    f"picked {clean(run_dir)}; the comparison view is issue 7 "
                    "(meanwhile: eagle3-tui compare A B)",
                    title="compare",
                    timeout=8,
                )

        self.push_screen(RunPicker(control, control.run_dir), picked)

    def action_export(self) -> None:
        self.run_worker(
            self._export(), name="export", group="export", exclusive=True, exit_on_error=False
        )

    async def _export(self) -> None:
        snap = self.snapshot
        window = self.view.window
        last = snap.global_step
        first = None if last is None else (max(0, last - window + 1) if window else 0)
        name = export_name(self.source.label, first, last)
        path = (self.export_dir or Path.cwd()) / name
        try:
            path, rows = await self.pipeline.export_csv(path, window)
        except OSError as e:
            self.notify(clean(f"export failed: {e}"), severity="error", timeout=10)
            return
        self.notify(clean(f"{rows:,} steps written to {path}"), title="export", timeout=8)

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for binding in self.BINDINGS:
            assert isinstance(binding, Binding)
            if binding.action in ("quit",):
                continue
            yield SystemCommand(
                f"{binding.description} ({binding.key_display or binding.key})",
                _HELP.get(binding.action, binding.description),
                lambda action=binding.action: self.run_action(action),  # type: ignore[misc]
            )


_HELP = {
    "kill": "Stop the run: confirm, SIGTERM, checkpoint saved, verified",
    "resume": "Relaunch the run from its latest complete checkpoint",
    "compare": "Pick a previous run on the host to compare with",
    "log_scale": "Toggle a log axis for the loss",
    "smoothing": "Cycle smoothing: off, 0.6, 0.9, 0.99",
    "narrower": "Halve the step window",
    "wider": "Double the step window",
    "whole_run": "Show the whole run",
    "pause": "Freeze the view (data keeps being read)",
    "export": "Write the window's columns as CSV in the current directory",
    "help": "Keys and panels",
}


def make_app(
    source: Source,
    *,
    control: RunControl | None = None,
    clock: Callable[[], float] = time.time,
    refresh_interval: float = 0.5,
    status_interval: float = 5.0,
    export_dir: Path | None = None,
) -> MonitorApp:
    """The one way to build the monitor: the CLI and the tests both come through here."""
    return MonitorApp(
        source,
        control=control,
        clock=clock,
        refresh_interval=refresh_interval,
        status_interval=status_interval,
        export_dir=export_dir,
    )
