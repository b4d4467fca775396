"""A transport that plays back given bytes: for tests, benchmarks and snapshots.

No textual here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable

from eagle3_tui.transport.base import Chunk, Link, LinkChanged, StreamEvent


class ReplayTransport:
    """Yields the given events (or byte chunks, offsets filled in), then waits forever.

    ``push()`` appends more bytes while streaming, as a live file would grow.
    """

    def __init__(self, items: Iterable[bytes | StreamEvent] = (), label: str = "replay") -> None:
        self._label = label
        self._queue: asyncio.Queue[bytes | StreamEvent] = asyncio.Queue()
        for item in items:
            self._queue.put_nowait(item)
        self._offset = 0

    @property
    def label(self) -> str:
        return self._label

    def push(self, item: bytes | StreamEvent) -> None:
        self._queue.put_nowait(item)

    async def stream(self, offset: int = 0) -> AsyncIterator[StreamEvent]:
        self._offset = offset
        yield LinkChanged(Link.LOCAL, self._label)
        while True:
            item = await self._queue.get()
            if isinstance(item, bytes):
                chunk = Chunk(self._offset, item)
                self._offset += len(item)
                yield chunk
            else:
                if isinstance(item, Chunk):  # bytes pushed after it follow it
                    self._offset = item.end
                yield item
