"""What happened to ``metrics.jsonl`` under a run being read, and to its writes.

The file a run writes can change under the reader: deleted (and recreated),
replaced (another run's file moved into place), truncated; the telemetry may refuse
what it finds there (a symbolic link). The stream says that it happened and when
(:class:`FileChanged`); the writer says what it saw and did, in a ``lifecycle``
``file`` event at the head of the file it recreated. ``model/run.py`` decides from
the new file's first records whose history it continues; each change becomes a
:class:`FileNotice`, whose :meth:`~FileNotice.sentence` says only what the stream and
the records said. A full disk is the other way the file stops growing while the
run goes on: the host's :class:`DiskSpace` says so while it lasts, the writers'
``write_gap`` events (:class:`WriteGap`) how much it cost once space returned.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from eagle3_tui.model.units import clock, size
from eagle3_tui.telemetry.schema import METRICS_FILE

MIN_ROOM = 1 << 20
"""Less room than this on the run's filesystem is no room: the telemetry's writes are
at most 64 KiB of lines (and a block of its columns companion), a record a few KiB."""
DISK_FRESH_S = 30.0
"""A disk report older than this (the host's clock) says nothing about now (the agent
reports at least every 10 s while it follows the file)."""
CHANGES = frozenset({"deleted", "replaced", "truncated", "refused"})
"""What a writer's ``file`` event may say happened."""
WRITE_ERRORS = {"ENOSPC": "disk full", "EDQUOT": "quota exceeded", "EIO": "I/O error"}
"""A ``write_gap``'s reason, as the sentences say it."""


@dataclass(frozen=True, slots=True)
class FileChanged:
    """The stream's word: the file it follows changed under it, and it starts over at 0.

    ``change``: ``deleted``, ``replaced``, ``truncated`` (a transport that cannot say:
    the reader's restart alone). ``at``: the host's clock when it was noticed."""

    change: str
    at: float | None = None
    read: int | None = None
    """Bytes of the earlier file the stream had delivered."""
    size: int | None = None
    """The file's size when the change was noticed (None: no file there now)."""
    stream: int = 0
    """Which file of the run (a node's, see ``transport/merge.py``)."""


@dataclass(frozen=True, slots=True)
class DiskSpace:
    """Room on the run directory's filesystem as the host saw it at ``at`` (its clock):
    ``os.statvfs`` (``agent/diskspace.py``). ``room``: what the writer's own user may
    still write (root may use the blocks reserved for it; 0 when read-only)."""

    avail: int
    free: int
    total: int
    room: int
    at: float
    read_only: bool = False
    stream: int = 0

    @classmethod
    def of(cls, report: Mapping[str, Any] | None, stream: int = 0) -> DiskSpace | None:
        """The agent's report (a ``disk`` event, ``eof``'s ``disk``); None where it is
        not one (an older agent's, a field of the wrong type)."""
        if not isinstance(report, Mapping):
            return None
        sizes = [report.get(k) for k in ("avail", "free", "total", "room")]
        at = finite(report.get("at"))
        if at is None or not all(type(x) is int and x >= 0 for x in sizes):
            return None
        avail, free, total, room = cast("list[int]", sizes)
        return cls(avail, free, total, room, at, report.get("read_only") is True, stream)

    def full(self, now: float) -> bool:
        """Whether this report, still current at ``now`` (host clock), leaves no room."""
        return now - self.at <= DISK_FRESH_S and (self.read_only or self.room < MIN_ROOM)

    def as_reason(self) -> str:
        """The host's filesystem, as the verdict says it."""
        if self.read_only:
            return "The run's filesystem is read-only on the host"
        return f"Disk full on the host ({size(self.room)} free on the run's filesystem)"


@dataclass(frozen=True, slots=True)
class WriteGap:
    """A stretch of failed writes one writer reported once it could write again: its
    ``records`` were never written (their sequence numbers ``first_seq..last_seq`` are
    a gap, counted as lost like any other)."""

    writer: str
    reason: str
    records: int
    first_seq: int
    last_seq: int
    since: float
    until: float

    @property
    def why(self) -> str:
        return WRITE_ERRORS.get(self.reason, self.reason)

    def sentence(self) -> str:
        many = "record" if self.records == 1 else "records"
        return (
            f"{self.records:,} {many} not written ({self.why}) between "
            f"{clock(self.since)} and {clock(self.until)}"
        )


def write_gap(payload: Mapping[str, Any], writer: str) -> WriteGap | None:
    """A ``write_gap`` event's payload; None when a field is missing or of the wrong type."""
    ints = [payload.get(k) for k in ("records", "first_seq", "last_seq")]
    since, until = finite(payload.get("since")), finite(payload.get("until"))
    reason = payload.get("reason")
    if not all(type(x) is int and x >= 0 for x in ints) or not isinstance(reason, str):
        return None
    if since is None or until is None:
        return None
    records, first, last = cast("list[int]", ints)
    return WriteGap(writer, reason[:40], records, first, last, since, until)


def finite(x: object) -> float | None:
    """A number of an event's payload as a float; None for anything else."""
    if type(x) not in (int, float):
        return None
    value = float(cast("float", x))
    return value if math.isfinite(value) else None


MERGE_S = 120.0
"""A writer's ``file`` event tells of a change the stream saw this close in time."""


class Outcome(enum.Enum):
    """What a change turned out to be for the history shown."""

    PENDING = "pending"
    """The new file has not said yet whose it is (its items wait)."""
    CONTINUES = "continues"
    """It continues the history shown (nothing dropped)."""
    BACK = "back"
    """It continues a history set aside earlier, which is shown again."""
    OTHER = "other"
    """Another file: the earlier history is set aside, this one shown."""
    IGNORED = "ignored"
    """Another file on a node of a multi-node run: its records are not applied."""
    KEPT = "kept"
    """Truncated: the history read before is kept."""
    HERE = "here"
    """Said by a writer's ``file`` event alone (the file was read from after it)."""


@dataclass(slots=True)
class FileNotice:
    """One change of the run's file, as the stream and the writer told it."""

    change: str
    at: float | None
    outcome: Outcome
    read: int | None = None
    size: int | None = None
    stream: int = 0
    writer: str | None = None
    """The ``w`` of the writer's ``file`` event, once one came."""
    moved_to: str | None = None
    found: str | None = None
    previous_size: int | None = None
    written_before: int | None = None
    gaps: dict[str, int] = field(default_factory=dict)
    """Per writer of the history continued: records missing between its last one
    before the change and its first one after."""
    other_run: str | None = None
    """OTHER: the other file's run id (once its records named one)."""
    noted: float | None = None
    """The host's time of the newest record read when it was noticed (where the stream
    did not say when: the log's order)."""
    set_aside: bool = False
    """OTHER: another change set the other file's history aside again (at
    ``shown_until``, when known)."""
    shown_until: float | None = None

    def goes_with(self, event: Mapping[str, Any], writer: str) -> bool:
        """Whether a writer's ``file`` event, met first in the file after this change,
        tells of it: a change the stream saw, of that kind, that close in time; or, once
        a writer told of it, another writer of the run telling of the same change (each
        writes its own event: the one that made the file, the others that adopted it)."""
        change = event.get("change")
        noticed = finite(event.get("noticed"))
        close = noticed is None or self.at is None or abs(noticed - self.at) <= MERGE_S
        if self.writer is not None:
            return writer != self.writer and change == self.change and close
        if self.outcome not in _STREAM_SAW:
            return False
        if self.change != "restarted" and (change == "truncated") != (self.change == "truncated"):
            return False  # the stream said which: a truncation, or a new file
        return close

    def merge(self, event: Mapping[str, Any], writer: str) -> None:
        """The writer's ``file`` event that goes with this change (a second writer's
        adds only where the file was moved, if the first did not say)."""
        moved = event.get("moved_to")
        if self.writer is not None:
            if self.moved_to is None and isinstance(moved, str):
                self.moved_to = moved[:300]
            return
        change = event.get("change")
        if isinstance(change, str) and change in CHANGES:
            self.change = change  # the writer saw what happened; the stream what followed
        noticed = finite(event.get("noticed"))
        if noticed is not None:
            self.at = noticed if self.at is None else min(self.at, noticed)
        self.writer = writer
        found = event.get("found")
        self.moved_to = moved[:300] if isinstance(moved, str) else None
        self.found = found[:300] if isinstance(found, str) else None
        previous = event.get("previous")
        if isinstance(previous, Mapping) and type(previous.get("size")) is int:
            self.previous_size = previous["size"]
        before = event.get("written_before")
        self.written_before = before if type(before) is int and before >= 0 else None

    # ---- what it says ---------------------------------------------------------------
    def sentence(self, run_id: str | None = None, trainer: str | None = None) -> str:
        """One sentence, every clause of it from the stream or the records. ``run_id``:
        the run id of the history shown (for the current OTHER notice); ``trainer``: the
        writer of its training steps."""
        f = METRICS_FILE
        at = f" at {clock(self.at)}" if self.at is not None else ""
        who = (
            "the trainer"
            if trainer is not None and self.writer == trainer
            else "a writer of this run"
        )
        if self.change == "refused":
            when = " at start" if not self.written_before else at
            what = self.found or "what it found there"
            moved = f"; moved aside to {self.moved_to}" if self.moved_to else ""
            return f"{f}: {who} refused {what}{when}{moved}; it writes its own file there"
        verb = "started over" if self.change not in CHANGES else self.change
        loss = self._loss()
        kept = self.change == "truncated" and self.outcome in _STREAM_SAW
        if kept:  # the file went on, shorter: its history read before stays
            gone = self._bytes_gone()
            parts = [f"{gone:,} bytes gone from the host"] if gone is not None else []
            parts.append("the history read before is kept")
            tail = f"; {loss}" if loss else ""
            return f"{f} truncated{at} ({'; '.join(parts)}){tail}"
        if self.outcome is Outcome.PENDING:
            if self.size is None:
                return f"{f} {verb}{at}; no file there yet (the history read before is shown)"
            return (
                f"{f} {verb}{at}; the new file there has not said yet whose it is "
                "(the history read before is shown)"
            )
        if self.outcome is Outcome.OTHER:
            other = self.other_run if self.set_aside else run_id
            whose = (
                f"another run: run id {other}" if other else "no writer or run id of this run in it"
            )
            if self.set_aside:
                until = f" until {clock(self.shown_until)}" if self.shown_until else ""
                return f"{f} {verb}{at} by another file ({whose}), shown{until}"
            return (
                f"{f} {verb}{at}: now showing the file there ({whose}); "
                "the earlier history is not this file's"
            )
        if self.outcome is Outcome.IGNORED:
            return (
                f"{f} of node {self.stream} {verb}{at} by another file: its records are not "
                "shown (the node's history read before is kept)"
            )
        if self.outcome is Outcome.HERE:
            return self._here(f, at, who)
        lost = f" ({loss})" if loss else ""
        back = "; the other file's history is set aside" if self.outcome is Outcome.BACK else ""
        if self.change == "deleted" and self.writer is not None:
            return f"{f} deleted{at}; {who} recreated it{lost}{back}"
        if self.change == "replaced" and self.moved_to:
            return (
                f"{f} replaced{at} by another file (moved aside to {self.moved_to} by {who}); "
                f"this run's history continues{lost}{back}"
            )
        return f"{f} {verb}{at}; the file there continues this run{lost}{back}"

    @property
    def lost(self) -> int | None:
        """Records missing across the change, of the writers that wrote since (None: no
        writer of the history continued has written since)."""
        return sum(self.gaps.values()) if self.gaps else None

    def _loss(self) -> str | None:
        lost = self.lost
        if lost is None:
            return None
        if not lost:
            return "nothing lost"
        return f"{lost:,} record{'' if lost == 1 else 's'} lost across it"

    def _bytes_gone(self) -> int | None:
        if self.read is not None and self.size is not None and self.read > self.size:
            return self.read - self.size
        return self.previous_size

    def _here(self, f: str, at: str, who: str) -> str:
        """The writer's word alone: the history before the change was not read here."""
        n = self.written_before
        missing = (
            f": the {n:,} record{'' if n == 1 else 's'} it wrote before are not in this file"
            if n
            else ""
        )
        if self.change == "truncated":
            had = f" ({self.previous_size:,} bytes then)" if self.previous_size is not None else ""
            return f"{f} was truncated{at}{had}: what was written past its cut is not in it"
        moved = f" (moved aside to {self.moved_to})" if self.moved_to else ""
        if self.change == "replaced":
            return f"{f} was replaced{at} by another file{moved}; {who} recreated it{missing}"
        return f"{f} was deleted{at} and recreated by {who}{missing}"


_STREAM_SAW = (Outcome.CONTINUES, Outcome.BACK, Outcome.KEPT)
"""What a change the stream saw turned out to be, when the file's first records said."""
