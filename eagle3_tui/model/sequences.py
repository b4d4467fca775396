"""Each writer's sequence numbers: records lost, records repeated, and across a change
of the file, how many of each writer's records went missing.

Every record of our schema carries its writer (``w``) and that writer's sequence
number (``seq``, from 0). A gap is records lost (a crash, a full disk, a file cut
short); a number already seen is a repeat (a resumed stream sending a range again),
dropped. A writer's first record counts nothing lost before it: what came before was
before the reader's first byte.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3_tui.model.files import FileNotice
from eagle3_tui.model.records import AnyRecord

Spans = dict[str, tuple[int, int]]
"""Each writer's first and last sequence number in a batch."""


@dataclass(slots=True)
class WriterSeq:
    """Sequence tracking of one writer."""

    next_seq: int = 0
    lost: int = 0
    duplicates: int = 0


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

    @property
    def lost(self) -> int:
        return sum(w.lost for w in self.values())

    @property
    def duplicates(self) -> int:
        return sum(w.duplicates for w in self.values())

    def check(self, rec: AnyRecord) -> bool:
        """Track a record's sequence number; False for a duplicate to drop."""
        if rec.seq < 0 or not rec.w:
            return True
        ws = self.get(rec.w)
        if ws is None:
            # a writer's first record: anything before it was before our first byte
            ws = self[rec.w] = WriterSeq(next_seq=rec.seq)
        if rec.seq < ws.next_seq:
            ws.duplicates += 1
            return False
        if self._crossing is not None:
            self._crossed(rec.w, rec.seq)
        if rec.seq > ws.next_seq and not self.partial:
            ws.lost += rec.seq - ws.next_seq
        ws.next_seq = rec.seq + 1
        return True

    def advance(self, spans: Spans) -> None:
        """A batch checked whole (model/step_ingest.py): each writer's next sequence
        number, and the records lost before its ``first``."""
        for writer, (first, last_seq) in spans.items():
            ws = self.get(writer)
            if ws is None:
                ws = self[writer] = WriterSeq(next_seq=first)
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
