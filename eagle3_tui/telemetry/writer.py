"""Append JSON lines to one file, whole lines only, never blocking or raising into the caller.

The caller (the training loop, through the logging handler) only *encodes* a
record — one ``orjson.dumps`` of the envelope and payload, a few microseconds —
and appends the bytes to an in-memory queue. A daemon thread, woken at once,
hands queued lines to ``os.write`` on a file descriptor opened with ``O_APPEND``,
in whole lines (several per call when they pile up): the kernel appends each
write at the current end of the file in one piece, so a tail sees a line within
milliseconds of the log call and never half a line or two writers' lines mixed.

Why a thread does the ``write``: a write to a slow or hung filesystem (NFS,
a full FUSE mount) can block for seconds or forever. The caller never waits for
it: while the thread is stuck, lines queue up to ``max_queue_bytes``; beyond
that, new records are dropped and counted (their sequence numbers are consumed,
so readers see the gap). Nothing here raises into the caller: an unencodable
value, a full disk (``ENOSPC``), a closed or replaced descriptor are counted by
reason in :class:`WriterStats` and reported in the next heartbeat.

A record counted written was written whole, into the run's file. The file is opened
and watched by :class:`~eagle3_tui.telemetry.runfile.RunFile` (never through a link,
never another user's file; deleted, replaced or truncated under the writer: noticed
before the next write, the file made again). Two events tell a reader what the lines
cannot (kind ``lifecycle``, the writer's envelope and sequence numbers):

* ``file``: the file changed under the writer (``change``: deleted, replaced,
  truncated, refused), the first line written after it was noticed;
* ``write_gap``: writes failed (a full disk) and now succeed again: the exact count
  and sequence range of the records not written, the first line after the gap.

Each goes before the records still unwritten, with the sequence number the first of
them had (those move up by one): a reader sees the numbers in order and without a
gap that is not one. A short write's torn line is ended (``\n``) before any next
record, so that no record is ever glued onto it.

Standard library only (orjson is used when installed). No fsync per line.

Over 600 lines: the writer thread, its file's checks (links, replaced or deleted files,
a full disk) and its counting of every line not written are one invariant — every record
written whole once or counted — that is easiest to check in one place.
"""

from __future__ import annotations

import atexit
import collections
import errno
import json
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from eagle3_tui.telemetry.column_log import ColumnLog
from eagle3_tui.telemetry.runfile import FileChange, RunFile
from eagle3_tui.telemetry.schema import SCHEMA_VERSION, Kind, scalar_or_list, to_jsonable

try:  # optional fast path
    import orjson

    _OPTS: Final = orjson.OPT_APPEND_NEWLINE

    _orjson_dumps = orjson.dumps

    def _fast_dumps(obj: Any) -> bytes:
        """One C pass; NaN/Infinity come out as ``null`` (the caller checks)."""
        try:
            return _orjson_dumps(obj, option=_OPTS)
        except TypeError:  # a tensor or numpy value: convert it, still in one pass
            return _orjson_dumps(obj, default=scalar_or_list, option=_OPTS)

    def _dumps(obj: Any) -> bytes:
        try:
            return orjson.dumps(obj, option=_OPTS)
        except TypeError:  # an int beyond 64 bits: the standard library copes
            return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode() + b"\n"

    HAVE_ORJSON = True
except ImportError:  # pragma: no cover - exercised where orjson is absent
    HAVE_ORJSON = False

    def _fast_dumps(obj: Any) -> bytes:
        # allow_nan: a NaN becomes the bare token NaN, which the "NaN" check below catches
        return json.dumps(obj, separators=(",", ":"), default=scalar_or_list).encode() + b"\n"

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode() + b"\n"


# What a non-finite float looks like after the fast encoder (orjson writes null, the
# standard library NaN/Infinity): a line containing it is re-encoded through
# to_jsonable (rare: a diverged loss, a None in a payload).
_SUSPECT: Final = (b"null",) if HAVE_ORJSON else (b"NaN", b"Infinity")

MAX_QUEUE_BYTES: Final = 8 << 20
POLL_S: Final = 0.025
"""How often the writer thread looks at the queue: a tail sees a line within ~25 ms.
(Waking the thread for every record costs the caller more than the encoding.)"""
WAKE_BYTES: Final = 256 << 10
"""A backlog this large wakes the writer thread at once."""
_EMPTY: Final[Mapping[str, Any]] = {}
_PREFIX: Final = b'{"v":%d,"seq":' % SCHEMA_VERSION
"""How each line the writer encodes starts (the envelope's first fields, in order)."""
MAX_WRITE: Final = 1 << 16
OVERHEAD_SAMPLES: Final = 2048


if TYPE_CHECKING:  # an alias for annotations only: the trainer's Python may be 3.8
    _Deferred = tuple[str, dict[str, Any], int | None, int, float, int]
    """A record the writer thread encodes: kind, payload, step, seq, ts, accounted bytes."""


@dataclass
class WriterStats:
    """What the writer has done so far; reported in heartbeats."""

    written: int = 0
    dropped: int = 0
    bytes: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    last_error: str = ""
    queued: int = 0
    queue_peak_bytes: int = 0
    reopened: int = 0
    dropped_by: dict[str, int] = field(default_factory=dict)
    """Records not written, by reason (``dropped`` is their sum)."""


@dataclass
class WriteGap:
    """Records whose write failed since the last one that succeeded (a ``write_gap``)."""

    reason: str
    since: float
    first_seq: int
    last_seq: int
    records: int = 0

    def payload(self, until: float) -> dict[str, Any]:
        return {
            "event": "write_gap",
            "reason": self.reason,
            "records": self.records,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "since": self.since,
            "until": until,
        }


class JsonlWriter:
    """Writes records to ``path`` as JSON lines with a per-writer sequence number.

    ``write`` never raises and never blocks on I/O (see the module docstring);
    with ``background=False`` it writes in the calling thread instead (tests,
    tools). ``tick`` (seconds, callback) runs the callback in the writer thread
    every ``tick[0]`` seconds; its exceptions are counted, never raised. ``run_id``:
    the run's id, written in ``file`` events (a sibling writer's new file is known by it).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        rank: int = 0,
        writer_id: str | None = None,
        clock: Callable[[], float] = time.time,
        background: bool = True,
        max_queue_bytes: int = MAX_QUEUE_BYTES,
        tick: tuple[float, Callable[[], None]] | None = None,
        columns: bool = True,
        run_id: str | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.run_id = run_id
        self.rank = rank
        self.writer_id = writer_id or f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._columns: ColumnLog | None = ColumnLog(
            self.path, on_error=self._count_error, rows=columns, writer=self.writer_id
        )
        """The companion (telemetry/columns.py): the training steps written, as columns
        (``columns`` False: none, the sidecar's), and every writer's events, marked."""
        self._clock = clock
        self._lock = threading.Lock()
        self._seq = 0
        self.stats = WriterStats()
        self._file = RunFile(self.path, run_id, clock, self._count_error, self._count_reopen)
        self.changes: list[FileChange] = []
        """What happened to the file under this writer (each written as a ``file`` event)."""
        self._events: list[FileChange] = []
        """Changes whose ``file`` event is not written yet."""
        self._gap: WriteGap | None = None
        self._torn = False
        """A short write left part of a line whose ending newline could not be written."""
        self._torn_whole: tuple[tuple[int, int] | None, int, bytes] | None = None
        """The torn line lacks its newline only (the file's identity, the line's offset,
        the line): counted lost, it is a whole record once its newline is there."""
        # encoded lines, or (kind, payload, step, seq, ts, accounted size) to encode
        self._queue: collections.deque[bytes | _Deferred] = collections.deque()
        self._estimate = 600  # bytes per deferred record, until one is encoded
        self._queue_bytes = 0
        self._max_queue_bytes = max_queue_bytes
        self._background = background
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._closing = False
        self._closed = False
        self._forked = False
        self._thread: threading.Thread | None = None
        self._thread_cpu = 0.0
        self._tick = tick
        self._overhead = [0] * OVERHEAD_SAMPLES
        self._overhead_n = 0
        self._owner_pid = os.getpid()
        _live_writers.add(self)
        if background:
            self._thread = threading.Thread(
                target=self._run, name=f"eagle3-tui-writer-{self.writer_id}", daemon=True
            )
            self._thread.start()
        else:
            self._open()

    # ---- the caller's side --------------------------------------------------------
    def write(
        self,
        kind: str,
        payload: Mapping[str, Any] | None = None,
        step: int | None = None,
        ts: float | None = None,
    ) -> bool:
        """Queue one record (``payload``'s fields, and ``step`` when given, after the
        envelope); returns False (and counts a drop) when it cannot be. ``ts``: when it
        happened, if not now (a death noticed, then its exit status waited for)."""
        try:
            if self._closed or self._forked:
                self._count_drop("closed" if self._closed else "forked_child")
                return False
            with self._lock:
                seq = self._seq
                self._seq = seq + 1
                line = self._encode(kind, payload, seq, step, ts)
                if line is None:
                    return False
                if not self._background:
                    self._write_lines([line], locked=True)
                    return True
                size = self._enqueue_locked(line, len(line))
            return self._queued(size)
        except Exception as e:  # never into the trainer
            self._count_drop(e)
            return False

    def write_deferred(self, kind: str, payload: Mapping[str, Any], step: int | None) -> bool:
        """Queue a record that the writer thread encodes: the hot path for the
        library's per-step metrics (the caller pays a shallow copy and an append).

        The payload's top level and the dicts directly in it are copied now;
        values must be immutable (speculators logs fresh dicts of Python floats).
        Sequence number and timestamp are taken now, so order and time are exact.
        """
        try:
            if self._closed or self._forked or not self._background:
                return self.write(kind, payload, step)
            copy = {k: (v.copy() if type(v) is dict else v) for k, v in payload.items()}
            ts = self._clock()
            with self._lock:
                seq = self._seq
                self._seq = seq + 1
                est = self._estimate
                size = self._enqueue_locked((kind, copy, step, seq, ts, est), est)
            return self._queued(size)
        except Exception as e:  # never into the trainer
            self._count_drop(e)
            return False

    def _enqueue_locked(self, item: bytes | _Deferred, nbytes: int) -> int | None:
        """Append to the queue (the lock held); its new size, or None when full (a drop)."""
        size = self._queue_bytes + nbytes
        if size > self._max_queue_bytes:
            self._count_drop("queue_full")
            return None
        self._queue.append(item)
        self._queue_bytes = size
        if size > self.stats.queue_peak_bytes:
            self.stats.queue_peak_bytes = size
        return size

    def _queued(self, size: int | None) -> bool:
        """Whether an item was queued (``size`` None: the queue was full, the drop is
        counted); the writer thread is woken once the queue holds ``WAKE_BYTES``."""
        if size is None:
            return False
        if size > WAKE_BYTES and not self._wake.is_set():
            self._wake.set()
        return True

    def _encode(
        self,
        kind: str,
        payload: Mapping[str, Any] | None,
        seq: int,
        step: int | None = None,
        ts: float | None = None,
    ) -> bytes | None:
        # one dict build: envelope, payload (no copy of the payload first); then the
        # step, in the payload's place if it named one (as a dict literal would put it)
        fields = payload or _EMPTY
        rec: dict[str, Any] = {
            "v": SCHEMA_VERSION,
            "seq": seq,
            "w": self.writer_id,
            "ts": self._clock() if ts is None else ts,
            "kind": kind,
            "rank": self.rank,
            **fields,
        }
        expected = 6 + len(fields)
        if step is not None:
            expected += "step" not in fields
            rec["step"] = step
        if len(rec) != expected:  # the payload named an envelope field: the envelope wins
            rec.update(v=SCHEMA_VERSION, seq=seq, w=self.writer_id, kind=kind, rank=self.rank)
        try:
            line = _fast_dumps(rec)
            for token in _SUSPECT:
                if token in line:
                    break
            else:
                return line
        except Exception:  # an unknown type or a non-string key: the slow path says so
            self._count_error("unserializable")
        try:  # non-finite floats become "NaN"/"Infinity"; unknown values their repr
            return _dumps({k: to_jsonable(v) for k, v in rec.items()})
        except Exception as e:
            self._count_drop(e)
            return None

    def note_overhead(self, ns: int) -> None:
        """Record one caller-side cost (nanoseconds) for the heartbeat's percentiles."""
        i = self._overhead_n
        self._overhead[i % OVERHEAD_SAMPLES] = ns
        self._overhead_n = i + 1

    # ---- the writer thread --------------------------------------------------------
    def _run(self) -> None:
        self._open()
        next_tick = time.monotonic() + (self._tick[0] if self._tick else 3600.0)
        cpu0 = time.thread_time()
        while True:
            timeout = POLL_S
            if self._tick:
                timeout = min(timeout, max(0.0, next_tick - time.monotonic()))
            self._wake.wait(timeout)
            self._wake.clear()
            self._drain()
            if self._tick and time.monotonic() >= next_tick:
                next_tick = time.monotonic() + self._tick[0]
                try:
                    self._tick[1]()
                except Exception as e:
                    self._count_error(e)
                self._drain()
            if self._columns is not None and self._columns.due():
                self._columns.flush()
            self._thread_cpu = time.thread_time() - cpu0
            if self._closing and not self._queue:
                break
        self._write_lines([], force=True)  # what the file went through, said before the count
        self._close_fd()

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._idle.set()
                    return
                self._idle.clear()
                items: list[bytes | _Deferred] = []
                size = 0
                while self._queue and size < MAX_WRITE:
                    item = self._queue.popleft()
                    items.append(item)
                    size += len(item) if isinstance(item, bytes) else item[5]
                self._queue_bytes -= size
                self.stats.queued = len(self._queue)
            lines: list[bytes] = []
            for item in items:
                if isinstance(item, bytes):
                    lines.append(item)
                    continue
                kind, payload, step, seq, ts, _ = item
                line = self._encode(kind, payload, seq, step, ts)
                if line is not None:
                    lines.append(line)
                    self._estimate = len(line)
            if lines:
                self._write_lines(lines)

    def _write_lines(self, lines: list[bytes], locked: bool = False, force: bool = False) -> None:
        """Write whole lines with as few ``os.write`` calls as possible; count what fails.

        First the file is verified (:meth:`RunFile.verify`), and the events owed are
        written (a ``file`` event, a ``write_gap`` once writes succeed again).
        ``locked``: the caller holds the lock (no writer thread); ``force``: look at the
        path now, not at most once a second, and write the events owed even without
        lines (the close)."""
        file = self._file
        try:
            change = file.verify(force)
        except Exception as e:  # never the writer thread's end: counted, tried again
            self._count_error(e)
            change = None
        if change is not None:
            self._noticed(change)
        if file.fd is None:
            if lines:
                self._not_written(lines, file.problem or "not_open")
            return
        if (self._events or self._gap is not None) and (lines or force):
            failed = self._write_events(lines, locked)
            if failed is not None:
                if lines:
                    self._not_written(lines, failed)
                else:
                    self._count_error(failed)
                return
        if not lines:
            return
        whole, error = self._append(lines)
        if error is not None:
            self._not_written(lines[whole:], error)
        elif self._events:  # a truncation the write revealed: say it at once
            self._write_events([], locked)

    def _write_events(self, lines: list[bytes], locked: bool) -> OSError | None:
        """Write the events owed (``file`` events, then the ``write_gap``) before
        ``lines``, with the sequence numbers the first unwritten records had (those, in
        ``lines`` and in the queue, move up). The error when not all were written (none:
        their numbers are given back); the records behind them are not written then."""
        if self._torn_whole is not None:
            self._settle_torn()  # before the gap's count is said
            if not self._events and self._gap is None and not lines:
                return None
        name = os.path.basename(self.path)
        payloads = [c.payload(self.run_id, name, self.stats.written) for c in self._events]
        files = len(payloads)
        if self._gap is not None:
            payloads.append(self._gap.payload(self._clock()))
        k = len(payloads)
        first = self._make_room(lines, k, locked)
        encoded = (self._encode(Kind.LIFECYCLE, p, first + i) for i, p in enumerate(payloads))
        events = [line for line in encoded if line is not None]  # (ours always encode)
        whole, error = self._append(events)
        if whole == 0 and error is not None:
            self._make_room(lines, -k, locked)
            return error
        del self._events[: min(whole, files)]  # (a truncation this write revealed stays owed)
        if whole == len(events):
            self._gap = None
        if error is not None:  # a short write: the events after the tear are records lost
            self._not_written(events[whole:], error)
        return error

    def _make_room(self, lines: list[bytes], k: int, locked: bool) -> int:
        """Move every record not yet written (``lines`` in hand, then the queue) up by
        ``k`` sequence numbers (down, with ``k`` < 0: given back); the first of them's
        number before the move (the first freed one). Rare (only when an event is
        written), so a pass over the whole queue is fine."""

        def shift() -> int:
            queue = self._queue
            if lines:
                first = _seq_of(lines[0])
            elif queue:
                head = queue[0]
                first = _seq_of(head) if isinstance(head, bytes) else head[3]
            else:
                first = self._seq
            lines[:] = [_renumbered(line, k) for line in lines]
            moved: collections.deque[bytes | _Deferred] = collections.deque()
            for item in queue:
                if isinstance(item, bytes):
                    line = _renumbered(item, k)
                    self._queue_bytes += len(line) - len(item)  # a digit more or less
                    moved.append(line)
                else:
                    moved.append((item[0], item[1], item[2], item[3] + k, item[4], item[5]))
            self._queue = moved
            self._seq += k
            return first

        if locked:
            return shift()
        with self._lock:
            return shift()

    def _append(self, lines: list[bytes]) -> tuple[int, OSError | None]:
        """One ``os.write`` of ``lines`` (after the newline a torn line is owed): how many
        whole lines made it, and the error when not all did. A short write's torn line
        is ended at once, or by the next write's first byte."""
        fd = self._file.fd
        assert fd is not None
        recovering = self._gap is not None  # a disk that was full: a sibling's line may be torn
        # our own torn line is owed its newline while it still ends the file: a sibling
        # coming back first has ended it (its newline: ours would make a blank line)
        owed = self._torn and self._file.size == self._file.end
        looks = recovering or self._torn
        cut = self._file.cut_mid  # truncated mid-line: its torn line must stay alone
        prefix = b"\n" if owed or cut or (looks and self._file.ends_mid_line()) else b""
        data = prefix + (lines[0] if len(lines) == 1 else b"".join(lines))
        try:
            n = os.write(fd, data)
        except OSError as e:
            if e.errno in (errno.EBADF, errno.EINVAL):
                self._file.lost()  # closed behind our back: reopened on the next write
            return 0, e
        start, change = self._file.wrote(n)
        if change is not None:  # the lines landed in a truncated file: its event is owed
            self._noticed(change)
        if n >= len(prefix):
            self._torn = self._file.cut_mid = False
        self.stats.bytes += n
        if n == len(data):
            self.stats.written += len(lines)
            self._index(lines, None if start is None else start + len(prefix))
            return len(lines), None
        done = len(prefix)
        whole = 0
        for line in lines:
            if done + len(line) > n:
                break
            done += len(line)
            whole += 1
        at = None if start is None else start + len(prefix)
        if n > done:  # a torn line: end it, or owe its newline to the next write
            try:
                self._torn = os.write(fd, b"\n") != 1
            except OSError:
                self._torn = True
            if n == done + len(lines[whole]) - 1:  # all of it but its newline
                if not self._torn:
                    whole += 1  # ended now: a whole record
                elif at is not None:
                    self._torn_whole = (self._file.ident, at + done - len(prefix), lines[whole])
        self.stats.written += whole
        self._index(lines[:whole], at)
        if whole == len(lines):
            return whole, None
        return whole, OSError(errno.ENOSPC, "short write")

    def _settle_torn(self) -> None:
        """A line torn before its newline only, counted lost: once its newline is there
        (ours, owed while the line still ends the file; or a sibling's, coming back from
        the full disk first) it is a record, counted written, not lost; glued onto, or
        in a file no longer ours, it stays lost."""
        assert self._torn_whole is not None
        ident, at, line = self._torn_whole
        fd = self._file.fd
        if fd is None or ident != self._file.ident:
            self._torn_whole = None
            return
        try:
            if self._torn and self._file.size == self._file.end:
                if os.write(fd, b"\n") != 1:
                    return  # still owed: tried again on the next write
                self._torn = False
                whole = True
            else:
                whole = os.pread(fd, 1, at + len(line) - 1) == b"\n"
        except OSError:
            return
        self._torn_whole = None
        if not whole:
            return
        seq = _seq_of(line)
        gap = self._gap
        if gap is not None:
            gap.records -= 1
            if seq == gap.first_seq:
                gap.first_seq += 1
            elif seq == gap.last_seq:
                gap.last_seq -= 1
            if gap.records <= 0:
                self._gap = None
        # counted dropped when it was torn (its gap said or not): written now
        name = _error_name(OSError(errno.ENOSPC, "short write"))  # as it was counted
        self.stats.dropped -= 1
        left = self.stats.dropped_by.get(name, 0) - 1
        if left > 0:
            self.stats.dropped_by[name] = left
        else:
            self.stats.dropped_by.pop(name, None)
        self.stats.written += 1
        self._index([line], at)

    def _noticed(self, change: FileChange) -> None:
        """A change of the file: its event is owed (unless a sibling writer wrote it), and
        the companion starts again (its blocks index the file as it was)."""
        self.changes.append(change)
        if not change.adopted:
            self._events.append(change)
        if self._columns is not None:
            self._columns.restart()

    def _not_written(self, lines: list[bytes], e: BaseException | str) -> None:
        """Count ``lines`` as not written, once each, in the stretch a ``write_gap`` reports."""
        self._count_drop(e, len(lines))
        name = _error_name(e)
        seqs = [_seq_of(line) for line in lines]
        gap = self._gap
        if gap is None:
            gap = self._gap = WriteGap(name, self._clock(), min(seqs), max(seqs))
        gap.records += len(lines)
        gap.first_seq = min(gap.first_seq, *seqs)
        gap.last_seq = max(gap.last_seq, *seqs)

    def _index(self, lines: list[bytes], at: int | None) -> None:
        """Hand the lines just appended, at their offsets, to the companion: with
        ``O_APPEND`` our descriptor's position is the end of our own write, whatever
        other writers appended before or after it."""
        cols = self._columns
        if cols is None or not lines:
            return
        ident = self._file.ident
        if at is None:  # where they landed is unknown: rows before them are unsure too
            cols.forget()
            if ident is not None:
                cols.lose_marks(ident)
            return
        assert ident is not None
        try:
            for line in lines:
                cols.add(ident, at, line)
                at += len(line)
            cols.end_batch()
        except Exception as e:  # the companion only speeds reading up: never fatal
            cols.forget()
            cols.lose_marks(ident)
            self._count_error(e)

    def _open(self) -> None:
        """The file opened (or what is at the path refused and moved aside: the ``file``
        event is owed to the first write)."""
        change = self._file.verify(force=True)
        if change is not None:
            self._noticed(change)

    def _close_fd(self) -> None:
        if self._columns is not None:
            self._columns.close()
        try:
            self._file.close()
        except OSError as e:
            self._count_error(e)

    # ---- bookkeeping --------------------------------------------------------------
    def _count_error(self, e: BaseException | str) -> None:
        name = _error_name(e)
        self.stats.errors[name] = self.stats.errors.get(name, 0) + 1
        self.stats.last_error = f"{name}: {e}"[:300] if not isinstance(e, str) else name

    def _count_drop(self, e: BaseException | str, n: int = 1) -> None:
        self.stats.dropped += n
        name = _error_name(e)
        self.stats.dropped_by[name] = self.stats.dropped_by.get(name, 0) + n
        self._count_error(e)

    def _count_reopen(self) -> None:
        self.stats.reopened += 1

    def overhead_us(self) -> dict[str, float]:
        """Percentiles of the recent caller-side costs, in microseconds."""
        n = min(self._overhead_n, OVERHEAD_SAMPLES)
        if n == 0:
            return {}
        xs = sorted(self._overhead[:n])
        return {
            "p50": round(xs[n // 2] / 1000, 2),
            "p99": round(xs[min(n - 1, (n * 99) // 100)] / 1000, 2),
            "n": self._overhead_n,
        }

    def figures(self) -> dict[str, Any]:
        """The figures a heartbeat reports (a plain, JSON-ready dict)."""
        s = self.stats
        return {
            "written": s.written,
            "dropped": s.dropped,
            "bytes": s.bytes,
            "errors": dict(s.errors),
            "last_error": s.last_error,
            "queued": len(self._queue),
            "queue_peak_bytes": s.queue_peak_bytes,
            "reopened": s.reopened,
            "overhead_us": self.overhead_us(),
            "writer_cpu_s": round(self._thread_cpu, 4),
        }

    @property
    def next_seq(self) -> int:
        return self._seq

    def outcome(self) -> str:
        """The truth about this writer's file in one line (a training's closing line):
        records written, records not written and why, what happened to the file."""
        s = self.stats
        text = f"{s.written} records written to {self.path}, {s.dropped} not written"
        if s.dropped_by:
            text += " (" + ", ".join(f"{k}: {v}" for k, v in sorted(s.dropped_by.items())) + ")"
        for c in self.changes:
            at = time.strftime("%H:%M:%S", time.localtime(c.noticed))
            moved = f", {os.path.basename(c.moved_to)} moved aside" if c.moved_to else ""
            if c.change == "refused":
                text += f"; at the start it was {c.found}{moved}, a new file made"
            elif c.change == "truncated":
                text += f"; it was truncated at {at}"
            else:
                made = "made by another writer of the run" if c.adopted else "made"
                text += f"; it was {c.change} at {at}{moved}, a new file {made}"
        if self._file.fd is None and self._file.said:
            text += f"; cannot write {self._file.said}"
        return text

    # ---- the end ------------------------------------------------------------------
    def flush(self, timeout: float = 5.0) -> bool:
        """Wait (at most ``timeout`` s) until every queued line was handed to the kernel."""
        if not self._background or self._thread is None or not self._thread.is_alive():
            return not self._queue
        deadline = time.monotonic() + timeout
        while self._queue or not self._idle.is_set():
            self._wake.set()
            if time.monotonic() > deadline:
                return False
            self._idle.wait(0.01)
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued (waiting at most ``timeout`` s) and close the file."""
        if self._closed:
            return
        if self._background and self._thread is not None and self._thread.is_alive():
            self.flush(timeout)
            self._closing = True
            self._wake.set()
            self._thread.join(timeout)
        else:
            with self._lock:
                self._write_lines([], locked=True, force=True)
                self._close_fd()
        self._closed = True

    def _after_fork_in_child(self) -> None:
        # A forked child must not write as this writer (same id, same sequence) and
        # has no writer thread: it drops and counts instead.
        self._forked = True
        self._lock = threading.Lock()
        self._columns = None  # the parent's rows and descriptor: not ours to write


def _error_name(e: BaseException | str) -> str:
    """What a failure is counted as: an errno's name (``ENOSPC``), else the type's."""
    if isinstance(e, str):
        return e
    if isinstance(e, OSError) and e.errno:
        return errno.errorcode.get(e.errno, type(e).__name__)
    return type(e).__name__


def _seq_of(line: bytes) -> int:
    """The sequence number of a line this writer encoded."""
    at = len(_PREFIX)
    return int(line[at : line.index(b",", at)])


def _renumbered(line: bytes, by: int) -> bytes:
    """``line`` (this writer's) with its sequence number moved by ``by``."""
    at = len(_PREFIX)
    end = line.index(b",", at)
    return b"%s%d%s" % (_PREFIX, int(line[at:end]) + by, line[end:])


_live_writers: weakref.WeakSet[JsonlWriter] = weakref.WeakSet()


def _flush_all_at_exit() -> None:
    for w in list(_live_writers):
        if w._owner_pid == os.getpid():
            w.flush(2.0)


def _after_fork_in_child() -> None:
    for w in list(_live_writers):
        w._after_fork_in_child()


atexit.register(_flush_all_at_exit)
os.register_at_fork(after_in_child=_after_fork_in_child)
