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
from eagle3_tui.transport.local import LocalTransport
from tests.records import Lines


async def test_no_verdict_until_the_history_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipeline_module, "VERDICT_UNREAD", 1 << 20)
    monkeypatch.setattr(local, "CATCH_UP_BYTES", 64 << 10)  # read as a longer file's is
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
