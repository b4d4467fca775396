"""Each writer's sequence numbers: records lost, records repeated, and across a change
of the file, how many of each writer's records went missing.

Every record of our schema carries its writer (``w``) and that writer's sequence
number (``seq``, from 0). A gap is records lost (a crash, a full disk, a file cut
short); a number already seen is a repeat (a resumed stream sending a range again),
dropped. A writer's first record counts nothing lost before it: what came before was
before the reader's first byte.

A number ahead of the writer's next one is held, not applied, until the writer's next
record says what it was: one that goes on after it (the records between were lost:
counted, and the held record applied first), or one that goes on from the writer's
own sequence (the held line was not that writer's: anyone who can append to the file
can write a line naming a writer and any number; it is refused, and the writer's
sequence is as it was). Without that, one line naming a writer and a number far ahead
made every later record of that writer a "duplicate", dropped, and counted the
difference as records lost. A record a few ahead (:data:`FEW_LOST`; not a sample)
is taken at once, as before: it may be its writer's last (a process's end after a
queue's drops), which no record of it follows; if the writer's next record goes on
from its own sequence, it is taken back (counted malformed, not a record; an event
it added removed) and the writer's sequence is as it was. Across a change of the file
(``begin_crossing``) a writer's first record may jump (the records written into the
file that went), and a glance's events (``partial``) jump by design: those are taken
as they come.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, cast

from eagle3_tui.model.files import FileNotice
from eagle3_tui.model.records import AnyRecord
from eagle3_tui.model.samples import SAMPLES_KEPT

Spans = dict[str, tuple[int, int]]
"""Each writer's first and last sequence number in a batch."""


class Decided(NamedTuple):
    """A record ahead of its writer's sequence, decided on by the writer's next one."""

    rec: AnyRecord
    refused: str | None
    """None: the writer's (held: apply it now, before the record checked); else why it
    is not the writer's line (a malformed line)."""
    applied: bool
    """It was taken (a few ahead, not a sample): applied, and counted a record."""


FEW_LOST = 1000
"""A record this far ahead of its writer's next number, or less, is taken at once as
records lost (a queue's drops; the last record of a process that lost some before it,
which no record of it follows to say it is its own), unless it is a sample (a sampler
writes again within seconds). One further ahead is held: no loss leaves a writer
nothing more to write, and a line naming a real writer and a number far ahead must not
move the state (see :meth:`Writers.check`)."""


@dataclass(slots=True)
class WriterSeq:
    """Sequence tracking of one writer."""

    next_seq: int = 0
    lost: int = 0
    duplicates: int = 0
    first_seq: int = -1
    """The number of the first of its records read."""
    ahead: AnyRecord | None = None
    """A record numbered ahead of the writer's sequence, until the writer's next record
    says whether it is the writer's: held (not applied), or taken (a few ahead)."""
    ahead_seq: int = -1
    """Its sequence number (a ``Deferred`` past 2**53 decodes its line to say it)."""
    ahead_from: int = -1
    """The writer's next number before it; -1: it is held, not taken."""


class Writers(dict[str, WriterSeq]):
    """The writers of a run's records, by name (``RunState.writers``)."""

    def __init__(self) -> None:
        super().__init__()
        self.partial = False
        """Set while only some of the file's lines are applied (a glance's events): a
        number jumping ahead is not records lost."""
        self._crossing: FileNotice | None = None
        self._crossing_next: dict[str, int] = {}
        """Each writer's next sequence number when the file changed (``begin_crossing``)."""
        self.decided: list[Decided] = []
        """Records ahead of their writer's sequence that the last :meth:`check` decided
        on, in order (see :class:`Decided`)."""

    @property
    def lost(self) -> int:
        return sum(w.lost for w in self.values())

    @property
    def duplicates(self) -> int:
        return sum(w.duplicates for w in self.values())

    def check(self, rec: AnyRecord) -> bool:
        """Track a record's sequence number; False for one not to apply now: a duplicate
        (counted and dropped), or one ahead of the writer's next number by more than
        :data:`FEW_LOST`, or a sample ahead (held). What it says of the writer's record
        ahead before it is put in :attr:`decided`."""
        seq = rec.seq
        if seq < 0 or not rec.w:
            return True
        ws = self.get(rec.w)
        if ws is None:
            # a writer's first record: anything before it was before our first byte
            ws = self[rec.w] = WriterSeq(next_seq=seq, first_seq=seq)
        elif ws.ahead is not None and not self._settle(rec.w, ws, seq):
            ws.duplicates += 1
            return False
        if seq < ws.next_seq:
            ws.duplicates += 1
            return False
        if seq > ws.next_seq and not self.jump_taken(rec.w) and not _gap_said(rec, ws.next_seq):
            ws.ahead, ws.ahead_seq = rec, seq
            if seq - ws.next_seq > FEW_LOST or rec.kind in SAMPLES_KEPT:
                ws.ahead_from = -1
                return False
            ws.ahead_from = ws.next_seq
        self._take(rec.w, ws, seq)
        return True

    def untake(self, rec: AnyRecord) -> None:
        """A record just checked is not applied after all (not the run's): one taken
        ahead of its writer's sequence leaves the sequence as it was."""
        ws = self.get(rec.w)
        if ws is not None and ws.ahead is rec and ws.ahead_from >= 0:
            ws.lost -= ws.ahead_seq - ws.ahead_from
            ws.next_seq = ws.ahead_from
            ws.ahead, ws.ahead_seq, ws.ahead_from = None, -1, -1

    def _settle(self, writer: str, ws: WriterSeq, seq: int) -> bool:
        """The writer's record after one ahead of its sequence (``seq``): it goes on
        after it (the records between were lost), or from the writer's own sequence (the
        one ahead was not its line). False for a repeat of either."""
        ahead, at = cast("AnyRecord", ws.ahead), ws.ahead_seq
        taken = ws.ahead_from >= 0
        before = ws.ahead_from if taken else ws.next_seq
        if seq < before or seq == at:
            return False
        ws.ahead, ws.ahead_seq, ws.ahead_from = None, -1, -1
        if seq > at:  # after it: the writer's
            if not taken:
                self._take(writer, ws, at)
                self.decided.append(Decided(ahead, None, False))
            return True
        # from the writer's own numbers: the line ahead was not its
        if taken:  # its lost records were not: the writer's sequence is as it was
            ws.lost -= at - before
            ws.next_seq = before
            if writer in self._crossing_next:
                self._crossing_next[writer] = before
        self.decided.append(Decided(ahead, _not_its(ahead, at, before, seq), taken))
        return True

    def jump_taken(self, writer: str) -> bool:
        """Whether a number of ``writer``'s ahead of its next one is taken as it comes:
        in a glance's events, or its first record after a change of the file."""
        return self.partial or writer in self._crossing_next

    def _take(self, writer: str, ws: WriterSeq, seq: int) -> None:
        if self._crossing is not None:
            self._crossed(writer, seq)
        if seq > ws.next_seq and not self.partial:
            ws.lost += seq - ws.next_seq
        ws.next_seq = seq + 1

    def advance(self, spans: Spans) -> None:
        """A batch checked whole (model/step_ingest.py): each writer's next sequence
        number, and the records lost before its ``first``."""
        for writer, (first, last_seq) in spans.items():
            ws = self.get(writer)
            if ws is None:
                ws = self[writer] = WriterSeq(next_seq=first, first_seq=first)
            if self._crossing is not None:
                self._crossed(writer, first)
            if not self.partial:
                ws.lost += first - ws.next_seq
            ws.next_seq = last_seq + 1

    def begin_crossing(self, notice: FileNotice) -> None:
        """The file changed (``notice``): each writer's first record after it says how
        many of its records went missing across the change."""
        self._crossing = notice
        self._crossing_next = {w: ws.next_seq for w, ws in self.items()}

    def _crossed(self, writer: str, seq: int) -> None:
        notice = self._crossing
        before = self._crossing_next.pop(writer, None)
        if notice is not None and before is not None:
            notice.gaps[writer] = seq - before


def _gap_said(rec: AnyRecord, expected: int) -> bool:
    """Whether ``rec`` is its writer's ``write_gap`` saying the jump to it: the numbers
    from ``expected`` to just before its own were written to no file (a full disk). It is
    taken as it comes, as a line that goes on after it would take it: it may be the
    writer's last (the disk stayed full after it, or the process ended)."""
    first, last = getattr(rec, "first_seq", None), getattr(rec, "last_seq", None)
    return (
        getattr(rec, "event", None) == "write_gap"
        and type(first) is int
        and type(last) is int
        and first <= expected
        and last == rec.seq - 1
    )


def _not_its(held: AnyRecord, ahead: int, expected: int, then: int) -> str:
    """Why a held record is not its writer's."""
    return (
        f"{held.kind or 'line'} seq {ahead} of writer {held.w[:40]!r}: {ahead - expected:,} "
        f"ahead of that writer's, whose next record was seq {then}: not that writer's line"
    )[:200]
