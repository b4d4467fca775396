"""A companion (telemetry/columns.py) read a block at a time, not whole.

:func:`~eagle3_tui.telemetry.columns.walk_blocks` takes the companion's bytes whole: a
1M-step run's is 77 MB, ~50 ms of page faults and copies before its first block.
A glance (agent/glance.py) needs the column blocks' headers only (their stats stand
for their rows): :func:`scan_headers` hops from header to header (the 1M-step run's
glance: 90 -> 53 ms, its first frame 0.15 -> 0.10 s), and :func:`read_block` reads a
block whole (its checksum checked) where its columns are needed after all.

Python 3.8+, standard library only.
"""

from __future__ import annotations

import os
import zlib
from typing import Iterator  # noqa: UP035 (Python 3.8 on the host)

from eagle3_tui.telemetry.columns import (
    HEAD,
    MAGIC,
    MAGICS,
    MAX_BODY,
    MAX_HEADER,
    Block,
    block_of,
)
from eagle3_tui.telemetry.parsing import parse_json

HEAD_READ = 8192
"""Bytes :func:`scan_headers` reads at a block's start: its head and, mostly, its
header whole (a column block's is ~3.5 KB)."""


def scan_headers(fd: int, size: int) -> Iterator[tuple[bytes, bytes, int, int]]:
    """:func:`walk_blocks`'s blocks of the companion open as ``fd`` (its first ``size``
    bytes), their headers only: (magic, header, the block's offset, its body's length),
    block to block by their lengths. A block's checksum is checked only where the chain
    breaks after it (neither a block nor the file's end at its end): then it is read
    whole and left out if it is torn (a later writer wrote past it), and the next block
    is looked for from its start, as :func:`walk_blocks` does. Elsewhere its body is not
    read: a block whose body alone is damaged is listed (its header is whole)."""
    for magic, head, at, hlen, blen in scan_heads(fd, size, HEAD_READ - HEAD.size):
        header = head if len(head) == hlen else whole_header(fd, at, head, hlen)
        if header is not None:
            yield magic, header, at, blen


def scan_heads(
    fd: int, size: int, prefix: int, skip: tuple[bytes, ...] = ()
) -> Iterator[tuple[bytes, bytes, int, int, int]]:
    """:func:`scan_headers` reading at most ``prefix`` bytes of each header: (magic,
    the header's first bytes, the block's offset, the header's length, the body's);
    :func:`whole_header` reads the rest where it is needed (a glance parses few of
    them: a 1M-step run's companion is ~3,400 blocks, their headers ~7 MB). Reads are
    at least :data:`SCAN_READ` bytes, and a block whose head lies in the last read is
    taken from it (a sampler's block, ~2 KB, is read with the head of the next).
    Blocks of the magics in ``skip`` are hopped over, not yielded."""
    pos = 0
    held: tuple[bytes, bytes, int, int, int, int] | None = None
    read = HEAD.size + max(0, prefix)
    chunk = max(read, SCAN_READ)
    buf, buf_at = b"", 0
    while True:
        found: tuple[bytes, bytes, int, int, int, int] | None = None
        if pos + HEAD.size <= size:
            start = pos - buf_at
            if start < 0 or start + read > len(buf):
                buf, buf_at, start = os.pread(fd, chunk, pos), pos, 0
            if start + HEAD.size <= len(buf):
                magic, hlen, blen, crc = HEAD.unpack_from(buf, start)
                if (
                    magic in MAGICS
                    and hlen <= MAX_HEADER
                    and blen <= MAX_BODY
                    and pos + HEAD.size + hlen + blen <= size
                ):
                    first = start + HEAD.size
                    cut = first + min(hlen, read - HEAD.size)
                    head = b"" if magic in skip else buf[first:cut]
                    found = (magic, head, pos, hlen, blen, crc)
        if held is not None:
            magic, head, at, hlen, blen, crc = held
            held = None
            if found is not None or pos == size or _crc_ok(fd, at, hlen, blen, crc):
                if magic not in skip:
                    yield magic, head, at, hlen, blen
            else:  # torn: the next block from its start on
                pos = _next_magic(fd, at + 1, size)
                if pos < 0:
                    return
                continue
        if found is None:
            if pos >= size:
                return
            pos = _next_magic(fd, pos + 1, size)
            if pos < 0:
                return
            continue
        held = found
        pos = found[2] + HEAD.size + found[3] + found[4]


SCAN_READ = 4096
"""The least :func:`scan_heads` reads at a time."""


def whole_header(fd: int, at: int, head: bytes, hlen: int) -> bytes | None:
    """The whole header of the block at ``at`` whose first bytes are ``head`` (None:
    the companion is shorter now)."""
    if len(head) >= hlen:
        return head[:hlen]
    rest = os.pread(fd, hlen - len(head), at + HEAD.size + len(head))
    return head + rest if len(rest) == hlen - len(head) else None


def _crc_ok(fd: int, at: int, hlen: int, blen: int, crc: int) -> bool:
    data = os.pread(fd, hlen + blen, at + HEAD.size)
    return len(data) == hlen + blen and zlib.crc32(data) == crc


def read_block(fd: int, at: int) -> Block | None:
    """The column block at ``at`` in the companion open as ``fd``, read whole and its
    checksum checked; None: none there (the companion changed, or it is not one)."""
    head = os.pread(fd, HEAD.size, at)
    if len(head) != HEAD.size:
        return None
    magic, hlen, blen, crc = HEAD.unpack(head)
    if magic != MAGIC or hlen > MAX_HEADER or blen > MAX_BODY:
        return None
    data = os.pread(fd, hlen + blen, at + HEAD.size)
    if len(data) != hlen + blen or zlib.crc32(data) != crc:
        return None
    try:
        header = parse_json(data[:hlen])
    except ValueError:
        return None
    return block_of(header, memoryview(data)[hlen:]) if isinstance(header, dict) else None


def _next_magic(fd: int, pos: int, size: int) -> int:
    """The offset of the first magic of any kind at or after ``pos`` (-1: none)."""
    overlap = len(MAGIC) - 1
    while pos < size:
        data = os.pread(fd, min(1 << 20, size - pos), pos)
        if not data:
            return -1
        found = [at for at in (data.find(m) for m in MAGICS) if at >= 0]
        if found:
            return pos + min(found)
        if pos + len(data) >= size:
            return -1
        pos += max(1, len(data) - overlap)
    return -1
