"""What a companion lists of a file besides its rows (telemetry/columns.py): every
writer's samples (sample blocks) and events (marks), and which of a range's lines they
account for (:class:`Listing`); the sample blocks a client already holds (:class:`Sent`).

Python 3.8+, standard library only.
"""

from __future__ import annotations

import os
import zlib
from bisect import bisect_left
from itertools import count
from typing import Any, Optional, Tuple  # noqa: UP035 (Python 3.8 on the host)

from eagle3_tui.telemetry.columns import Samples

Listed = Tuple[Samples, int, int]  # noqa: UP006 (evaluated: Python 3.8)
"""Lines ``i`` to ``j`` (not included) of a sample block."""
Unread = Tuple[int, int, Any, Any]  # noqa: UP006 (evaluated: Python 3.8)
"""A sample block not read yet: the span its header says, its header and its body."""


def unread_samples(header: dict[str, Any], body: Any) -> Optional[Unread]:  # noqa: UP045
    """A sample block to read when a range first reaches it (:class:`Listing`), or None
    when its header says no span."""
    span = header.get("span")
    if not (isinstance(span, list) and len(span) == 2 and all(type(x) is int for x in span)):
        return None
    return (span[0], span[1], header, body)


def _read(unread: Unread) -> Optional[Samples]:  # noqa: UP045
    """The block read (its places unpacked and checked), or None: not one."""
    try:
        return Samples(unread[2], unread[3])
    except (ValueError, KeyError, TypeError, IndexError, zlib.error):
        return None


class Sent:
    """The sample blocks a client holds (sent with an earlier frame of this stream):
    it forgets each at the first columns frame that starts at or past its end, and so
    does this."""

    def __init__(self) -> None:
        self._held: dict[int, tuple[int, Samples]] = {}
        """By the block's ``id()``: the number it was sent under, and the block."""

    def update(self, start: int, listed: list[Listed]) -> list[tuple[int, Samples]]:
        """Before the frame at ``start`` that lists ``listed``: the blocks to send with
        it, each with the number the frame's ranges name it by."""
        self._held = {k: v for k, v in self._held.items() if v[1].end > start}
        new: list[tuple[int, Samples]] = []
        for b, _, _ in listed:
            if id(b) not in self._held:
                self._held[id(b)] = (next(_NUMBERS), b)
                new.append(self._held[id(b)])
        return new

    def number(self, block: Samples) -> int:
        return self._held[id(block)][0]


_NUMBERS = count()
"""Sample blocks' numbers on the wire: never two alike in one agent."""


class Listing:
    """What a companion lists of one file besides its rows: every writer's samples
    (sample blocks) and events (marks). Where the rows of a block, the samples and the
    marks inside a range add up to its every byte, the companion accounts for the
    range: each byte is a line one of the file's writers wrote whole and listed."""

    def __init__(self, samples: list[Unread], marks: list[tuple[int, int, str]]) -> None:
        self.samples = sorted(samples, key=lambda b: b[0])
        """Each block is read when a range first reaches it (a 1M-step run's 977 blocks:
        ~0.25 s without numpy), so that the first frames travel while later ones are
        planned; one that is not a sample block lists nothing."""
        self.marks = sorted(set(marks))
        self._mark_offsets = [m[0] for m in self.marks]
        self._next = 0
        self._active: list[Samples] = []

    def lines_in(
        self, a: int, b: int, rows: int
    ) -> tuple[list[tuple[int, int, str]], list[Listed]] | None:
        """The marks and samples inside ``a``..``b``, when with ``rows`` bytes of rows
        they fill it and none crosses its ends; else None. Ranges are asked in file
        order (a range before the last one asked may find nothing)."""
        while self._next < len(self.samples) and self.samples[self._next][0] < b:
            block = _read(self.samples[self._next])
            if block is not None:
                self._active.append(block)
            self._next += 1
        self._active = [x for x in self._active if x.end > a]
        covered = rows
        samples: list[Listed] = []
        for blk in self._active:
            i, j = bisect_left(blk.offsets, a), bisect_left(blk.offsets, b)
            if i > 0 and blk.offsets[i - 1] + blk.lengths[i - 1] > a:
                return None  # a line across the range's start
            if j > i:
                if blk.offsets[j - 1] + blk.lengths[j - 1] > b:
                    return None
                covered += sum(blk.lengths[i:j])
                samples.append((blk, i, j))
        i, j = bisect_left(self._mark_offsets, a), bisect_left(self._mark_offsets, b)
        marks = self.marks[i:j]
        if (i > 0 and sum(self.marks[i - 1][:2]) > a) or (marks and sum(marks[-1][:2]) > b):
            return None
        covered += sum(n for _, n, _ in marks)
        return (marks, samples) if covered == b - a else None


def listing_header(number: int, b: Samples) -> dict[str, Any]:
    """A sample block as a columns frame's ``"listings"`` names it (its packed columns
    follow the frame's own)."""
    return {"id": number, "n": b.n, "kinds": b.kinds, "writers": b.writers, "cols": b.cols}


def marks_of(header: dict[str, Any]) -> list[tuple[int, int, str]] | None:
    """A mark block's marks (offset, length, kind), or None when they are not that."""
    marks = header.get("marks")
    if not isinstance(marks, list):
        return None
    out = []
    for m in marks:
        if not (isinstance(m, list) and len(m) == 3):
            return None
        off, n, kind = m
        if type(off) is not int or type(n) is not int or off < 0 or n <= 0:
            return None
        if not isinstance(kind, str) or len(kind) > 40:
            return None
        out.append((off, n, kind))
    return out


def line_at(fd: int, off: int, n: int) -> bytes | None:
    """The ``n`` bytes at ``off`` when they are one whole line of the file."""
    before = 1 if off > 0 else 0
    data = os.pread(fd, n + before, off - before)
    if len(data) != n + before or (before and data[0] != 10) or data[-1] != 10:
        return None
    line = data[before:]
    return None if b"\n" in line[:-1] else line
