"""One run's records from several files at once: the nodes of a multi-node run.

Under torchrun on several hosts, each node's telemetry writes its own
``metrics.jsonl`` (rank 0's node has the metrics; every node has its GPUs, its
ranks' reads and heartbeats). :class:`MergedSource` follows all of them, each
through its own transport (its own connection, reconnection and offsets), and
yields their chunks (and what each says of its file and its disk) tagged with the
stream they belong to, so that the model cuts each file's lines apart and applies
them to one run state. The link it
reports is the worst of its streams', named by node.

No textual here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

from eagle3_tui.transport.base import (
    Chunk,
    DiskSpace,
    FileChanged,
    Link,
    LinkChanged,
    StreamEvent,
)

_WORST = (
    Link.REFUSED,
    Link.UNREADABLE,
    Link.RECONNECTING,
    Link.WAITING,
    Link.CONNECTING,
    Link.CONNECTED,
    Link.LOCAL,
)
"""Link states, the one to show first first."""


class MergedSource:
    """Several sources (one per node) as one; chunk ``stream`` = the source's index."""

    def __init__(self, sources: Sequence[Any], names: Sequence[str] | None = None) -> None:
        self.sources = list(sources)
        self.names = list(names) if names is not None else [s.label for s in self.sources]
        self._links: list[LinkChanged | None] = [None] * len(self.sources)

    @property
    def label(self) -> str:
        first = self.sources[0].label
        return f"{first} (+{len(self.sources) - 1} node{'s' if len(self.sources) > 2 else ''})"

    def link(self) -> LinkChanged | None:
        """The worst link of the streams (named by node when it is not the first's)."""
        known = [(i, ev) for i, ev in enumerate(self._links) if ev is not None]
        if not known:
            return None
        i, ev = min(known, key=lambda x: _WORST.index(x[1].link))
        if i == 0 or ev.link in (Link.CONNECTED, Link.LOCAL):
            return ev
        detail = f"{self.names[i]}: {ev.detail}" if ev.detail else self.names[i]
        return LinkChanged(ev.link, detail, ev.retry_in)

    async def stream(self, offset: int = 0) -> AsyncIterator[StreamEvent]:
        queue: asyncio.Queue[tuple[int, StreamEvent | None]] = asyncio.Queue()

        async def pump(i: int, source: Any) -> None:
            try:
                async for event in source.stream(offset):
                    await queue.put((i, event))
            finally:
                await queue.put((i, None))

        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(self.sources)]
        running = len(tasks)
        shown: LinkChanged | None = None
        try:
            while running:
                i, event = await queue.get()
                if event is None:
                    running -= 1
                elif isinstance(event, Chunk):
                    yield Chunk(event.offset, event.data, stream=i, span=event.span)
                elif isinstance(event, FileChanged | DiskSpace):
                    yield replace(event, stream=i)  # that node's file, that node's disk
                else:
                    self._links[i] = event
                    now = self.link()
                    if now is not None and now != shown:
                        shown = now
                        yield now
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
