"""The columnar catch-up: ship ``metrics.cols`` blocks instead of the lines they index.

Over 600 lines: the plan, its checks and the payloads are one protocol, read together.

:func:`column_plan` reads the companion (telemetry/columns.py) of the file being
sent and keeps the blocks that can stand for their lines: blocks of this very file
(device and inode), after the client's offset, inside the file as it is now, not
overlapping each other, and whose every row is checked against the file: a whole
line at the offset the block says, with the sequence number it says. The last such
block is left out: its steps travel as JSON, so the client's newest values are
the exact ones written, not float32 copies.

A segment is the byte range from a block's first row to the end of its last one.
Its payload (a ``C`` frame, agent/frames.py) holds the block's columns (the ones
the client keeps: the request's ``"columns"`` names, per group, the only fields it
wants, e.g. ``{"profile": ["step_ms"]}``), and every other line of the range (other
kinds, other writers' lines) as zlib-packed text with their offsets::

    u32 header length | header JSON | the columns' packed bytes | runs | text
    header: the block's header, "cols" cut to the kept columns, and
            "gaps": [runs size, text size packed, text size]

``runs`` is a packed ``q`` column of (offset in the range, length) pairs, one per
run of consecutive other lines.

**Frames of several blocks.** Consecutive accounted segments (below) of blocks alike
(the same header but for their rows, the same columns sent) share one frame of up to
:data:`GROUP_ROWS` rows (:func:`group_payload`): each column's pieces, one a block,
back to back, ``"pieces": [[rows, [[type, size], ...]], ...]`` (each block's rows and
its columns' types and sizes, in ``"cols"``' order; ``"cols"`` then gives no type:
a block's ``seq`` or ``epoch`` may be ``a`` where the next one's is ``q``).

**Accounted segments.** Where the companion lists every line of a range (the block's
rows, the writers' samples and events add up to its every byte: agent/listing.py), a
segment reaches back to the previous one's end and its range is not read: only its
events (each read and checked, sent as runs of text), the lines at its edges, and no
sample line: the old samples go as ranges of the writers' sample blocks,
``"listed": [[number, i, j], ...]``, each block sent once a stream as ``"listings":
[{"id": number, "n", "kinds", "writers", "cols"}, ...]`` (its packed columns after the
block's); the client forgets a block at the first frame that starts past its end, as
:class:`~eagle3_tui.agent.listing.Sent` does here. A segment whose samples the client
keeps whole (the newest: ``cutoffs``) is read and checked instead. A request's
``"history"`` cuts an old block's columns further (agent/names.py's ``SUMMARY_HISTORY``).

Python 3.8+, standard library only.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import struct
import zlib
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

from eagle3_tui.agent.listing import (
    Listed,
    Listing,
    Sent,
    Unread,
    line_at,
    listing_header,
    marks_of,
    unread_samples,
)
from eagle3_tui.telemetry.columns import (
    DIGEST_MAGIC,
    ENVELOPE,
    MAGIC,
    MARK_MAGIC,
    NL_ENVELOPE,
    PACE_TIMINGS,
    PLAIN_TIME,
    SAMPLE_MAGIC,
    Block,
    Samples,
    block_of,
    companion_path,
    kind_of,
    pack_column,
    pack_envelopes,
    seq_fits,
    unpack_floats,
    unpack_ints,
    walk_blocks,
)
from eagle3_tui.telemetry.parsing import parse_json
from eagle3_tui.telemetry.safefs import open_file

__all__ = ["ENVELOPE", "NL_ENVELOPE", "Segment", "column_plan", "ready", "sample_cutoffs"]

HEADER_LEN = struct.Struct("<I")
TEXT_LEVEL = 1
STUB_LEVEL = 1
CHUNK = 4 << 20
MAX_COMPANION = 1 << 31


GROUP_ROWS = 8192
"""Rows of consecutive blocks sent as one C frame at most: the client decodes, checks
and applies each frame once (a 1M-step run as a live writer indexes it, 1,667 blocks:
132 frames, its local ``summary`` 1.20 -> 1.00 s), and a frame this long is ~120 KB
for a summary (~10 ms of a 100 Mbit/s link)."""
_PER_BLOCK = frozenset({"n", "cols", "stats", "span", "bytes", "pace"})
"""A block header's fields that are its own (the rest its frame's: :func:`group_payload`)."""


MAX_READ_LINES = 4096
"""Events of an accounted segment read one by one at most: past that, its range is
read whole and checked."""


_ENVELOPE_COLUMNS = frozenset(
    {"@off", "@len", "v", "seq", "rank", "epoch", "step", "global_step", "ts"}
)
"""What a block sends of each row under a request's ``"history"``, whatever it names."""


class Segment:
    """A block that stands for the bytes ``start``..``end`` of the file.

    Checked (:meth:`check`), its range is read and each row found in it. *Accounted*
    (``marks`` and ``samples`` set: the companion lists every line of the range, see
    :class:`Listing`), only its events, its newest samples and the lines at its rows'
    and samples' ends are read: the rest is what the companion says."""

    __slots__ = (
        "_lengths",
        "_offsets",
        "block",
        "data",
        "end",
        "first_seq",
        "latest",
        "marks",
        "newer",
        "rows_bytes",
        "rows_start",
        "samples",
        "start",
        "tail_ts",
        "text",
    )

    def __init__(self, block: Block, start: int, end: int, rows_bytes: int, first_seq: int) -> None:
        self.block = block
        self.rows_start = self.start = start
        self.end = end
        self.rows_bytes = rows_bytes
        """The rows' lines' bytes (the block's header says, or its ``@len``)."""
        self.first_seq = first_seq
        self._offsets: list[int] | None = None
        self._lengths: list[int] | None = None
        self.data = b""
        self.newer = 0
        """Rows in the blocks after this one (the plan's, and the last block's)."""
        self.latest: frozenset[str] = frozenset()
        """The columns of the file's last block (the metrics a run still logs)."""
        self.marks: list[tuple[int, int, str]] | None = None
        self.samples: list[Listed] = []
        """An accounted segment's samples, as ranges of sample blocks."""
        self.text: list[tuple[int, bytes]] = []
        """An accounted segment's events read (offset, line), in file order."""
        self.tail_ts: float | None = None
        """The time of the plan's newest row (its last block's), where its block is
        old enough for its pace's timings to go as their sum (:func:`pace_summed`)."""

    @classmethod
    def of(cls, block: Block, first_seq: int | None) -> Segment | None:
        """The segment of a block, from its header where it says where its rows are and
        how many bytes they are, and its first row's sequence number (its stats', see
        :func:`_header`), else from its ``@off`` and ``@len``; None when it cannot be."""
        h = block.header
        span, size = h.get("span"), h.get("bytes")
        if (
            isinstance(span, list)
            and len(span) == 2
            and all(type(v) is int for v in span)
            and 0 <= span[0] < span[1]
            and type(size) is int
            and block.n <= size <= span[1] - span[0]
            and first_seq is not None
        ):
            return cls(block, span[0], span[1], size, first_seq)
        try:
            offsets, lengths = block.ints("@off"), block.ints("@len")
        except (ValueError, zlib.error):
            return None
        if offsets != sorted(offsets) or min(lengths) <= 0:
            return None
        seg = cls(block, offsets[0], offsets[-1] + lengths[-1], sum(lengths), -1)
        seg._offsets, seg._lengths = offsets, lengths
        return seg

    @property
    def offsets(self) -> list[int]:
        if self._offsets is None:
            self._offsets = self.block.ints("@off")
        return self._offsets

    @property
    def lengths(self) -> list[int]:
        if self._lengths is None:
            self._lengths = self.block.ints("@len")
        return self._lengths

    def check(self, fd: int, cutoffs: dict[str, int] | None = None) -> bool:
        """Whether every row is a whole line of the file with the block's sequence number
        (an accounted segment: its rows' and samples' first and last, and every line it
        reads). ``cutoffs``: see :meth:`payload` (the samples from them are read)."""
        try:
            if self.marks is not None:
                return self._check_listed(fd, cutoffs or {})
            return self._check(fd)
        except (OSError, ValueError, IndexError, zlib.error):
            return False

    def _check_listed(self, fd: int, cutoffs: dict[str, int]) -> bool:
        """An accounted segment's rows at its ends, its events and the samples the client
        keeps whole read and checked (the older samples go as ranges of their blocks); a
        segment with more lines to read than :data:`MAX_READ_LINES` is read whole and
        checked instead."""
        assert self.marks is not None
        listed, whole = self._split_samples(cutoffs)
        if len(self.marks) + sum(j - i for _, i, j in whole) > MAX_READ_LINES:
            self.marks = None
            return self._check(fd)
        # the rows' ends: a line of the first row's sequence number starts the rows, a
        # newline ends them (the tiling says the rest)
        at, end = self.rows_start, self.end
        head = os.pread(fd, 65, at - 1) if at > 0 else b"\n" + os.pread(fd, 64, 0)
        if head[:1] != b"\n" or os.pread(fd, 1, end - 1) != b"\n":
            return False
        seq = self.first_seq if self.first_seq >= 0 else self.block.ints("seq")[0]
        if not head.startswith(b'\n{"v":1,"seq":%d,' % seq) and _seq_of(head, 1, 65) != seq:
            return False
        for b, i, j in listed:  # each range's first and last line here: a sample of it
            for k in {i, j - 1}:
                if _sample_at(fd, b, k) is None:
                    return False
        text: list[tuple[int, bytes]] = []
        for off, n, kind in self.marks:
            line = line_at(fd, off, n)
            if line is None or kind_of(line) != kind:
                return False
            text.append((off, line))
        for b, i, j in whole:  # the samples the client keeps: their lines, every one read
            for k in range(i, j):
                line = _sample_at(fd, b, k)
                if line is None:
                    return False
                text.append((b.offsets[k], line))
        if whole:
            text.sort()
        self.samples, self.text = listed, text
        return True

    def _split_samples(self, cutoffs: dict[str, int]) -> tuple[list[Listed], list[Listed]]:
        """The segment's samples as the ranges that go by their envelopes (before their
        kind's cutoff) and those whose lines are sent (at or past it; a kind the client
        keeps none of has no cutoff: its lines go whole, as a plain read's). Raises
        ValueError where a block's kinds cannot be read."""
        listed: list[Listed] = []
        whole: list[Listed] = []
        for b, i, j in self.samples:
            cuts = [cutoffs.get(k, 0) for k in b.kinds]
            lo, hi = min(cuts, default=0), max(cuts, default=0)
            a = max(i, min(j, bisect_left(b.offsets, lo, i, j)))  # all before: envelopes
            z = max(a, min(j, bisect_left(b.offsets, hi, i, j)))  # all past: lines
            if a > i:
                listed.append((b, i, a))
            if z > a:  # between: each by its kind
                kinds, offsets = b.row_kinds(), b.offsets
                k = a
                while k < z:
                    as_line = offsets[k] >= cutoffs.get(kinds[k], 0)
                    e = k + 1
                    while e < z and (offsets[e] >= cutoffs.get(kinds[e], 0)) == as_line:
                        e += 1
                    (whole if as_line else listed).append((b, k, e))
                    k = e
            if j > z:
                whole.append((b, z, j))
        return listed, whole

    def _check(self, fd: int) -> bool:
        before = 1 if self.start > 0 else 0  # the range must start a line too
        data = os.pread(fd, self.end - self.start + before, self.start - before)
        if len(data) != self.end - self.start + before or (before and data[0] != 10):
            return False
        data = data[before:]
        offsets, lengths, seqs = self.offsets, self.lengths, self.block.ints("seq")
        if len(offsets) != self.block.n or len(lengths) != self.block.n:
            return False
        if offsets[0] < self.start or offsets[-1] + lengths[-1] != self.end:
            return False
        base = self.start
        starts = data.startswith
        for off, n, seq in zip(offsets, lengths, seqs):  # noqa: B905 (3.8: no strict)
            rel = off - base
            if n <= 0 or data[rel + n - 1] != 10 or (rel > 0 and data[rel - 1] != 10):
                return False
            # the writer's own lines start so (one C call); any other spelling is parsed
            if not starts(b'{"v":1,"seq":%d,' % seq, rel) and _seq_of(data, rel, rel + n) != seq:
                return False
        self.data = data
        return True

    def payload(
        self,
        keep: dict[str, Any],
        cutoffs: dict[str, int] | None = None,
        sent: Sent | None = None,
        history: Any = None,
    ) -> bytes:
        """The C frame's payload; ``keep``: per group, the only fields to send;
        ``cutoffs``: per sampler kind, where the lines the client keeps begin (the ones
        before go as envelopes, see :func:`sample_cutoffs`); ``sent``: the sample blocks
        the client holds (an accounted segment's samples are sent as ranges of them);
        ``history``: a request's ``"history"`` (agent/names.py's ``SUMMARY_HISTORY``)."""
        kept = self.kept(keep, history)
        sent = sent if sent is not None else Sent()
        if self.marks is not None:  # accounted: the events read, the samples listed
            return group_payload([self], [kept], sent)
        header = self.shared_header()
        header["n"] = self.block.n
        header["cols"] = [[path, kind, len(packed)] for path, kind, packed in kept]
        parts = [packed for _, _, packed in kept]
        runs: list[int] = []
        text: list[bytes] = []
        stubs = _Stubs()
        self._others(cutoffs, runs, text, stubs)
        if stubs.n:
            header["stubs"] = stubs.header()
            parts += stubs.parts
        return _framed(header, parts, runs, text)

    def shared_header(self) -> dict[str, Any]:
        """The block's header less what is its own (its rows, columns, stats): what the
        blocks of one frame share (:func:`group_payload`)."""
        return {k: v for k, v in self.block.header.items() if k not in _PER_BLOCK}

    def kept(self, keep: dict[str, Any], history: Any = None) -> list[tuple[str, str, bytes]]:
        """The columns sent, each as (path, type, packed bytes): see :meth:`payload`."""
        only = self._history(history)
        paths = tuple(path for path, _, _ in self.block.cols)
        wanted = tuple(
            (str(g), tuple(x for x in v if isinstance(x, str)) if isinstance(v, list) else None)
            for g, v in keep.items()
        )
        kept = self.block.packed(_kept(paths, wanted, only, self.latest))
        tokens = self._pace_sum(history) if only is not None else None
        return kept if tokens is None else pace_summed(kept, self.block.n, tokens)

    def _pace_sum(self, history: dict[str, Any]) -> float | None:
        """The tokens of this old block's steps, where its timings can go as their sum
        (its writer's ``"pace"``, telemetry/columns.py's :func:`pace_of`): the request
        says how old (``pace_sums_s``), its rows are all older than that before the
        plan's newest one, and no process starts among its lines (it is accounted: each
        of its other lines was read, and is parsed here: a record of any kind that says
        ``"event": "start"`` or ``"resume"`` is taken for one). None: sent as they are."""
        recent, tail = history.get("pace_sums_s"), self.tail_ts
        pace = _pace(self.block)
        if not isinstance(recent, (int, float)) or tail is None or pace is None:
            return None
        if self.marks is None or pace[1] >= tail - recent:
            return None
        for _, line in self.text:
            if b"start" in line or b"resume" in line:
                rec = parse_json(line)
                if isinstance(rec, dict) and rec.get("event") in ("start", "resume"):
                    return None
        return pace[0]

    def _history(self, history: Any) -> frozenset[str] | None:
        """The only columns to send of a block older than the request's newest rows (with
        the envelope and the rows' places); None: every one."""
        if not isinstance(history, dict):
            return None
        paths, newest = history.get("paths"), history.get("newest")
        if not isinstance(paths, list) or type(newest) is not int or self.newer < newest:
            return None
        return frozenset(str(p) for p in paths) | _ENVELOPE_COLUMNS

    def _others(
        self, cutoffs: dict[str, int] | None, runs: list[int], text: list[bytes], stubs: _Stubs
    ) -> None:
        """The range's lines between the rows, from the range's bytes read."""
        cuts = {k.encode(): v for k, v in cutoffs.items() if v > 0} if cutoffs else {}
        at = 0  # in the range: the end of the last row
        data, base = self.data, self.start
        for off, n in zip(self.offsets, self.lengths):  # noqa: B905 (3.8: no strict)
            rel = off - base
            if rel > at:
                if cuts:
                    stubs.split(data, at, rel, base, cuts, runs, text)
                else:
                    runs += [at, rel - at]
                    text.append(data[at:rel])
            at = rel + n


class _Stubs:
    """The sampler lines of a range that go as envelopes only: where each is, its
    kind, writer, sequence number and time. The client keeps the newest few hundred
    samples of each kind; the older ones only count (records, sequence numbers,
    times), so only their envelopes travel."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, bytes, bytes, bytes, bytes]] = []
        """(offset, length, kind, writer, seq, ts): the last four as written."""
        self.parts: list[bytes] = []

    @property
    def n(self) -> int:
        return len(self.rows)

    def split(
        self,
        data: bytes,
        lo: int,
        hi: int,
        base: int,
        cutoffs: dict[bytes, int],
        runs: list[int],
        text: list[bytes],
    ) -> None:
        """The lines of ``data[lo:hi]`` (whole lines) into runs of text and stubs."""
        run_start = lo
        find = data.find
        rows = self.rows
        first = ENVELOPE.match(data, lo, hi) if lo == 0 else None
        found = NL_ENVELOPE.finditer(data, max(lo - 1, 0), hi)  # data[lo - 1] is a newline
        for m in [first, *found] if first is not None else found:
            pos = m.start() if m is first else m.start() + 1
            seq, w, ts, kind = m.groups()
            if base + pos >= cutoffs.get(kind, 0):
                continue
            nl = find(b"\n", m.end(), hi)
            if nl < 0 or not PLAIN_TIME.fullmatch(ts) or not seq_fits(seq):
                continue  # (a line of the run's text)
            if pos > run_start:
                runs += [run_start, pos - run_start]
                text.append(data[run_start:pos])
            rows.append((pos, nl + 1 - pos, kind, w, seq, ts))
            run_start = nl + 1
        if hi > run_start:
            runs += [run_start, hi - run_start]
            text.append(data[run_start:hi])

    def header(self) -> dict[str, Any]:
        offs, lens, kinds, ws, seqs, ts = zip(*self.rows)  # noqa: B905 (3.8: no strict)
        head, self.parts = pack_envelopes(
            list(offs),
            list(lens),
            list(kinds),
            list(ws),
            list(map(int, seqs)),
            list(map(float, ts)),
            STUB_LEVEL,
        )
        return head


SAMPLES_MARGIN = 64
"""Lines of a sampler kind sent whole beyond the ones the client keeps: a line it does
not keep (a repeated record, a malformed one) still counts here, and without a margin
its history would hold that many fewer than a read of the lines (exact while the
newest lines hold at most this many)."""


def sample_cutoffs(fd: int, size: int, keep: Any) -> dict[str, int]:
    """Per sampler kind the client keeps ``keep[kind]`` of, the offset of the first of
    the newest that many lines of that kind and :data:`SAMPLES_MARGIN` more (0: the
    file has no more than that): the lines of that kind before it may go as envelopes.
    Read backwards, line by line only in chunks that name a kind still counted."""
    if not isinstance(keep, dict):
        return {}
    left = {str(k): v + SAMPLES_MARGIN for k, v in keep.items() if isinstance(v, int) and v > 0}
    cutoffs = {k: 0 for k in left}
    hi = size
    while left and hi > 0:
        lo = max(0, hi - CHUNK)
        data = os.pread(fd, hi - lo, lo)
        first = 0 if lo == 0 else data.find(b"\n") + 1
        if first == 0 and lo > 0:  # one line longer than a chunk: look further back
            hi = lo
            continue
        if any(('"' + k + '"').encode() in data for k in left):
            lines = data[first:].split(b"\n")
            end = hi - len(lines[-1])  # the last piece: a torn line, or nothing
            for line in reversed(lines[:-1]):  # whole lines only
                start = end - 1 - len(line)
                end = start
                m = ENVELOPE.match(line)
                if m is None:
                    continue
                kind = m.group(4).decode()
                if kind in left:
                    left[kind] -= 1
                    if left[kind] == 0:
                        cutoffs[kind] = start
                        del left[kind]
                        if not left:
                            break
        hi = lo + first
    return cutoffs


def column_plan(fd: int, jsonl_path: str, start: int, size: int) -> list[Segment]:
    """The segments that may stand for the file (open as ``fd``) from ``start`` to
    ``size``, in file order; empty when there is no usable companion. Each must pass
    :meth:`Segment.check` before it is sent (checked as they go, so that the first
    ones travel while the later ones are checked). A segment the companion accounts
    for reaches back to the end of the one before it (or ``start``), so that nothing
    between them is read."""
    return list(planned(fd, jsonl_path, start, size))


def planned(fd: int, jsonl_path: str, start: int, size: int) -> Iterator[Segment]:
    """:func:`column_plan`'s segments, each as soon as it is planned: its sample blocks
    are read as the ranges reach them."""
    data = _read_companion(companion_path(jsonl_path))
    if not data:
        return
    st = os.fstat(fd)
    candidates: list[Segment] = []
    samples: list[Unread] = []
    marks: list[tuple[int, int, str]] = []
    for magic, head, body in walk_blocks(data):
        if magic == DIGEST_MAGIC:
            continue  # a glance's (agent/glance.py)
        h, first_seq = _header(head) if magic == MAGIC else (_parsed(head), None)
        if h is None or h.get("dev") != st.st_dev or h.get("ino") != st.st_ino:
            continue  # another file's (the run's file was replaced)
        if magic == MARK_MAGIC:
            marks += marks_of(h) or ()
            continue
        if magic == SAMPLE_MAGIC:
            unread = unread_samples(h, body)
            if unread is not None and unread[1] <= size:
                samples.append(unread)
            continue
        block = block_of(h, body) if magic == MAGIC else None
        if block is None:
            continue
        seg = Segment.of(block, first_seq)
        if seg is not None and seg.start >= start and seg.end <= size:
            candidates.append(seg)
    candidates.sort(key=lambda s: s.start)
    if candidates:
        latest = frozenset(candidates[-1].block.chunks)
        newer = 0
        for seg in reversed(candidates):
            seg.newer, seg.latest = newer, latest
            newer += seg.block.n
        tail = _newest_ts(candidates[-1].block)
        for seg in candidates[1:-1]:  # (the first's first row starts a pace: never summed)
            seg.tail_ts = tail
    listing = Listing(samples, marks)
    at = start
    for seg in candidates[:-1]:  # the last block's steps go as JSON (the exact latest)
        if seg.start < at:
            continue  # overlapping one taken (two writers' blocks)
        for a in (at, seg.start) if at < seg.start else (at,):
            found = listing.lines_in(a, seg.end, seg.rows_bytes)
            if found is not None:
                seg.start, (seg.marks, seg.samples) = a, found
                break
        yield seg
        at = seg.end


def ready(
    fd: int, jsonl_path: str, start: int, size: int, samples: Any, keep: Any, history: Any = None
) -> Iterator[tuple[int, int, bytes]]:
    """The segments of :func:`column_plan` that passed their check, in file order, as
    the C frames' ranges (start, end) and payloads (``samples``, ``keep``,
    ``history``: a request's ``"samples"``, ``"columns"`` and ``"history"``); the bytes
    between them are the caller's to send. Consecutive accounted segments of blocks
    alike share a frame, up to :data:`GROUP_ROWS` rows (:func:`group_payload`)."""
    cutoffs: dict[str, int] | None = None
    sent = Sent()
    group: list[Segment] = []
    kepts: list[list[tuple[str, str, bytes]]] = []
    shared: tuple[dict[str, Any], list[str]] | None = None
    rows = 0
    for seg in planned(fd, jsonl_path, start, size):
        if cutoffs is None:
            cutoffs = sample_cutoffs(fd, size, samples)
        if not seg.check(fd, cutoffs):
            continue  # its lines go as lines
        if seg.marks is None:  # read and checked: a frame alone
            if group:
                yield group[0].start, group[-1].end, group_payload(group, kepts, sent)
                group, kepts, rows = [], [], 0
            yield seg.start, seg.end, seg.payload(keep, cutoffs, sent, history)
            continue
        kept = seg.kept(keep, history)
        mine = (seg.shared_header(), [path for path, _, _ in kept])
        if group and (
            mine != shared or seg.start != group[-1].end or rows + seg.block.n > GROUP_ROWS
        ):
            yield group[0].start, group[-1].end, group_payload(group, kepts, sent)
            group, kepts, rows = [], [], 0
        group.append(seg)
        kepts.append(kept)
        shared = mine
        rows += seg.block.n
    if group:
        yield group[0].start, group[-1].end, group_payload(group, kepts, sent)


@functools.lru_cache(maxsize=64)
def _kept(
    paths: tuple[str, ...],
    keep: tuple[tuple[str, tuple[str, ...] | None], ...],
    only: frozenset[str] | None,
    latest: frozenset[str],
) -> tuple[int, ...]:
    """Which of a block's columns (``paths``) are sent (:meth:`Segment.kept`): worked
    out once for the blocks that share their columns (a writer's, mostly). ``keep``:
    per group, the only fields wanted (None: all); ``only``: of an old block, the
    columns a history sends; ``latest``: the last block's columns."""
    fields = dict(keep)
    out: list[int] = []
    for i, path in enumerate(paths):
        group, _, name = path.partition(".")
        wanted = fields.get(group) if name else None
        if wanted is not None and name not in wanted:
            continue
        if only is not None and path not in only and path in latest:
            continue
        out.append(i)
    return tuple(out)


def pace_summed(
    kept: list[tuple[str, str, Any]], n: int, tokens: float
) -> list[tuple[str, str, Any]]:
    """A block's columns with its pace's timings as their sum, ``tokens``: every row's
    absent (NaN) but the last's, whose ``step_ms`` is 1000 and ``tokens_per_s`` the
    tokens -- the client's pace, which adds up the tokens of the steps of a span
    (model/derived.py's ``pace``), adds this block's all at once. As sent where the
    block sends no such columns."""
    if n < 1 or any(path not in {p for p, _, _ in kept} for path in PACE_TIMINGS):
        return kept
    summed = {
        PACE_TIMINGS[0]: ("d", _absent_but_last("d", n, tokens)),
        PACE_TIMINGS[1]: ("f", _absent_but_last("f", n, 1000.0)),
    }
    return [(path, *summed[path]) if path in summed else (path, kind, packed)
            for path, kind, packed in kept]  # fmt: skip


@functools.lru_cache(maxsize=256)
def _absent_but_last(kind: str, n: int, last: float) -> bytes:
    """A packed column of ``n`` NaN but its last value (the same for every block of ``n``
    rows where ``last`` is: a 1M-step run's ~1,700 blocks, packed once a length)."""
    return pack_column(kind, [*([math.nan] * (n - 1)), last], level=1)


def _pace(block: Block) -> tuple[float, float] | None:
    """A block's tokens and newest time, as its writer says them (its ``"pace"``)."""
    pace = block.header.get("pace")
    if not isinstance(pace, dict):
        return None
    tokens, ts = pace.get("tokens"), pace.get("ts")
    if type(tokens) is not float or type(ts) is not float:
        return None
    if not (math.isfinite(tokens) and math.isfinite(ts)):
        return None
    return tokens, ts


def _newest_ts(block: Block) -> float | None:
    """The newest time among a block's rows (None: it cannot be read)."""
    pace = _pace(block)
    if pace is not None:
        return pace[1]
    try:
        kind, packed = block.chunks["ts"]
        if kind in ("f", "d"):
            return max(unpack_floats(bytes(packed), block.n, kind), default=None)
        return max(unpack_ints(bytes(packed), block.n, kind), default=None)
    except (KeyError, ValueError, zlib.error):
        return None


def group_payload(
    segs: list[Segment], kepts: list[list[tuple[str, str, bytes]]], sent: Sent
) -> bytes:
    """One C frame's payload for consecutive accounted segments of blocks alike (the
    same header but for their rows, the same columns sent: ``kepts``, each one's
    :meth:`Segment.kept`): each column's pieces one after the other, and where there
    are several, ``"pieces"``: each block's rows and its pieces' types and sizes, in
    the columns' order (``"cols"`` then gives no type). Their events are one frame's
    runs, their samples one frame's ranges."""
    first = segs[0]
    header = first.shared_header()
    header["n"] = sum(seg.block.n for seg in segs)
    cols: list[list[Any]] = []
    parts: list[bytes] = []
    several = len(segs) > 1
    for c, (path, kind, _) in enumerate(kepts[0]):
        pieces = [kept[c][2] for kept in kepts]
        cols.append([path, None if several else kind, sum(map(len, pieces))])
        parts += pieces
    header["cols"] = cols
    if several:  # each block's rows and columns (a column's type may differ: q or a)
        header["pieces"] = [
            [seg.block.n, [[kind, len(packed)] for _, kind, packed in kept]]
            for seg, kept in zip(segs, kepts)  # noqa: B905 (3.8: no strict)
        ]
    runs: list[int] = []
    text: list[bytes] = []
    for seg in segs:
        for off, line in seg.text:
            runs += [off - first.start, len(line)]
            text.append(line)
    samples = [listed for seg in segs for listed in seg.samples]
    if samples:
        new = sent.update(first.start, samples)
        header["listings"] = [listing_header(k, b) for k, b in new]
        parts += [b.body for _, b in new]
        header["listed"] = [[sent.number(b), i, j] for b, i, j in samples]
    return _framed(header, parts, runs, text)


def _framed(
    header: dict[str, Any], parts: list[bytes], runs: list[int], text: list[bytes]
) -> bytes:
    """A payload: the header (with ``"gaps"``), the columns' bytes, the runs, the text."""
    raw = b"".join(text)
    packed_runs = pack_column("q", runs) if runs else b""
    packed_text = zlib.compress(raw, TEXT_LEVEL) if raw else b""
    header["gaps"] = [len(packed_runs), len(packed_text), len(raw)]
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([HEADER_LEN.pack(len(head)), head, *parts, packed_runs, packed_text])


_STATS = b',"stats":{'
_FIRST_SEQ = re.compile(rb'[{,]"seq":\[(-?[0-9]{1,19})[],]')


def _header(head: bytes) -> tuple[dict[str, Any] | None, int | None]:
    """A column block's header without its ``stats`` (a glance's, ~2/3 of its bytes:
    parsing them was a fifth of the plan's first frame), and its first row's ``seq``
    as they say it (checked against the file before the block is used). The writer
    puts ``stats`` last; a header where they are not is parsed whole, or without what
    follows them (then its block, missing what it needs, goes as lines)."""
    cut = head.rfind(_STATS)
    if cut > 0 and head.endswith(b"}}"):
        h = _parsed(head[:cut] + b"}")
        if h is not None and "stats" not in h:
            m = _FIRST_SEQ.search(head, cut + len(_STATS) - 1)
            return h, int(m.group(1)) if m else None
    h = _parsed(head)
    stats = h.pop("stats", None) if h is not None else None
    seq = stats.get("seq") if isinstance(stats, dict) else None
    if isinstance(seq, list) and seq and type(seq[0]) is int:
        return h, seq[0]
    return h, None


def _parsed(head: bytes) -> dict[str, Any] | None:
    try:
        h = parse_json(head)
    except ValueError:
        return None
    return h if isinstance(h, dict) else None


def _sample_at(fd: int, block: Samples, k: int) -> bytes | None:
    """Line ``k`` of a sample block when it is one whole line of the file with an
    envelope of one of the block's kinds."""
    line = line_at(fd, block.offsets[k], block.lengths[k])
    m = None if line is None else ENVELOPE.match(line)
    return line if m is not None and m.group(4).decode() in block.kinds else None


def _seq_ok(line: bytes, seq: int) -> bool:
    return line.startswith(b'{"v":1,"seq":%d,' % seq) or _seq_of(line, 0, len(line)) == seq


def _seq_of(data: bytes, start: int, end: int) -> int | None:
    """The ``seq`` of the line at ``start`` (its envelope is near the start)."""
    at = data.find(b'"seq"', start, end)
    if at < 0:
        return None
    at += 5
    while at < end and data[at] in b" :":
        at += 1
    stop = at
    while stop < end and data[stop] in b"-0123456789":
        stop += 1
    try:
        return int(data[at:stop])
    except ValueError:
        return None


def _read_companion(path: str) -> bytes | None:
    try:
        with open_file(path) as f:
            if os.fstat(f.fileno()).st_size > MAX_COMPANION:
                return None
            return f.read()
    except OSError:
        return None
