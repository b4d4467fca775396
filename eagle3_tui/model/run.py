"""A run being read: the line reader and the state it feeds.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

from eagle3_tui.model import parallel
from eagle3_tui.model.reader import LineReader
from eagle3_tui.model.state import RunState

SLICE = 2 * 1024 * 1024


class Run:
    """Bytes of ``metrics.jsonl`` in, :class:`RunState` out."""

    def __init__(self, offset: int = 0, line_no: int = 0, *, parallel: bool = True) -> None:
        self.reader = LineReader(offset, line_no)
        self._state = RunState()
        self._parallel = parallel

    @property
    def state(self) -> RunState:
        """The run state, its queued sampler records applied."""
        self._state.settle()
        return self._state

    def feed(self, offset: int, data: bytes) -> int:
        """Feed a chunk; returns how many items (records, malformed lines) it completed.

        A big chunk (a catch-up) is read on two cores when it can be
        (:mod:`eagle3_tui.model.parallel`), and always in slices of ~2 MiB:
        decoding and the column path run fastest on batches that fit the caches.
        """
        if (
            self._parallel
            and len(data) >= parallel.PARALLEL_MIN
            and offset == self.reader.next_offset
            and self.reader.pending() == 0
        ):
            split = data.rfind(b"\n", 0, len(data) // 2) + 1
            if split > 0:
                line_no = self.reader.line_no + data.count(b"\n", 0, split)
                future = parallel.submit(data[split:], offset + split, line_no)
                if future is not None:
                    n = self._feed_serial(offset, data[:split])
                    try:
                        later, tail = future.result()
                    except Exception:  # the worker died or could not run: read it here
                        later = None
                    if later is not None and self._state.merge(later):
                        self.reader.adopt(tail)
                        return n + later.records + later.malformed_count
                    return n + self._feed_serial(offset + split, data[split:])
        return self._feed_serial(offset, data)

    def _feed_serial(self, offset: int, data: bytes) -> int:
        n = 0
        for start in range(0, max(len(data), 1), SLICE):
            items = self.reader.feed(offset + start, data[start : start + SLICE])
            self._state.apply_all(items)
            n += len(items)
        return n

    @property
    def resume_offset(self) -> int:
        """Offset just past the last complete line: where a broken stream resumes."""
        return self.reader.complete_offset
