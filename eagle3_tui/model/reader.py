"""Incremental line reading: bytes with their file offsets in, whole records out.

A transport hands over chunks of a file as ``(offset, data)``. The reader keeps a
torn last line until its newline arrives, so any split of the byte stream yields
the same records as reading it whole. It notices when a chunk does not continue
where the last one ended (the file was truncated or replaced and the transport
restarted at 0) and reports it, and it never stops on a bad line.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3_tui.model.records import Malformed, Record, decode_line

MAX_LINE = 16 * 1024 * 1024  # a "line" longer than this is junk, not a record


@dataclass(frozen=True, slots=True)
class Restarted:
    """The stream restarted at ``offset`` (truncation or replacement)."""

    offset: int
    expected: int
    reason: str


Item = Record | Malformed | Restarted


class LineReader:
    """Turns ``feed(offset, data)`` calls into records, malformed lines and restarts."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._buf_offset = 0  # file offset of _buf[0]
        self._line_no = 0

    @property
    def next_offset(self) -> int:
        """Where the next chunk is expected to start."""
        return self._buf_offset + len(self._buf)

    @property
    def complete_offset(self) -> int:
        """Offset just past the last complete line: resume a broken stream here."""
        return self._buf_offset

    def reset(self, offset: int = 0) -> None:
        self._buf.clear()
        self._buf_offset = offset
        self._line_no = 0 if offset == 0 else self._line_no

    def feed(self, offset: int, data: bytes) -> list[Item]:
        """Consume a chunk that starts at ``offset`` in the file; returns what it completed."""
        out: list[Item] = []
        if offset != self.next_offset:
            if offset < self.next_offset and offset == self.complete_offset:
                # a transport resumed at the last complete line: drop the torn tail
                self._buf.clear()
            elif offset > self.next_offset or offset < self.complete_offset:
                reason = (
                    "truncated or replaced" if offset < self.complete_offset else "skipped bytes"
                )
                out.append(Restarted(offset, self.next_offset, reason))
                self._buf.clear()
                self._buf_offset = offset
                if offset == 0:
                    self._line_no = 0
            else:  # overlap inside the torn tail: keep what we have, skip the repeat
                skip = self.next_offset - offset
                data = data[skip:]
        buf = self._buf
        start_len = len(buf)
        buf += data
        search_from = start_len
        pos = 0
        while True:
            nl = buf.find(b"\n", search_from)
            if nl < 0:
                break
            line = bytes(buf[pos:nl])
            line_offset = self._buf_offset + pos
            self._line_no += 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if line.strip():
                out.append(decode_line(line, self._line_no, line_offset))
            pos = nl + 1
            search_from = pos
        if pos:
            del buf[:pos]
            self._buf_offset += pos
        if len(buf) > MAX_LINE:
            self._line_no += 1
            out.append(
                Malformed(self._line_no, self._buf_offset, "line longer than 16 MiB, skipped", "")
            )
            self._buf_offset += len(buf)
            buf.clear()
        return out

    def pending(self) -> int:
        """Bytes of a torn last line still waiting for their newline."""
        return len(self._buf)
