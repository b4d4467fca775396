"""The nodes of one run as one stream: chunks tagged by node, the worst link shown."""

from __future__ import annotations

import asyncio
from pathlib import Path

from eagle3_tui.transport.base import Chunk, Link, LinkChanged
from eagle3_tui.transport.merge import MergedSource
from eagle3_tui.transport.replay import ReplayTransport


async def test_chunks_keep_their_node_and_the_worst_link_is_named() -> None:
    node0 = ReplayTransport([b"a0\n", b"a1\n"], label="node0:/r")
    node1 = ReplayTransport([b"b0\n"], label="node1:/r/node1")
    merged = MergedSource([node0, node1], ["node0", "node1"])
    assert merged.label == "node0:/r (+1 node)"
    seen: list[object] = []

    async def collect() -> None:
        async for event in merged.stream(0):
            seen.append(event)

    task = asyncio.create_task(collect())
    await asyncio.sleep(0.05)
    node1.push(LinkChanged(Link.RECONNECTING, "connection lost", retry_in=2.0))
    await asyncio.sleep(0.05)
    node1.push(LinkChanged(Link.CONNECTED))
    node1.push(b"b1\n")
    await asyncio.sleep(0.05)
    task.cancel()
    chunks = [(e.stream, e.offset, e.data) for e in seen if isinstance(e, Chunk)]
    assert sorted(chunks) == [(0, 0, b"a0\n"), (0, 3, b"a1\n"), (1, 0, b"b0\n"), (1, 3, b"b1\n")]
    links = [e for e in seen if isinstance(e, LinkChanged)]
    assert links[0].link is Link.LOCAL  # replay's own state, both nodes alike
    assert LinkChanged(Link.RECONNECTING, "node1: connection lost", 2.0) in links
    assert links[-1] == LinkChanged(Link.CONNECTED)  # node1 back: nothing worse to show


async def test_the_apps_control_acts_on_every_node_and_reports_each(tmp_path: Path) -> None:
    from eagle3_tui.app.run_control import RunControl
    from eagle3_tui.reports import format_kill, format_resume, resume_exit_status
    from eagle3_tui.transport.channel import LocalHost
    from tests.transport.fakes import dead_pid, fake_manifest

    node0, node1 = tmp_path / "run", tmp_path / "run" / "node1"
    fake_manifest(node0, dead_pid(), "r0", checkpoint_dir=str(tmp_path / "ckpt"))
    fake_manifest(node1, dead_pid(), "r1", checkpoint_dir=str(tmp_path / "ckpt"))
    second = RunControl(LocalHost(), str(node1), "node1:run/node1")
    control = RunControl(LocalHost(), str(node0), "node0:run", nodes=[second])
    killed = await control.kill()
    assert [(n.where, n.status) for n in killed.nodes or []] == [
        ("node0:run", "not_running"),
        ("node1:run/node1", "not_running"),
    ]
    assert killed.status == "not_running"
    assert "== node0:run\nnothing to stop: the run is not running" in format_kill(killed)
    assert "== node1:run/node1\nnothing to stop" in format_kill(killed)
    resumed = await control.resume()  # no numbered checkpoint on either: refused on both
    assert [n.status for n in resumed.nodes or []] == ["refused", "refused"]
    text = format_resume(resumed)
    assert resume_exit_status(resumed) == 9 and "== node1:run/node1\nrefused: " in text
