"""How often a local run's file is looked at: closely after an append, less and less
while it does not grow (each look wakes the app's event loop)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from eagle3_tui.transport.base import Chunk
from eagle3_tui.transport.local import LocalTransport


class EnoughError(Exception):
    """Ends the stream once enough waits were seen."""


async def read_until_enough(source: LocalTransport, chunks: list[Chunk]) -> None:
    async for event in source.stream():
        if isinstance(event, Chunk):
            chunks.append(event)


async def test_polling_backs_off_while_idle_and_hurries_after_an_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"a":1}\n')
    real_sleep = asyncio.sleep
    waits: list[float] = []

    async def sleep(seconds: float) -> None:  # no time passes: the waits are recorded
        waits.append(seconds)
        if len(waits) > 10:
            raise EnoughError
        if len(waits) == 6:  # the run writes a line after six empty looks
            with path.open("ab") as f:
                f.write(b'{"b":2}\n')
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)  # the transport sleeps through asyncio
    source = LocalTransport(tmp_path, poll_interval=0.05, idle_interval=0.25)
    chunks: list[Chunk] = []
    with pytest.raises(EnoughError):
        await read_until_enough(source, chunks)
    assert [c.data for c in chunks] == [b'{"a":1}\n', b'{"b":2}\n']
    assert waits[:10] == [0.05, 0.1, 0.2, 0.25, 0.25, 0.25, 0.05, 0.1, 0.2, 0.25]
