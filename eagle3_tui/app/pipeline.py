"""Bytes in, snapshots out: the app's data path, without any Textual.

``pump`` only moves the transport's chunks into a list; ``ingest`` feeds all that
piled up since its last turn to the model in one worker-thread call (a backlog
coalesces into one batch: the model's column path); ``snapshot`` builds a frozen
:class:`Snapshot` in a worker thread. One lock serialises feeding, building,
probes and exports, so the model is never read while it is written.
"""

from __future__ import annotations

import asyncio
import csv
import re
from bisect import bisect_left
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from eagle3_tui.model.compare import Comparison, compare
from eagle3_tui.model.run import Run
from eagle3_tui.model.snapshot import Snapshot, ViewParams, build_snapshot
from eagle3_tui.transport.base import Chunk, LinkChanged, StreamEvent


class Source(Protocol):
    """Where the app's bytes come from (LocalTransport, SshTransport, ReplayTransport)."""

    @property
    def label(self) -> str: ...

    def stream(self, offset: int = 0) -> AsyncIterator[StreamEvent]: ...


def coalesce(chunks: list[Chunk]) -> list[Chunk]:
    """Adjacent chunks of one stream joined into one (a restart at another offset, or
    another node's file, starts a new one)."""
    out: list[Chunk] = []
    parts: list[bytes] = []
    start = end = stream = 0
    for c in chunks:
        if parts and c.offset == end and c.stream == stream:
            parts.append(c.data)
            end += len(c.data)
            continue
        if parts:
            out.append(Chunk(start, b"".join(parts), stream))
        parts, start, end, stream = [c.data], c.offset, c.offset + len(c.data), c.stream
    if parts:
        out.append(Chunk(start, b"".join(parts), stream))
    return out


class Pipeline:
    """The model of one run and the only ways in and out of it."""

    def __init__(self) -> None:
        self.run = Run()
        self.lock = asyncio.Lock()
        self.generation = 0
        """Bumped whenever the model changed: a snapshot of an older one is stale."""
        self.feeds = 0
        """How many model updates the chunks took (fewer than chunks under a backlog)."""
        self._pending: list[Chunk] = []
        self._wake = asyncio.Event()

    async def pump(self, source: Source, on_link: Callable[[LinkChanged], None]) -> None:
        """Move the source's events along until it ends (a refused host ends it)."""
        async for event in source.stream(0):
            if isinstance(event, Chunk):
                self._pending.append(event)
                self._wake.set()
            else:
                on_link(event)

    async def ingest(self) -> None:
        """Feed what piled up, as one update, forever."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            chunks, self._pending = self._pending, []
            if not chunks:
                continue
            async with self.lock:
                await asyncio.to_thread(self._feed, coalesce(chunks))
                self.generation += 1
                self.feeds += 1

    def _feed(self, chunks: list[Chunk]) -> None:
        for c in chunks:
            self.run.feed(c.offset, c.data, c.stream)

    @property
    def global_step(self) -> int | None:
        """The latest step read (an int read: safe while a feed runs)."""
        return self.run.state.global_step

    async def snapshot(self, now: float, view: ViewParams) -> tuple[Snapshot, int]:
        """A frozen picture for ``view``, and the generation it shows."""
        async with self.lock:
            generation = self.generation
            snap = await asyncio.to_thread(build_snapshot, self.run.state, now, view)
        return snap, generation

    async def set_status(self, status: dict[str, Any], now: float) -> None:
        """Evidence from the host: the manifest and whether its trainer is alive."""
        async with self.lock:
            manifest = status.get("manifest")
            if isinstance(manifest, dict):
                self.run.state.set_manifest(manifest)
            alive = status.get("alive")
            self.run.state.set_process(alive if isinstance(alive, bool) else None, now)
            self.generation += 1

    async def export_csv(self, path: Path, window: int | None) -> tuple[Path, int]:
        """Every column of the step table for the window, as CSV at ``path``: rows written."""
        async with self.lock:
            table = self.run.state.table
            last = table.last_step or 0
            first = max(0, last - window + 1) if window else 0
            i = bisect_left(table.steps, first)
            steps = np.frombuffer(table.steps, dtype=np.int64)[i:].copy()
            ts = np.frombuffer(table.ts, dtype=np.float64)[i:].copy()
            names = sorted(table.columns)
            cols = [np.frombuffer(table.columns[k], dtype=np.float32)[i:].copy() for k in names]
        await asyncio.to_thread(write_csv, path, steps, ts, names, cols)
        return path, len(steps)


def write_csv(
    path: Path,
    steps: np.ndarray[Any, Any],
    ts: np.ndarray[Any, Any],
    names: list[str],
    cols: list[np.ndarray[Any, Any]],
) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(["step", "ts", *names])
        for r in range(len(steps)):
            out.writerow([int(steps[r]), f"{ts[r]:.3f}", *(f"{float(c[r]):.7g}" for c in cols)])


async def compare_runs(
    a: Pipeline, b: Pipeline, axis: str, view: ViewParams, labels: tuple[str, str]
) -> Comparison:
    """Both runs compared (model.compare) in a worker thread, each model under its lock."""
    async with a.lock, b.lock:
        return await asyncio.to_thread(
            compare, a.run.state, b.run.state, axis=axis, view=view, labels=labels
        )


def short_label(label: str) -> str:
    """The last part of a run's path: ``host:/runs/exp7`` -> ``exp7``."""
    return label.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1] or label


def export_name(label: str, first: int | None, last: int | None) -> str:
    """A file name for an export of ``label``'s steps ``first``..``last``."""
    base = label.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1] or "run"
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", base).strip("._") or "run"
    span = f"-steps{first}-{last}" if first is not None and last is not None else ""
    return f"eagle3-{base}{span}.csv"
