"""A run being read: the line reader and the state it feeds.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

from eagle3_tui.model.reader import LineReader
from eagle3_tui.model.state import RunState


class Run:
    """Bytes of ``metrics.jsonl`` in, :class:`RunState` out."""

    def __init__(self) -> None:
        self.reader = LineReader()
        self._state = RunState()

    @property
    def state(self) -> RunState:
        """The run state, its queued sampler records applied."""
        self._state.settle()
        return self._state

    def feed(self, offset: int, data: bytes) -> int:
        """Feed a chunk; returns how many items (records, malformed lines) it completed."""
        items = self.reader.feed(offset, data)
        self._state.apply_all(items)
        return len(items)

    @property
    def resume_offset(self) -> int:
        """Offset just past the last complete line: where a broken stream resumes."""
        return self.reader.complete_offset
