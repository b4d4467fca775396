"""Bytes in, snapshots out: the app's data path, without any Textual.

``pump`` only moves the transport's chunks into a list; ``ingest`` feeds all that
piled up since its last turn to the model in one worker-thread call (a backlog
coalesces into one batch: the model's column path); ``snapshot`` builds a frozen
:class:`Snapshot` in a worker thread. One lock serialises feeding, building,
probes and exports, so the model is never read while it is written.

The link's state reaches the model too: health is judged only on evidence that
reached the client, so while the link is down the model knows since when, and
after a reconnection the link counts as up once what the host wrote meanwhile
(the file up to its size at the reconnection) has been read. What the stream says of
the file (deleted, replaced, truncated: ``FileChanged``) and of the room on its
filesystem (``DiskSpace``) goes into the model in its place among the chunks.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import os
import re
import time
from bisect import bisect_left
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import numpy as np

from eagle3_tui import heap
from eagle3_tui.api.reading import apply_status
from eagle3_tui.model.compare import Comparison, compare
from eagle3_tui.model.glance import GlanceData, glance_run
from eagle3_tui.model.run import Run
from eagle3_tui.model.snapshot import Snapshot, SnapshotCache, ViewParams, build_snapshot
from eagle3_tui.model.verdict import Diagnosis, Health
from eagle3_tui.transport.base import (
    Chunk,
    DiskSpace,
    FileChanged,
    Link,
    LinkChanged,
    StreamEvent,
    TargetError,
)
from eagle3_tui.transport.replies import Status

LINK_DOWN = frozenset({Link.RECONNECTING, Link.REFUSED, Link.UNREADABLE})
"""Link states in which no data can arrive."""


class Source(Protocol):
    """Where the app's bytes come from (LocalTransport, SshTransport, ReplayTransport)."""

    @property
    def label(self) -> str: ...

    def stream(self, offset: int = 0) -> AsyncIterator[StreamEvent]: ...


Fed = Chunk | FileChanged | DiskSpace
"""What the stream says that goes into the model, in the order it said it."""
F = TypeVar("F", Chunk, Fed)


def coalesce(chunks: Sequence[F]) -> list[F]:
    """Adjacent chunks of one stream joined into one (a restart at another offset, or
    another node's file, starts a new one; what the stream said of the file or its
    disk stays between the chunks it came between)."""
    out: list[F] = []
    parts: list[bytes] = []
    start = end = stream = 0
    for c in chunks:
        if not isinstance(c, Chunk) or c.span >= 0:  # never joined to bytes
            if parts:
                out.append(Chunk(start, b"".join(parts), stream))
                parts = []
            out.append(c)
            continue
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


GLANCE_S = 5.0
"""How long a glance may take before the run is read whole instead (a host that does
not answer is then reported by the stream, this long later than without a glance)."""
GLANCE_TAIL_ROWS = 512
"""The newest training steps a glance reads whole (agent/glance.py's ``TAIL_ROWS``)."""
FIRST_PICTURE_S = 0.5
"""Behind a glance, the whole read waits this long at most for the first picture to
be built: its reading and decoding would share the interpreter with that build."""


def _feed_into(run: Run, chunks: list[Fed]) -> None:
    for c in chunks:
        if isinstance(c, Chunk):
            run.feed(c.offset, c.data, c.stream, c.span)
        elif isinstance(c, FileChanged):
            run.file_changed(c)
        else:
            run.set_disk(c)


FILL_SLICE = 2 << 20
"""The whole read behind a glance is fed this many bytes at a time: each feed holds the
interpreter in long C calls (joins, decodes), so smaller feeds keep keys answered."""
FILL_AHEAD = 32 << 20
"""The main stream reads no further ahead of that feed (memory stays bounded)."""


def _size(chunks: list[Fed]) -> int:
    return sum(len(c.data) for c in chunks if isinstance(c, Chunk))


def _take(pending: list[Fed], limit: int) -> list[Fed]:
    """The first of ``pending`` up to about ``limit`` bytes, taken out of it."""
    n = total = 0
    while n < len(pending) and total < limit:
        c = pending[n]
        total += len(c.data) if isinstance(c, Chunk) else 0
        n += 1
    taken = pending[:n]
    del pending[:n]
    return taken


def _give_back_memory() -> None:
    """The heap the whole read's decoding used, handed back to the system (glibc keeps
    freed memory otherwise: a 1M-step run read locally held ~75 MB more)."""
    heap.give_back()


VERDICT_UNREAD = 8 << 20
"""A run read from its start (no glance: no companion, or an older telemetry's) gets
no verdict while more than this much of what its file held is still unread: the
steps read so far are hours old, and judged as the latest they made the run of a
live trainer STALLED for the 18 s its 1M steps took to read."""


def _reading(snap: Snapshot, unread: tuple[int, int]) -> Snapshot:
    """``snap`` while the history is still being read: how far, and no verdict yet."""
    read, size = unread
    part = f"{read / max(1, size):.0%}"
    why = (
        f"Reading what the run wrote before ({part} of {size / 1e6:,.0f} MB): the steps "
        "read so far are not its latest, so no verdict until they are."
    )
    return replace(
        snap,
        history=f"reading the history: {part}",
        diagnosis=Diagnosis(Health.WAITING, why, snap.diagnosis.link_down_since),
    )


def _join_and_feed(run: Run, chunks: list[Fed]) -> None:
    _feed_into(run, coalesce(chunks))


def _apply(run: Run, status: Status, now: float) -> None:
    """The host's evidence into ``run``: its own history's, also while another file's is
    shown instead."""
    run_id = status.manifest.get("run_id") if status.manifest else None
    apply_status(run.state_of(run_id if isinstance(run_id, str) else None), status, now)
    if status.now is not None:
        run.set_host_clock(status.now, now)


class Glancing(Protocol):
    """A source that can show a long run at a glance (transport/glancing.py) and give a
    second stream of the same run (LocalTransport, SshTransport)."""

    async def glance(self, tail_rows: int, min_size: int) -> GlanceData | str: ...

    def fork(self) -> Source: ...


class Pipeline:
    """The model of one run and the only ways in and out of it.

    **At a glance.** With ``glance_min`` set (the monitor's own run), a file at least
    that long is first shown at a glance (model/glance.py: its events, its newest
    lines, its history in brief): that run is followed live by a second stream from
    the glance's end, while the main stream reads the file from its start into a run
    of its own, off the lock, in a worker thread. Once that one has read past the
    glance's end it is shown instead (what the host said meanwhile applied to it too):
    the first picture comes in well under a second however long the run, and every
    figure ends up read from the lines themselves. That read begins once the first
    picture is built (at most :data:`FIRST_PICTURE_S` after the link's state is said),
    so that its build has the interpreter to itself.
    """

    def __init__(
        self, clock: Callable[[], float] = time.time, glance_min: int | None = None
    ) -> None:
        self.run = Run()
        self.clock = clock
        self.glance_min = glance_min
        """Open a file at least this long at a glance (None: always read it whole)."""
        self.glance_note: str | None = None
        """Why the run was not opened at a glance (None: it was, or none was asked)."""
        self._fill: Run | None = None
        """While a run opened at a glance is read whole: that read, shown once done."""
        self._fill_pending: list[Fed] = []
        self._fill_wake = asyncio.Event()
        self._fill_room = asyncio.Event()
        self._fill_to = 0
        self.filled = asyncio.Event()
        """Set once a whole read behind a glance is shown and the heap it used handed
        back (what the monitor then holds)."""
        self._pictured = asyncio.Event()
        """Set once a snapshot was built (the whole read behind a glance waits for it)."""
        self._fill_said: list[tuple[Status, float]] = []
        """What the host said while the run was read whole: applied to it before it shows."""
        self._tasks: list[asyncio.Task[None]] = []
        self._live_task: asyncio.Task[None] | None = None
        """The glance's own stream: ended when the whole read is shown (an idle run's
        would otherwise keep its agent on the host until the monitor quits)."""
        self.lock = asyncio.Lock()
        self.generation = 0
        """Bumped whenever the model changed: a snapshot of an older one is stale."""
        self.feeds = 0
        """How many model updates the chunks took (fewer than chunks under a backlog)."""
        self._pending: list[Fed] = []
        self._wake = asyncio.Event()
        self._links: list[tuple[bool, float, str, float | None]] = []
        """Link changes not yet handed to the model: (up, client time, detail, host time)."""
        self._reconnected = False
        """The link came back since it went down (it counts as up once caught up)."""
        self._catch_up: int | None = None
        """After a reconnection: the file's size then; the link is up once read to here."""
        self.caught_up = False
        self._file_changed = False
        """The file was truncated, replaced or deleted under the stream (its first read
        no longer aims at the size it had: :attr:`unread`)."""
        """The stream connected once and what the file held then has been read."""
        self._cache = SnapshotCache()
        """Kept between snapshots: a long run's lines reduce only the rows since the last."""
        self._last: tuple[Snapshot, ViewParams] | None = None
        """The last snapshot and its view: its lines serve the next when no chart is due."""

    async def pump(self, source: Source, on_link: Callable[[LinkChanged], None]) -> None:
        """Move the source's events along until it ends (a refused host ends it); a long
        file is shown at a glance first (see the class docstring)."""
        try:
            if self.glance_min is not None and hasattr(source, "glance"):
                await self._at_a_glance(cast(Glancing, source), self.glance_min)
            waited = False
            async for event in source.stream(0):
                if isinstance(event, FileChanged):
                    self._file_changed = True  # what the first read aimed at is gone
                if isinstance(event, Chunk | FileChanged | DiskSpace):
                    if self._fill is not None and not waited and isinstance(event, Chunk):
                        waited = await self._first_picture()
                    if self._fill is not None:
                        self._fill_pending.append(event)
                        self._fill_wake.set()
                        while self._fill is not None and _size(self._fill_pending) > FILL_AHEAD:
                            self._fill_room.clear()  # read no further ahead of the feed
                            await self._fill_room.wait()
                        await asyncio.sleep(0)  # a local file's reads come without a pause
                    else:
                        self._pending.append(event)
                        self._wake.set()
                else:
                    self._link_changed(event)
                    on_link(event)
                    if self._fill is not None and not waited:  # (the link's state said)
                        waited = await self._first_picture()
        finally:
            for task in self._tasks:
                task.cancel()

    async def _first_picture(self) -> bool:
        """Behind a glance, the whole read's first request waits for the first picture
        (at most :data:`FIRST_PICTURE_S`): the stream reads nothing meanwhile, so that
        build has the interpreter to itself."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._pictured.wait(), FIRST_PICTURE_S)
        return True

    @property
    def filling(self) -> float | None:
        """How far the whole read of a run shown at a glance is (0 to 1); None when
        none is under way."""
        fill = self._fill
        if fill is None:
            return None
        return min(1.0, fill.reader.next_offset / max(1, self._fill_to))

    async def _at_a_glance(self, source: Glancing, min_size: int) -> None:
        try:
            data = await asyncio.wait_for(source.glance(GLANCE_TAIL_ROWS, min_size), GLANCE_S)
        except (TargetError, OSError) as e:
            data = f"no glance: {e}"
        except TimeoutError:  # a host that does not answer: the stream says why
            data = f"no glance within {GLANCE_S:.0f} s"
        if isinstance(data, str):
            self.glance_note = data
            return
        built = await asyncio.to_thread(glance_run, data)
        if isinstance(built, str):
            self.glance_note = built
            return
        async with self.lock:
            self.run = built[0]
            self._cache, self._last = SnapshotCache(), None
            self.generation += 1
        self._fill, self._fill_to = Run(), data.size
        self._live_task = asyncio.ensure_future(self._live(source.fork(), data.size))
        self._tasks += [asyncio.ensure_future(self._filling(self._fill)), self._live_task]

    async def _live(self, source: Source, offset: int) -> None:
        """The run shown at a glance, followed from the glance's end (its link is the
        main stream's)."""
        async for event in source.stream(offset):
            if self._fill is None:
                return  # the whole read is shown now
            if isinstance(event, Chunk | FileChanged | DiskSpace):
                self._pending.append(event)
                self._wake.set()

    async def _filling(self, fill: Run) -> None:
        """Feed the main stream into ``fill`` (off the lock: no one else reads it) until
        it has read past the glance's end, then show it."""
        while True:
            if not self._fill_pending:
                await self._fill_wake.wait()
            self._fill_wake.clear()
            chunks = _take(self._fill_pending, FILL_SLICE)
            self._fill_room.set()
            if chunks:  # joined in the thread too: a slice at a time, the loop stays free
                await asyncio.to_thread(_join_and_feed, fill, chunks)
            if fill.reader.next_offset >= self._fill_to and not self._fill_pending:
                break
        async with self.lock:
            for status, at in self._fill_said:
                _apply(fill, status, at)
            quick = self.run
            if quick.link_down_since is not None:
                fill.set_link(False, quick.link_down_since)
            self.run, self._fill, self._fill_said = fill, None, []
            self._fill_room.set()
            self._pending, self._fill_pending = self._fill_pending, []
            self._cache, self._last = SnapshotCache(), None
            self.generation += 1
            self._wake.set()
        if self._live_task is not None:
            self._live_task.cancel()
        await asyncio.to_thread(_give_back_memory)
        self.filled.set()

    def _link_changed(self, event: LinkChanged) -> None:
        now = self.clock()
        if event.link in LINK_DOWN:
            self._reconnected, self._catch_up = False, None
            # an agent that fell silent: the link went down with its last byte
            down = now - event.silent_s if event.silent_s else now
            self._links.append((False, down, event.detail, None))
        elif event.link in (Link.CONNECTED, Link.LOCAL, Link.WAITING):
            self._reconnected, self._catch_up = True, event.size
            self._links.append((True, now, "", event.host_time))
        self._wake.set()

    def _apply_links(self) -> bool:
        """Hand the link's changes to the model (under the lock); whether any."""
        run = self.run
        changed = False
        for up, at, detail, host_time in self._links:
            if host_time is not None:
                run.set_host_clock(host_time, at)
            if not up:
                run.set_link(False, at, detail)
                changed = True
        self._links.clear()
        read = (self._fill or run).reader  # the main stream's reader
        if self._reconnected and not self._pending and not self._fill_pending:
            target = self._catch_up
            if target is None or read.next_offset >= target:
                self.caught_up = True
                if run.link_down_since is not None:
                    # what the host wrote while the link was down has been read
                    run.set_link(True, self.clock())
                    self._reconnected, self._catch_up = False, None
                    changed = True
        return changed

    async def ingest(self) -> None:
        """Feed what piled up, as one update, forever."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self.ingest_pending()

    async def ingest_pending(self) -> None:
        """Feed what piled up since the last feed, as one update, and the link's changes
        (a reader that looks now and then, ``watch``, calls this instead of :meth:`ingest`:
        a whole interval's chunks in one feed)."""
        chunks, self._pending = self._pending, []
        if not chunks:
            if self._links or self._reconnected:
                async with self.lock:
                    if self._apply_links():
                        self.generation += 1
            return
        async with self.lock:
            await asyncio.to_thread(self._feed, coalesce(chunks))
            self._apply_links()
            self.generation += 1
            self.feeds += 1

    def _feed(self, chunks: list[Fed]) -> None:
        _feed_into(self.run, chunks)

    @property
    def global_step(self) -> int | None:
        """The latest step read (an int read, without settling: safe while a feed runs
        and outside the lock)."""
        return self.run.unsettled.global_step

    async def snapshot(
        self, now: float, view: ViewParams, lines: bool = True
    ) -> tuple[Snapshot, int]:
        """A frozen picture for ``view``, and the generation it shows. ``lines`` False:
        no chart is due to draw, so the plotted lines of the last picture for the same
        view are kept (built anew if there is none, or the table was rewound)."""
        async with self.lock:
            generation = self.generation
            state = self.run.state
            last = self._last
            keep = last[0] if not lines and last is not None and last[1] == view else None
            snap = await asyncio.to_thread(build_snapshot, state, now, view, self._cache, keep)
            filling = self.filling
            if filling is not None:  # at a glance: the history in brief while it is read
                snap = replace(snap, history=f"reading the whole history: {filling:.0%}")
            unread = self.unread
            if unread is not None:
                snap = _reading(snap, unread)
            self._last = (snap, view)
        self._pictured.set()
        return snap, generation

    @property
    def unread(self) -> tuple[int, int] | None:
        """While the file's first read (no glance) still has more than
        :data:`VERDICT_UNREAD` bytes of what it held at the start to go: (bytes read,
        its size then); else None (also once the file changed under it)."""
        target = self._catch_up
        if self.caught_up or target is None or self._fill is not None or self._file_changed:
            return None  # (at a glance: the tail read first is the latest)
        read = self.run.reader.next_offset
        return (read, target) if target - read > VERDICT_UNREAD else None

    async def set_status(self, status: Status, now: float) -> None:
        """Evidence from the host: the manifest, whether its trainer is alive, what of
        the run outlived it, and the host's clock (asked at ``now``, the client's)."""
        async with self.lock:
            _apply(self.run, status, now)
            if self._fill is not None:
                self._fill_said.append((status, now))
            self.generation += 1

    async def export_csv(self, folder: Path, label: str, window: int | None) -> tuple[Path, int]:
        """Every column of the step table for the window, as CSV in ``folder``, named by
        ``label`` and the steps it holds (:func:`export_name`, of the rows written: a
        live run's table is ahead of the picture on the screen): its path, rows written."""
        async with self.lock:
            table = self.run.state.table
            last = table.last_step or 0
            first = max(0, last - window + 1) if window else 0
            i = bisect_left(table.steps, first)
            steps = table.step_view()[i:].copy()
            ts = table.ts_view()[i:].copy()
            views = table.views()
            names = sorted(views)
            cols = [views[k][i:].copy() for k in names]
        held = (int(steps[0]), int(steps[-1])) if len(steps) else (None, None)
        path = folder / export_name(label, *held)
        written = await asyncio.to_thread(write_csv, path, steps, ts, names, cols)
        return written, len(steps)


def write_csv(
    path: Path,
    steps: np.ndarray[Any, Any],
    ts: np.ndarray[Any, Any],
    names: list[str],
    cols: list[np.ndarray[Any, Any]],
) -> Path:
    """Writes the CSV (its folder made if need be); its absolute path, to be shown.
    ``step`` and ``epoch`` as every view shows them (1-based: speculators counts both
    from 0); ``global_step`` is speculators' counter."""
    path.parent.mkdir(parents=True, exist_ok=True)
    cols = [c + 1 if name == "epoch" else c for name, c in zip(names, cols, strict=True)]
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(["step", "global_step", "ts", *names])
        for r in range(len(steps)):
            g = int(steps[r])
            out.writerow([g + 1, g, f"{ts[r]:.3f}", *(f"{float(c[r]):.7g}" for c in cols)])
    return path.absolute()


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


def short_labels(a: str, b: str) -> tuple[str, str]:
    """Two runs' labels, each as short as tells them apart: ``exp7`` and ``exp6``, but
    ``a/exp7`` and ``b/exp7`` (or the whole labels) where their last parts are the same."""

    def tails(label: str) -> list[str]:
        x = label.rstrip("/") or label
        cuts = [i for i, ch in enumerate(x) if ch in "/:"]
        return [t for t in (x[i + 1 :] for i in reversed(cuts)) if t] + [x]

    ta, tb = tails(a), tails(b)
    for k in range(max(len(ta), len(tb))):
        sa, sb = ta[min(k, len(ta) - 1)], tb[min(k, len(tb) - 1)]
        if sa != sb:
            return sa.lstrip("/") or sa, sb.lstrip("/") or sb
    return short_label(a), short_label(b)


def export_name(label: str, first: int | None, last: int | None) -> str:
    """A file name for an export of ``label``'s steps ``first``..``last`` (speculators'
    ``global_step``): the run's name (its directory's), then the steps as shown (1-based:
    ``exp7-steps1-144.csv`` holds global steps 0 to 143)."""
    base = label.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1] or "run"
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", base).strip("._") or "run"
    span = f"-steps{first + 1}-{last + 1}" if first is not None and last is not None else ""
    return f"{base}{span}.csv"


def default_export_dir() -> Path:
    """Where exports of runs on other hosts go (and a local run's, when its directory is
    not writable): ``${XDG_DATA_HOME:-~/.local/share}/eagle3-tui/exports``. Never the
    current directory, which may be a clone under version control."""
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "share"
    )
    return Path(data) / "eagle3-tui" / "exports"


def export_dirs(preferred: Path | None) -> list[Path]:
    """The folders to try, in order: the one given (a local run's ``exports/``), then ours."""
    fallback = default_export_dir()
    return [preferred, fallback] if preferred is not None and preferred != fallback else [fallback]
