"""The writer's side of ``metrics.cols`` (its format: telemetry/columns.py): each writer
keeps the companion of the file it appends to as it goes (:class:`ColumnLog`), and
:func:`index_file` writes one for a file written before.

Standard library only (imported inside the trainer); Python 3.8+.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from eagle3_tui.telemetry.columns import (
    ALL_WRITERS,
    BLOCK_AGE_S,
    BLOCK_ROWS,
    DIGEST_BLOCKS,
    ENVELOPE,
    MARKS_PER_BLOCK,
    PLAIN_TIME,
    SAMPLE_ROWS,
    SAMPLED_KINDS,
    Shape,
    companion_path,
    encode_block,
    encode_digest,
    encode_marks,
    encode_samples,
    flatten,
    kind_of,
    merge_stats,
    seq_fits,
)
from eagle3_tui.telemetry.parsing import parse_json
from eagle3_tui.telemetry.safefs import UnsafeFileError, create_exclusive, move_aside, open_append


class ColumnLog:
    """Keeps the companion of one ``metrics.jsonl`` as its writer appends to it.

    :meth:`add` takes each line the writer appended, at its offset; rows collect
    until a block is due. Errors are counted, never raised: the companion only
    speeds up reading, and the lines are there either way.

    The companion is opened as ``metrics.jsonl`` is (never through a link, never
    another user's file: such an entry is moved aside, ``metrics.cols.refused-…``), and
    made again when it was deleted or replaced. When the JSON lines' file changed under
    the writer (deleted, replaced, truncated), :meth:`restart` empties it: its blocks
    index a file that is no longer there as they say (an inode number can be reused).
    """

    def __init__(
        self,
        jsonl_path: str,
        block_rows: int = BLOCK_ROWS,
        on_error: Callable[[BaseException], None] | None = None,
        rows: bool = True,
        writer: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = companion_path(jsonl_path)
        self._clock = clock
        """What a block's age is told by (:func:`index_file`: its lines' own times)."""
        self.block_rows = block_rows
        self.rows_kept = rows
        """Training steps become rows (False: the sidecar's writer, which only marks)."""
        self.writer = writer
        self._marks: list[list[Any]] = []
        self._mark_ident: tuple[int, int] | None = None
        """The file this writer last marked lines of (it announces itself once per file)."""
        self._unsaid: tuple[int, int] | None = None
        """A file whose marks could not all be written (a full disk): said lost once the
        companion can be written again, so that no glance trusts marks that miss events."""
        self.on_error = on_error
        """Told of each block that could not be written (the writer counts it)."""
        self._fd: int | None = None
        self._own: tuple[int, int] = (0, 0)
        """The companion's own (device, inode), as opened."""
        self._ident: tuple[int, int] = (0, 0)
        self._shape: Shape | None = None
        self._const: tuple[str, str] = ("", "")
        self._offsets: list[int] = []
        self._lengths: list[int] = []
        self._rows: list[list[Any]] = []
        self._since = 0.0
        self._samples: tuple[list[Any], ...] = ([], [], [], [], [], [])
        """The sampler lines listed since the last sample block: offsets, lengths,
        kinds, writers, sequence numbers, times."""
        self._sample_ident: tuple[int, int] = (0, 0)
        self._samples_since = 0.0
        self._digest_key: tuple[Any, ...] | None = None
        self._digested: list[tuple[list[int], int, dict[str, list[Any]]]] = []
        """The blocks written since the last digest (span, rows, stats), of one file and
        shape (``_digest_key``)."""
        self.blocks = 0
        self.errors = 0

    def add(self, ident: tuple[int, int], offset: int, line: bytes) -> None:
        """A line now at ``offset`` of the file ``ident`` (device, inode): a row, or a
        mark when it is an event (call :meth:`end_batch` after a batch of lines)."""
        if ident != self._mark_ident:
            self.end_batch()
            self._mark_ident = ident
            self._write_marks(ident, [], False)  # this writer writes to this file
        kind = kind_of(line)
        if kind in SAMPLED_KINDS and self._sample(ident, offset, line, kind):
            return  # listed by its envelope
        if not kind and not line.strip():
            return  # a blank line (no record)
        flat = None
        if kind == "train" and self.rows_kept:
            try:
                flat = flatten(parse_json(line))
            except ValueError:
                flat = None
        if flat is None:
            self._marks.append([offset, len(line), kind])  # an event: a glance reads it
            if len(self._marks) >= MARKS_PER_BLOCK:
                self.end_batch()
            return
        shape, const, values = flat
        if self._rows and (shape != self._shape or const != self._const or ident != self._ident):
            self.flush()
        if not self._rows:
            self._shape, self._const, self._ident = shape, const, ident
            self._since = self._clock()
        self._offsets.append(offset)
        self._lengths.append(len(line))
        self._rows.append(values)
        if len(self._rows) >= self.block_rows:
            self.flush()

    def _sample(self, ident: tuple[int, int], offset: int, line: bytes, kind: str) -> bool:
        """List a sampler line by its envelope (False: it has not our writer's, its
        time is not a plain number, or its sequence number is longer than a sample
        block holds exactly (``seq_fits``): it is marked instead)."""
        m = ENVELOPE.match(line)
        if (
            m is None
            or m.group(4) != kind.encode()
            or not PLAIN_TIME.fullmatch(m.group(3))
            or not seq_fits(m.group(1))
        ):
            return False
        s = self._samples
        if s[0] and ident != self._sample_ident:
            self._flush_samples()
        if not s[0]:
            self._sample_ident = ident
            self._samples_since = self._clock()
        s[0].append(offset)
        s[1].append(len(line))
        s[2].append(m.group(4))
        s[3].append(m.group(2))
        s[4].append(int(m.group(1)))
        s[5].append(float(m.group(3)))
        if len(s[0]) >= SAMPLE_ROWS:
            self._flush_samples()
        return True

    def due(self) -> bool:
        now = self._clock()
        return (bool(self._rows) and now - self._since >= BLOCK_AGE_S) or (
            bool(self._samples[0]) and now - self._samples_since >= BLOCK_AGE_S
        )

    def forget(self) -> None:
        """Drop the rows and samples not yet written (their lines did not all reach the file)."""
        self._offsets, self._lengths, self._rows = [], [], []
        self._samples = ([], [], [], [], [], [])

    def end_batch(self) -> None:
        """The events marked since the last batch, as one mark block (and, first, that
        marks were lost, while that could not be written)."""
        if self._unsaid is not None:
            self._write_marks(self._unsaid, [], True, count=False)  # counted when lost
        if self._marks and self._mark_ident is not None:
            self._write_marks(self._mark_ident, self._marks, False)
        self._marks = []

    def lose_marks(self, ident: tuple[int, int]) -> None:
        """Lines of this writer landed where it cannot say: its marks of ``ident`` can
        no longer stand for all its events (a glance of that file reads it whole)."""
        self._marks = []
        self._write_marks(ident, [], True)

    def _write_marks(
        self, ident: tuple[int, int], marks: list[Any], lost: bool, count: bool = True
    ) -> None:
        try:
            fd = self._open()
            view = memoryview(encode_marks(ident, self.writer, marks, lost))
            while view:
                view = view[os.write(fd, view) :]
            if lost:
                self._unsaid = None
        except Exception as e:
            self._unsaid = ident  # (a block cut short is skipped by its checksum)
            if count:
                self.errors += 1
                if self.on_error is not None:
                    self.on_error(e)

    def restart(self) -> None:
        """Forget the rows not yet written and empty the companion (the JSON lines' file
        changed: what it indexes is gone or moved). Nothing is made where there is none."""
        self.forget()
        self._marks, self._mark_ident, self._unsaid = [], None, None
        self._digest_key, self._digested = None, []
        try:
            if self._fd is None and not os.path.lexists(self.path):
                return
            os.ftruncate(self._open(), 0)
        except Exception as e:
            self.errors += 1
            if self.on_error is not None:
                self.on_error(e)

    def _open(self) -> int:
        """The companion's descriptor: the file still at the path, else opened again
        (an entry that may not be written is moved aside and a new file made)."""
        if self._fd is not None:
            try:
                st = os.lstat(self.path)
                if (st.st_dev, st.st_ino) == self._own:
                    return self._fd
            except FileNotFoundError:
                pass
            os.close(self._fd)
            self._fd = None
        try:
            fd, _ = open_append(self.path)
        except UnsafeFileError:
            st = os.lstat(self.path)
            move_aside(self.path, "refused", (st.st_dev, st.st_ino))
            fd = create_exclusive(self.path, 0o644, os.O_APPEND)
            if self.on_error is not None:
                self.on_error(UnsafeFileError(self.path, "moved aside (not written through)"))
        st = os.fstat(fd)
        self._fd, self._own = fd, (st.st_dev, st.st_ino)
        return fd

    def flush(self) -> None:
        """The rows and the samples listed so far, as blocks."""
        self._flush_samples()
        if not self._rows or self._shape is None:
            return
        ident, const, shape = self._ident, self._const, self._shape
        offsets, lengths, rows = self._offsets, self._lengths, self._rows
        self._offsets, self._lengths, self._rows = [], [], []
        stats: dict[str, list[Any]] = {}
        if self._append(lambda: encode_block(ident, const, shape, offsets, lengths, rows, stats)):
            self.blocks += 1
            self._digest((ident, shape), [offsets[0], offsets[-1] + lengths[-1]], len(rows), stats)

    def _digest(
        self, key: tuple[Any, ...], span: list[int], n: int, stats: dict[str, list[Any]]
    ) -> None:
        """A block written: after :data:`DIGEST_BLOCKS` in a row of one file and shape,
        their digest (telemetry/columns.py)."""
        if key != self._digest_key:
            self._digest_key, self._digested = key, []
        self._digested.append((span, n, stats))
        if len(self._digested) < DIGEST_BLOCKS:
            return
        done, self._digested = self._digested, []
        ident, shape = key
        kinds = dict(shape)
        merged = merge_stats([(m, st) for _, m, st in done], kinds)
        spans = [sp for sp, _, _ in done]
        self._append(lambda: encode_digest(ident, spans, sum(m for _, m, _ in done), merged))

    def _flush_samples(self) -> None:
        s, ident = self._samples, self._sample_ident
        if s[0]:
            self._samples = ([], [], [], [], [], [])
            self._append(lambda: encode_samples(ident, *s))

    def _append(self, encode: Callable[[], bytes]) -> bool:
        """A block onto the companion; an error is counted (and told), never raised."""
        try:
            view = memoryview(encode())
            fd = self._open()
            while view:
                view = view[os.write(fd, view) :]
            return True
        except Exception as e:
            self.errors += 1
            if self.on_error is not None:
                self.on_error(e)
            return False

    def close(self) -> None:
        self.flush()
        self.end_batch()
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                self.errors += 1
            self._fd = None


def index_file(jsonl_path: str, block_rows: int = BLOCK_ROWS, as_written: bool = False) -> int:
    """Write the companion of an existing ``metrics.jsonl`` (one written before the
    writer kept one); returns the blocks written. The file must not be growing.
    ``as_written``: close blocks as the writer did while the lines came, by their own
    times (:data:`BLOCK_AGE_S` after a block's first line, as well as every
    ``block_rows`` rows): a run of 2 steps a second has blocks of ~600 rows, not 1,024."""
    now = [0.0]
    clock = (lambda: now[0]) if as_written else time.monotonic
    log = ColumnLog(jsonl_path, block_rows, writer=ALL_WRITERS, clock=clock)
    if os.path.exists(log.path):
        os.unlink(log.path)
    with open(jsonl_path, "rb") as f:
        st = os.fstat(f.fileno())
        ident = (st.st_dev, st.st_ino)
        offset = 0
        for line in f:
            if line.endswith(b"\n"):
                if as_written:
                    m = ENVELOPE.match(line)
                    if m is not None and PLAIN_TIME.fullmatch(m.group(3)):
                        now[0] = max(now[0], float(m.group(3)))
                log.add(ident, offset, line)
                if as_written and log.due():
                    log.flush()
            offset += len(line)
    log.close()
    return log.blocks


if __name__ == "__main__":  # python -m eagle3_tui.telemetry.column_log RUN/metrics.jsonl
    import sys

    for name in sys.argv[1:]:
        print(f"{companion_path(name)}: {index_file(name)} blocks")
