"""A run directory on this machine, read and followed like ``tail -F``.

No textual here.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from eagle3_tui.telemetry.schema import METRICS_FILE
from eagle3_tui.transport.base import Chunk, Link, LinkChanged, StreamEvent, TargetError

READ_SIZE = 1024 * 1024
"""Reads of a few MiB: the freed buffer is reused for the next read, where a 16 MiB
read gets fresh pages from the kernel each time (35 MB read in 5 ms, not 25 ms)."""


def check_run_dir(run_dir: Path) -> Path:
    """The metrics file of ``run_dir``, or a one-line TargetError saying what is wrong."""
    if not run_dir.exists():
        raise TargetError(f"{run_dir}: no such run directory")
    if not run_dir.is_dir():
        raise TargetError(f"{run_dir}: not a directory")
    path = run_dir / METRICS_FILE
    if not path.exists():
        raise TargetError(
            f"{run_dir}: no {METRICS_FILE} here (is telemetry attached to the trainer?)"
        )
    return path


def read_from(path: Path, offset: int = 0, size: int = READ_SIZE) -> list[Chunk]:
    """The file from ``offset`` to its current end, as chunks."""
    return list(iter_chunks(path, offset, size))


def iter_chunks(path: Path, offset: int = 0, size: int = READ_SIZE) -> Iterator[Chunk]:
    """The file from ``offset`` to its current end, a chunk at a time (a catch-up
    holds one chunk, not the whole file)."""
    with open(path, "rb") as f:
        f.seek(offset)
        while True:
            data = f.read(size)
            if not data:
                return
            yield Chunk(offset, data)
            offset += len(data)


IDLE_POLL_S = 0.25
"""The longest wait between two looks at a file that stopped growing: a step written
then is read within it, well inside the app's one-second picture of new data."""


class LocalTransport:
    """Follows ``run_dir/metrics.jsonl``: reads what is there, then polls for appends.

    It looks again ``poll_interval`` after an append, then twice as long after each
    look that found nothing, up to ``idle_interval``: a burst is followed closely, and
    a run that writes twice a second costs ~8 looks a second instead of 20 (each one a
    wake-up of the app's event loop).
    """

    def __init__(
        self, run_dir: Path, poll_interval: float = 0.05, idle_interval: float = IDLE_POLL_S
    ) -> None:
        self.run_dir = run_dir
        self.path = run_dir / METRICS_FILE
        self.poll_interval = poll_interval
        self.idle_interval = max(poll_interval, idle_interval)

    @property
    def label(self) -> str:
        return str(self.run_dir)

    async def stream(self, offset: int = 0) -> AsyncIterator[StreamEvent]:
        announced_wait = False
        while not self.path.exists():
            if not announced_wait:
                yield LinkChanged(Link.WAITING, f"waiting for {self.path}")
                announced_wait = True
            await asyncio.sleep(self.poll_interval)
        yield LinkChanged(Link.LOCAL, str(self.run_dir))
        identity: tuple[int, int] | None = None
        wait = self.poll_interval
        while True:
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                await asyncio.sleep(self.poll_interval)
                continue
            ident = (st.st_dev, st.st_ino)
            if identity is not None and (ident != identity or st.st_size < offset):
                offset = 0  # replaced or truncated: start over, the reader notices
            identity = ident
            if st.st_size > offset:
                chunks = await asyncio.to_thread(read_from, self.path, offset)
                for chunk in chunks:
                    yield chunk
                    offset = chunk.offset + len(chunk.data)
                wait = self.poll_interval
            else:
                await asyncio.sleep(wait)
                wait = min(self.idle_interval, 2 * wait)
