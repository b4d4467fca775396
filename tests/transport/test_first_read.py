"""A run read from its start (no glance: no companion) gets no verdict while most of
its file is still unread: the steps read so far are not its latest, and judged as if
they were they made a live run STALLED for as long as its history took to read."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from eagle3_tui.app import pipeline as pipeline_module
from eagle3_tui.app.pipeline import Pipeline
from eagle3_tui.model.snapshot import ViewParams
from eagle3_tui.model.verdict import Health
from eagle3_tui.transport import local
from eagle3_tui.transport.base import Chunk
from eagle3_tui.transport.local import LocalTransport
from tests.records import Lines


async def test_no_verdict_until_the_history_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipeline_module, "VERDICT_UNREAD", 1 << 20)
    monkeypatch.setattr(local, "CATCH_UP_BYTES", 64 << 10)  # read as a longer file's is
    real_read = local._read

    def slow_read(fd: int, offset: int, end: int) -> list[Chunk]:
        time.sleep(0.01)  # ~0.7 s for the file: pictures while most is unread, under load too
        return real_read(fd, offset, end)

    monkeypatch.setattr(local, "_read", slow_read)
    lines = Lines(t0=time.time() - 3 * 86400, dt=0.5)  # steps of days ago, no end
    body = b"".join(lines.train(step, 2.0) for step in range(12_000))
    (tmp_path / "metrics.jsonl").write_bytes(body)
    assert len(body) > 4 << 20
    pipeline = Pipeline(glance_min=None)
    tasks = [
        asyncio.ensure_future(pipeline.pump(LocalTransport(tmp_path), lambda _e: None)),
        asyncio.ensure_future(pipeline.ingest()),
    ]
    seen: list[tuple[int, Health, str, str | None]] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not pipeline.caught_up:
            await asyncio.sleep(0.002)
            if pipeline.run.unsettled.records:
                snap, _ = await pipeline.snapshot(time.time(), ViewParams())
                read = pipeline.run.reader.next_offset
                seen.append((read, snap.health, snap.diagnosis.reason, snap.history))
        assert pipeline.caught_up
        final, _ = await pipeline.snapshot(time.time(), ViewParams())
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    early = [s for s in seen if len(body) - s[0] > 1 << 20]
    assert early, "no picture while most of the file was unread"
    for read, health, reason, history in early:
        assert health == Health.WAITING, (read, health, reason)
        assert reason.startswith("Reading what the run wrote before (")
        assert history is not None and history.startswith("reading the history: ")
    # read: the verdict on the latest steps (days old: not running), no word of reading
    assert final.health not in (Health.WAITING, Health.RUNNING), final.diagnosis
    assert final.history is None and "Reading" not in final.diagnosis.reason


async def test_a_file_truncated_while_it_is_read_gets_its_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The size the first read aims at no longer holds once the file changed under it
    (truncated, replaced): the verdict is not held back for good."""
    monkeypatch.setattr(pipeline_module, "VERDICT_UNREAD", 1 << 20)
    monkeypatch.setattr(local, "CATCH_UP_BYTES", 64 << 10)
    lines = Lines(t0=time.time() - 3 * 86400, dt=0.5)
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"".join(lines.train(step, 2.0) for step in range(12_000)))
    pipeline = Pipeline(glance_min=None)
    tasks = [
        asyncio.ensure_future(pipeline.pump(LocalTransport(tmp_path), lambda _e: None)),
        asyncio.ensure_future(pipeline.ingest()),
    ]
    try:
        deadline = time.monotonic() + 20
        while pipeline.unread is None or not pipeline.run.unsettled.records:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.001)
        again = Lines(t0=time.time() - 3 * 86400, dt=0.5)
        with path.open("r+b") as f:  # truncated in place: the reader starts over at 0
            f.truncate(0)
            f.write(b"".join(again.train(step, 2.0) for step in range(50)))
        while True:
            assert time.monotonic() < deadline, "the verdict stayed held back"
            await asyncio.sleep(0.05)
            snap, _ = await pipeline.snapshot(time.time(), ViewParams())
            if snap.history is None:
                break
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert "Reading" not in snap.diagnosis.reason
    assert snap.health not in (Health.WAITING, Health.RUNNING), snap.diagnosis
