"""The Textual app: one screen of live panels over one run.

Data flows one way: the transport's chunks are fed to the model in a worker
thread; a timer builds a frozen Snapshot (off the UI thread) when something
changed and assigns it; widgets draw it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import ClassVar, Protocol

from textual import on
from textual.app import App, ComposeResult
from textual.containers import Horizontal
from textual.reactive import reactive
from textual.widgets import Footer
from textual.worker import Worker, WorkerState

from eagle3_tui.app.widgets import MetricsTable, SeriesPlot, StatusLine
from eagle3_tui.model.run import Run
from eagle3_tui.model.snapshot import EMPTY, Snapshot, ViewParams, build_snapshot
from eagle3_tui.transport.base import Chunk, Link, LinkChanged, StreamEvent


class Source(Protocol):
    """Where the app's bytes come from (LocalTransport, SshTransport, a replay)."""

    @property
    def label(self) -> str: ...

    def stream(self, offset: int = 0) -> AsyncIterator[StreamEvent]: ...


class MonitorApp(App[None]):
    """Live view of one EAGLE-3 training run."""

    CSS_PATH = "app.tcss"
    TITLE = "eagle3-tui"
    BINDINGS: ClassVar = [("q", "quit", "Quit")]

    snapshot: reactive[Snapshot] = reactive(EMPTY, always_update=True)
    """The latest frozen picture of the run; panels are bound to it."""
    link: reactive[LinkChanged] = reactive(LinkChanged(Link.CONNECTING))
    """The state of the connection to the run."""

    def __init__(
        self,
        source: Source,
        *,
        clock: Callable[[], float] = time.time,
        refresh_interval: float = 0.25,
    ) -> None:
        super().__init__()
        self.source = source
        self.clock = clock
        self.refresh_interval = refresh_interval
        self.run_model = Run()
        self._model_lock = asyncio.Lock()
        self._dirty = True

    def compose(self) -> ComposeResult:
        yield StatusLine(self.source.label).data_bind(MonitorApp.snapshot, MonitorApp.link)
        with Horizontal(id="plots"):
            yield SeriesPlot("loss", "loss", id="loss").data_bind(MonitorApp.snapshot)
            yield SeriesPlot("acceptance", "acc", id="acc").data_bind(MonitorApp.snapshot)
            yield MetricsTable().data_bind(MonitorApp.snapshot)
        yield Footer()

    def on_mount(self) -> None:
        self.run_worker(
            self._ingest(), name="ingest", group="ingest", exclusive=True, exit_on_error=False
        )
        self.set_interval(self.refresh_interval, self._refresh_snapshot)

    async def _ingest(self) -> None:
        async for event in self.source.stream(0):
            if isinstance(event, Chunk):
                async with self._model_lock:
                    await asyncio.to_thread(self.run_model.feed, event.offset, event.data)
                self._dirty = True
            else:
                self.link = event

    def view_params(self) -> ViewParams:
        width = self.query_one("#loss", SeriesPlot).size.width or 100
        return ViewParams(columns=max(20, width))

    async def _refresh_snapshot(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        view = self.view_params()
        async with self._model_lock:
            snap = await asyncio.to_thread(build_snapshot, self.run_model.state, self.clock(), view)
        self.snapshot = snap

    @on(Worker.StateChanged)
    def _worker_failed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR and event.worker.error is not None:
            err = event.worker.error
            self.link = LinkChanged(Link.REFUSED, f"{type(err).__name__}: {err}")
            self.notify(f"{event.worker.name} stopped: {err}", severity="error", timeout=10)
