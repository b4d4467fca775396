"""The run state: everything the records of one run say, kept compactly.

``RunState.apply_all`` takes records, malformed lines and restarts in file order.
It never raises on odd content: a record it cannot use is counted, not fatal.
Training steps go into a :class:`~eagle3_tui.model.table.StepTable`; a catch-up
of thousands of steps is applied column by column (a few C-level passes) rather
than record by record.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Any, cast

import msgspec
import numpy as np
import numpy.typing as npt

from eagle3_tui.model.files import CHANGES, DiskSpace, FileNotice, Outcome, WriteGap, write_gap
from eagle3_tui.model.observed import HISTORY as PROC_HISTORY
from eagle3_tui.model.observed import (
    BarSeen,
    Observed,
    ProcSample,
    decode_bar,
    decode_members,
    decode_process,
)
from eagle3_tui.model.observed import Member as ObservedMember
from eagle3_tui.model.reader import Item, Restarted
from eagle3_tui.model.records import (
    PROFILE_FIELDS,
    SUPPORTED_SCHEMA,
    AnyRecord,
    Deferred,
    GpuDevice,
    IoWorker,
    Malformed,
    Record,
    TrainMetrics,
    TrainStep,
    gpu_devices,
    io_workers,
    record_problem,
    struct_columns,
    train_items,
)
from eagle3_tui.model.samples import GPU_HISTORY, IO_HISTORY, SAMPLES_KEPT
from eagle3_tui.model.stack import StackSample, stack_sample
from eagle3_tui.model.table import StepTable
from eagle3_tui.telemetry.schema import SAVED_RE, SAVING_RE

BATCH_MIN = 16
"""Batches at least this big try the column path."""
MAX_LOG = 2000
MAX_MALFORMED = 200
MAX_EVENTS = 1000
RECENT_FILES = 50
_ACTIVITIES = ("saving", "validating")

_EPOCH_RE = re.compile(r"Training epoch (\d+)/(\d+) (started|completed)")
_VAL_RE = re.compile(r"Validation epoch (\d+)/(\d+) (started|completed)")
_SIGNAL_RE = re.compile(r"^Received (SIG\w+) .* interrupting")
"""speculators' graceful-shutdown handler: the process was told to stop and saves
``interrupted/`` (a ``finish`` written after it does not make the run finished)."""


@dataclass(frozen=True, slots=True)
class LogLine:
    ts: float
    level: str
    logger: str
    msg: str


@dataclass(frozen=True, slots=True)
class Redo:
    """A resume that went back: steps ``first..last`` had been trained and are redone."""

    first: int
    last: int
    ts: float


@dataclass(frozen=True, slots=True)
class Event:
    """A lifecycle event (start, resume, interrupt, finish, crash)."""

    ts: float
    event: str
    step: int | None
    writer: str
    pid: int | None
    error: str | None
    rank: int = 0
    exit_status: int | None = None
    host: str | None = None


@dataclass(frozen=True, slots=True)
class CkptEvent:
    ts: float
    event: str
    path: str
    epoch: int | str | None
    bytes: float | None
    duration_s: float | None
    complete: bool | None
    at: float | None = None
    """When the save was written, where a save seen by polling says it (its files'
    newest time; ``ts`` is when it was seen): None to use ``ts``."""

    @property
    def when(self) -> float:
        return self.at if self.at is not None else self.ts


@dataclass(frozen=True, slots=True)
class SavedProgress:
    """Where a checkpoint says the run was: ``steps_done`` (its ``global_step``), the
    0-based epoch under way after it, when it was saved."""

    ts: float
    steps_done: int
    epoch: int


@dataclass(frozen=True, slots=True)
class IoPoint:
    ts: float
    bytes: float
    files_read: int
    workers: int
    worker_bytes: float = 0.0
    """Of ``bytes``, what the dataloader workers read (not the trainer itself)."""
    rank: int = 0
    host: str = ""


@dataclass(slots=True)
class WriterSeq:
    """Sequence tracking of one writer."""

    next_seq: int = 0
    lost: int = 0
    duplicates: int = 0


@dataclass(frozen=True, slots=True)
class Leftover:
    """A process of the run still alive after its trainer is gone (a probe's finding)."""

    pid: int
    comm: str
    rss_bytes: int | None
    gpu_bytes: int | None
    """GPU memory it holds, summed over devices (None: NVML cannot say)."""
    gpus: tuple[int, ...] = ()


@dataclass(slots=True)
class Activity:
    """Something long that legitimately stops metrics: a save or a validation epoch."""

    what: str
    since: float
    detail: str = ""


@dataclass
class RunState:
    """Mutable state of one run, built by :meth:`apply_all`."""

    table: StepTable = field(default_factory=StepTable)
    val_by_epoch: dict[int, dict[str, float]] = field(default_factory=dict)
    val_steps: dict[int, int] = field(default_factory=dict)
    hparams: dict[str, Any] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)
    logs: deque[LogLine] = field(default_factory=lambda: deque(maxlen=MAX_LOG))
    warnings: int = 0
    events: list[Event] = field(default_factory=list)
    malformed: deque[Malformed] = field(default_factory=lambda: deque(maxlen=MAX_MALFORMED))
    malformed_count: int = 0
    restarts: list[Restarted] = field(default_factory=list)
    redos: list[Redo] = field(default_factory=list)
    writers: dict[str, WriterSeq] = field(default_factory=dict)
    records: int = 0
    epoch: int | None = None
    epochs_total: int | None = None
    first_ts: float | None = None
    last_ts: float | None = None
    last_train_ts: float | None = None
    ttt_steps: int = 0
    # samplers
    gpu_status: str | None = None
    gpu_error: str | None = None
    gpu_devices: dict[tuple[str, int], GpuDevice] = field(default_factory=dict)
    """By (host, NVML index): several nodes of a run each have their device 0."""
    gpu_samples: deque[tuple[float, list[GpuDevice]]] = field(
        default_factory=lambda: deque(maxlen=GPU_HISTORY)
    )
    """Per device index: (ts, reading), oldest first."""
    last_gpu_ts: float | None = None
    io_history: deque[IoPoint] = field(default_factory=lambda: deque(maxlen=IO_HISTORY))
    io_workers: dict[tuple[str, int], IoWorker] = field(default_factory=dict)
    """By (host, pid): the processes of each sampler's latest io sample (every rank's
    sampler reports its own; those alive then)."""
    recent_files: deque[tuple[float, int, str]] = field(
        default_factory=lambda: deque(maxlen=RECENT_FILES)
    )
    last_io_ts: float | None = None
    ckpt_events: deque[CkptEvent] = field(default_factory=lambda: deque(maxlen=MAX_EVENTS))
    saved_progress: SavedProgress | None = None
    """The furthest point a checkpoint saved since the trainer started says the run
    reached (its ``training_state.json``): progress between epoch bars without telemetry."""
    heartbeat: Record | None = None
    last_heartbeat_ts: float | None = None
    rank_heartbeats: dict[int, Record] = field(default_factory=dict)
    """The newest heartbeat of each rank (under torchrun every rank writes its own)."""
    activity: Activity | None = None
    stack: StackSample | None = None
    """The trainer's main thread when its steps last stopped (a ``stack`` record)."""
    _pending: dict[str, deque[Record | Deferred]] = field(
        default_factory=lambda: {k: deque(maxlen=n) for k, n in SAMPLES_KEPT.items()}, repr=False
    )
    _unsettled: bool = False
    # evidence from outside the file (a probe of the process)
    process_alive: bool | None = None
    process_checked_at: float | None = None
    leftovers: tuple[Leftover, ...] = ()
    """Processes of the run alive after its trainer (dataloader workers...): from a probe."""
    # process starts: the start-up of each, learned for the next
    startups: list[float] = field(default_factory=list)
    """Seconds from each earlier process start (start, resume) to its first logged step."""
    _starting: Event | None = field(default=None, repr=False)
    signalled: str | None = None
    """The signal speculators said it received in the current process (SIGTERM...)."""
    # records not in our schema that were read nonetheless
    plain_records: int = 0
    """Records without our envelope (plain speculators dicts): no sequence numbers."""
    wrapped_records: int = 0
    """Of those, lines of a user's own JSON handler (the dict under ``msg``)."""
    # the clocks and the link: when evidence can reach the client
    clock_offset: float = 0.0
    """The host's clock minus the client's (records carry the host's ``ts``)."""
    link_down_since: float | None = None
    """Client time since which no data can arrive (None: the link is up, data current)."""
    link_detail: str = ""
    # a run observed without telemetry (proc / progress records: model/observed.py)
    observed: Observed | None = None
    proc_samples: deque[ProcSample] = field(default_factory=lambda: deque(maxlen=PROC_HISTORY))
    bars: deque[BarSeen] = field(default_factory=lambda: deque(maxlen=200))
    # the run's file and its writes (model/files.py)
    file_notices: list[FileNotice] = field(default_factory=list)
    """What happened to metrics.jsonl, oldest first (one list for every history of a
    ``Run``: the notices are the path's, whichever file is shown)."""
    write_gaps: list[WriteGap] = field(default_factory=list)
    """Stretches of failed writes (a full disk...) its writers reported afterwards."""
    disk: dict[int, DiskSpace] = field(default_factory=dict)
    """The newest room report of each file's filesystem (by stream: a node's)."""
    run_ids: list[str] = field(default_factory=list)
    """The run ids its records and manifest named, first seen first."""
    train_writer: str | None = None
    """The writer (``w``) of the latest training step: the trainer."""
    foreign: bool = False
    """Another file's history, shown because it is what the path holds now."""
    _crossing: FileNotice | None = field(default=None, repr=False)
    _crossing_next: dict[str, int] = field(default_factory=dict, repr=False)
    """Each writer's next sequence number when the file changed (``begin_crossing``)."""

    # ---- ingest -------------------------------------------------------------
    def apply_all(self, items: list[Item]) -> None:
        """Apply items in file order; a big batch of uniform steps takes the column path."""
        if len(items) >= BATCH_MIN and self._apply_batch(items):
            return
        for item in items:
            self.apply(item)

    def apply(self, item: Item) -> None:
        if isinstance(item, Malformed):
            self._malformed(item)
        elif isinstance(item, Restarted):
            self.restarts.append(item)
        elif isinstance(item, Deferred):
            if item.kind in self._pending and self._check_seq(item):
                self.records += 1
                self._touch(item.ts)
                self._pending[item.kind].append(item)
                self._unsettled = True
                return
            full = item.resolve()
            if isinstance(full, Malformed):
                self._malformed(full)
            elif self._valid(full, item.start) and self._check_seq(full):
                self._apply_record(full)
        elif self._valid(item) and self._check_seq(item):
            self._apply_record(item)

    def _malformed(self, bad: Malformed) -> None:
        self.malformed_count += 1
        self.malformed.append(bad)

    def _valid(self, rec: Record | TrainStep, offset: int = -1) -> bool:
        """Whether a decoded line may move the state; if not, it is counted as malformed
        with its reason (:func:`~eagle3_tui.model.records.record_problem`)."""
        problem = record_problem(rec)
        if problem is None:
            if rec.v == 0:  # no envelope: a plain speculators dict
                self.plain_records += 1
                if isinstance(rec, Record) and rec.t is not None:
                    self.wrapped_records += 1
            return True
        seq = f" seq {rec.seq}" if rec.seq >= 0 else ""
        self._malformed(Malformed(0, offset, f"{rec.kind or 'line'}{seq}: {problem}"[:200], ""))
        return False

    def set_host_clock(self, host_now: float, client_now: float) -> None:
        """The host's clock read at ``client_now``: records' ``ts`` are in its time."""
        self.clock_offset = host_now - client_now

    def host_time(self, client_now: float) -> float:
        return client_now + self.clock_offset

    def set_link(self, up: bool, at: float, detail: str = "") -> None:
        """Whether data can reach the client (client clock ``at``). Up means current:
        everything the host wrote until the reconnection has been read."""
        if up:
            self.link_down_since = None
            self.link_detail = ""
        else:
            if self.link_down_since is None:
                self.link_down_since = at
            self.link_detail = detail

    def set_manifest(self, manifest: dict[str, Any]) -> None:
        self.manifest = dict(manifest)
        self._note_run_id(manifest.get("run_id"))
        epochs = manifest.get("epochs")
        if isinstance(epochs, int) and epochs > 0:
            self.epochs_total = epochs

    def set_process(
        self, alive: bool | None, checked_at: float, leftovers: Iterable[Leftover] = ()
    ) -> None:
        self.process_alive = alive
        self.process_checked_at = checked_at
        self.leftovers = tuple(leftovers)

    def settle(self) -> None:
        """Apply the queued sampler records (only the newest ones a history keeps).

        A catch-up meets tens of thousands of GPU, IO and heartbeat samples of which
        the bounded histories keep the last few hundred: they wait here, undecoded,
        and only those kept are decoded and applied. Readers of sampler state call
        this first (``Run.state``, ``diagnose``, ``build_snapshot`` do).
        """
        if not self._unsettled:
            return
        self._unsettled = False
        for kind, queue in self._pending.items():
            while queue:
                item = queue.popleft()
                if isinstance(item, Deferred) and item.stub:
                    continue  # an envelope only (an old sample of a catch-up): counted
                rec = item.resolve() if isinstance(item, Deferred) else item
                if isinstance(rec, Malformed):
                    self._malformed(rec)
                elif isinstance(rec, Record) and self._valid(rec):
                    if kind == "gpu":
                        self._apply_gpu(rec)
                    elif kind == "io":
                        self._apply_io(rec)
                    else:
                        self.heartbeat = rec
                        self.last_heartbeat_ts = rec.ts
                        self.rank_heartbeats[self.heartbeat.rank] = self.heartbeat

    def _check_seq(self, rec: AnyRecord) -> bool:
        """Track per-writer sequence numbers; False for a duplicate to drop."""
        if rec.seq < 0 or not rec.w:
            return True
        ws = self.writers.get(rec.w)
        if ws is None:
            # a writer's first record: anything before it was before our first byte
            ws = self.writers[rec.w] = WriterSeq(next_seq=rec.seq)
        if rec.seq < ws.next_seq:
            ws.duplicates += 1
            return False
        if self._crossing is not None:
            self._crossed(rec.w, rec.seq)
        if rec.seq > ws.next_seq:
            ws.lost += rec.seq - ws.next_seq
        ws.next_seq = rec.seq + 1
        return True

    def begin_crossing(self, notice: FileNotice) -> None:
        """The file changed (``notice``): each writer's first record after it says how
        many of its records went missing across the change."""
        self._crossing = notice
        self._crossing_next = {w: ws.next_seq for w, ws in self.writers.items()}

    def _crossed(self, writer: str, seq: int) -> None:
        notice = self._crossing
        before = self._crossing_next.pop(writer, None)
        if notice is not None and before is not None:
            notice.gaps[writer] = seq - before

    def _touch(self, ts: float) -> None:
        if ts:
            if self.first_ts is None or ts < self.first_ts:
                self.first_ts = ts
            if self.last_ts is None or ts > self.last_ts:
                self.last_ts = ts

    def _apply_record(self, rec: Record | TrainStep) -> None:
        self.records += 1
        self._touch(rec.ts)
        kind = rec.kind
        if kind == "train":
            self._apply_train(rec)
        elif not isinstance(rec, Record):
            return
        elif kind in self._pending:
            self._pending[kind].append(rec)
            self._unsettled = True
        elif kind == "val":
            self._apply_val(rec)
        elif kind == "log":
            self._apply_log(rec)

        elif kind == "ckpt":
            self._apply_ckpt(rec)
        elif kind == "lifecycle":
            self._apply_lifecycle(rec)
        elif kind == "proc":
            self._apply_proc(rec)
        elif kind == "progress":
            self._apply_progress(rec)
        elif kind == "stack":
            self.stack = stack_sample(rec) or self.stack
        elif kind == "hparams" and rec.hparams:
            self.hparams.update(rec.hparams)

    # ---- training steps -------------------------------------------------------
    def _redo_check(self, step: int, ts: float) -> None:
        last = self.table.last_step
        if last is not None and step <= last:
            self.redos.append(Redo(step, last, ts))
            self._truncate(step)

    def _truncate(self, step: int) -> None:
        self.table.truncate_from(step)
        for e in [e for e, s in self.val_steps.items() if s > step]:
            self.val_steps.pop(e, None)

    def _close(self, kinds: tuple[str, ...], ts: float) -> None:
        """Something that ends these activities happened at ``ts``."""
        if self.activity is not None and self.activity.what in kinds and self.activity.since <= ts:
            self.activity = None

    def _note_train(self, rec: Record | TrainStep, first_ts: float | None = None) -> None:
        """A training step was logged: whatever long activity began before it is over,
        and a process that was starting has started (``first_ts``: the earliest step of
        a batch, when this is its last one)."""
        if rec.epoch is not None and isinstance(rec.epoch, int):
            self.epoch = rec.epoch
        self.last_train_ts = rec.ts or self.last_train_ts
        self.train_writer = rec.w or self.train_writer
        self._close(_ACTIVITIES, rec.ts)
        starting = self._starting
        if starting is not None:
            first = rec.ts if first_ts is None else first_ts
            if first and first >= starting.ts:
                self.startups.append(first - starting.ts)
                self._starting = None

    def _apply_train(self, rec: Record | TrainStep) -> None:
        step = rec.step_or_global
        if step is None:
            last = self.table.last_step
            step = 0 if last is None else last + 1
        self._redo_check(step, rec.ts)
        values: dict[str, float | None] = {}
        if rec.train is not None:
            train = train_items(rec.train)
            for k, v in train.items():
                values["train/" + k] = v
            self._note_ttt(train.keys())
        if rec.profile is not None:
            for k, v in zip(PROFILE_FIELDS, msgspec.structs.astuple(rec.profile), strict=True):
                if v == v:  # absent timings are NaN: store only the ones logged
                    values["profile/" + k] = v
        if isinstance(rec.epoch, int):
            values["epoch"] = float(rec.epoch)
        lr = rec.lr
        if isinstance(lr, (int, float)):
            values["lr"] = float(lr)
        elif isinstance(lr, dict):
            for k, v in lr.items():
                values["lr/" + k] = v
        self.table.append_row(step, rec.ts, values)
        self._note_train(rec)

    def _note_ttt(self, keys: Iterable[str]) -> None:
        names = set(keys)
        k = self.ttt_steps
        while f"full_acc_{k}" in names or f"cond_acc_{k}" in names:
            k += 1
        self.ttt_steps = k

    def _apply_batch(self, items: list[Item]) -> bool:
        """The catch-up fast path; False (nothing applied) when the batch is not uniform.

        Uniform: per writer, consecutive sequence numbers continuing the writer's; no
        restart; training steps decoded by the learned typed decoders with increasing
        steps, a float lr and an int epoch. Other kinds are applied one by one, in
        order; they never touch the step table, so applying the steps after them
        changes nothing but the (re-derived) activity.
        """
        batch = _split_batch(items)
        if batch is None:
            return False
        spans = self._batch_spans(batch)
        if spans is None or not _steps_valid(batch, "" in spans):
            return False
        # From here on the batch is applied, in the order the lines came: the other
        # kinds, the writers' sequence numbers, the malformed lines, the steps.
        starts = [self._starting] if self._starting is not None else []
        events_before = len(self.events)
        if batch.kinds is not None:
            self._apply_others(batch)
        starts += [e for e in self.events[events_before:] if e.event in ("start", "resume")]
        self._advance_writers(spans)
        for bad in items:
            if type(bad) is Malformed:
                self.apply(bad)
        self._store_steps(batch, starts)
        return True

    def apply_steps(self, rows: StepColumns, others: list[Item], before: list[int]) -> bool:
        """A columns frame (model/segments.py): its training steps as columns, and the
        range's other lines decoded (``others``, in file order; ``before[i]``: how many
        steps come before ``others[i]``), applied as :meth:`_apply_batch` applies the
        lines themselves. False, with nothing applied, where it would not take them as
        one batch (the caller then applies the steps as records, line by line)."""
        n = len(rows.steps)
        if n < BATCH_MIN or not rows.w or not _rows_valid(rows):
            return False
        recs = [r for r in others if type(r) is not Malformed]
        if any(type(r) is Restarted or _KIND(r) == "train" or not _W(r) for r in recs):
            return False
        at = [b for r, b in zip(others, before, strict=True) if type(r) is not Malformed]
        spans = self._row_spans(rows, recs, at)
        if spans is None:
            return False
        starts = [self._starting] if self._starting is not None else []
        events_before = len(self.events)
        if recs:
            rec_arr = np.fromiter(recs, dtype=object, count=len(recs))
            kinds = np.fromiter(map(_KIND, recs), object, len(recs))
            batch = _Batch(set(), cast("list[AnyRecord]", recs), [], {}, rows.steps, kinds, rec_arr)
            self._apply_others(batch)
        starts += [e for e in self.events[events_before:] if e.event in ("start", "resume")]
        self._advance_writers(spans)
        for bad in others:
            if type(bad) is Malformed:
                self.apply(bad)
        last = Record(kind="train", ts=float(rows.ts[-1]), epoch=int(rows.epoch[-1]), w=rows.w)
        self._store_columns(rows.steps, rows.ts, rows.columns, rows.keys, True, last, starts)
        return True

    def _row_spans(
        self, rows: StepColumns, recs: list[Item], before: list[int]
    ) -> dict[str, tuple[int, int]] | None:
        """:meth:`_batch_spans` of the steps and the other records, in file order."""
        groups = {rows.w: rows.seqs}
        if recs:
            try:  # a Deferred's seq_f is None without a seq: the careful path then
                seqs = np.fromiter(
                    (r.seq_f if type(r) is Deferred else _SEQ(r) for r in recs),
                    np.float64,
                    len(recs),
                )
            except (TypeError, ValueError):
                return None
            if not bool(np.isfinite(seqs).all()):
                return None
            seqs_i = seqs.astype(np.int64)
            names = np.fromiter(map(_W, recs), object, len(recs))
            at = np.asarray(before, dtype=np.int64)
            for w in set(names.tolist()):
                mask = names == w
                if w == rows.w:  # the steps' own writer: its other records among them
                    groups[w] = np.insert(rows.seqs, at[mask], seqs_i[mask])
                else:
                    groups[w] = seqs_i[mask]
        return self._spans(groups)

    def _batch_spans(self, batch: _Batch) -> dict[str, tuple[int, int]] | None:
        """Each writer's first and last sequence number in ``batch``; None unless they
        are consecutive and continue the writer's (a repeat: the careful path drops it)."""
        recs = batch.recs
        if batch.trains is recs:
            seqs = batch.cols["seq"].astype(np.int64)
        else:
            # lean steps and the deferred others have a float seq_f: one C-level pass
            lean = type(batch.trains[0])
            fast = issubclass(lean, TrainStep) and batch.types - {Malformed} <= {lean, Deferred}
            try:
                floats = np.fromiter(
                    map(_SEQ_F if fast else _SEQ, recs), dtype=np.float64, count=len(recs)
                )
            except (TypeError, ValueError):  # a missing seq (None)
                return None
            if not np.isfinite(floats).all():  # a seq the record did not have (NaN)
                return None
            seqs = floats.astype(np.int64)
        names = list(map(_W, recs))
        unique = set(names)
        if len(unique) == 1:
            groups = {names[0]: seqs}
        else:
            arr = np.fromiter(names, object, len(names))  # str objects: no str dtype to infer
            groups = {w: seqs[arr == w] for w in unique}
        return self._spans(groups)

    def _spans(self, groups: dict[str, npt.NDArray[np.int64]]) -> dict[str, tuple[int, int]] | None:
        """Each writer's (first, last) sequence number, from its numbers in file order;
        None unless they are consecutive and continue the writer's."""
        spans: dict[str, tuple[int, int]] = {}
        for writer, mine in groups.items():
            first = int(mine[0])
            if first < 0 or (len(mine) > 1 and not bool((np.diff(mine) == 1).all())):
                return None
            known = self.writers.get(writer)
            if known is not None and first < known.next_seq:
                return None
            spans[writer] = (first, int(mine[-1]))
        return spans

    def _apply_others(self, batch: _Batch) -> None:
        """The batch's records of other kinds: sampler records queue (``settle()``
        applies the ones the bounded histories keep); the rest apply in order."""
        recs, kinds, rec_arr = batch.recs, batch.kinds, batch.rec_arr
        assert kinds is not None and rec_arr is not None
        applied = kinds == "train"
        for kind, queue in self._pending.items():
            mask = kinds == kind
            applied |= mask
            idx = np.flatnonzero(mask)
            if not len(idx):
                continue
            queue.extend(rec_arr[idx[-(queue.maxlen or len(idx)) :]].tolist())
            self._unsettled = True
            self.records += len(idx)
            self._touch(recs[int(idx[0])].ts)
            self._touch(recs[int(idx[-1])].ts)
        for i in np.flatnonzero(~applied).tolist():
            r = recs[i]
            if isinstance(r, Deferred):
                full = r.resolve()
                if isinstance(full, Malformed):
                    self._malformed(full)
                elif self._valid(full, r.start):
                    self._apply_record(full)
            elif self._valid(r):
                self._apply_record(r)

    def _advance_writers(self, spans: dict[str, tuple[int, int]]) -> None:
        """Each writer's next sequence number, and the records lost before ``first``."""
        for writer, (first, last_seq) in spans.items():
            ws = self.writers.get(writer)
            if ws is None:
                ws = self.writers[writer] = WriterSeq(next_seq=first)
            if self._crossing is not None:
                self._crossed(writer, first)
            ws.lost += first - ws.next_seq
            ws.next_seq = last_seq + 1

    def _store_steps(self, batch: _Batch, starts: list[Event]) -> None:
        """The batch's training steps into the table, column by column."""
        cols, trains = batch.cols, batch.trains
        keys = cast("TrainMetrics", _TRAIN(trains[0])).__keys__
        columns = {"train/" + k: cols["train/m" + str(i)] for i, k in enumerate(keys)}
        for k in PROFILE_FIELDS:
            col = cols.get("profile/" + k)
            if col is not None:
                columns["profile/" + k] = col
        columns.update((k, v) for k, v in cols.items() if k == "lr" or k.startswith("lr/"))
        columns["epoch"] = cols["epoch"]
        last = cast("TrainStep", trains[-1])
        self._store_columns(batch.steps, cols["ts"], columns, keys, "v" in cols, last, starts)

    def _store_columns(
        self,
        steps: npt.NDArray[np.int64],
        ts: npt.NDArray[np.float64],
        columns: dict[str, npt.NDArray[Any]],
        keys: tuple[str, ...],
        ours: bool,
        last: Record | TrainStep,
        starts: list[Event],
    ) -> None:
        """Steps into the table, column by column (a profile timing no step logged is
        left out); ``ours``: lines with our envelope; ``last``: the last step."""
        self._redo_check(int(steps[0]), float(ts[0]))
        for k in PROFILE_FIELDS:
            col = columns.get("profile/" + k)
            if col is not None and bool(np.isnan(col).all()):
                del columns["profile/" + k]
        self.table.extend_columns(steps, ts, columns)
        n = len(steps)
        self.records += n
        self._touch(float(ts.min()))
        self._touch(float(ts.max()))
        self._note_ttt(keys)
        first_ts = self._batch_startups(ts, starts)
        if not ours:  # lines without our envelope (another writer's)
            self.plain_records += n
        self._note_train(last, first_ts)

    # ---- other kinds ----------------------------------------------------------
    def _batch_startups(self, ts: npt.NDArray[np.float64], starts: list[Event]) -> float | None:
        """The start-ups a batch's steps end: each process start (before or in the
        batch) up to its first step in it. Returns the first step's time of the process
        still starting, for :meth:`_note_train`."""
        if not starts:
            return None
        for event, following in zip(starts, [*starts[1:], None], strict=True):
            mine = ts >= event.ts
            if following is not None:
                mine &= ts < following.ts
            if bool(mine.any()):
                first = float(ts[mine].min())
                if following is None:
                    return first  # _note_train records it
                self.startups.append(first - event.ts)
        return None

    def _apply_val(self, rec: Record) -> None:
        if not rec.val:
            return
        epoch = rec.epoch if isinstance(rec.epoch, int) else len(self.val_by_epoch)
        self.val_by_epoch[epoch] = {k: (math.nan if v is None else v) for k, v in rec.val.items()}
        step = rec.step_or_global
        self.val_steps[epoch] = step if step is not None else (self.table.last_step or 0) + 1
        self._close(("validating",), rec.ts)

    def _apply_log(self, rec: Record) -> None:
        msg = rec.msg if isinstance(rec.msg, str) else ""
        level = rec.level or "INFO"
        self.logs.append(LogLine(rec.ts, level, rec.logger or "", msg))
        if level in ("WARNING", "ERROR", "CRITICAL"):
            self.warnings += 1
        if (m := _EPOCH_RE.search(msg)) is not None:
            self.epochs_total = int(m.group(2))
        elif (m := _VAL_RE.search(msg)) is not None:
            self.epochs_total = int(m.group(2))
            if m.group(3) == "started":
                self.activity = Activity("validating", rec.ts, f"epoch {m.group(1)}/{m.group(2)}")
            else:
                self._close(("validating",), rec.ts)
        elif (m := _SIGNAL_RE.match(msg)) is not None:
            self.signalled = m.group(1)
        elif (m := SAVING_RE.match(msg)) is not None:
            self.activity = Activity("saving", rec.ts, m.group(1))
        elif SAVED_RE.match(msg) is not None:
            self._close(("saving",), rec.ts)

    def _apply_gpu(self, rec: Record) -> None:
        try:
            devices = gpu_devices(rec)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            self._bad_payload(rec, f"gpu devices: {e}")
            return
        self.last_gpu_ts = rec.ts
        self.gpu_status = rec.status or "ok"
        self.gpu_error = rec.error
        host = rec.host or ""
        for dev in devices:
            dev.host = host
            self.gpu_devices[(host, dev.index)] = dev
        self.gpu_samples.append((rec.ts, devices))

    def gpu_history(self, key: tuple[str, int]) -> list[tuple[float, GpuDevice]]:
        """(ts, reading) of one device (host, NVML index), oldest first."""
        host, index = key
        return [
            (ts, d)
            for ts, devs in self.gpu_samples
            for d in devs
            if d.index == index and d.host == host
        ]

    def _bad_payload(self, rec: Record, reason: str) -> None:
        """A record whose envelope is fine but whose payload is not: counted as malformed."""
        self.malformed_count += 1
        self.malformed.append(
            Malformed(0, -1, f"{rec.kind} record seq {rec.seq}: {reason}"[:200], "")
        )

    def _apply_io(self, rec: Record) -> None:
        self.last_io_ts = rec.ts
        try:
            workers = io_workers(rec)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            self._bad_payload(rec, f"io workers: {e}")
            return
        total = rec.bytes
        if total is None:
            total = sum(w.read_bytes or 0.0 for w in workers)
        files_read = (
            rec.files_read if rec.files_read is not None else sum(len(w.files) for w in workers)
        )
        host = rec.host or ""
        worker_bytes = sum(w.read_bytes or 0.0 for w in workers if w.role == "worker")
        self.io_history.append(
            IoPoint(
                rec.ts, float(total), files_read, len(workers), float(worker_bytes), rec.rank, host
            )
        )
        # each sampler's latest processes only: a worker of an earlier epoch, or the
        # trainer before a resume, is gone (each sample lists the trainer's children now)
        self.io_workers = {
            key: w for key, w in self.io_workers.items() if (w.host, w.rank) != (host, rec.rank)
        }
        for w in workers:
            w.rank = rec.rank
            w.host = host
            self.io_workers[(host, w.pid)] = w
            for f in w.files:
                self.recent_files.append((rec.ts, w.pid, f))

    def _apply_ckpt(self, rec: Record) -> None:
        ev = CkptEvent(
            rec.ts,
            rec.event or "",
            rec.path or "",
            rec.epoch,
            rec.bytes,
            rec.duration_s,
            rec.complete,
            _written_at(rec),
        )
        self.ckpt_events.append(ev)
        saved = _saved_progress(rec)
        if saved is not None and (
            self.saved_progress is None or saved.steps_done > self.saved_progress.steps_done
        ):
            started = self.observed.info.started if self.observed is not None else None
            if started is None or saved.ts >= started:  # not an earlier run's checkpoint
                self.saved_progress = saved
        if ev.event in ("save_started", "save_progress"):
            since = (
                self.activity.since if self.activity and self.activity.what == "saving" else rec.ts
            )
            self.activity = Activity("saving", since, ev.path)
        elif ev.event == "save_finished":
            self._close(("saving",), rec.ts)

    def _apply_lifecycle(self, rec: Record) -> None:
        self._note_run_id(rec.run_id)
        if rec.event == "file":
            self._file_event(rec)
            return
        if rec.event == "write_gap":
            gap = write_gap(msgspec.structs.asdict(rec), rec.w)
            if gap is None:
                self._bad_payload(
                    rec,
                    "write_gap: 'reason', 'records', 'first_seq', "
                    "'last_seq', 'since' and 'until' are required",
                )
            else:
                self.write_gaps.append(gap)
            return
        event = Event(
            rec.ts,
            rec.event or "",
            rec.step_or_global,
            rec.w,
            rec.pid,
            rec.error,
            rank=rec.rank,
            exit_status=rec.exit_status,
            host=rec.host,
        )
        self.events.append(event)
        if rec.event in ("start", "resume"):
            self._close(_ACTIVITIES, rec.ts)
            self._starting = event  # until its first step: a start-up, not a silence
            self.signalled = None

    def _note_run_id(self, run_id: object) -> None:
        if isinstance(run_id, str) and run_id and run_id not in self.run_ids:
            self.run_ids.append(run_id[:80])

    def _file_event(self, rec: Record) -> None:
        """A writer's word on what happened to its file: with the change the stream saw,
        if it goes with it; else a notice of its own (the file was read from after it)."""
        if rec.change not in CHANGES:
            self._bad_payload(rec, f"file: unknown change {str(rec.change)[:40]!r}")
            return
        if self.foreign:
            return  # the other file's past: not this run's path
        payload = msgspec.structs.asdict(rec)
        latest = self.file_notices[-1] if self.file_notices else None
        if latest is not None and latest.goes_with(payload, rec.w):
            latest.merge(payload, rec.w)
            return
        notice = FileNotice(rec.change, None, Outcome.HERE, noted=rec.ts)
        notice.merge(payload, rec.w)
        self.file_notices.append(notice)

    def file_sentence(self, notice: FileNotice) -> str:
        """What happened to the run's file, as the views say it of this history."""
        return notice.sentence(self.run_ids[0] if self.run_ids else None, self.train_writer)

    def set_disk(self, report: DiskSpace) -> None:
        """The room on a file's filesystem, from the host."""
        self.disk[report.stream] = report

    def take_host_view(self, other: RunState) -> None:
        """What is the host's or the link's, not the file's, from the history shown
        before (this one is shown instead now): the clock, the link, the disk."""
        self.clock_offset = other.clock_offset
        self.link_down_since, self.link_detail = other.link_down_since, other.link_detail
        self.disk = dict(other.disk)

    # ---- observed runs (no telemetry) -----------------------------------------------
    def _apply_proc(self, rec: Record) -> None:
        """The process tree of a run observed from outside; the trainer alive or not."""
        if not isinstance(rec.alive, bool) or rec.process is None:
            self._bad_payload(rec, "proc: 'alive' (bool) and 'process' are required")
            return
        try:
            info = decode_process(rec.process)
            members = decode_members(rec.processes)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            self._bad_payload(rec, f"proc: {e}")
            return
        self.observed = Observed(rec.ts, rec.alive, info, tuple(members))
        self.proc_samples.append(ProcSample(rec.ts, rec.alive, info.cpu_pct, info.log_grew))
        # its tree once the trainer is gone: what of the run was still alive then
        left = [] if rec.alive else [_leftover(m) for m in members]
        self.set_process(rec.alive, rec.ts, left)
        if self.epochs_total is None and isinstance(info.epochs, int) and info.epochs > 0:
            self.epochs_total = info.epochs

    def _apply_progress(self, rec: Record) -> None:
        """An epoch progress bar of the trainer's output."""
        try:
            bar = decode_bar(rec.bar)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            self._bad_payload(rec, f"progress: {e}")
            return
        last = self.bars[-1].bar if self.bars else None
        if (
            last is not None
            and not last.done
            and (last.epoch, last.phase) == (bar.epoch, bar.phase)
        ):
            self.bars.pop()  # a bar redrawn at each step: its latest drawing stands for it
        self.bars.append(BarSeen(rec.ts, bar))

    # ---- queries ------------------------------------------------------------
    @property
    def global_step(self) -> int | None:
        return self.table.last_step

    @property
    def train_steps(self) -> int:
        return len(self.table)

    def latest(self, key: str) -> float | None:
        return self.table.latest.get(key)

    @property
    def lost_records(self) -> int:
        return sum(w.lost for w in self.writers.values())

    @property
    def duplicate_records(self) -> int:
        return sum(w.duplicates for w in self.writers.values())

    def last_event(self) -> Event | None:
        return self.events[-1] if self.events else None

    @property
    def starting(self) -> Event | None:
        """The start or resume event of a process that has not logged a step yet."""
        return self._starting

    def process_start(self) -> Event | None:
        """The start or resume event of the current process (None: none was written)."""
        for event in reversed(self.events):
            if event.event in ("start", "resume"):
                return event
        return None

    def ending(self) -> Event | None:
        """How the current process ended: its ``finish``, ``interrupt`` or ``crash``
        event (None while it runs). An interrupt is never overwritten: a ``finish``
        after an ``interrupt`` — or after speculators said it received a signal —
        of the same process (the README's one-liner calls ``finish()`` after
        ``run_training()`` returns from a SIGTERM) ends it as interrupted."""
        interrupted: Event | None = None
        for event in reversed(self.events):
            if event.event in ("start", "resume"):
                break
            if event.event == "interrupt":
                interrupted = event
        last = self.last_event()
        if last is None or last.event not in ("finish", "interrupt", "crash"):
            return None
        if last.event == "finish":
            if interrupted is not None:
                step = last.step if last.step is not None else interrupted.step
                return replace(interrupted, step=step)
            if self.signalled is not None:
                return replace(last, event="interrupt")
        return last


_W = attrgetter("w")
_V = attrgetter("v")
_SEQ = attrgetter("seq")
_SEQ_F = attrgetter("seq_f")
_KIND = attrgetter("kind")
_STEP = attrgetter("step")
_TS = attrgetter("ts")
_LR = attrgetter("lr")
_EPOCH = attrgetter("epoch")
_ENVELOPE = (("seq", _SEQ), ("step", _STEP), ("ts", _TS), ("lr", _LR), ("epoch", _EPOCH))
_TRAIN = attrgetter("train")
_PROFILE = attrgetter("profile")


@dataclass(slots=True)
class _Batch:
    """A batch cut for the fast path (:meth:`RunState._apply_batch`)."""

    types: set[type]
    recs: list[AnyRecord]
    """The batch without its malformed lines."""
    trains: list[AnyRecord]
    """Its training steps (``recs`` itself when it holds nothing else)."""
    cols: dict[str, npt.NDArray[np.float64]]
    """The steps' columns (:func:`_lean_columns` or :func:`_record_columns`)."""
    steps: npt.NDArray[np.int64]
    kinds: npt.NDArray[np.object_] | None = None
    """Each record's kind, when not all are training steps; ``rec_arr`` the records."""
    rec_arr: npt.NDArray[np.object_] | None = None


@dataclass(slots=True)
class StepColumns:
    """Training steps of one writer as columns (a columns frame's, model/segments.py)."""

    w: str
    seqs: npt.NDArray[np.int64]
    steps: npt.NDArray[np.int64]
    ts: npt.NDArray[np.float64]
    epoch: npt.NDArray[np.int64]
    versions: npt.NDArray[np.int64]
    keys: tuple[str, ...]
    """The ``train`` keys, in the lines' order."""
    columns: dict[str, npt.NDArray[Any]]
    """The table's columns: ``train/<key>``, ``profile/<field>``, ``lr``, ``epoch``."""


def _leftover(m: ObservedMember) -> Leftover:
    """A process of an observed run alive when its trainer was found gone."""
    rss = int(m.rss) if m.rss is not None and math.isfinite(m.rss) else None
    return Leftover(m.pid, m.comm[:32], rss, None)


def _rows_valid(rows: StepColumns) -> bool:
    """:func:`_steps_valid` and :func:`_record_columns`'s demands, of columns."""
    steps, ts, v = rows.steps, rows.ts, rows.versions
    if len(steps) > 1 and not bool((np.diff(steps) > 0).all()):
        return False
    if not bool((v >= 1).all()) or bool((v > SUPPORTED_SCHEMA).any()):
        return False
    if not bool((ts > 0).all()) or not np.isfinite(ts).all():
        return False
    return int(steps[0]) >= 0 and int(rows.seqs[0]) >= 0


def _split_batch(items: list[Item]) -> _Batch | None:
    """The training steps of ``items`` and their columns; None when it has a restart,
    fewer than :data:`BATCH_MIN` steps, or steps the typed columns cannot hold."""
    types = set(map(type, items))
    if Restarted in types:
        return None
    recs = cast(
        "list[AnyRecord]",
        [it for it in items if type(it) is not Malformed] if Malformed in types else items,
    )
    kind_arr = rec_arr = None
    if len(types) == 1 and issubclass(next(iter(types)), TrainStep):
        # the common catch-up: nothing but lean training steps (the lean decoder
        # makes TrainStep values of training steps only)
        trains = recs
    else:
        kinds = list(map(_KIND, recs))
        if kinds.count("train") == len(recs):
            trains = recs
        else:
            # object arrays via fromiter: ~10x faster than from a list here
            rec_arr = np.fromiter(recs, dtype=object, count=len(recs))
            kind_arr = np.fromiter(kinds, object, len(kinds))
            trains = rec_arr[kind_arr == "train"].tolist()
    if len(trains) < BATCH_MIN:
        return None
    cols = _lean_columns(trains) if isinstance(trains[0], TrainStep) else None
    if cols is None:
        cols = _record_columns(trains)
        if cols is None:
            return None
    steps = cols["step"].astype(np.int64)
    return _Batch(types, recs, trains, cols, steps, kind_arr, rec_arr)


def _steps_valid(batch: _Batch, unnamed_writer: bool) -> bool:
    """Increasing steps, none negative; and what :func:`record_problem` asks of each
    line, for the whole batch at once: our writer's lines (``v``) carry a writer and a
    finite, positive time."""
    steps, ts = batch.steps, batch.cols["ts"]
    if len(steps) > 1 and not bool((np.diff(steps) > 0).all()):
        return False
    if "v" in batch.cols and (
        unnamed_writer or not bool((ts > 0).all()) or not np.isfinite(ts).all()
    ):
        return False
    return int(steps[0]) >= 0


def _lean_columns(trains: list[AnyRecord]) -> dict[str, npt.NDArray[np.float64]] | None:
    """The columns of lean training steps (see :func:`struct_columns`), keyed as
    :func:`_record_columns` keys them; None unless every row has an integral seq,
    step and epoch, a float lr and a learned ``train`` struct."""
    if not isinstance(cast("TrainStep", trains[0]).train, TrainMetrics):
        return None
    cols = struct_columns(trains)
    if cols is None:
        return None
    step = cols.get("step_f", cols.get("global_step_f"))
    seq, epoch = cols.get("seq_f"), cols.get("epoch_f")
    if step is None or seq is None or epoch is None:
        return None
    first_lr = cast("TrainStep", trains[0]).lr_f
    if isinstance(first_lr, TrainMetrics):  # one lr per optimizer, as "lr/<name>"
        for i, name in enumerate(first_lr.__keys__):
            cols["lr/" + name] = cols[f"lr_f/m{i}"]
    elif (lr := cols.get("lr_f")) is not None:
        cols["lr"] = lr
    else:
        return None
    if "v_f" in cols:  # our envelope (its version checked by the decoder)
        cols["v"] = cols["v_f"]
    seq, step, epoch, ts = (a.astype(np.float64) for a in (seq, step, epoch, cols["ts"]))
    ints = np.concatenate((seq, step, epoch))
    with np.errstate(invalid="ignore"):  # inf - inf: NaN, which is not 0
        if not bool((ints - np.floor(ints) == 0).all()):  # False for NaN, ±inf, 2.5
            return None
    cols.update(seq=seq, step=step, epoch=epoch, ts=ts)
    return cols


def _record_columns(trains: list[AnyRecord]) -> dict[str, npt.NDArray[np.float64]] | None:
    """The columns of training steps decoded as records (or a mix of records and
    lean steps): ``seq``, ``step``, ``ts``, ``lr``, ``epoch``, ``train/m<i>`` and
    ``profile/<field>``; None for a None step or train, a dict lr, a str epoch..."""
    metrics = list(map(_TRAIN, trains))
    if not isinstance(metrics[0], TrainMetrics):
        return None
    train = struct_columns(metrics)
    if train is None:  # a None train, or another run's keys, among them
        return None
    cols = {"train/" + k: v for k, v in train.items()}
    profiles = list(map(_PROFILE, trains))
    if None not in profiles:
        profile = struct_columns(profiles)
        if profile is None:
            return None
        cols.update(("profile/" + k, v) for k, v in profile.items())
    elif any(p is not None for p in profiles):
        return None
    n = len(trains)
    try:
        for name, get in _ENVELOPE:
            cols[name] = np.fromiter(map(get, trains), dtype=np.float64, count=n)
        versions = np.fromiter(map(_V, trains), dtype=np.float64, count=n)
    except (TypeError, ValueError):
        return None
    if bool(versions.all()):  # our envelope on every line, a version this reader reads
        if bool((versions > SUPPORTED_SCHEMA).any()):
            return None
        cols["v"] = versions
    elif bool(versions.any()):  # a mix of plain dicts and enveloped lines
        return None
    return cols


WRITTEN_AT_WINDOW_S = 3600.0
"""How far before its record a polled save's file time is believed (a file's time is
the host's to set: an older one, or one after the record, is not the save's)."""


def _written_at(rec: Record) -> float | None:
    at = rec.written_at
    if not isinstance(at, float | int) or not math.isfinite(at) or rec.ts is None:
        return None
    return float(at) if rec.ts - WRITTEN_AT_WINDOW_S <= at <= rec.ts else None


def _saved_progress(rec: Record) -> SavedProgress | None:
    """A saved checkpoint's ``training_state`` as progress: speculators' ``local_step`` is
    the steps done in ``epoch``; 0 (an epoch's end) means the next epoch comes."""
    st = rec.training_state
    if rec.event not in ("save_finished", "completed") or not isinstance(st, dict):
        return None
    steps, epoch, local = st.get("global_step"), st.get("epoch"), st.get("local_step")
    if not all(type(v) is int and 0 <= v < 1 << 40 for v in (steps, epoch, local)):
        return None
    assert isinstance(steps, int) and isinstance(epoch, int) and isinstance(local, int)
    at = _written_at(rec) or rec.ts
    return SavedProgress(at, steps, epoch if local > 0 else epoch + 1) if at else None
