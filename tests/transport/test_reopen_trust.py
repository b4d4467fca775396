"""A file made at a run's path while it is followed is checked as the first one was: a
link another user planted there, to a file they may not read, is not followed (as root,
the monitor and ``api.follow`` read root's private file through it, shown as the run's)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from benchmarks.records import train_lines
from eagle3_tui import api
from eagle3_tui.transport.base import Chunk, Link, LinkChanged, TargetError
from eagle3_tui.transport.local import LocalTransport

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a link another user owns)")

SECRET = b"a private line of root's\n"


def _plant(run_dir: Path, tmp_path: Path) -> None:
    """metrics.jsonl replaced by nobody's link to root's 0600 file."""
    private = tmp_path / "private.jsonl"
    private.write_bytes(SECRET)
    private.chmod(0o600)
    path = run_dir / "metrics.jsonl"
    path.unlink()
    path.symlink_to(private)
    os.lchown(path, 65534, 65534)


def _run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_bytes(b"".join(train_lines(3)))
    return run_dir


async def test_the_monitor_does_not_follow_a_planted_link(tmp_path: Path) -> None:
    run_dir = _run(tmp_path)
    source = LocalTransport(run_dir, poll_interval=0.02, idle_interval=0.05)
    read: list[bytes] = []
    said: list[str] = []

    async def follow() -> None:
        planted = False
        async for event in source.stream():
            if isinstance(event, Chunk):
                read.append(event.data)
                if not planted:
                    _plant(run_dir, tmp_path)
                    planted = True
            elif isinstance(event, LinkChanged) and event.link == Link.UNREADABLE:
                said.append(event.detail)
                return

    await asyncio.wait_for(follow(), 10)
    assert not any(SECRET in data for data in read), read
    assert said and "symbolic link of user nobody" in said[0], said


def test_api_follow_does_not_follow_a_planted_link(tmp_path: Path) -> None:
    run_dir = _run(tmp_path)
    looks = api.follow(run_dir, every=0.01)
    try:
        first = next(looks)
        assert first.run.state.records == 3
        _plant(run_dir, tmp_path)
        with pytest.raises(TargetError, match="symbolic link of user nobody"):
            next(looks)
    finally:
        looks.close()
