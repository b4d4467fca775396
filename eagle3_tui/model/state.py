"""The run state: everything the records of one run say, kept compactly.

``RunState.apply`` takes records (and malformed lines and restarts) in file order.
It never raises on odd content: a record it cannot use is counted, not fatal.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from eagle3_tui.model.reader import Item, Restarted
from eagle3_tui.model.records import Malformed, Record
from eagle3_tui.model.series import Series

MAX_LOG = 2000
MAX_MALFORMED = 200


@dataclass(frozen=True, slots=True)
class LogLine:
    ts: float
    level: str
    logger: str
    msg: str


@dataclass(frozen=True, slots=True)
class Redo:
    """A resume that went back: steps ``first..last`` were trained again."""

    first: int
    last: int
    ts: float


@dataclass(slots=True)
class WriterSeq:
    """Sequence tracking of one writer."""

    next_seq: int = 0
    lost: int = 0
    duplicates: int = 0


@dataclass
class RunState:
    """Mutable state of one run, built by :meth:`apply`."""

    series: dict[str, Series] = field(default_factory=dict)
    val_by_epoch: dict[int, dict[str, float]] = field(default_factory=dict)
    hparams: dict[str, Any] = field(default_factory=dict)
    logs: deque[LogLine] = field(default_factory=lambda: deque(maxlen=MAX_LOG))
    lifecycle: list[Record] = field(default_factory=list)
    malformed: deque[Malformed] = field(default_factory=lambda: deque(maxlen=MAX_MALFORMED))
    malformed_count: int = 0
    restarts: list[Restarted] = field(default_factory=list)
    redos: list[Redo] = field(default_factory=list)
    writers: dict[str, WriterSeq] = field(default_factory=dict)
    records: int = 0
    train_records: int = 0
    global_step: int | None = None
    epoch: int | None = None
    first_ts: float | None = None
    last_ts: float | None = None
    last_train_ts: float | None = None
    last_record: dict[str, Record] = field(default_factory=dict)
    ttt_steps: int = 0

    # ---- ingest -------------------------------------------------------------
    def apply_all(self, items: list[Item]) -> None:
        for item in items:
            self.apply(item)

    def apply(self, item: Item) -> None:
        if isinstance(item, Record):
            self._apply_record(item)
        elif isinstance(item, Malformed):
            self.malformed_count += 1
            self.malformed.append(item)
        else:
            self.restarts.append(item)

    def _check_seq(self, rec: Record) -> bool:
        """Track per-writer sequence numbers; False for a duplicate to drop."""
        if rec.seq < 0 or not rec.w:
            return True
        ws = self.writers.get(rec.w)
        if ws is None:
            ws = self.writers[rec.w] = WriterSeq(next_seq=rec.seq)
            if rec.seq > 0 and not self.restarts:
                # joined mid-stream (a bounded read): not a loss we can prove
                pass
        if rec.seq < ws.next_seq:
            ws.duplicates += 1
            return False
        if rec.seq > ws.next_seq:
            ws.lost += rec.seq - ws.next_seq
        ws.next_seq = rec.seq + 1
        return True

    def _apply_record(self, rec: Record) -> None:
        if not self._check_seq(rec):
            return
        self.records += 1
        ts = rec.ts or None
        if ts is not None:
            if self.first_ts is None:
                self.first_ts = ts
            if self.last_ts is None or ts > self.last_ts:
                self.last_ts = ts
        self.last_record[rec.kind] = rec
        kind = rec.kind
        if kind == "train":
            self._apply_train(rec)
        elif kind == "val":
            self._apply_val(rec)
        elif kind == "log":
            self.logs.append(LogLine(rec.ts, rec.level or "INFO", rec.logger or "", rec.msg or ""))
        elif kind == "lifecycle":
            self.lifecycle.append(rec)
        elif kind == "hparams" and rec.hparams:
            self.hparams.update(rec.hparams)

    def _series(self, key: str) -> Series:
        s = self.series.get(key)
        if s is None:
            s = self.series[key] = Series()
        return s

    def _apply_train(self, rec: Record) -> None:
        step = rec.step if rec.step is not None else rec.global_step
        if step is None:
            step = 0 if self.global_step is None else self.global_step + 1
        if self.global_step is not None and step <= self.global_step:
            self.redos.append(Redo(step, self.global_step, rec.ts))
            for s in self.series.values():
                s.truncate_from(step)
        self.train_records += 1
        self.global_step = step
        if rec.epoch is not None:
            self.epoch = rec.epoch
        self.last_train_ts = rec.ts or self.last_train_ts
        if rec.train:
            for k, v in rec.train.items():
                self._series("train/" + k).append(step, v)
                if k.startswith("full_acc_"):
                    idx = _suffix_int(k)
                    if idx is not None and idx + 1 > self.ttt_steps:
                        self.ttt_steps = idx + 1
        if rec.profile:
            for k, v in rec.profile.items():
                if isinstance(v, (int, float)):
                    self._series("profile/" + k).append(step, float(v))
        lr = rec.lr
        if isinstance(lr, (int, float)):
            self._series("lr").append(step, float(lr))
        elif isinstance(lr, dict):
            for k, v in lr.items():
                self._series("lr/" + k).append(step, v)

    def _apply_val(self, rec: Record) -> None:
        if not rec.val:
            return
        epoch = rec.epoch if rec.epoch is not None else len(self.val_by_epoch)
        values = {k: (math.nan if v is None else v) for k, v in rec.val.items()}
        self.val_by_epoch[epoch] = values
        step = rec.step if rec.step is not None else (self.global_step or 0)
        for k, v in values.items():
            self._series("val/" + k).append(step, v)

    # ---- queries ------------------------------------------------------------
    def latest(self, key: str) -> float | None:
        s = self.series.get(key)
        return None if s is None else s.last_value()

    @property
    def lost_records(self) -> int:
        return sum(w.lost for w in self.writers.values())

    @property
    def duplicate_records(self) -> int:
        return sum(w.duplicates for w in self.writers.values())

    def lifecycle_events(self) -> list[str]:
        return [r.event or "" for r in self.lifecycle]


def _suffix_int(key: str) -> int | None:
    tail = key.rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else None
