"""The monitor: one screen of live panels over one run.

Data flows one way. Workers move the transport's chunks into the model
(:class:`~eagle3_tui.app.pipeline.Pipeline`); a timer builds a frozen Snapshot in a
worker thread when the data or the view changed, or every ``CLOCK_REFRESH_S``
(health depends on time), and assigns it; panels bound to it draw. Keys change
the :class:`ViewState` or open a screen; they never block.

Over 600 lines: the App class is where keys, screens, the pipeline's workers and the
refresh timer meet; its logic lives elsewhere (``pipeline.py``, ``run_control.py``,
``screens/``, ``widgets/``).
"""

from __future__ import annotations

import asyncio
import gc
import math
import signal
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from textual import events, on
from textual.app import App, ComposeResult, ScreenStackError, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.notifications import SeverityLevel
from textual.reactive import var
from textual.screen import Screen
from textual.widgets import Footer
from textual.worker import Worker, WorkerState

from eagle3_tui import heap
from eagle3_tui.app.pipeline import (
    Pipeline,
    Source,
    compare_runs,
    export_dirs,
    short_labels,
)
from eagle3_tui.app.run_control import RunControl
from eagle3_tui.app.screens.attach import AttachDialog
from eagle3_tui.app.screens.compare import CompareScreen
from eagle3_tui.app.screens.help import HelpScreen
from eagle3_tui.app.screens.kill_resume import ControlDialog
from eagle3_tui.app.screens.log import LogScreen
from eagle3_tui.app.screens.runs import RunPicker
from eagle3_tui.app.text import clean
from eagle3_tui.app.view import MIN_WINDOW, ViewState
from eagle3_tui.app.widgets.header import HealthBanner, RunHeader
from eagle3_tui.app.widgets.log import LogPanel
from eagle3_tui.app.widgets.panels import AcceptanceTable, DataPanel, GpuPanel, ProgressPanel
from eagle3_tui.app.widgets.plots import AcceptancePlot, LossPlot, MetricPlot
from eagle3_tui.model.inert import printable
from eagle3_tui.model.snapshot import EMPTY, Snapshot
from eagle3_tui.model.verdict import Health
from eagle3_tui.notify import ALARMS
from eagle3_tui.transport.base import Link, LinkChanged
from eagle3_tui.transport.glancing import MIN_GLANCE_BYTES
from eagle3_tui.transport.replies import AttachResult, KillReport, ResumeReport

ENDED = (Health.FINISHED, Health.STOPPED)
"""A run its own records say ended: nothing of it left to stop."""
ACTING = (
    "kill",
    "resume",
    "attach",
    "compare",
    "export",
    "narrower",
    "wider",
    "whole_run",
    "log_scale",
    "smoothing",
)
"""The keys that can act only at times (on the run's host, its steps, the step window):
each offered only where it can act."""
PLOT_KEYS = {
    "log_scale": "log scale: the comparison's plots are linear",
    "smoothing": "smoothing: set on the run's plots; the comparison follows it",
    "narrower": "step window: the comparison shows both runs whole",
    "wider": "step window: the comparison shows both runs whole",
    "whole_run": "step window: the comparison shows both runs whole",
}
"""The keys of the run's own plots (the comparison's are not theirs: they say so)."""
HIDDEN_WHEN_REFUSED = ("attach", "export", "wider", "whole_run")
"""Left out of the footer (not dimmed) while they cannot act: ``a`` for a run that has
telemetry, ``e`` before any step, ``]`` and ``0`` while the whole run is shown (the
footer holds every other key at 80 columns)."""

CLOCK_REFRESH_S = 2.0
"""Rebuild at least this often without new data: silence is judged against the clock."""
DATA_TICKS = 2
"""New data alone is shown at most every this many refresh ticks (1 s at the default
0.5 s): each picture re-renders the header, progress and TTT table and costs a snapshot;
a key (a new view) is shown at the next tick."""
TELEMETRY_LOOK_S = 15.0
"""How often a view of a training without telemetry that logs nothing asks whether it has
telemetry now (each ask starts the agent on the host: ~1 % of a core at this interval,
and only while the view says SILENT or WAITING)."""
STATUS_BUSY_S = 60.0
"""While new steps keep arriving (the trainer writes them: it lives), the periodic probe
asks the host at most this often; each probe starts the agent there (~150 ms of CPU
here, for a local run: every 30 s that was 0.5 % of a core, a sixth of what following
a live run may cost)."""


def tune_collector() -> None:
    """The collector for an app that runs all day: the objects of the start (widgets,
    styles, modules, the history read so far) live as long as the app, so they leave
    the collector's sight (``gc.freeze``; every full collection walked them all again,
    ~28 ms every ~20 s while following a run, 0.13 % of a core); the youngest objects
    are collected every :data:`~eagle3_tui.heap.YOUNG_OBJECTS` allocations."""
    gc.freeze()
    heap.collect_less()


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
        Binding("a", "attach", "Attach"),  # listed only where it can act (check_action)
        Binding("c", "compare", "Comp"),
        Binding("l", "log_scale", "Log"),
        Binding("s", "smoothing", "Smooth"),
        Binding("left_square_bracket", "narrower", "½", key_display="["),
        Binding("right_square_bracket", "wider", "×2", key_display="]"),
        Binding("0", "whole_run", "All"),
        Binding("p", "pause", "Pause"),
        Binding("e", "export", "CSV"),
        Binding("m", "messages", "Msgs", show=False),  # the log panel's title says it
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("F", "fleet", "Fleet", show=False),  # the help and the palette say it
        Binding("q", "quit", "Quit"),
    ]

    # var, not reactive: a reactive of the App repaints the whole screen on each change;
    # the panels bound to these repaint themselves, each only when what it shows changed
    snapshot: var[Snapshot] = var(EMPTY, always_update=True)
    """The picture of the run the panels show (frozen while paused)."""
    link: var[LinkChanged] = var(LinkChanged(Link.CONNECTING))
    """Whether data flows from where the run lives."""
    view: var[ViewState] = var(ViewState())
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
        compare: Source | None = None,
        open_run: Callable[[str], Source] | None = None,
        note: str = "",
        chosen: str = "",
        quit_stops_run: bool = False,
        on_hang_up: Callable[[], None] | None = None,
        glance_min: int | None = MIN_GLANCE_BYTES,
    ) -> None:
        """The monitor of ``source``.

        ``source`` streams the run; ``control`` acts on its host (kill, resume, probes,
        the runs there); ``compare`` streams a previous run to compare with, and
        ``open_run`` opens one picked on the host by its directory; ``note`` says what was
        chosen (a host's live training, its latest run) and why, ``chosen`` in a few words
        for the header; ``quit_stops_run``:
        the caller stops the run after ``q`` (the demo), and after SIGHUP (its terminal
        closed) or SIGTERM, on which the app quits as on ``q`` (``on_hang_up`` is
        called first: the demo starts stopping its run there); ``glance_min``: a file at
        least this long is shown at a glance while it is read whole (app/pipeline.py).
        """
        super().__init__()
        self.source = source
        self.note = note
        """What was chosen and why (a host's live training, its latest run): said at start."""
        self.chosen = chosen
        """The same in a few words, for the header."""
        self.control = control
        self.clock = clock
        self.refresh_interval = refresh_interval
        self.status_interval = status_interval
        self.export_dir = export_dir
        self.glance_min = glance_min
        self.pipeline = Pipeline(clock, glance_min)
        self.open_run = open_run
        """Opens another run of the same host by its directory (the compare picker)."""
        self.quit_stops_run = quit_stops_run
        """``q`` also stops the run (the demo owns its run); the help says which."""
        self.on_hang_up = on_hang_up
        self.fleet_requested = False
        """``F`` ended the monitor: the command line shows the fleet of this host next."""
        self.compare_source = compare
        self.compare_label = compare.label if compare is not None else ""
        self.compare_pipeline: Pipeline | None = None
        self._compared: object = None
        self._shown: tuple[int, object] | None = None
        self._lines_at = -1
        """The generation of the model the snapshot's plotted lines were built from."""
        self._built_at = 0.0
        self._health_seen: str | None = None
        """The verdict last shown (a change under another screen is said: _say_change)."""
        self._building = False
        self._probe_ok = True
        self._probed_at = 0.0
        self._tick_step: int | None = None
        self._step_seen_at = -math.inf
        self._probing = False
        self._refusals: tuple[str | None, ...] = ()
        self._stopped_by_kill = False
        """A kill from this monitor found the run's processes gone: ``r`` is offered at
        once (the host says whether it can resume), ahead of the stream's word."""
        """Why each of :data:`ACTING` cannot act, as the footer last showed it."""
        self._loss_plot = LossPlot("loss", id="loss")
        self._plots: tuple[MetricPlot, ...] = (
            self._loss_plot,
            AcceptancePlot("acceptance", id="acc"),
        )

    # ---- layout -----------------------------------------------------------------
    def compose(self) -> ComposeResult:
        bound = (MonitorApp.snapshot,)
        header = RunHeader(self.source.label, self.chosen)
        yield header.data_bind(*bound, MonitorApp.link, MonitorApp.view)
        yield HealthBanner().data_bind(*bound, MonitorApp.link)
        with Horizontal(id="plots"):
            yield self._loss_plot.data_bind(*bound, MonitorApp.view)
            yield self._plots[1].data_bind(*bound, MonitorApp.view)
        with Horizontal(id="middle"):
            yield AcceptanceTable("per TTT step", id="ttt").data_bind(*bound)
            yield ProgressPanel("progress", id="progress").data_bind(*bound)
        with Horizontal(id="bottom"):
            yield GpuPanel("GPUs", id="gpus").data_bind(*bound)
            yield DataPanel("data", id="data").data_bind(*bound)
        yield LogPanel("log · m: all, whole lines", id="log").data_bind(*bound)
        yield Footer(compact=True, show_command_palette=False)

    owns_process = False
    """Set by the command line, whose process is the app's alone: after the first
    picture the collector is tuned for a long watch (:func:`tune_collector`). Not in
    a test's process, whose objects it would keep."""
    _frozen = False

    def on_mount(self) -> None:
        self._worker(self.pipeline.pump(self.source, self._link_changed), "stream")
        self._worker(self.pipeline.ingest(), "ingest")
        self.set_interval(self.refresh_interval, self._tick, name="refresh")
        if self.compare_source is not None:
            self._start_compare(self.compare_source)
        if self.note:
            self.notify(self.note, title="chosen", timeout=20)
        if self.control is not None and not self.control.observed:
            self._start_probing()
        elif self.control is not None:  # telemetry attached from outside (attach, a script)
            self.set_interval(TELEMETRY_LOOK_S, self._telemetry_tick, name="telemetry")
        if self.quit_stops_run:  # the terminal closed, or a kill: as on q, the run stops too
            loop = asyncio.get_running_loop()
            for hang_up in (signal.SIGHUP, signal.SIGTERM):
                loop.add_signal_handler(hang_up, self._hung_up)

    def _hung_up(self) -> None:
        if self.on_hang_up is not None:
            self.on_hang_up()
        self.exit()

    def on_unmount(self) -> None:
        if self.quit_stops_run:
            loop = asyncio.get_running_loop()
            for hang_up in (signal.SIGHUP, signal.SIGTERM):
                loop.remove_signal_handler(hang_up)
                # the caller stops the run next: a hang-up or a kill then (the terminal
                # closing after q) must not cut that short and leave the training behind
                signal.signal(hang_up, signal.SIG_IGN)

    def _start_probing(self) -> None:
        """The host is asked now, then every ``status_interval`` (see :meth:`_probe_tick`)."""
        self.probe()
        if not self._probing:
            self._probing = True
            self.set_interval(self.status_interval, self._probe_tick, name="status")

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = False,
    ) -> None:
        """Every notification of the monitor (the app's, a screen's, a widget's: Textual
        routes them all here) is inert: what it quotes of the run (a path, an error, a
        host's answer) is shown as written, escapes escaped, its markup never parsed
        (``markup`` is accepted as Textual passes it, and never honoured)."""
        super().notify(
            clean(message), title=clean(title), severity=severity, timeout=timeout, markup=False
        )

    def _link_changed(self, event: LinkChanged) -> None:
        self.link = event

    # ---- which keys can act -----------------------------------------------------
    def refusal(self, action: str) -> str | None:
        """Why ``action`` cannot act on the run as shown now, in one line (None: it can).

        ``r`` only where a resume can act: a run that stopped or died with a checkpoint
        to resume from (a training without telemetry: once it exited, its kill recorded
        the restart); ``k`` not on a run that ended with nothing of it left; ``a`` only
        for a live training without telemetry (and only that training: see
        :meth:`RunControl.attach_plan`); ``e`` only once a step is logged; ``]`` and ``0``
        only while a step window is set, ``[`` until the narrowest."""
        if action not in ACTING or (action == "compare" and self.compare_pipeline is not None):
            return None
        if action in PLOT_KEYS:
            stack = self.screen_stack  # (empty while the app starts or ends: no screen)
            if stack and isinstance(stack[-1], CompareScreen):  # its plots are not the run's
                return f"{PLOT_KEYS[action]} (c: back to the run's plots)"
            if action in ("log_scale", "smoothing"):
                return None
        window = self.view.window
        if action in ("wider", "whole_run"):
            return None if window is not None else "the whole run is shown already"
        if action == "narrower":
            return f"the narrowest window: {MIN_WINDOW} steps" if window == MIN_WINDOW else None
        if action == "export":
            filling = self.pipeline.filling
            if filling is not None:  # the table holds the newest steps only, for now
                return (
                    f"export: the history is still being read ({filling:.0%}): press e again soon"
                )
            if len(self.pipeline.run.unsettled.table):
                return None
            if self.snapshot.observed is not None:
                return "export: no per-step metrics without telemetry: nothing to write"
            return "export: no step logged yet: nothing to write"
        if self.control is None:
            return f"{action}: this view has no run host to act on"
        snap = self.snapshot
        health, observed = snap.health, snap.observed
        if action == "kill" and health in ENDED and all(x.gone for x in snap.leftovers):
            return f"kill: the run {health.value}: nothing to kill"
        if action == "resume":
            return self._resume_refusal(snap)
        if action == "attach":
            if observed is not None:
                return (
                    None if observed.alive else "attach: the training exited: nothing to attach to"
                )
            launched_with = self.pipeline.run.unsettled.manifest  # written by its telemetry
            if not self.control.observed and (snap.records or launched_with):
                return "attach: this run already writes telemetry: nothing to attach"
        return None

    def _resume_refusal(self, snap: Snapshot) -> str | None:
        health, observed = snap.health, snap.observed
        # (not "the run is running": it may be stalled, or held stopped by a SIGSTOP)
        held = self.pipeline.run.unsettled.liveness.process_state in ("T", "t")
        how = "held stopped" if held else health.value
        running: str | None = (
            f"resume: its trainer is still alive ({how}): nothing to resume (k stops it first)"
        )
        if self._stopped_by_kill:
            running = None  # the kill saw it stop; the stream's word may come later
        if health == Health.FINISHED:  # with telemetry or without: it ran to its end
            return "resume: the run finished: nothing to resume"
        if observed is not None:
            return running if observed.alive else None
        # the last probe's answer (None: none yet); a run its records say stopped is
        # offered even before the next probe: the dialog asks the host again
        alive = self.pipeline.run.unsettled.liveness.process_alive
        if health not in (*ENDED, Health.DEAD) and (
            alive or (alive is None and health != Health.WAITING)
        ):
            return running
        if not snap.records:
            return "resume: nothing of the run read yet"
        if not any(c.event == "save_finished" for c in snap.checkpoints):
            return "resume: no checkpoint saved: nothing to resume from"
        return None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The footer dims the keys that cannot act now (:data:`HIDDEN_WHEN_REFUSED`:
        leaves them out); pressed, each says why (:meth:`on_key`)."""
        if self.refusal(action) is None:
            return True
        return False if action in HIDDEN_WHEN_REFUSED else None

    def on_key(self, event: events.Key) -> None:
        """A key of the monitor that cannot act now says why, in one line. Only where
        the key is the monitor's: not a screen's own (``a`` on the comparison), nor in a
        dialog (whose chain of bindings ends at itself)."""
        for namespace, bindings in self.screen._modal_binding_chain:
            found = bindings.key_to_bindings.get(event.key, ())
            if not found:
                continue
            if namespace is not self:
                return  # the key of a screen or widget in front of the monitor
            for binding in found:
                reason = self.refusal(binding.action)
                if reason is not None and self._probed_alive(binding.action):
                    event.stop()  # the host asked again first: a kill may have ended it since
                    self._worker(self._ask_again(binding.action), "status")
                elif reason is not None:
                    self.notify(reason, severity="warning")
                    event.stop()
            return

    def _probed_alive(self, action: str) -> bool:
        """``r`` refused on the last probe's word alone that the trainer lives (a run
        with telemetry): that word may be older than a kill that ended it (from the
        command line, another monitor): the host is asked again before it is said."""
        if action != "resume" or self.control is None or self.control.observed:
            return False
        return self.pipeline.run.unsettled.liveness.process_alive is True

    async def _ask_again(self, action: str) -> None:
        """The host's answer now, then ``action``, or why not on that answer."""
        await self._probe()
        reason = self.refusal(action)
        if reason is not None:
            self.notify(reason, severity="warning")
            return
        await self.run_action(action)

    def watch_snapshot(self) -> None:
        """The footer follows what the keys can do (a run that ends, a probe's answer);
        a change of verdict while another screen is up is said there."""
        self._refresh_keys()
        self._say_change(self.snapshot)

    def _say_change(self, snap: Snapshot) -> None:
        """A change of the run's verdict while another screen covers the header (help,
        the log, a dialog, the comparison): a toast on that screen, and the bell when it
        needs a human — as ``watch`` would alert (``notify.ALARMS``)."""
        health = snap.health.value
        before, self._health_seen = self._health_seen, health
        if before is None or health == before or len(self.screen_stack) <= 1:
            return
        alarm = health in ALARMS
        if not alarm and not (health in ("finished", "stopped") or before in ALARMS):
            return  # waiting <-> running: nothing to say
        word = "RECOVERED" if health in ("running", "waiting") else snap.diagnosis.label
        if snap.diagnosis.link_down_since is not None:  # the alarm named, as the header does
            word = f"{snap.diagnosis.label}, last known {health.upper().replace('_', ' ')}"
        self.notify(
            printable(snap.diagnosis.reason)[:400],
            title=f"the run: {word}",
            severity="error" if alarm else "information",
            timeout=30,
        )
        if alarm:
            self.bell()

    def watch_view(self) -> None:
        self._refresh_keys()  # the window keys: ] and 0 once a window is set

    def _refresh_keys(self) -> None:
        refusals = tuple(self.refusal(action) for action in ACTING)
        if refusals != self._refusals:
            self._refusals = refusals
            self.refresh_bindings()

    # ---- refresh ----------------------------------------------------------------
    def _columns(self) -> int:
        return self._loss_plot.content_size.width or 100

    async def _tick(self) -> None:
        """Build and show a new snapshot when the data or the view changed, or the clock
        matters; while paused, only count how far behind the picture is."""
        if self._building:
            return
        try:
            screen = self.screen
        except ScreenStackError:  # a tick during shutdown: no screen left to draw on
            return
        if isinstance(screen, CompareScreen):
            await self._tick_compare(screen)
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
        view_key = (params,)
        generation = self.pipeline.generation
        key = (generation, view_key)
        since = time.monotonic() - self._built_at
        data_only = self._shown is not None and view_key == self._shown[1]
        # the plotted lines cost most of a snapshot: built only when a chart would draw
        charts_due = not data_only or any(plot.data_due() for plot in self._plots)
        lines_behind = charts_due and self._lines_at != generation
        if key == self._shown and since < CLOCK_REFRESH_S and not lines_behind:
            return
        if data_only and since < DATA_TICKS * self.refresh_interval * 0.95:
            return  # new data alone: at most every DATA_TICKS ticks; a key: at the next
        self._building = True
        pipeline = self.pipeline
        try:
            snap, generation = await pipeline.snapshot(self.clock(), params, charts_due)
        finally:
            self._building = False
        if self.view.paused and not view.paused:
            return  # paused while it was built: keep the frozen picture
        if pipeline is not self.pipeline:
            return  # another run is followed now: its own picture comes next
        self._built_at = time.monotonic()
        self._shown = (generation, view_key)  # what was built, not what is now
        if charts_due:
            self._lines_at = generation
        self.snapshot = snap
        if self.owns_process and not self._frozen:
            self._frozen = True
            self.call_after_refresh(tune_collector)

    async def _tick_compare(self, screen: CompareScreen) -> None:
        other = self.compare_pipeline
        if other is None:
            return
        plots = screen.query("#cmp-loss")
        if not plots:  # pushed, not composed yet: a tick can come first
            return
        width = plots.first().content_size.width or 100
        params = replace(self.view.params(width), smoothing=max(self.view.smoothing, 0.6))
        key = (self.pipeline.generation, other.generation, screen.axis, params)
        if time.monotonic() - self._built_at >= CLOCK_REFRESH_S:  # its verdict, under it
            self._built_at = time.monotonic()
            main, _ = await self.pipeline.snapshot(self.clock(), self.view.params(100), False)
            self.snapshot = main
        if key == self._compared:
            return
        self._building = True
        try:
            labels = short_labels(self.source.label, self.compare_label)
            comparison = await compare_runs(self.pipeline, other, screen.axis, params, labels)
        finally:
            self._building = False
        self._compared = key
        screen.comparison = comparison

    def _start_compare(self, source: Source) -> None:
        """Read another run alongside this one (its own model, stream and worker)."""
        self.compare_source = source
        self.compare_label = source.label
        self.compare_pipeline = other = Pipeline()
        self._compared = None
        self._worker(other.pump(source, lambda _event: None), "compare-stream")
        self._worker(other.ingest(), "compare-ingest")
        control = RunControl.for_source(source)
        if control is not None:  # its manifest: the recipe half of "what differs"
            self._worker(self._probe_compared(control, other), "compare-status")

    def _worker(self, work: Coroutine[Any, Any, object], name: str) -> None:
        """Run ``work`` as the one worker of its group ``name`` (a new one replaces the
        old); an error ends the worker, not the app."""
        self.run_worker(work, name=name, group=name, exclusive=True, exit_on_error=False)

    async def _probe_compared(self, control: RunControl, other: Pipeline) -> None:
        from eagle3_tui.transport.base import TargetError

        try:
            status = await control.status()
        except TargetError:
            return  # no manifest (a user's own writer): compared on its records alone
        await other.set_status(status, self.clock())

    @property
    def is_current(self) -> bool:
        """Whether the picture shows all the data read, for the view and width of now."""
        return self._shown == (self.pipeline.generation, self._view_key(self.view))

    @property
    def lines_current(self) -> bool:
        """Whether the picture's plotted lines hold all the data read (they are built
        only when a chart is due to draw: see :meth:`_tick`)."""
        return self._lines_at == self.pipeline.generation

    def _view_key(self, view: ViewState) -> object:
        return (view.params(self._columns()),)

    def _probe_tick(self, now: float | None = None) -> None:
        """The periodic probe, skipped while steps arrive (for up to ``STATUS_BUSY_S``):
        a tick without a new step for two intervals asks, so a dead trainer is told at
        most one interval later than before. ``now``: a monotonic time (tests)."""
        now = time.monotonic() if now is None else now
        step = self.pipeline.global_step
        if step != self._tick_step:
            self._tick_step, self._step_seen_at = step, now
        busy = now - self._step_seen_at < 2 * self.status_interval
        if busy and now - self._probed_at < STATUS_BUSY_S:
            return
        self.probe(now)

    def probe(self, now: float | None = None) -> None:
        """Ask the host whether the trainer lives (and for its manifest)."""
        if self.control is not None and self._probe_ok:
            self._probed_at = time.monotonic() if now is None else now
            self._worker(self._probe(), "status")

    async def _probe(self) -> None:
        assert self.control is not None
        from eagle3_tui.transport.base import TargetError
        from eagle3_tui.transport.channel import AgentAnswerError
        from eagle3_tui.transport.replies import ErrorKind

        try:
            status = await self.control.status()
        except AgentAnswerError as e:
            if e.kind is ErrorKind.NO_MANIFEST:
                self._probe_ok = False  # a run without a manifest: judged from its records
            return
        except TargetError:
            return  # unreachable for now: the stream's link state says so
        await self.pipeline.set_status(status, self.clock())

    @on(ControlDialog.Finished)
    @on(AttachDialog.Finished)
    def _control_finished(self, event: ControlDialog.Finished | AttachDialog.Finished) -> None:
        if self._follow_new_run(event.result):
            return
        result = event.result
        if isinstance(result, KillReport) and result.status in ("stopped", "not_running"):
            self._stopped_by_kill = True
            self._refresh_keys()
        if isinstance(result, ResumeReport) and result.status == "started" and self.chosen:
            # the header named the process it followed ("telemetry attached: pid N"),
            # which has exited: the one resumed in its place
            self.chosen = f"resumed: pid {result.pid}" if result.pid else "resumed"
            self.query_one(RunHeader).show_target(self.source.label, self.chosen)
        self._probe_ok = True
        self.probe()

    def _follow_new_run(self, result: object) -> bool:
        """After ``r`` or ``a`` on a training without telemetry, the monitor follows the run
        directory its metrics now go to, as if it had been opened on it: a restart's (the
        one its kill recorded), or the one an attach made (the view from outside said
        SILENT, "no metric has been logged", while they flowed). Whether it did."""
        run_dir, chosen = None, ""
        if isinstance(result, ResumeReport) and result.status == "started" and result.restart:
            run_dir, chosen = result.run_dir, f"restarted with telemetry: pid {result.pid}"
        elif isinstance(result, AttachResult) and result.status in ("attached", "already"):
            run_dir = result.run_dir
            chosen = f"telemetry attached: pid {result.pid}" if result.pid else "telemetry attached"
        control = self.control
        if run_dir is None or control is None or not control.observed or self.open_run is None:
            return False
        if control.host_is_local:  # its CSV goes where its records are, as any local run's
            self.export_dir = Path(run_dir) / "exports"
        self.follow(self.open_run(run_dir), control.of_run(run_dir), chosen)
        return True

    def _telemetry_tick(self) -> None:
        """While a training without telemetry is said to log nothing (SILENT, WAITING),
        ask the host whether it has telemetry now: an ``eagle3-tui attach`` from another
        terminal, or a script's ``attach()``, left this view saying "no handler" while
        its metrics flowed."""
        control, observed = self.control, self.snapshot.observed
        if control is None or not control.observed or observed is None or not observed.alive:
            return
        if self.snapshot.health in (Health.SILENT, Health.WAITING):
            self._worker(self._look_for_telemetry(control), "telemetry")

    async def _look_for_telemetry(self, control: RunControl) -> None:
        from eagle3_tui.transport.base import TargetError

        try:
            status = await control.status()
        except TargetError:  # gone, unreachable: the stream says so
            return
        row = status.row
        if control is not self.control or row is None or not row.telemetry or not row.run_dir:
            return
        if self.open_run is None:
            return
        if control.host_is_local:
            self.export_dir = Path(row.run_dir) / "exports"
        chosen = f"telemetry found (attached since this view opened): pid {row.pid}"
        self.follow(self.open_run(row.run_dir), control.of_run(row.run_dir), chosen)

    def follow(self, source: Source, control: RunControl, chosen: str) -> None:
        """Show another run in place of this one: a model of its own fed by ``source``
        (the old stream ends), acted on and probed through ``control``; the header says
        what is followed now, and why (``chosen``)."""
        self.source, self.control, self.chosen = source, control, chosen
        self.pipeline = Pipeline(self.clock, self.glance_min)
        self._shown, self._lines_at, self._probe_ok = None, -1, True
        self._stopped_by_kill = False
        self.query_one(RunHeader).show_target(source.label, chosen)
        self._worker(self.pipeline.pump(source, self._link_changed), "stream")
        self._worker(self.pipeline.ingest(), "ingest")
        self.notify(f"{chosen}; following {source.label}", title="following", timeout=20)
        self._start_probing()

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

    def action_messages(self) -> None:
        self.push_screen(LogScreen())

    def action_fleet(self) -> None:
        """``F``: every live and recent run of this host, one row each (``fleet``); the
        run goes on. The demo's own run would stop with it: said, not done."""
        if self.quit_stops_run:
            self.notify("the demo stops its run on leaving: eagle3-tui fleet localhost, elsewhere")
            return
        self.fleet_requested = True
        self.exit()

    def action_kill(self) -> None:
        if self.control is not None:  # else refused (check_action)
            self.push_screen(ControlDialog("kill", self.control))

    def action_resume(self) -> None:
        if self.control is not None:
            self.push_screen(ControlDialog("resume", self.control))

    def action_attach(self) -> None:
        """Telemetry into the live training without it, written into this run directory."""
        if self.control is not None:
            self.push_screen(AttachDialog(self.control))

    def action_compare(self) -> None:
        """The comparison with the run given by --compare, or one picked on the host."""
        if self.compare_pipeline is not None:
            self.push_screen(CompareScreen(self.compare_label))
            return
        self.action_pick_compared()

    def action_pick_compared(self) -> None:
        """Pick the run to compare with among the host's runs (``o`` on the comparison:
        another one in its place)."""
        control = self.control
        if control is None:
            self.notify("compare: this view has no run host to list runs on", severity="warning")
            return

        def picked(run_dir: str | None) -> None:
            if run_dir is None:
                return
            if self.open_run is None:
                self.notify("this source cannot open another run", severity="warning")
                return
            if isinstance(self.screen, CompareScreen):
                self.pop_screen()  # the comparison with the run picked before
            self._start_compare(self.open_run(run_dir))
            self.push_screen(CompareScreen(self.compare_label))

        manifest = self.pipeline.run.unsettled.manifest
        self.push_screen(RunPicker(control, control.run_dir, manifest), picked)

    def action_export(self) -> None:
        self._worker(self._export(), "export")

    async def _export(self) -> None:
        window = self.view.window
        failed: list[str] = []
        for folder in export_dirs(self.export_dir):  # the run's own folder, else ours
            try:
                path, rows = await self.pipeline.export_csv(folder, self.source.label, window)
            except OSError as e:
                failed.append(f"{folder}: {e.strerror or e}")
                continue
            note = f" ({failed[0]})" if failed else ""
            self.notify(f"{rows:,} steps written to {path}{note}", title="export", timeout=12)
            return
        self.notify(f"export failed: {'; '.join(failed)}", severity="error", timeout=12)

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for binding in self.BINDINGS:
            assert isinstance(binding, Binding)
            if binding.action in ("quit",):
                continue
            yield SystemCommand(
                f"{binding.description} ({binding.key_display or binding.key})",
                _HELP.get(binding.action, binding.description),
                lambda action=binding.action: self._run_or_say(action),
            )

    async def _run_or_say(self, action: str) -> None:
        """A palette entry: the action, or why it cannot act now (as its key says)."""
        reason = self.refusal(action)
        if reason is not None and self._probed_alive(action):
            await self._ask_again(action)
            return
        if reason is not None:
            self.notify(reason, severity="warning")
            return
        await self.run_action(action)


_HELP = {
    "kill": "Stop the run: confirm, a stop at its next step boundary (else SIGTERM), "
    "checkpoint saved, every process verified gone",
    "resume": "Relaunch a stopped or dead run from its latest complete checkpoint",
    "compare": "Compare with a previous run (--compare, or picked on the host)",
    "log_scale": "Toggle a log axis for the loss",
    "smoothing": "Cycle smoothing: off, 0.6, 0.9, 0.99",
    "narrower": "Halve the step window",
    "wider": "Double the step window",
    "whole_run": "Show the whole run",
    "pause": "Freeze the view (data keeps being read)",
    "export": "Write the window's step columns as CSV (the run's exports/ folder)",
    "messages": "Every log message and event, whole lines, scrollable",
    "attach": "Add telemetry to this training, which has none, without restarting it",
    "help": "Keys and panels",
    "fleet": "Every live and recent run of this host, one row each (the run goes on)",
}


make_app = MonitorApp
"""The one way to build the monitor: the CLI and the tests both come through here
(its arguments: :meth:`MonitorApp.__init__`)."""
