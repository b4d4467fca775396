"""The columnar catch-up: ship ``metrics.cols`` blocks instead of the lines they index.

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
run of consecutive other lines. Python 3.8+, standard library only.
"""

from __future__ import annotations

import json
import os
import re
import struct
import zlib
from typing import Any

from eagle3_tui.telemetry.columns import Block, companion_path, pack_column, read_blocks
from eagle3_tui.telemetry.safefs import open_file

HEADER_LEN = struct.Struct("<I")
TEXT_LEVEL = 1
STUB_LEVEL = 1
CHUNK = 4 << 20
MAX_COMPANION = 1 << 31


class Segment:
    """A block that stands for the bytes ``start``..``end`` of the file."""

    __slots__ = ("block", "data", "end", "lengths", "offsets", "start")

    def __init__(self, block: Block, offsets: list[int], lengths: list[int]) -> None:
        self.block = block
        self.offsets = offsets
        self.lengths = lengths
        self.start = offsets[0]
        self.end = offsets[-1] + lengths[-1]
        self.data = b""

    def check(self, fd: int) -> bool:
        """Whether every row is a whole line of the file with the block's sequence number."""
        try:
            return self._check(fd)
        except (OSError, ValueError, zlib.error):
            return False

    def _check(self, fd: int) -> bool:
        before = 1 if self.start > 0 else 0  # the range must start a line too
        data = os.pread(fd, self.end - self.start + before, self.start - before)
        if len(data) != self.end - self.start + before or (before and data[0] != 10):
            return False
        data = data[before:]
        seqs = self.block.ints("seq")
        base = self.start
        starts = data.startswith
        for off, n, seq in zip(self.offsets, self.lengths, seqs):  # noqa: B905 (3.8: no strict)
            rel = off - base
            if n <= 0 or data[rel + n - 1] != 10 or (rel > 0 and data[rel - 1] != 10):
                return False
            # the writer's own lines start so (one C call); any other spelling is parsed
            if not starts(b'{"v":1,"seq":%d,' % seq, rel) and _seq_of(data, rel, rel + n) != seq:
                return False
        self.data = data
        return True

    def payload(self, keep: dict[str, Any], cutoffs: dict[str, int] | None = None) -> bytes:
        """The C frame's payload; ``keep``: per group, the only fields to send;
        ``cutoffs``: per sampler kind, where the lines the client keeps begin (the ones
        before go as envelopes, see :func:`sample_cutoffs`)."""
        header = dict(self.block.header)
        header.pop("stats", None)  # a glance's (agent/glance.py): not the client's to keep
        header.pop("span", None)
        cols: list[list[Any]] = []
        parts: list[bytes] = []
        for path, (kind, packed) in self.block.chunks.items():
            group, _, name = path.partition(".")
            wanted = keep.get(group) if name else None
            if isinstance(wanted, list) and name not in wanted:
                continue
            cols.append([path, kind, len(packed)])
            parts.append(packed)
        header["cols"] = cols
        runs: list[int] = []
        text: list[bytes] = []
        stubs = _Stubs()
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
        if stubs.n:
            header["stubs"] = stubs.header()
            parts += stubs.parts
        raw = b"".join(text)
        packed_runs = pack_column("q", runs) if runs else b""
        packed_text = zlib.compress(raw, TEXT_LEVEL) if raw else b""
        header["gaps"] = [len(packed_runs), len(packed_text), len(raw)]
        head = json.dumps(header, separators=(",", ":")).encode()
        return b"".join([HEADER_LEN.pack(len(head)), head, *parts, packed_runs, packed_text])


ENVELOPE = re.compile(
    rb'\{"v": ?1, ?"seq": ?(\d+), ?"w": ?"([^"\\]*)", ?"ts": ?([-0-9.eE+]+), ?"kind": ?"(\w+)"'
)
"""A line's envelope as our writer writes it (its fields first, in this order)."""
_TIME = re.compile(rb"[1-9][0-9]{0,11}(\.[0-9]+)?")
"""A time a stub may carry: positive, finite, plain decimal (else the line goes whole)."""
NL_ENVELOPE = re.compile(b"\n" + ENVELOPE.pattern)
"""The same after a newline: a literal start, which the regex engine scans for fast."""


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
            if nl < 0 or not _TIME.fullmatch(ts):
                continue
            if pos > run_start:
                runs += [run_start, pos - run_start]
                text.append(data[run_start:pos])
            rows.append((pos, nl + 1 - pos, kind, w, seq, ts))
            run_start = nl + 1
        if hi > run_start:
            runs += [run_start, hi - run_start]
            text.append(data[run_start:hi])

    def header(self) -> dict[str, Any]:
        offs, lens, kinds_b, ws_b, seqs, ts = zip(*self.rows)  # noqa: B905 (3.8: no strict)
        kinds = {k: i for i, k in enumerate(dict.fromkeys(kinds_b))}
        writers = {w: i for i, w in enumerate(dict.fromkeys(ws_b))}
        cols = {
            "@off": list(offs),
            "@len": list(lens),
            "kind": [kinds[k] for k in kinds_b],
            "w": [writers[w] for w in ws_b],
            "seq": list(map(int, seqs)),
        }
        meta: list[list[Any]] = []
        for name, values in cols.items():
            packed = pack_column("q", values, STUB_LEVEL)
            meta.append([name, "q", len(packed)])
            self.parts.append(packed)
        packed = pack_column("d", list(map(float, ts)), STUB_LEVEL)
        meta.append(["ts", "d", len(packed)])
        self.parts.append(packed)
        return {
            "n": self.n,
            "kinds": [k.decode() for k in kinds],
            "writers": [w.decode("utf-8", "replace") for w in writers],
            "cols": meta,
        }


def sample_cutoffs(fd: int, size: int, keep: Any) -> dict[str, int]:
    """Per sampler kind the client keeps ``keep[kind]`` of, the offset of the first of
    the newest that many lines of that kind (0: the file has no more than that): the
    lines of that kind before it may go as envelopes. Read backwards, line by line only
    in chunks that name a kind still counted."""
    if not isinstance(keep, dict):
        return {}
    left = {str(k): v for k, v in keep.items() if isinstance(v, int) and v > 0}
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
    ones travel while the later ones are checked)."""
    data = _read_companion(companion_path(jsonl_path))
    if not data:
        return []
    st = os.fstat(fd)
    candidates: list[Segment] = []
    for block in read_blocks(data):
        h = block.header
        if h.get("dev") != st.st_dev or h.get("ino") != st.st_ino:
            continue  # another file's (the run's file was replaced)
        try:
            offsets, lengths = block.ints("@off"), block.ints("@len")
        except (ValueError, zlib.error):
            continue
        if len(offsets) != block.n or offsets != sorted(offsets):
            continue
        seg = Segment(block, offsets, lengths)
        if seg.start >= start and seg.end <= size:
            candidates.append(seg)
    candidates.sort(key=lambda s: s.start)
    plan: list[Segment] = []
    at = start
    for seg in candidates[:-1]:  # the last block's steps go as JSON (the exact latest)
        if seg.start >= at:  # not overlapping one taken (two writers' blocks)
            plan.append(seg)
            at = seg.end
    return plan


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
