"""A run being read: the line reader and the state it feeds, and whose history the
file at the run's path holds when it changes under the reader.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from eagle3_tui.model.files import DiskSpace, FileChanged, FileNotice, Outcome
from eagle3_tui.model.inflate import Inflated
from eagle3_tui.model.reader import Item, LineReader, Restarted
from eagle3_tui.model.records import Deferred, Malformed, Record, TrainStep, record_problem
from eagle3_tui.model.segments import apply_segment, segment_items
from eagle3_tui.model.state import RunState

SLICE = 1024 * 1024
HOLD_ITEMS = 64
"""A new file with no record of our schema (an envelope: writer, sequence number) among
its first this many items is another file."""
MAX_SHELVED = 3
"""Histories set aside (another file was shown instead) kept, the newest."""


class DataFrameLike(Protocol):
    """``transport.channel.DataFrame``, as this layer sees it."""

    @property
    def offset(self) -> int: ...
    @property
    def data(self) -> bytes: ...
    @property
    def span(self) -> int: ...


@dataclass(slots=True)
class _Held:
    """A new file's items, waiting until its records say whose history it continues."""

    notice: FileNotice
    items: list[Item] = field(default_factory=list)


class Run:
    """Bytes of ``metrics.jsonl`` in, :class:`RunState` out.

    A multi-node run is several files (one per node): each ``stream`` has its own
    line reader (its own offsets, torn lines, restarts), all feed one state; each
    writer's sequence numbers keep their own order in it.

    Never two files' histories in one state. When the file is replaced, or deleted
    and created again (:meth:`file_changed`, or a restart the reader notices with
    nothing said), the new file's items are held until its first record of our
    schema says whose it is: a writer a history knows, or the run id it names, picks
    that history (the one shown: it continues, nothing dropped; one set aside: it is
    shown again); anything else, or no such record in its first :data:`HOLD_ITEMS`
    items, is another file, shown as what the path holds now while the history read
    before is set aside (:attr:`shelved`). A truncated file keeps its history. Each
    change is a :class:`~eagle3_tui.model.files.FileNotice` of the state shown.
    """

    def __init__(self) -> None:
        self.reader = LineReader()
        self._readers: dict[int, LineReader] = {0: self.reader}
        self._notices: list[FileNotice] = []
        self._state = RunState(file_notices=self._notices)
        self.shelved: list[RunState] = []
        """Histories of earlier files at the path, set aside (not shown), oldest first."""
        self._held: dict[int, _Held] = {}
        self._said: set[int] = set()
        """Streams whose restart the transport explained (the reader's next one is it)."""
        self._ignored: set[int] = set()
        """Streams of a multi-node run whose file is another's now: not applied."""
        self._shown_by: FileNotice | None = None
        """The notice that put another file's history on show, while it is."""

    @property
    def state(self) -> RunState:
        """The run state shown, its queued sampler records applied: settling changes it,
        so whoever shares the run across threads reads this under its lock (the app's
        pipeline does). :attr:`unsettled` reads without settling."""
        self._state.settle()
        return self._state

    @property
    def unsettled(self) -> RunState:
        """The run state shown, as it is (sampler records may wait in its queues): for a
        reader outside the lock that needs no sampler history, e.g. the latest step."""
        return self._state

    def feed(
        self,
        offset: int,
        data: bytes,
        stream: int = 0,
        span: int = -1,
        ahead: Inflated | None = None,
    ) -> int:
        """Feed a chunk; returns how many items (records, malformed lines) it completed.
        ``span`` >= 0: ``data`` is a columns payload standing for ``span`` bytes of the
        file (a ``C`` frame: see :mod:`eagle3_tui.model.segments`); ``ahead``: its
        columns inflated beforehand (``inflate.inflate_ahead``), or None.

        A big chunk (a catch-up) is fed in slices of ~1 MiB, without copying
        them: decoding and the column path run fastest on batches whose decoded
        records fit the L2 cache (a 35 MB chunk fed whole takes up to ~1.7× as
        long; 2 MiB slices ~8 % longer than 1 MiB ones on this machine).
        """
        n = 0
        reader = self._readers.get(stream)
        if reader is None:
            reader = self._readers[stream] = LineReader()
        if span >= 0:
            if stream in self._held or stream in self._ignored or offset < reader.complete_offset:
                # whose it is is not known yet (or the file started over): as records
                items = segment_items(reader, offset, span, data, ahead)
                self._take(items, stream)
                return len(items)
            return apply_segment(reader, self._state, offset, span, data, ahead)
        for start in range(0, max(len(data), 1), SLICE):
            items = reader.feed(offset + start, data, start, min(start + SLICE, len(data)))
            self._take(items, stream)
            n += len(items)
        return n

    def feed_frame(self, frame: DataFrameLike, stream: int = 0) -> int:
        """Feed an agent's data frame (bytes, or columns)."""
        return self.feed(frame.offset, frame.data, stream, frame.span)

    # ---- the file at the path ----------------------------------------------------------
    def file_changed(self, change: FileChanged) -> None:
        """The stream said the file changed under it (it starts the new one at 0)."""
        stream = change.stream
        self._said.add(stream)
        held = self._held.get(stream)
        if held is not None:
            if not any(type(item) is not Restarted for item in held.items):
                held.notice.size = change.size  # the same change: deleted, then a file there
                held.items.clear()
                return
            self._decide(stream, held, undecided=True)  # it never said whose it is: another
        notice = FileNotice(
            change.change, change.at, Outcome.PENDING, change.read, change.size, stream
        )
        notice.noted = self._state.last_ts
        self._notices.append(notice)
        if change.change == "truncated" and stream not in self._ignored:
            notice.outcome = Outcome.KEPT
            self._state.writers.begin_crossing(notice)
            return
        self._ignored.discard(stream)
        self._held[stream] = _Held(notice)

    def _take(self, items: list[Item], stream: int) -> None:
        """A stream's items: applied, or held while whose they are is not known."""
        said = stream in self._said
        self._said.discard(stream)
        held = self._held.get(stream)
        if held is None:
            if said or not _restarted(items):
                if stream not in self._ignored:
                    self._state.apply_all(items)
                return
            # the reader saw the file start over, and nothing said why
            notice = FileNotice("restarted", None, Outcome.PENDING, stream=stream)
            notice.noted = self._state.last_ts
            self._notices.append(notice)
            self._ignored.discard(stream)
            held = self._held[stream] = _Held(notice)
        held.items.extend(items)
        self._decide(stream, held)

    def _decide(self, stream: int, held: _Held, undecided: bool = False) -> None:
        """Whose history the held items continue, once their records say (``undecided``:
        the file was replaced again before they did: another file)."""
        whose: RunState | None = None
        looked = 0
        for item in held.items:
            envelope = _envelope(item)
            if envelope is not None:
                whose = self._whose(*envelope)
                break
            if type(item) is not Restarted:
                looked += 1
                if looked >= HOLD_ITEMS:
                    break
        else:
            if not undecided:
                return  # not known yet: wait for more
        del self._held[stream]
        notice, items = held.notice, held.items
        if whose is None and not self._state.records:  # nothing shown: nothing to keep apart
            self._notices.remove(notice)
            self._state.apply_all(items)
            return
        if whose is self._state:
            notice.outcome = Outcome.CONTINUES
        elif len(self._readers) > 1 or stream != 0:  # a node's file in a multi-node run
            notice.outcome = Outcome.IGNORED
            self._ignored.add(stream)
            return
        elif whose is None:
            notice.outcome = Outcome.OTHER
            self._show(RunState(file_notices=self._notices, foreign=True), notice)
        else:
            notice.outcome = Outcome.BACK
            self._show(whose, notice)
        if notice.outcome is not Outcome.OTHER:
            self._state.writers.begin_crossing(notice)
        self._state.apply_all(items)

    def _whose(self, writer: str, run_id: str | None) -> RunState | None:
        """The history a record of ``writer`` (naming ``run_id``) belongs to, if any."""
        for state in (self._state, *reversed(self.shelved)):
            if writer in state.writers or (run_id is not None and run_id in state.run_ids):
                return state
        return None

    def _show(self, state: RunState, notice: FileNotice) -> None:
        """Show ``state`` instead of the history shown, which is set aside."""
        old = self._state
        if state in self.shelved:
            self.shelved.remove(state)
        self.shelved = [*self.shelved, old][-MAX_SHELVED:]
        shown_by = self._shown_by
        if shown_by is not None:  # the other file's history is set aside in turn
            shown_by.set_aside, shown_by.shown_until = True, notice.at
            shown_by.other_run = old.run_ids[0] if old.run_ids else None
        self._shown_by = notice if notice.outcome is Outcome.OTHER else None
        state.take_host_view(old)
        self._state = state

    def state_of(self, run_id: str | None) -> RunState:
        """The history a manifest of ``run_id`` (the host's ``run.json``) is about: the
        one whose records name it, else the run's own (not another file's)."""
        states = (self._state, *reversed(self.shelved))
        for state in states:
            if run_id is not None and run_id in state.run_ids:
                return state
        return next((s for s in states if not s.foreign), self._state)

    # ---- what the host says ------------------------------------------------------------
    def set_disk(self, report: DiskSpace) -> None:
        """Room on the filesystem of a file of the run (``report.stream``)."""
        self._state.set_disk(report)

    def set_link(self, up: bool, at: float, detail: str = "") -> None:
        """Whether data can reach the client (see :meth:`Liveness.set_link`); cheap, no
        settling of queued samples."""
        self._state.liveness.set_link(up, at, detail)

    def set_host_clock(self, host_now: float, client_now: float) -> None:
        self._state.liveness.set_host_clock(host_now, client_now)

    @property
    def link_down_since(self) -> float | None:
        return self._state.liveness.link_down_since


def _restarted(items: list[Item]) -> bool:
    """Whether the file started over: the reader's restart to an earlier offset (a feed's
    first item, when there is one)."""
    first = items[0] if items else None
    return type(first) is Restarted and first.offset < first.expected


def _envelope(item: Item) -> tuple[str, str | None] | None:
    """The writer (and the run id it names) of a valid record of our schema; None for
    anything else (a malformed line, a plain speculators dict, a restart)."""
    if type(item) is Malformed or type(item) is Restarted:
        return None
    rec: Any = item.resolve() if type(item) is Deferred else item
    if not isinstance(rec, Record | TrainStep) or record_problem(rec) is not None:
        return None
    if not rec.w or rec.seq < 0:
        return None
    return rec.w, rec.run_id if isinstance(rec, Record) else None
