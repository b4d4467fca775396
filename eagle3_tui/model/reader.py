"""Incremental line reading: bytes with their file offsets in, whole records out.

A transport hands over chunks of a file as ``(offset, data)``. The reader keeps a
torn last line until its newline arrives, so any split of the byte stream yields
the same records as reading it whole. It notices when a chunk does not continue
where the last one ended (the file was truncated or replaced and the transport
restarted) and reports it, and it never stops on a bad line.

Complete lines are decoded in batches (one msgspec call for thousands of lines);
a batch with a bad line is split in halves until the bad line is isolated, so a
malformed line costs a few extra calls, not a slow path for the whole file.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import numpy as np

from eagle3_tui.model.records import Decoders, Deferred, Malformed, Record, TrainStep

MAX_LINE = 16 * 1024 * 1024  # a "line" longer than this is junk, not a record
_MIN_BATCH = 8


@dataclass(frozen=True, slots=True)
class Restarted:
    """The stream restarted at ``offset`` although ``expected`` was next."""

    offset: int
    expected: int
    reason: str


Item = Record | TrainStep | Deferred | Malformed | Restarted


class LineReader:
    """Turns ``feed(offset, data)`` calls into records, malformed lines and restarts."""

    def __init__(self) -> None:
        self._buf = b""
        self._buf_offset = 0  # file offset of _buf[0] == just past the last complete line
        self._line_no = 0  # lines completed so far
        self._skipping_long = False
        self.decoders = Decoders()
        self.listings: dict[int, Any] = {}
        """Sample blocks a columns frame of this stream sent for later frames to use
        (model/segments.py); forgotten when the stream restarts."""

    @property
    def next_offset(self) -> int:
        """Where the next chunk is expected to start."""
        return self._buf_offset + len(self._buf)

    @property
    def complete_offset(self) -> int:
        """Offset just past the last complete line: resume a broken stream here."""
        return self._buf_offset

    @property
    def line_no(self) -> int:
        """Lines completed so far."""
        return self._line_no

    def skip(self, offset: int, span: int, lines: int) -> None:
        """``lines`` whole lines, ``span`` bytes at ``offset``, were read another way (a
        columns frame): go on after them. ``offset`` must be where the next line starts."""
        if self._buf or self._buf_offset != offset or self._skipping_long:
            raise ValueError(
                f"a columns frame at {offset}, but the stream is at {self.next_offset}"
            )
        self._buf_offset = offset + span
        self._line_no += lines

    def decode_lines(self, offset: int, data: bytes, line_no: int) -> list[Item]:
        """Whole lines (``data`` ends with a newline) at ``offset``, the first one
        numbered ``line_no + 1``, decoded as :meth:`feed` decodes them; the stream's
        position does not move."""
        end = len(data) - 1
        newlines = np.frombuffer(memoryview(data)[:end], dtype=np.uint8) == 10
        recs = self.decoders.lines(data, 0, end, newlines) if end > 0 else None
        if recs is not None:
            return recs  # type: ignore[return-value]
        out: list[Item] = []
        self._decode(data[:end].split(b"\n"), offset, line_no + 1, out)
        return out

    def decode_pieces(self, pieces: Sequence[tuple[int, bytes]]) -> list[Item]:
        """Whole lines at their offsets (each ends with a newline), decoded as
        :meth:`decode_lines` decodes each of them: in one call where all of them decode
        (a glance's events: hundreds of lines, ~8 µs of calls each), else one by one."""
        data = b"".join(line for _, line in pieces)
        end = len(data) - 1
        if end > 0:
            newlines = np.frombuffer(memoryview(data)[:end], dtype=np.uint8) == 10
            recs = self.decoders.lines(data, 0, end, newlines)
            if recs is not None:
                return recs  # type: ignore[return-value]
        out: list[Item] = []
        for offset, line in pieces:
            out += self.decode_lines(offset, line, 0)
        return out

    def pending(self) -> int:
        """Bytes of a torn last line still waiting for their newline."""
        return len(self._buf)

    def feed(self, offset: int, data: bytes, lo: int = 0, hi: int | None = None) -> list[Item]:
        """Consume ``data[lo:hi]``, which starts at file ``offset``; returns what it
        completed, in order. (A range, so that a big catch-up read is fed in slices
        without copying them.)"""
        out: list[Item] = []
        if hi is None:
            hi = len(data)
        expected = self.next_offset
        if offset != expected:
            if offset == self._buf_offset:
                self._buf = b""  # resumed at the last complete line: drop the torn tail
            elif self._buf_offset < offset < expected:
                lo = min(hi, lo + expected - offset)  # overlaps the torn tail we hold
                offset = expected
            else:
                reason = "truncated or replaced" if offset < self._buf_offset else "bytes skipped"
                out.append(Restarted(offset, expected, reason))
                self.listings = {}
                self._buf = b""
                self._buf_offset = offset
                self._skipping_long = False
                if offset == 0:
                    self._line_no = 0
        if lo >= hi:
            return out
        if self._skipping_long:
            # the rest of a line already reported as too long: dropped up to its newline
            nl = data.find(b"\n", lo, hi)
            if nl < 0:
                self._buf_offset += hi - lo
                return out
            self._buf_offset += nl + 1 - lo
            self._skipping_long = False
            lo = nl + 1
            if lo >= hi:
                return out
        nl = data.find(b"\n", lo, hi)
        if nl < 0:
            self._buf += data[lo:hi]
            self._check_long(out)
            return out
        # the head: a torn line we held, completed by this chunk's first line
        head_offset = self._buf_offset
        head = self._buf + data[lo:nl] if self._buf else data[lo:nl]
        data_offset = head_offset + len(self._buf) - lo  # file offset of data[0]
        self._buf = b""
        self._line_no += 1
        head_line_no = self._line_no
        body_out: list[Item] = []
        cut = data.rfind(b"\n", lo, hi)
        if cut > nl:
            # how many lines the body holds: one vectorised pass, no line objects
            # the body's newlines: one vectorised pass, no line objects
            newlines = np.frombuffer(memoryview(data)[nl + 1 : cut], dtype=np.uint8) == 10
            first_line_no = self._line_no + 1
            recs = self.decoders.lines(data, nl + 1, cut, newlines)
            if recs is not None:  # the whole body in one C call: one record per line
                body_out = recs  # type: ignore[assignment]
                self._line_no += len(recs)
            else:
                lines = data[nl + 1 : cut].split(b"\n")
                self._line_no += len(lines)
                self._decode(lines, data_offset + nl + 1, first_line_no, body_out)
        # the head after the body: it then uses the typed decoder the body taught
        if head:
            lean = self.decoders.lines(head, 0, len(head), np.zeros(len(head), dtype=bool))
            if lean is not None:  # a training step like the body's: one column batch
                out.extend(lean)
            else:
                self._decode([head], head_offset, head_line_no, out)
        out.extend(body_out)
        self._buf = data[cut + 1 : hi]
        self._buf_offset = data_offset + cut + 1
        self._check_long(out)
        return out

    def _check_long(self, out: list[Item]) -> None:
        """A torn line past MAX_LINE is one malformed line: reported once, and the rest
        of it, up to its newline, dropped as it arrives (never held, never re-counted)."""
        if len(self._buf) > MAX_LINE:
            self._line_no += 1
            out.append(
                Malformed(self._line_no, self._buf_offset, "line longer than 16 MiB, skipped", "")
            )
            self._buf_offset += len(self._buf)
            self._buf = b""
            self._skipping_long = True

    def _decode(self, lines: list[bytes], start: int, line_no: int, out: list[Item]) -> None:
        if len(lines) >= _MIN_BATCH and all(lines):
            recs = self.decoders.batch(lines)
            if recs is not None:
                out.extend(recs)
                return
            half = len(lines) // 2
            self._decode(lines[:half], start, line_no, out)
            skipped = sum(len(ln) + 1 for ln in lines[:half])
            self._decode(lines[half:], start + skipped, line_no + half, out)
            return
        offsets = accumulate((len(ln) + 1 for ln in lines), initial=start)
        for i, (ln, off) in enumerate(zip(lines, offsets, strict=False)):
            if ln.strip():
                out.append(self.decoders.one(ln, line_no + i, off))
