"""Observing a training that has no telemetry, from outside: ``observe``.

Nothing touches the process. Every interval the agent reads what the host shows and
writes records of the JSON-lines schema (``docs/ARCHITECTURE.md``), so the client's
model and panels work as for an instrumented run wherever the data exists:

* ``proc``: the process tree (torchrun agent, ranks, trainer, dataloader workers,
  helpers) with CPU and memory, whether the trainer lives, its log's size and growth;
* ``gpu``: the telemetry GPU sampler (NVML seam) with this training's PIDs;
* ``io``: the telemetry read sampler on the trainer and its workers (``/proc``);
* ``ckpt``: the telemetry checkpoint watcher on the checkpoint directory found by
  discovery (or later, once one appears), plus the checkpoints already there with
  their sizes and times, and ``val`` records from each epoch's ``val_metrics.json``;
* ``log``, ``progress``, ``train``, ``val``: the trainer's stdout/stderr log, line by
  line (:mod:`eagle3_tui.agent.logparse`).

Records come in data frames (offsets count from 0 per call: the client keeps its
own); after each, a ``cursor`` event says where a reconnect resumes: the log's
offset and identity, the log records' writer sequence and the parser's state. Log
records of a resumed call carry the same writer id and sequence numbers, so any
repeated after a cut are dropped by the reader as duplicates.

Standard library only, Python 3.8+.

Over 600 lines: one observation loop turns /proc, the log, the checkpoints and a
backend's files into records of the schema at the same tick; the readers of each
backend's files are their own modules (``tfevents.py``, ``trackers.py``,
``wandbfile.py``).
"""

from __future__ import annotations

import json
import os
import select
import stat
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eagle3_tui.agent import tfevents, trackers, wandbfile
from eagle3_tui.agent.discover import _HELPERS, _WORKER_MARKS, left_behind, live_or_ended
from eagle3_tui.agent.frames import client_gone, emit, emit_data, tick
from eagle3_tui.agent.logparse import LineParser, metric_record
from eagle3_tui.agent.names import EV_CURSOR, EV_ENDED, EV_EOF, EV_OBSERVED, TICK_S
from eagle3_tui.agent.process_facts import find_checkpoint_dir, user_name
from eagle3_tui.agent.stuck import QUIET_S as STUCK_QUIET_S
from eagle3_tui.agent.stuck import StuckWatch
from eagle3_tui.agent.timeline import (
    COPY_EVERY_S,
    Timeline,
    TimelineWriter,
    open_timeline,
)
from eagle3_tui.telemetry import procs
from eagle3_tui.telemetry.nvml import nvml_from_env
from eagle3_tui.telemetry.parsing import parse_json
from eagle3_tui.telemetry.procs import exit_status, open_pidfd
from eagle3_tui.telemetry.safefs import open_file
from eagle3_tui.telemetry.samplers import (
    CheckpointWatcher,
    GpuSampler,
    IoSampler,
    dir_contents,
    epoch_of,
    is_complete,
    training_state,
)
from eagle3_tui.telemetry.schema import SCHEMA_VERSION, Kind, to_jsonable

INTERVAL_S = 1.0
IDLE_CPU_PCT = 10.0
"""Below this (% of one core, the whole tree) an observed trainer is idle: its stack is
looked at after a while (agent/stuck.py); the model's busy threshold is the same."""
CATCH_UP_BYTES = 4 << 20
"""A log's first read starts at most this far from its end (its last lines matter)."""
READ_BYTES = 1 << 20
MAX_ROUND_BYTES = 8 << 20
"""Log bytes parsed per round at most: a huge backlog does not stall the samplers."""
REDRAWN_BYTES = 8192
"""How much of a line being written is looked at for a bar's last drawing (a drawing is
~100-300 bytes with its colours; a line of an epoch's drawings may be megabytes)."""
MAX_ROUND_ROWS = 200_000
"""Rows of a tracker's store read per round (a long history is read over rounds)."""
FIND_CKPT_EVERY = 5
"""Rounds between looks for a checkpoint directory while none is known."""
FIND_EVENTS_EVERY = 5
"""Rounds between looks for a TensorBoard event file of the trainer's (none yet)."""


class BarParser(LineParser):
    """The log's parser, an epoch's bars told apart by how many of that epoch's bars
    have closed (a bar's line ends only when it closes: rich prints it whole then, tqdm
    and a terminal's rich end its redrawn line), not by how many closed at 100%: a
    training loop cut short (``max_steps``, a stop) closes its bar below its total, and
    the validation bar after it was read as the training's (its step time said as the
    training's). Its state (the count per epoch) travels in the cursor as before."""

    def parse(self, raw: str) -> list[Any]:
        out = super().parse(raw)
        for kind, payload, _ in out:
            figures = payload.get("bar") if kind == Kind.PROGRESS else None
            if isinstance(figures, dict) and not figures.get("done"):  # (done: counted)
                epoch = str(figures.get("epoch"))
                self.bars[epoch] = self.bars.get(epoch, 0) + 1
                if len(self.bars) > 64:
                    self.bars.pop(min(self.bars, key=int))
        return out


class FrameSink:
    """Records in the JSON-lines schema, collected for the next data frame: what the
    telemetry samplers write to (``write(kind, payload)``, as a JsonlWriter)."""

    def __init__(
        self, writer: str, out: list[bytes], seq: int = 0, tee: TimelineWriter | None = None
    ) -> None:
        self.w = writer
        self.out = out
        self.seq = seq
        self.tee = tee
        """The run's timeline, offered each record (it keeps what it keeps)."""

    def write(
        self,
        kind: str,
        payload: Mapping[str, Any] | None = None,
        step: int | None = None,
        ts: float | None = None,
    ) -> bool:
        rec: dict[str, Any] = {
            "v": SCHEMA_VERSION,
            "seq": self.seq,
            "w": self.w,
            "ts": round(time.time() if ts is None else ts, 6),
            "kind": kind,
            "rank": 0,
        }
        if payload:
            rec.update(payload)
        if step is not None:
            rec["step"] = step
        self.seq += 1
        line = json.dumps(to_jsonable(rec), separators=(",", ":"), allow_nan=False)
        self.out.append(line.encode() + b"\n")
        if self.tee is not None:
            self.tee.write(kind, dict(payload) if payload else None, step, rec["ts"])
        return True


class _WithoutInventory:
    """The checkpoint watcher's records but its ``inventory``: the observer writes each
    checkpoint already there as a ``save_finished`` with its real time instead."""

    def __init__(self, sink: FrameSink) -> None:
        self.sink = sink
        self.at: float | None = None
        """The time of the trainer's message being passed on (``Saving checkpoint to``...):
        the records it makes are stamped with it, not with the look's time (a look that
        reads an old message, as a first look's catch-up does, would date its save now)."""

    def write(
        self, kind: str, payload: Mapping[str, Any] | None = None, step: int | None = None
    ) -> bool:
        if kind == Kind.CKPT and isinstance(payload, dict) and payload.get("event") == "inventory":
            return True
        return self.sink.write(kind, payload, step, ts=self.at)


class _Followed:
    """A file followed from an offset: what a look at it finds (its size, growth, change
    time, identity)."""

    path: str
    offset: int
    identity: str | None
    size: int
    grew: int
    mtime: float | None

    def _look(self) -> tuple[os.stat_result, bool] | None:
        """The file now (None: gone, or not a regular file: a FIFO or a device, nothing
        to read ever), and whether it was replaced or truncated since the last look
        (its content is to be read from 0 again)."""
        try:
            st = os.stat(self.path)
        except OSError:
            self.grew = 0
            return None
        if not stat.S_ISREG(st.st_mode):
            self.grew = 0
            return None
        ident = f"{st.st_dev}:{st.st_ino}"
        replaced = (self.identity is not None and ident != self.identity) or (
            st.st_size < self.offset
        )
        self.grew = max(0, st.st_size - self.size) if self.size else 0
        self.size = st.st_size
        self.mtime = st.st_mtime
        self.identity = ident
        return st, replaced


class LogFollower(_Followed):
    """The trainer's log from an offset: whole lines only, a truncated or replaced file
    restarts at 0, a first look starts near the end of a long file."""

    def __init__(
        self,
        path: str,
        sink: FrameSink,
        parser: LineParser,
        offset: int = 0,
        identity: str | None = None,
        on_message: Any = None,
    ) -> None:
        self.path = path
        self.sink = sink
        self.parser = parser
        self.offset = offset
        self.identity = identity
        self.on_message = on_message
        self.size = 0
        self.grew = 0
        self.mtime: float | None = None
        """When the log last changed (a one-shot look sees growth from before it)."""
        self._catch_up_to = -1
        self._catch_up_ts = 0.0
        self._drawn: tuple[int, str, int, int] | None = None
        """The redrawn bar last sent (each is sent once)."""

    def poll(self, now: float) -> None:
        fresh = self.identity is None
        looked = self._look()
        if looked is None:
            return
        st, replaced = looked
        if replaced:
            self.offset = 0  # replaced or truncated: its new content from the start
            fresh = True
        if fresh:
            self._catch_up_to = st.st_size  # lines already there: stamped with the mtime
            self._catch_up_ts = st.st_mtime
            if st.st_size - self.offset > CATCH_UP_BYTES:
                self.offset = self._line_start(st.st_size - CATCH_UP_BYTES)
        read = 0
        try:
            with open_file(self.path) as f:  # never a FIFO or a device
                while self.offset < st.st_size and read < MAX_ROUND_BYTES:
                    f.seek(self.offset)
                    data = f.read(min(READ_BYTES, st.st_size - self.offset))
                    cut = data.rfind(b"\n")
                    if cut < 0:
                        if len(data) >= READ_BYTES:  # a line of over 1 MiB: skip it
                            self.offset += len(data)
                            continue
                        break
                    self._lines(data[: cut + 1], now)
                    self.offset += cut + 1
                    read += cut + 1
                if self.offset < st.st_size and read < MAX_ROUND_BYTES:
                    self._redrawn(f, st, now)
        except OSError:
            return

    def _redrawn(self, f: Any, st: os.stat_result, now: float) -> None:
        """The line being written, when it is a bar redrawn after each ``\\r``: its
        latest drawing, once per change (per-step progress between the epoch ends; read
        from its last :data:`REDRAWN_BYTES`). A drawing being written does not parse (a
        bar's figures end it): the one before it is taken."""
        start = max(self.offset, st.st_size - REDRAWN_BYTES)
        f.seek(start)
        drawings = f.read(st.st_size - start).split(b"\r")
        if len(drawings) < 2:
            return  # no redrawing: a line being written
        if start > self.offset:
            drawings = drawings[1:]  # the first may be cut by the window
        figures = None
        for drawing in [d for d in drawings if d.strip()][-3:][::-1]:
            figures = self.parser.redrawn(drawing.decode("utf-8", "replace"))
            if figures is not None:
                break
        if figures is None:
            return
        key = (figures["epoch"], figures["phase"], figures["n"], figures["total"])
        if key != self._drawn:
            self._drawn = key
            stamp = self._catch_up_ts if st.st_size <= self._catch_up_to else now
            self.sink.write(Kind.PROGRESS, {"bar": figures}, ts=stamp)

    def _line_start(self, at: int) -> int:
        try:
            with open_file(self.path) as f:  # never a FIFO or a device
                f.seek(at)
                chunk = f.read(READ_BYTES)
        except OSError:
            return at
        nl = chunk.find(b"\n")
        return at + nl + 1 if nl >= 0 else at

    def _lines(self, data: bytes, now: float) -> None:
        pos = self.offset
        for raw in data.split(b"\n")[:-1]:
            pos += len(raw) + 1
            stamp = self._catch_up_ts if pos <= self._catch_up_to else now
            for kind, payload, ts in self.parser.parse(raw.decode("utf-8", "replace")):
                when = ts if ts is not None else stamp
                self.sink.write(kind, payload, ts=when)
                if kind == Kind.LOG and self.on_message is not None:
                    self.on_message(str(payload.get("msg", "")), when)


class EventFollower(_Followed):
    """A TensorBoard event file of speculators' own backend (:mod:`tfevents`), from an
    offset: whole records only; the offset kept (:attr:`offset`) is where no metric
    dict is half read, so a reconnect loses none and repeats none. A replaced or
    truncated file starts again at 0."""

    def __init__(
        self, path: str, sink: FrameSink, offset: int = 0, identity: str | None = None
    ) -> None:
        self.path = path
        self.sink = sink
        self.offset = offset
        self.identity = identity
        self.size = 0
        self.grew = 0
        self.mtime: float | None = None
        self.framing = tfevents.Framing()
        self.regroup = tfevents.Regroup()
        self._read_to = offset
        self.records = 0
        self.behind = False
        """More of the file was there than a round reads: the next round comes at once."""

    def poll(self, now: float) -> None:
        looked = self._look()
        if looked is None:
            return
        st, replaced = looked
        if replaced or st.st_size < self._read_to:  # truncated inside a dict too
            self.offset = self._read_to = 0
            self.regroup = tfevents.Regroup()
            self.framing = tfevents.Framing()
        if self.framing.broken_at is not None:
            return  # its framing is lost there: nothing after it can be trusted
        read = 0
        try:
            with open_file(self.path) as f:
                while self._read_to < st.st_size and read < MAX_ROUND_BYTES:
                    f.seek(self._read_to)
                    data = f.read(min(tfevents.READ_BYTES, st.st_size - self._read_to))
                    ends: list[int] = []
                    bodies, used = tfevents.records(data, self.framing, self._read_to, ends)
                    for body, end in zip(bodies, ends):  # noqa: B905 (Python 3.8)
                        self._event(body)
                        self.records += 1
                        if not self.regroup.flat:  # no dict half read up to here
                            self.offset = self._read_to + end
                    if not used:
                        break
                    self._read_to += used
                    read += used
                    if not self.regroup.flat:
                        self.offset = self._read_to
        except OSError:
            return
        self.behind = self._read_to < st.st_size and self.framing.broken_at is None

    @property
    def problem(self) -> str | None:
        """What could not be read of the file, in one line (None: nothing)."""
        f = self.framing
        said = []
        if f.bad_crc:
            said.append(f"{f.bad_crc} record(s) skipped (their CRC does not match)")
        if f.broken_at is not None:
            said.append(f"its framing is broken at byte {f.broken_at:,}: nothing after it is read")
        return "; ".join(said) or None

    def _event(self, body: bytes) -> None:
        found = tfevents.scalars(body)
        if found is None:
            self.framing.not_scalars += 1
            return
        wall, step, values = found
        for tag, value in values:
            for d, ts in self.regroup.add(wall, step, tag, value):
                kind, payload, _ = metric_record(d, ts)
                self.sink.write(kind, payload, ts=ts)


class WandbFollower(_Followed):
    """A W&B run file of speculators' own backend (:mod:`wandbfile`), from an offset:
    whole records only (the offset kept is where a record begins: every row is one
    step's whole metrics), a replaced or truncated file starting again at 0."""

    def __init__(
        self, path: str, sink: FrameSink, offset: int = 0, identity: str | None = None
    ) -> None:
        self.path = path
        self.sink = sink
        self.offset = offset
        self.identity = identity
        self.size = 0
        self.grew = 0
        self.mtime: float | None = None
        self.framing = wandbfile.Framing()
        self.records = 0
        self.behind = False
        """More of the file was there than a round reads: the next round comes at once."""

    def poll(self, now: float) -> None:
        looked = self._look()
        if looked is None:
            return
        st, replaced = looked
        if replaced:
            self.offset = 0
            self.framing = wandbfile.Framing()
        if self.framing.broken_at is not None:
            return  # not a W&B run file: nothing in it can be trusted
        read = 0
        try:
            with open_file(self.path) as f:
                while self.offset < st.st_size and read < MAX_ROUND_BYTES:
                    f.seek(self.offset)
                    data = f.read(min(wandbfile.READ_BYTES, st.st_size - self.offset))
                    rows, used = wandbfile.history(data, self.framing, self.offset)
                    for metrics, step, wall in rows:
                        for d, ts in wandbfile.metric_dicts(metrics, step, wall):
                            kind, payload, _ = metric_record(d, ts)
                            self.sink.write(kind, payload, ts=ts)
                    self.records += len(rows)
                    if not used:
                        break
                    self.offset += used
                    read += used
        except OSError:
            return
        self.behind = self.offset < st.st_size and read >= MAX_ROUND_BYTES

    @property
    def problem(self) -> str | None:
        """What could not be read of the file, in one line (None: nothing)."""
        return self.framing.problem


class StoreFollower:
    """A run in the store of speculators' MLflow or trackio backend (:mod:`trackers`),
    from a position (:attr:`offset`: a row, after which no dict is half read): a
    reconnect loses none and repeats none. Its :attr:`identity` is the run: a cursor of
    another run starts again at the beginning."""

    def __init__(
        self, store: trackers.Store, sink: FrameSink, offset: int = 0, identity: str | None = None
    ) -> None:
        self.store = store
        self.path = store.path
        self.sink = sink
        self.identity = f"{store.kind}:{store.run}"
        self.offset = offset if identity == self.identity else 0
        self.error: str | None = None
        self.records = 0
        self.behind = False
        """A round's rows were read and more were there: the next round comes at once."""

    def poll(self, now: float) -> None:
        rows = 0
        self.behind = False
        while rows < MAX_ROUND_ROWS:
            try:
                found, after = self.store.read(self.offset)
            except trackers.StoreError as e:
                self.error = f"{self.store.words} {self.path} cannot be read: {e}"
                return
            self.error = None
            for d, ts in found:
                kind, payload, _ = metric_record(d, ts)
                self.sink.write(kind, payload, ts=ts)
            self.records += len(found)
            rows += max(1, after - self.offset)
            if after == self.offset:
                return
            self.offset = after
        self.behind = True

    @property
    def problem(self) -> str | None:
        """What could not be read of the run, in one line (None: nothing)."""
        said = [self.error] if self.error else []
        if self.store.skipped:
            said.append(f"{self.store.skipped} row(s) skipped (not one of its metric dicts)")
        return "; ".join(said) or None


class Observer:
    """One observed training: its samplers, its log, its own handler's file, its
    checkpoints; one round per interval. With a ``timeline`` it keeps its record
    (:mod:`timeline`) while it holds it; ``ended``: a post-mortem look at a training that
    has ended (its record's end), with its log read from ``log_source`` (the record's
    copy)."""

    def __init__(
        self,
        row: dict[str, Any],
        cursor: dict[str, Any],
        interval: float,
        timeline: Timeline | None = None,
        ended: dict[str, Any] | None = None,
        log_source: str | None = None,
    ) -> None:
        self.row = row
        self.pid = int(row["pid"])
        self.start = int(row["start_ticks"])
        launcher = row.get("launcher_pid")
        self.root = launcher if isinstance(launcher, int) else self.pid
        self.interval = interval
        self.out: list[bytes] = []
        self.timeline = timeline
        self.recorder = TimelineWriter(timeline) if timeline is not None else None
        self.sink = FrameSink(f"obs-{self.pid}-{uuid.uuid4().hex[:6]}", self.out, 0, self.recorder)
        seq = int(cursor.get("seq") or 0)
        self.log_sink = FrameSink(f"log-{self.pid}-{self.start}", self.out, seq, self.recorder)
        separate = row.get("handler") in ("tensorboard", "wandb") or (
            row.get("metrics_file") and row.get("metrics_file") != row.get("log")
        )  # the metrics come from their own file: the log's printed ones would come twice
        self.parser = BarParser(cursor.get("parser"), key_values=not separate)
        self.ckpt_sink = _WithoutInventory(self.sink)
        self.watcher = CheckpointWatcher(self.ckpt_sink, None)
        self.ckpt_dir: str | None = None
        self.inventoried = False
        log = log_source or row.get("log")
        self.log = self._follower(log, cursor, "log", self.log_sink, self.parser)
        metrics = row.get("metrics_file")
        self.metrics_sink = FrameSink(
            f"own-{self.pid}-{self.start}", self.out, int(cursor.get("metrics_seq") or 0)
        )
        self.metrics: LogFollower | EventFollower | WandbFollower | StoreFollower | None = None
        store = trackers.store_for(row.get("handler"), metrics, row.get("metrics_run"))
        if row.get("handler") == "tensorboard" and metrics:
            self.metrics = self._events(str(metrics), cursor)
        elif row.get("handler") == "wandb" and metrics:
            self.metrics = self._wandb(str(metrics), cursor)
        elif store is not None:
            self.metrics = self._store(store, cursor)
        elif row.get("handler") in trackers.TRACKER_NAMES:
            pass  # a backend whose store cannot be read (metrics_note says why)
        elif metrics and metrics != row.get("log"):
            self.metrics = self._follower(
                metrics, cursor, "metrics", self.metrics_sink, LineParser()
            )
        self.record: dict[str, Any] = {**row, "members": []}
        """What a record keeps of it (and what :func:`left_behind` needs): its row and
        every process of its tree seen, with its start time."""
        self.end = ended
        """How it ended (``ended_at``, ``exit_status``, ``leftovers``, ``watched``), once
        a look found it gone."""
        self.gone: set[tuple[Any, Any]] = set()
        """Of its leftovers, those a look since found gone (PID and start time)."""
        self.pidfd = open_pidfd(self.pid) if ended is None else None
        if self.pidfd is not None and not procs.alive(self.pid, self.start):
            os.close(self.pidfd)  # not the process described: its end is not ours to read
            self.pidfd = None
        self.members: dict[int, str] = {}
        self.gpu = GpuSampler(
            self.sink,
            nvml_from_env(),
            entries=None,
            run_pids=lambda: set(self.members),
        )
        self.io = IoSampler(
            self.sink,
            trainer_pid=self.pid,
            receiver=None,
            # reads by dataloader workers only (a worker importing modules reads too)
            exclude=lambda: {p for p, r in self.members.items() if r != "worker"},
        )
        self._roles: dict[tuple[int, int], str] = {}
        self._recorded: set[tuple[int, int]] = set()
        self._cpu: dict[int, tuple[int, float]] = {}
        self._held: dict[tuple[int, int], tuple[float, int | None]] = {}
        """Its processes in state T (held stopped): when a look first found each so in
        the stop it is in, and its context switches then (:func:`_switches`)."""
        self._kept_held = _kept_held(timeline)
        """The same, as the run's record has it from any look (another observer's, an
        earlier summary's): a stop older than this observer."""
        self._held_kept = _held_record(self._kept_held)
        """What the record holds of it, as this observer last read or wrote it."""
        self._last = time.monotonic()
        self._vals: dict[str, float] = {}
        self.rounds = 0
        self._log_copied = float("-inf")
        self.alive = True
        self.stuck = StuckWatch(self.pid)
        self.cwd = row.get("cwd")
        self.started = row.get("started")
        env = procs.environ(self.pid) or {}  # empty: not readable
        job = env.get("SLURM_JOB_ID") if env.get("ENVIRONMENT") == "BATCH" else None
        self.slurm_job = job.strip() or None if isinstance(job, str) else None  # a batch job's
        self.set_checkpoint_dir(row.get("checkpoint_dir"))

    def _events(self, path: str, cursor: dict[str, Any]) -> EventFollower:
        same = cursor.get("metrics") == path
        return EventFollower(
            path,
            self.metrics_sink,
            int(cursor.get("metrics_offset") or 0) if same else 0,
            cursor.get("metrics_identity") if same else None,
        )

    def _wandb(self, path: str, cursor: dict[str, Any]) -> WandbFollower:
        same = cursor.get("metrics") == path
        return WandbFollower(
            path,
            self.metrics_sink,
            int(cursor.get("metrics_offset") or 0) if same else 0,
            cursor.get("metrics_identity") if same else None,
        )

    def _store(self, store: trackers.Store, cursor: dict[str, Any]) -> StoreFollower:
        same = cursor.get("metrics") == store.path
        return StoreFollower(
            store,
            self.metrics_sink,
            int(cursor.get("metrics_offset") or 0) if same else 0,
            cursor.get("metrics_identity") if same else None,
        )

    def _find_metrics(self) -> None:
        """speculators' backends make their files at the first metric (TensorBoard's
        event file, MLflow's run, trackio's rows): looked for until found, the event
        file by the writer's PID in its name, a tracker's run in its store."""
        roots = [r for r in (self.cwd, self.row.get("log_dir")) if isinstance(r, str)]
        pids = {self.pid, *self.members}  # under torchrun rank 0 writes
        row_uid, row_since = self.row.get("uid"), self.started
        uid = row_uid if isinstance(row_uid, int) else None
        since = float(row_since) if isinstance(row_since, (int, float)) else None
        events = tfevents.find_event_files(roots, pids, uid, since)
        if events:
            self.row["handler"] = "tensorboard"
            self.row["metrics_file"] = events[0]
            self.metrics = self._events(events[0], {})
            self.parser.key_values = False
            return
        runs = wandbfile.find_run_files(roots, pids, uid, since)
        if runs:
            self.row.update(handler="wandb", metrics_file=runs[0], metrics_note=None)
            self.metrics = self._wandb(runs[0], {})
            self.parser.key_values = False
            return
        backends = self.row.get("backends")
        named = {str(b) for b in backends} if isinstance(backends, list) else set()
        held: set[str] = set()
        for pid in pids:
            held.update((procs.fd_targets(pid) or {}).values())
        env = procs.environ(self.pid) or {}
        found = trackers.find_tracker(env, self.cwd, uid, since, named, held)
        if found is None:
            return
        backend, store, why = found
        if store is not None:
            self.row.update(
                handler=backend, metrics_file=store.path, metrics_run=store.run, metrics_note=None
            )
            self.metrics = self._store(store, {})
            self.parser.key_values = False
        elif self.row.get("handler") is None:
            self.row.update(handler=backend, metrics_note=why)

    def _follower(
        self,
        path: str | None,
        cursor: dict[str, Any],
        name: str,
        sink: FrameSink,
        parser: LineParser,
    ) -> LogFollower | None:
        """A follower of ``path`` from where ``cursor`` left it (``<name>_offset`` and
        its identity, when the cursor is of the same file)."""
        if not path:
            return None
        same = cursor.get(name) == path
        return LogFollower(
            str(path),
            sink,
            parser,
            int(cursor.get(f"{name}_offset") or 0) if same else 0,
            cursor.get(f"{name}_identity") if same else None,
            on_message=self._on_message if name == "log" else None,
        )

    def _on_message(self, text: str, ts: float) -> None:
        """A line of the trainer's log, to the checkpoint watcher: the save records it
        makes carry the line's time."""
        self.ckpt_sink.at = ts
        try:
            self.watcher.on_message(text, ts)
        finally:
            self.ckpt_sink.at = None

    # -- the tree ------------------------------------------------------------------------
    def _role(self, st: procs.ProcStat) -> str:
        key = (st.pid, st.start_ticks)
        role = self._roles.get(key)
        if role is None:
            joined = " ".join(procs.cmdline(st.pid)[:6])
            if st.pid == self.pid:
                role = "trainer"
            elif st.pid == self.root:
                role = "launcher"
            elif any(h in joined for h in _HELPERS):
                role = "helper"
            elif st.comm == "pt_data_worker":
                role = "worker"
            elif any(m in joined for m in _WORKER_MARKS):
                role = "spawned"  # a dataloader worker still starting (importing), or other
            elif st.ppid == self.root and self.root != self.pid:
                role = "rank"
            else:
                role = "child"
            self._roles[key] = role
        if role in ("child", "spawned") and st.comm == "pt_data_worker":
            role = self._roles[key] = "worker"  # torch names it when its loop starts
        return role

    def tree(self) -> list[dict[str, Any]]:
        mono = time.monotonic()
        wall = max(1e-3, mono - self._last)
        self._last = mono
        out = []
        members: dict[int, str] = {}
        cpu: dict[int, tuple[int, float]] = {}
        held: dict[tuple[int, int], tuple[float, int | None]] = {}
        seen_at = time.time()
        for pid in [self.root, *procs.descendants(self.root)]:
            st = procs.stat(pid)
            if st is None or st.zombie:
                continue
            role = self._role(st)
            members[pid] = role
            if (pid, st.start_ticks) not in self._recorded:
                self._recorded.add((pid, st.start_ticks))
                self.record["members"].append(
                    {"pid": pid, "start_ticks": st.start_ticks, "role": role, "comm": st.comm}
                )
            prev = self._cpu.get(pid)
            pct = None
            if prev is not None and prev[0] == st.start_ticks:
                pct = round(max(0.0, st.cpu_s - prev[1]) / wall * 100.0, 1)
            cpu[pid] = (st.start_ticks, st.cpu_s)
            member: dict[str, Any] = {
                "pid": pid,
                "role": role,
                "comm": st.comm,
                "state": st.state,
                "cpu_pct": pct,
                "rss": procs.rss_bytes(pid),
            }
            if st.state == "T":  # held stopped (SIGSTOP, Ctrl-Z): since a look first saw it
                key = (pid, st.start_ticks)
                switches = _switches(pid)
                since = self._held_since(key, switches, seen_at)
                held[key] = (since, switches)
                member["held_since"] = since
            out.append(member)
        self.members = members
        self._cpu = cpu
        self._held = held
        return out

    def _held_since(self, key: tuple[int, int], switches: int | None, now: float) -> float:
        """When a look first found process ``key`` held stopped, in the stop it is in
        now: this observer's earlier look or any look the run's record kept, where the
        process's context switches are the same as then (a process continued and
        stopped again in between has run: its stop is a new one, seen from ``now``).
        Where they cannot be read, only this observer's previous look counts (it found
        it held a round ago), as the least that is known."""
        mine = self._held.get(key)
        for known in (mine, self._kept_held.get(key)):
            if known is not None and switches is not None and known[1] == switches:
                return known[0]
        if mine is not None and switches is None and mine[1] is None:
            return mine[0]
        return now

    def _keep_held(self) -> None:
        """The processes held stopped now, into the run's record (when it changed): a
        later look (a summary) says for how long from the first look that saw each."""
        if self.timeline is None:
            return
        kept = _held_record(self._held)
        if kept == self._held_kept:
            return
        try:
            self.timeline.note_held(kept)
        except OSError:
            return  # (the record's other files say why, where the directory refuses)
        self._held_kept = kept

    # -- checkpoints ---------------------------------------------------------------------
    def set_checkpoint_dir(self, path: str | None) -> None:
        if path and path != self.ckpt_dir:
            self.ckpt_dir = path
            self.inventoried = False
            self.watcher.set_dir(path)

    def _find_checkpoint_dir(self) -> None:
        fds = procs.fd_targets(self.pid) or {}
        for target in fds.values():
            if os.path.basename(target) in ("model.safetensors", "optimizer_state_dict.pt"):
                self.set_checkpoint_dir(os.path.dirname(os.path.dirname(target)))
                return
        command = self.row.get("command")
        started = self.row.get("started")
        found = find_checkpoint_dir(
            self.cwd,
            command=[str(a) for a in command] if isinstance(command, list) else None,
            pid=self.pid,
            since=started if isinstance(started, (int, float)) else None,
        )
        if found:
            self.set_checkpoint_dir(found)

    def _inventory(self, root: Path) -> None:
        """The checkpoints already there, each as a finished save at its files' time."""
        found = []
        try:
            entries = list(os.scandir(root))
        except OSError:
            return
        self.inventoried = True
        for e in entries:
            try:
                if e.is_symlink() or not e.is_dir():
                    continue
            except OSError:
                continue
            if not (e.name.isdigit() or e.name == "interrupted"):
                continue
            path = Path(e.path)
            nbytes, files = dir_contents(path)
            times = []
            for name in files:
                try:
                    times.append(os.stat(path / name).st_mtime)
                except OSError:
                    continue
            found.append((max(times) if times else 0.0, path, nbytes, files))
        for ts, path, nbytes, files in sorted(found, key=lambda f: f[0]):
            payload: dict[str, Any] = {
                "event": "save_finished",
                "path": str(path),
                "epoch": epoch_of(path.name),
                "bytes": nbytes,
                "duration_s": None,
                "complete": is_complete(path.name, files),
                "files": files,
                "inferred": True,
            }
            state = training_state(path) if path.name.isdigit() else None
            if state is not None:
                payload["training_state"] = state  # where the run was: progress
            if path.name == "interrupted":
                payload["label"] = "interrupted"
            self.sink.write(Kind.CKPT, payload, ts=ts)
        best = root / "checkpoint_best"
        if best.is_symlink():
            try:
                target = (root / os.readlink(best)).resolve()
            except OSError:
                return
            try:  # when the link was made (the look's time said it was being written now)
                made: float | None = os.lstat(best).st_mtime
            except OSError:
                made = None
            self.sink.write(
                Kind.CKPT,
                {"event": "best", "path": str(target), "epoch": epoch_of(target.name)},
                ts=made,
            )

    def _validations(self, root: Path) -> None:
        """``val`` records from each epoch's ``val_metrics.json`` (new or rewritten)."""
        try:
            entries = [e for e in os.scandir(root) if e.name.isdigit()]
        except OSError:
            return
        for e in sorted(entries, key=lambda e: int(e.name)):
            path = Path(e.path) / "val_metrics.json"
            try:
                mtime = path.stat().st_mtime
            except OSError:
                continue
            if self._vals.get(e.name) == mtime:
                continue
            try:
                values = parse_json(path.read_text())
            except (OSError, ValueError):
                continue
            self._vals[e.name] = mtime
            if not isinstance(values, dict):
                continue
            payload: dict[str, Any] = {"epoch": int(e.name), "val": values, "source": str(path)}
            try:
                state = parse_json((Path(e.path) / "training_state.json").read_text())
                if isinstance(state.get("global_step"), int):
                    payload["step"] = state["global_step"]
            except (OSError, ValueError, AttributeError):
                pass
            self.sink.write(Kind.VAL, payload, ts=mtime)

    # -- one round -----------------------------------------------------------------------
    def round(self, now: float, last: bool = False) -> None:
        """One look; ``last``: the final round of a one-shot look (``until_s``), where the
        stack of a trainer idle throughout is read at once."""
        self.rounds += 1
        self.alive = self.end is None and procs.alive(self.pid, self.start)
        members = self.tree() if self.alive else []
        holding = self.recorder is not None and self.recorder.holding()
        if self.log is not None:
            self.log.poll(now)
        if self.metrics is None and self.alive and self.rounds % FIND_EVENTS_EVERY == 1:
            self._find_metrics()
        if self.metrics is not None:
            self.metrics.poll(now)
        if self.ckpt_dir is None and self.rounds % FIND_CKPT_EVERY == 1:
            self._find_checkpoint_dir()
        if self.ckpt_dir is not None:
            root = Path(self.ckpt_dir)
            if not self.inventoried:
                self._inventory(root)
            self.watcher.sample(now)
            self._validations(root)
        if self.alive:
            self.gpu.sample(now)
            self.io.sample(now)
            self._keep(now, holding)
        elif self.end is None:
            self.end = self._ended(now)
        cpu = sum(m["cpu_pct"] or 0.0 for m in members)
        self._look_for_the_stack(now, cpu, last)
        process = {
            "pid": self.pid,
            "started": self.started,
            "telemetry": False,
            "command": self.row.get("command"),
            "cwd": self.cwd,
            "user": self.row.get("user") or user_name(procs.owner(self.pid)),
            "log_file": self.row.get("log"),
            "log_bytes": self.log.size if self.log is not None else None,
            "log_grew": self.log.grew if self.log is not None else None,
            "log_mtime": self.log.mtime if self.log is not None else None,
            "checkpoint_dir": self.ckpt_dir,
            "epochs": self.row.get("epochs"),
            "cpu_pct": round(cpu, 1) if self.rounds > 1 else None,
            "launcher_pid": self.row.get("launcher_pid"),
            "stack_unavailable": self.stuck.unavailable or None,
            "slurm_job": self.slurm_job,
            "handler": self.row.get("handler"),
            "metrics_file": self.row.get("metrics_file"),
            "metrics_problem": getattr(self.metrics, "problem", None)
            or self.row.get("metrics_note"),
            "metrics_stuck": (
                isinstance(self.metrics, (EventFollower, WandbFollower))
                and self.metrics.framing.broken_at is not None
            )
            or (self.metrics is None and bool(self.row.get("metrics_note"))),
        }
        if self.end is not None:  # how it ended; what of it was still alive then
            process.update({k: self.end.get(k) for k in ("exit_status", "ended_at", "last_alive")})
            left = [x for x in self.end.get("leftovers") or [] if isinstance(x, dict)]
            for x in left:  # each looked at again until gone: k offers only what lives
                key = (x.get("pid"), x.get("start_ticks"))
                if key not in self.gone and not _still_alive(x):
                    self.gone.add(key)
            members = [
                {
                    "pid": x.get("pid"),
                    "role": x.get("role"),
                    "comm": x.get("comm"),
                    "rss": x.get("rss_bytes"),
                    **(
                        {"state": "gone"}
                        if (x.get("pid"), x.get("start_ticks")) in self.gone
                        else {}
                    ),
                }
                for x in left
            ]
        self.sink.write(Kind.PROC, {"alive": self.alive, "process": process, "processes": members})
        if self.recorder is not None:
            self.recorder.flush()

    def _keep(self, now: float, holding: bool) -> None:
        """Its record: seen alive now, with every process of its tree so far; its log's
        tail copied while it grows (by the record's writer, every 10 s at most)."""
        if self.timeline is None:
            return
        self._keep_held()
        try:
            self.timeline.note(
                {**self.row, "checkpoint_dir": self.ckpt_dir}, self.record["members"]
            )
            grew = self.log is not None and self.log.grew > 0
            if holding and grew and now - self._log_copied >= COPY_EVERY_S:
                self._log_copied = now
                self.timeline.copy_log_tail(self.row.get("log"))
        except OSError:
            self.timeline = None  # the state directory refused: observed, not recorded

    def _ended(self, now: float) -> dict[str, Any]:
        """The first look that finds it gone: how it ended (the pidfd held since the first
        look tells its exit status), and what of its tree is still alive; kept in its
        record."""
        status = exit_status(self.pid, self.pidfd)
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
        record = {**self.record, **(self.timeline.process if self.timeline else {})}
        record["members"] = self.record["members"] + list(record.get("members") or [])
        leftovers = left_behind(record)
        end = {"ended_at": now, "exit_status": status, "leftovers": leftovers, "watched": True}
        if self.timeline is not None:
            try:
                end = self.timeline.ended(now, status, leftovers, True, self.row.get("log"))
            except OSError:
                self.timeline = None
        return end

    def _look_for_the_stack(self, now: float, cpu: float, last: bool) -> None:
        """A ``stack`` record of the trainer's main thread once its tree has been idle
        (no CPU, no data read, no log growth) for a while (:class:`StuckWatch`)."""
        grew = self.log is not None and self.log.grew > 0
        idle = self.alive and self.rounds > 1 and cpu < IDLE_CPU_PCT
        idle = idle and not self.io.last_bytes and not grew
        age = now - self.started if isinstance(self.started, (int, float)) else 0.0
        force = last and self.stuck.idle_since is not None and age >= STUCK_QUIET_S
        stack = self.stuck.round(now, idle, force)
        if stack is not None:
            self.sink.write(Kind.STACK, stack)

    def cursor(self) -> dict[str, Any]:
        metrics = self.metrics
        return {
            "seq": self.log_sink.seq,
            "log": self.log.path if self.log is not None else None,
            "log_offset": self.log.offset if self.log is not None else 0,
            "log_identity": self.log.identity if self.log is not None else None,
            "parser": self.parser.state,
            "metrics": metrics.path if metrics is not None else None,
            "metrics_offset": metrics.offset if metrics is not None else 0,
            "metrics_identity": metrics.identity if metrics is not None else None,
            "metrics_seq": self.metrics_sink.seq,
        }

    def close(self) -> None:
        self.gpu.close()
        self.io.close()
        if self.recorder is not None:
            self.recorder.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def _stdin_closed(timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for the client; True once it has gone (stdin closed)."""
    poller = select.poll()
    poller.register(0, select.POLLIN)
    if poller.poll(int(timeout_s * 1000)):
        try:
            return not os.read(0, 65536)
        except OSError:
            return True
    return False


def op_observe(req: dict[str, Any]) -> int:
    """Observe a training without telemetry: records every ``interval_s`` until the
    trainer exits (``ended``), the client goes away, or ``until_s`` passed (``eof``: a
    one-shot look for ``summary``); its record is kept meanwhile. A training that has
    ended is read from its record (:func:`post_mortem`)."""
    pid = int(req["pid"])
    start = req.get("start_ticks")
    start = start if isinstance(start, int) else None
    interval = max(0.1, float(req.get("interval_s") or INTERVAL_S))
    until = req.get("until_s")
    cursor = req.get("cursor") if isinstance(req.get("cursor"), dict) else {}
    row, ended = live_or_ended(pid, start)
    if ended is not None:
        return post_mortem(ended, cursor or {}, interval)
    timeline = open_timeline(row)
    record = str(timeline.path) if timeline is not None else None
    emit(EV_OBSERVED, row=row, host=os.uname().nodename, now=time.time(), record=record)
    obs = Observer(row, cursor or {}, interval, timeline)
    first_look = True
    offset = 0
    t0 = time.monotonic()
    try:
        while True:
            round_start = time.monotonic()
            last = until is not None and round_start - t0 + interval >= float(until)
            obs.round(time.time(), last and not first_look)
            first_look = False
            if obs.out:
                data = b"".join(obs.out)
                obs.out.clear()
                emit_data(offset, data)
                offset += len(data)
                emit(EV_CURSOR, **obs.cursor())
            if not obs.alive:
                emit(EV_ENDED, pid=obs.pid, now=time.time(), size=offset)
                return 0
            if until is not None and time.monotonic() - t0 >= float(until):
                emit(EV_EOF, now=time.time(), size=offset)
                return 0
            if client_gone():
                return 0
            tick(TICK_S)  # a round that had nothing new: the client still hears this agent
            wait = max(0.0, interval - (time.monotonic() - round_start))
            if getattr(obs.metrics, "behind", False):
                wait = 0.0  # a long history being read: no pause until it is
            if until is not None:
                time.sleep(wait)
            elif _stdin_closed(wait):
                return 0
    finally:
        obs.close()


def post_mortem(timeline: Timeline, cursor: dict[str, Any], interval: float) -> int:
    """A training that has ended, as its record has it: what was kept while it lived
    (unless this is a reconnect: ``cursor``), then one look with it gone — its log as
    copied at its end, its checkpoints and validations as they are now, and a ``proc``
    record saying how it ended — then ``ended``."""
    row = timeline.row()
    emit(EV_OBSERVED, row=row, host=os.uname().nodename, now=time.time(), record=str(timeline.path))
    offset = 0
    if not cursor:
        kept = timeline.records()
        if kept:
            emit_data(offset, kept)
            offset += len(kept)
    copy = timeline.log_tail() if not cursor else None
    obs = Observer(row, cursor, interval, ended=timeline.end(), log_source=copy)
    try:
        obs.round(time.time())
        if obs.out:
            data = b"".join(obs.out)
            emit_data(offset, data)
            offset += len(data)
            emit(EV_CURSOR, **obs.cursor())
    finally:
        obs.close()
    emit(EV_ENDED, pid=obs.pid, now=time.time(), size=offset)
    return 0


def _switches(pid: int) -> int | None:
    """The context switches of process ``pid``'s main thread so far (``/proc/PID/status``),
    None where unreadable. A process held stopped makes none; continued, it runs (and
    switches) before any new stop holds it again."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            text = f.read(1 << 16).decode("ascii", "replace")
    except OSError:
        return None
    total = 0
    found = 0
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
            try:
                total += int(value.strip())
            except ValueError:
                return None
            found += 1
    return total if found == 2 else None


def _held_record(held: dict[tuple[int, int], tuple[float, int | None]]) -> dict[str, Any]:
    """``held.json``'s content: those whose context switches could be read."""
    return {
        f"{pid}-{start}": {"since": round(since, 3), "switches": switches}
        for (pid, start), (since, switches) in held.items()
        if switches is not None
    }


def _kept_held(timeline: Timeline | None) -> dict[tuple[int, int], tuple[float, int | None]]:
    """The run record's processes held stopped (:meth:`Timeline.held`), as the observer
    keeps them; what is not well formed is left out."""
    out: dict[tuple[int, int], tuple[float, int | None]] = {}
    try:
        kept = timeline.held() if timeline is not None else {}
    except OSError:
        return out
    for name, rec in kept.items():
        pid, _, start = str(name).partition("-")
        if not (pid.isdigit() and start.isdigit() and isinstance(rec, dict)):
            continue
        since, switches = rec.get("since"), rec.get("switches")
        if isinstance(since, bool) or not isinstance(since, (int, float)):
            continue
        if isinstance(switches, bool) or not isinstance(switches, int):
            continue
        out[(int(pid), int(start))] = (float(since), switches)
    return out


def _still_alive(left: dict[str, Any]) -> bool:
    """A leftover of the run (its PID and start time) still running."""
    pid, start = left.get("pid"), left.get("start_ticks")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    return procs.alive(pid, start if isinstance(start, int) else None)
