"""A run being read: the line reader and the state it feeds.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

from typing import Protocol

from eagle3_tui.model.columns import apply_segment
from eagle3_tui.model.reader import LineReader
from eagle3_tui.model.state import RunState

SLICE = 1024 * 1024


class DataFrameLike(Protocol):
    """``transport.channel.DataFrame``, as this layer sees it."""

    @property
    def offset(self) -> int: ...
    @property
    def data(self) -> bytes: ...
    @property
    def span(self) -> int: ...


class Run:
    """Bytes of ``metrics.jsonl`` in, :class:`RunState` out.

    A multi-node run is several files (one per node): each ``stream`` has its own
    line reader (its own offsets, torn lines, restarts), all feed one state; each
    writer's sequence numbers keep their own order in it.
    """

    def __init__(self) -> None:
        self.reader = LineReader()
        self._readers: dict[int, LineReader] = {0: self.reader}
        self._state = RunState()

    @property
    def state(self) -> RunState:
        """The run state, its queued sampler records applied."""
        self._state.settle()
        return self._state

    def feed(self, offset: int, data: bytes, stream: int = 0, span: int = -1) -> int:
        """Feed a chunk; returns how many items (records, malformed lines) it completed.
        ``span`` >= 0: ``data`` is a columns payload standing for ``span`` bytes of the
        file (a ``C`` frame: see :mod:`eagle3_tui.model.columns`).

        A big chunk (a catch-up) is fed in slices of ~1 MiB, without copying
        them: decoding and the column path run fastest on batches whose decoded
        records fit the L2 cache (a 35 MB chunk fed whole takes up to ~1.7× as
        long; 2 MiB slices ~8 % longer than 1 MiB ones on this machine).
        """
        n = 0
        reader = self._readers.get(stream)
        if reader is None:
            reader = self._readers[stream] = LineReader()
        if span >= 0:
            return apply_segment(reader, self._state, offset, span, data)
        for start in range(0, max(len(data), 1), SLICE):
            items = reader.feed(offset + start, data, start, min(start + SLICE, len(data)))
            self._state.apply_all(items)
            n += len(items)
        return n

    def feed_frame(self, frame: DataFrameLike, stream: int = 0) -> int:
        """Feed an agent's data frame (bytes, or columns)."""
        return self.feed(frame.offset, frame.data, stream, frame.span)

    def set_link(self, up: bool, at: float, detail: str = "") -> None:
        """Whether data can reach the client (see :meth:`RunState.set_link`); cheap, no
        settling of queued samples."""
        self._state.set_link(up, at, detail)

    def set_host_clock(self, host_now: float, client_now: float) -> None:
        self._state.set_host_clock(host_now, client_now)

    @property
    def link_down_since(self) -> float | None:
        return self._state.link_down_since

    @property
    def resume_offset(self) -> int:
        """Offset just past the last complete line: where a broken stream resumes."""
        return self.reader.complete_offset
