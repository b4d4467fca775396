"""The run state: everything the records of one run say, kept compactly.

``RunState.apply_all`` takes records, malformed lines and restarts in file order.
It never raises on odd content: a record it cannot use is counted, not fatal.
Training steps go into a :class:`~eagle3_tui.model.table.StepTable`, all through
one method (``_store_steps``); a catch-up of thousands of steps is applied column by
column (a few C-level passes, model/step_ingest.py) rather than record by record.
The samplers' histories are :class:`~eagle3_tui.model.sampled.Samplers`, applied
when the state settles (:meth:`RunState.settle`).

Over 600 lines: ``RunState`` is the one place where a record moves a run's state, and
what is left here shares what every record moves: the counts (records, malformed
lines), the first and last times, and the activity that steps, saves and validation
epochs open and close (the dispatch by kind, the training steps, lifecycle events and
process starts, logs, checkpoints, the file's notices, an observed run's records). Its
separable parts live beside it: the column path (model/step_ingest.py), the samplers'
histories (model/sampled.py), the writers' sequence numbers (model/sequences.py), the
clock, link and probe (model/liveness.py), and the values it keeps (model/events.py).

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, cast

import msgspec
import numpy as np

from eagle3_tui.model.events import (
    Activity,
    CkptEvent,
    Event,
    LogLine,
    Redo,
    SavedProgress,
    inventory_events,
    save_written_at,
    saved_progress_of,
)
from eagle3_tui.model.files import CHANGES, DiskSpace, FileNotice, Outcome, WriteGap, write_gap
from eagle3_tui.model.history import History
from eagle3_tui.model.liveness import Leftover, Liveness
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
    DECODE_ERRORS,
    PROFILE_FIELDS,
    Deferred,
    Malformed,
    Record,
    TrainStep,
    record_problem,
    train_items,
)
from eagle3_tui.model.sampled import Samplers
from eagle3_tui.model.sequences import Spans, Writers
from eagle3_tui.model.stack import stack_sample
from eagle3_tui.model.step_ingest import (
    BATCH_MIN,
    Batch,
    Envelopes,
    StepBlock,
    StepColumns,
    batch_block,
    batch_spans,
    batch_startups,
    others_apart,
    others_batch,
    row_spans,
    rows_valid,
    split_batch,
    steps_valid,
)
from eagle3_tui.model.table import StepTable
from eagle3_tui.telemetry.schema import SAVED_RE, SAVING_RE

MAX_LOG = 2000
MAX_MALFORMED = 200
MAX_EVENTS = 1000
_ACTIVITIES = ("saving", "validating")

_EPOCH_RE = re.compile(r"Training epoch (\d+)/(\d+) (started|completed)")
_VAL_RE = re.compile(r"Validation epoch (\d+)/(\d+) (started|completed)")
_SIGNAL_RE = re.compile(r"^Received (SIG\w+) .* interrupting")
"""speculators' graceful-shutdown handler: the process was told to stop and saves
``interrupted/`` (a ``finish`` written after it does not make the run finished)."""


_YEAR_S = 365 * 86400.0
"""Longer than any run: a record's time this far before the newest is not its start."""

RUN_ENDS = frozenset({"finish", "interrupt", "crash", "stop"})
"""Lifecycle events that end a process of the run."""
_STARTS = frozenset({"start", "resume", "attach"})
"""Lifecycle events that name a process of the run (their ``pid``)."""


def not_this_runs(rec: Record, run_id: str | None, known: bool, pids: set[int]) -> str | None:
    """Why a lifecycle event is not the run's (None: it may be), where anyone who can
    append to its file may write any line.

    A ``start`` or ``resume`` names its run (``run_id``): a resume keeps the run's id
    (the manifest's), every rank derives the same one, so one naming another run than
    the run's first start (``run_id``) is another run's line (it made a finished run
    "dead" with another pid). A process's end (:data:`RUN_ENDS`) comes from a writer
    the run heard of before (``known``: its trainer wrote its start, a rank its
    heartbeats), or names a process of the run (``pids``: a sidecar saw its trainer
    die), or is another rank's own crash (only rank 0 writes the run's start); one of
    a writer never heard of, naming no process of the run, is no process's end.
    """
    if rec.event in ("start", "resume"):
        named = rec.run_id
        if run_id is None or not isinstance(named, str) or not named or named[:80] == run_id:
            return None
        return f"a {rec.event} of run {named[:40]!r} in run {run_id[:40]!r}'s file: another run's"
    if known or (rec.pid is not None and rec.pid in pids):
        return None
    if rec.event == "crash" and rec.rank > 0:
        return None
    return (
        f"a {rec.event} of writer {rec.w[:40]!r}, of which no record came before, naming no "
        "process of the run: no process's end"
    )


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
    writers: Writers = field(default_factory=Writers)
    records: int = 0
    epoch: int | None = None
    epochs_total: int | None = None
    first_ts: float | None = None
    last_ts: float | None = None
    last_train_ts: float | None = None
    ttt_steps: int = 0
    samplers: Samplers = field(default_factory=Samplers)
    """What the sidecar's samplers said (GPUs, reads, heartbeats, the stack)."""
    ckpt_events: deque[CkptEvent] = field(default_factory=lambda: deque(maxlen=MAX_EVENTS))
    saved_progress: SavedProgress | None = None
    """The furthest point a checkpoint saved since the trainer started says the run
    reached (its ``training_state.json``): progress between epoch bars without telemetry."""
    activity: Activity | None = None
    activity_took: dict[str, float] = field(default_factory=dict)
    """By kind (``validating``, ``saving``): the longest such activity that ended, in
    seconds (a validation far longer than any before it, with nothing moving, is hung)."""
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
    liveness: Liveness = field(default_factory=Liveness)
    """Evidence from outside the file: the host's clock, the link, a probe's finding."""
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
    file_run_ids: list[str] = field(default_factory=list)
    """Those its records named (the file's own word: another run's file names others)."""
    started_run: str | None = None
    """The run id its first ``start`` or ``resume`` named: a start or resume naming
    another is another run's record, not applied (:func:`not_this_runs`)."""
    train_writer: str | None = None
    """The writer (``w``) of the latest training step: the trainer."""
    history: History | None = None
    """Set on a run opened at a glance (model/glance.py): its steps before the table's
    first, in brief, for the charts only, until the whole file is read."""
    foreign: bool = False
    """Another file's history, shown because it is what the path holds now."""

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
            if item.kind in self.samplers.pending:
                if self._in_sequence(item):  # (False: a repeat, dropped; or held)
                    self._queue_sample(item)
                return
            full = item.resolve()
            if isinstance(full, Malformed):
                self._malformed(full)
            elif (
                self._valid(full, item.start)
                and self._in_sequence(full)
                and self._belongs(full, item.start)
            ):
                self._apply_record(full)
        elif self._valid(item) and self._in_sequence(item) and self._belongs(item):
            self._apply_record(item)

    def _in_sequence(self, rec: Record | TrainStep | Deferred) -> bool:
        """Whether a record may be applied now by its writer's sequence number
        (model/sequences.py). A record ahead of its writer's sequence that this one
        decides on is applied first (held, and the writer's), or counted as malformed
        instead (a line naming that writer, not its own; one taken at once, a few
        ahead, is taken back: no longer a record, nor an event)."""
        ok = self.writers.check(rec)
        if self.writers.decided:
            decided, self.writers.decided = self.writers.decided, []
            for ahead, refused, applied in decided:
                if refused is not None:
                    if applied:
                        self._take_back(ahead)
                    offset = ahead.start if isinstance(ahead, Deferred) else -1
                    self._malformed(Malformed(0, offset, refused, ""))
                elif isinstance(ahead, Deferred) and ahead.kind in self.samplers.pending:
                    self._queue_sample(ahead)
                elif not isinstance(ahead, Deferred) and self._belongs(ahead):
                    self._apply_record(ahead)
        return ok

    def _take_back(self, rec: Record | TrainStep | Deferred) -> None:
        """A record taken, then found not to be its writer's line: not a record, and
        the event it added is removed (a step it stored stays: its step's own)."""
        self.records -= 1
        for i in range(len(self.events) - 1, -1, -1):
            e = self.events[i]
            if (e.writer, e.ts, e.event) == (rec.w, rec.ts, getattr(rec, "event", None)):
                del self.events[i]
                if self._starting is e:
                    self._starting = None
                break

    def _queue_sample(self, item: Deferred) -> None:
        """A sampler's record, counted now and applied when the state settles."""
        self.records += 1
        self._touch(item.ts)
        self.samplers.queue(item.kind, item)

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

    def _belongs(
        self, rec: Record | TrainStep, offset: int = -1, batch: Spans | None = None
    ) -> bool:
        """Whether a lifecycle event is this run's; if not, it is counted as malformed
        (:func:`not_this_runs`). Asked once its sequence number is taken (both reads,
        line by line and a batch at once, then count its writer's numbers alike).
        ``batch``: the writers' numbers in the batch the record is applied with."""
        if rec.kind != "lifecycle" or not isinstance(rec, Record):
            return True
        event = rec.event
        if event in ("start", "resume"):
            problem = not_this_runs(rec, self.started_run, True, self._pids())
        elif event in RUN_ENDS:
            # a writer with records before this one (its numbers checked before it is
            # applied: in the state's writers, or in the batch it comes with)
            mine, span = self.writers.get(rec.w), batch.get(rec.w) if batch else None
            known = (mine is not None and mine.first_seq < rec.seq) or (
                span is not None and span[0] < rec.seq
            )
            known = known or any(e.writer == rec.w for e in self.events)
            problem = not_this_runs(rec, self.started_run, known, self._pids())
        else:
            return True
        if problem is None:
            return True
        self.writers.untake(rec)
        reason = f"lifecycle {event} seq {rec.seq}: {problem}"[:200]
        self._malformed(Malformed(0, offset, reason, ""))
        return False

    def _pids(self) -> set[int]:
        """The processes this run's records and manifest name as its own: each start's,
        resume's and attach's, the manifest's trainer and its ranks'."""
        pids = {e.pid for e in self.events if e.pid is not None and e.event in _STARTS}
        mine = self.manifest.get("pid")
        if type(mine) is int:
            pids.add(mine)
        ranks = self.manifest.get("ranks")
        for entry in ranks if isinstance(ranks, list) else ():
            pid = entry.get("pid") if isinstance(entry, dict) else None
            if type(pid) is int:
                pids.add(pid)
        return pids

    def set_manifest(self, manifest: dict[str, Any]) -> None:
        self.manifest = dict(manifest)
        self._note_run_id(manifest.get("run_id"), in_file=False)
        epochs = manifest.get("epochs")
        if isinstance(epochs, int) and epochs > 0:
            self.epochs_total = epochs

    def settle(self) -> None:
        """Apply the queued sampler records (only the newest ones a history keeps).

        A catch-up meets tens of thousands of GPU, IO and heartbeat samples of which
        the bounded histories keep the last few hundred: they wait in
        ``samplers.pending``, undecoded, and only those kept are decoded and applied
        here. Settling is the readers' to ask for, not the ingest's: a feed that ends
        a catch-up's slice leaves the queues as they are, so that its next slice can
        push the older samples out undecoded. Whoever reads ``samplers`` calls this
        first (``Run.state``, ``diagnose``, ``build_snapshot`` do); it mutates the
        state, so a reader that shares the run across threads calls it under the
        lock its feeding holds (the app's pipeline reads ``Run.state`` under its own).
        """
        for kind, rec in self.samplers.take_pending():
            # each was counted a record when it was queued: one that is not is a
            # malformed line instead, counted once
            if isinstance(rec, Malformed):
                self.records -= 1
                self._malformed(rec)
            elif not self._valid(rec):
                self.records -= 1
            else:
                problem = self.samplers.apply(kind, rec)
                if problem is not None:
                    self.records -= 1
                    self._bad_payload(rec, problem)

    def _touch(self, ts: float) -> None:
        if ts:
            if self.last_ts is None or ts > self.last_ts:
                self.last_ts = ts
            # no run spans a year: a time a year before the newest is no start of it
            # (a line dated 1970 made a run of a minute "ran 20794d"), and a start a
            # year before the newest was such a line
            floor = self.last_ts - _YEAR_S
            if self.first_ts is None or self.first_ts < floor or floor <= ts < self.first_ts:
                self.first_ts = ts

    def _apply_record(self, rec: Record | TrainStep) -> None:
        self.records += 1
        self._touch(rec.ts)
        kind = rec.kind
        if kind == "train":
            self._apply_train(rec)
        elif not isinstance(rec, Record):
            return
        elif kind in self.samplers.pending:
            self.samplers.queue(kind, rec)
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
            self.samplers.stack = stack_sample(rec) or self.samplers.stack
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
        what = self.activity
        if what is not None and what.what in kinds and what.since <= ts:
            took = ts - what.since
            if math.isfinite(took) and took > self.activity_took.get(what.what, 0.0):
                self.activity_took[what.what] = took
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
        crash = self.events[-1] if self.events else None
        if (
            crash is not None
            and crash.event == "crash"
            and (crash.error or "").startswith("the trainer process")
            and rec.ts
            and rec.ts <= crash.ts
        ):
            # a step logged before the crash its sidecar saw, whose line came after the
            # crash's in the file (two writers): one more step done by then (a fresh
            # read said "crash after step 80" where the live monitor said 81)
            done = self._done_by_crash(crash.done)
            if done != crash.done:
                self.events[-1] = replace(crash, done=done)

    def _apply_train(self, rec: Record | TrainStep) -> None:
        step = rec.step_or_global
        if step is None:
            last = self.table.last_step
            step = 0 if last is None else last + 1
        values: dict[str, float | None] = {}
        keys: Iterable[str] = ()
        if rec.train is not None:
            train = train_items(rec.train)
            for k, v in train.items():
                values["train/" + k] = v
            keys = train.keys()
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
        self._store_steps(step, rec.ts, values, keys, rec)

    def _store_steps(
        self,
        step: int,
        ts: float,
        rows: dict[str, float | None] | StepBlock,
        keys: Iterable[str],
        last: Record | TrainStep,
        started: float | None = None,
    ) -> None:
        """The one way training steps enter the table: one step's values (``step`` at
        ``ts``: a record's), or a block of them as columns (``step``, ``ts``: its first).
        A step at or below the last one first drops the steps it redoes; then what the
        steps say of the run is noted: the TTT depth of their ``train`` ``keys``, and
        of ``last``, the last step, the epoch, the time, the writer, the end of a long
        activity and of a start-up (``started``: the batch's first step of the process
        still starting)."""
        self._redo_check(step, ts)
        if isinstance(rows, dict):
            self.table.append_row(step, ts, rows)
        else:
            self.table.extend_columns(rows.steps, rows.ts, rows.columns)
        self._note_ttt(keys)
        self._note_train(last, started)

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
        steps, a float lr and an int epoch (model/step_ingest.py). Other kinds are
        applied one by one, in order; they never touch the step table, so applying the
        steps after them changes nothing but the (re-derived) activity.
        """
        batch = split_batch(items)
        if batch is None:
            return False
        spans = batch_spans(batch, self.writers)
        if spans is None or not steps_valid(batch, "" in spans):
            return False
        # From here on the batch is applied, in the order the lines came: the other
        # kinds, the writers' sequence numbers, the malformed lines, the steps.
        starts = self._apply_others(batch if batch.kinds is not None else None, spans)
        self.writers.advance(spans)
        for bad in items:
            if type(bad) is Malformed:
                self.apply(bad)
        last = cast("TrainStep", batch.trains[-1])
        self._apply_block(batch_block(batch), "v" in batch.cols, last, starts)
        return True

    def apply_steps(
        self,
        rows: StepColumns,
        others: list[Item],
        before: list[int],
        envelopes: Envelopes | None = None,
        places: list[int] | None = None,
    ) -> bool:
        """A columns frame (model/segments.py): its training steps as columns, and the
        range's other lines decoded (``others``, in file order; ``before[i]``: how many
        steps come before ``others[i]``), applied as :meth:`_apply_batch` applies the
        lines themselves; ``envelopes``: its old samples, which only count (``places``:
        where each of ``others`` is in the file). False, with nothing applied, where it
        would not take them as one batch (the caller then applies the steps as records,
        line by line)."""
        n = len(rows.steps)
        if n < BATCH_MIN or not rows.w or not rows_valid(rows):
            return False
        good = [type(r) is not Malformed for r in others]
        recs = [r for r, ok in zip(others, good, strict=True) if ok]
        if not others_apart(recs):
            return False
        at = [b for b, ok in zip(before, good, strict=True) if ok]
        where = None if places is None else [p for p, ok in zip(places, good, strict=True) if ok]
        spans = row_spans(rows, recs, at, self.writers, envelopes, where)
        if spans is None:
            return False
        starts = self._apply_others(others_batch(recs, rows.steps) if recs else None, spans)
        if envelopes is not None:
            self._count_envelopes(envelopes)
        self.writers.advance(spans)
        for bad in others:
            if type(bad) is Malformed:
                self.apply(bad)
        last = Record(kind="train", ts=float(rows.ts[-1]), epoch=int(rows.epoch[-1]), w=rows.w)
        self._apply_block(rows.block(), True, last, starts)
        return True

    def _count_envelopes(self, env: Envelopes) -> None:
        """Old samples by their envelopes: counted, their first and last times touched
        (as :meth:`_apply_others` does each kind's), queued for no history (every one
        of their kind that a history keeps comes after them)."""
        self.records += env.n
        kind, ts = env.kind, env.ts
        if not len(kind):
            return
        lo, hi = int(kind.min()), int(kind.max())
        # a few kinds, numbered from 0: each one's first and last by argmax, no sort
        for k in range(lo, hi + 1) if hi - lo < 16 else np.unique(kind).tolist():
            hit = kind == k
            first = int(hit.argmax())
            if hit[first]:
                self._touch(float(ts[first]))
                self._touch(float(ts[len(hit) - 1 - int(hit[::-1].argmax())]))

    def _apply_others(self, batch: Batch | None, spans: Spans) -> list[float]:
        """The batch's records of other kinds (None: it has none): sampler records
        queue (``settle()`` applies the ones the bounded histories keep); the rest
        apply in order. Returns the times of the process starts its steps may end:
        the one still starting before it, and those among these records."""
        starts = [self._starting.ts] if self._starting is not None else []
        if batch is None:
            return starts
        events_before = len(self.events)
        recs, kinds, rec_arr = batch.recs, batch.kinds, batch.rec_arr
        assert kinds is not None and rec_arr is not None
        applied = kinds == "train"
        for kind, queue in self.samplers.pending.items():
            mask = kinds == kind
            applied |= mask
            idx = np.flatnonzero(mask)
            if not len(idx):
                continue
            queue.extend(rec_arr[idx[-(queue.maxlen or len(idx)) :]].tolist())
            self.samplers.unsettled = True
            self.records += len(idx)
            self._touch(recs[int(idx[0])].ts)
            self._touch(recs[int(idx[-1])].ts)
        for i in np.flatnonzero(~applied).tolist():
            r = recs[i]
            if isinstance(r, Deferred):
                full = r.resolve()
                if isinstance(full, Malformed):
                    self._malformed(full)
                elif self._valid(full, r.start) and self._belongs(full, r.start, spans):
                    self._apply_record(full)
            elif self._valid(r) and self._belongs(r, -1, spans):
                self._apply_record(r)
        new = self.events[events_before:]
        return starts + [e.ts for e in new if e.event in ("start", "resume")]

    def _apply_block(
        self, block: StepBlock, ours: bool, last: Record | TrainStep, starts: list[float]
    ) -> None:
        """A batch's training steps, counted as its records (``ours``: lines with our
        envelope), then stored (``last``: the last step; ``starts``: the times of the
        process starts they may end)."""
        ts = block.ts
        n = len(ts)
        self.records += n
        self._touch(float(ts.min()))
        self._touch(float(ts.max()))
        if not ours:  # lines without our envelope (another writer's)
            self.plain_records += n
        ended, started = batch_startups(ts, starts)
        self.startups += ended
        self._store_steps(int(block.steps[0]), float(ts[0]), block, block.keys, last, started)

    # ---- other kinds ----------------------------------------------------------
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

    def _bad_payload(self, rec: Record, reason: str) -> None:
        """A record whose envelope is fine but whose payload is not: counted as malformed."""
        self.malformed_count += 1
        self.malformed.append(
            Malformed(0, -1, f"{rec.kind} record seq {rec.seq}: {reason}"[:200], "")
        )

    def _apply_ckpt(self, rec: Record) -> None:
        if rec.event == "inventory":  # (a resume's look finds the saves its records hold)
            held = {e.path for e in self.ckpt_events if e.event == "save_finished"}
            found = inventory_events(rec)
            if any(e.event == "save_finished" and e.path not in held for e in found):
                self.ckpt_events.extend(e for e in found if e.path not in held)
            return
        ev = CkptEvent(
            rec.ts,
            rec.event or "",
            rec.path or "",
            rec.epoch,
            rec.bytes,
            rec.duration_s,
            rec.complete,
            save_written_at(rec),
        )
        self.ckpt_events.append(ev)
        saved = saved_progress_of(rec)
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
            done=self._done_by(rec),
        )
        self.events.append(event)
        if rec.event in ("start", "resume"):
            if self.started_run is None and isinstance(rec.run_id, str) and rec.run_id:
                self.started_run = rec.run_id[:80]
            self._close(_ACTIVITIES, rec.ts)
            self._starting = event  # until its first step: a start-up, not a silence
            self.signalled = None
        elif rec.event == "attach" and self._starting is not None and self._starting.pid == rec.pid:
            self._starting = None  # attached to a process long started: no start-up ends

    def _done_by(self, rec: Record) -> int | None:
        """A lifecycle event's steps done by then (:func:`_steps_done`); a crash its
        sidecar saw says the last step the sidecar heard of, which may be older than the
        last one logged (the log panel said "crash after step 11" beside the banner's
        12): not fewer than the steps logged before it."""
        done = _steps_done(rec)
        if rec.event != "crash" or not (rec.error or "").startswith("the trainer process"):
            return done
        return self._done_by_crash(done)

    def _done_by_crash(self, done: int | None) -> int | None:
        """A sidecar's crash: not fewer steps done than this process logged."""
        start, last = self.process_start(), self.last_train_ts
        if self.global_step is None or last is None or (start is not None and last < start.ts):
            return done  # no step of this process logged: the last one is another's
        logged = self.global_step + 1
        return logged if done is None or logged > done else done

    def _note_run_id(self, run_id: object, in_file: bool = True) -> None:
        if not isinstance(run_id, str) or not run_id:
            return
        if run_id[:80] not in self.run_ids:
            self.run_ids.append(run_id[:80])
        if in_file and run_id[:80] not in self.file_run_ids:
            self.file_run_ids.append(run_id[:80])

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
        self.liveness.take_link(other.liveness)
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
        except DECODE_ERRORS as e:
            self._bad_payload(rec, f"proc: {e}")
            return
        self.observed = Observed(rec.ts, rec.alive, info, tuple(members))
        self.proc_samples.append(ProcSample(rec.ts, rec.alive, info.cpu_pct, info.log_grew))
        # its tree once the trainer is gone: what of the run was still alive then
        left = [] if rec.alive else [_leftover(m) for m in members]
        self.liveness.set_process(rec.alive, rec.ts, left)
        if self.epochs_total is None and isinstance(info.epochs, int) and info.epochs > 0:
            self.epochs_total = info.epochs

    def _apply_progress(self, rec: Record) -> None:
        """An epoch progress bar of the trainer's output."""
        try:
            bar = decode_bar(rec.bar)
        except DECODE_ERRORS as e:
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
        return self.writers.lost

    @property
    def duplicate_records(self) -> int:
        return self.writers.duplicates

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


def _leftover(m: ObservedMember) -> Leftover:
    """A process of an observed run alive when its trainer was found gone (``gone``: a
    later look found it gone too)."""
    rss = int(m.rss) if m.rss is not None and math.isfinite(m.rss) else None
    return Leftover(m.pid, m.comm[:32], rss, None, gone=m.state == "gone")


def _steps_done(rec: Record) -> int | None:
    """A lifecycle event's steps done by then (what "after step N" says). Its ``step``
    is that count in the trainer's own events (interrupt, finish, a crash it raised),
    while a kill's ``stop`` and a crash its sidecar saw carry the 0-based index of the
    last step (the stop's ``global_step`` is the count)."""
    if rec.event == "stop" and rec.global_step is not None:
        return rec.global_step
    seen = rec.event == "crash" and (rec.error or "").startswith("the trainer process")
    if (rec.event == "stop" or seen) and rec.step is not None:
        return rec.step + 1
    return rec.step_or_global
