"""A hung host (its sshd frozen with SIGSTOP: no FIN, no RST): ``ssh`` gives up on its
keepalives and ends its output, and that end counted as a byte heard, so the monitor
said "No data since" the moment the hang was noticed (18 s late, shown as current)
instead of when the last byte came."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

from eagle3_tui.app.pipeline import Pipeline
from eagle3_tui.transport.base import Link, LinkChanged
from eagle3_tui.transport.channel import Heard, read_frames
from eagle3_tui.transport.openssh import (
    KEEPALIVE_COUNT_MAX,
    KEEPALIVE_INTERVAL_S,
    OpenSshHost,
    find_ssh,
    ssh_argv,
)
from eagle3_tui.transport.ssh import SshTransport
from tests.conftest import need
from tests.records import Lines
from tests.transport.conftest import ssh_target
from tests.transport.sshd import Sshd


class Ends:
    """A reader that gives one frame, then, a while later, its end."""

    def __init__(self, quiet: float) -> None:
        self.quiet = quiet
        self.reads = 0

    async def read(self, n: int = -1) -> bytes:
        self.reads += 1
        if self.reads == 1:
            return b'J {"event":"tick"}\n'
        await asyncio.sleep(self.quiet)
        return b""


async def test_the_end_of_the_output_is_no_byte_heard() -> None:
    heard = Heard()
    frames = [f async for f in read_frames(Ends(0.5), heard=heard)]
    assert len(frames) == 1
    assert time.monotonic() - heard.last >= 0.45  # the tick's time, not the end's


def test_keepalive_gives_up_on_a_silent_host_sooner_than_one_silent_agent_tick_could_mislead() -> (
    None
):
    """ssh drops a connection after about ``(count + 1) × interval`` without a packet from
    the host (it was 5 s × 3: the monitor said "connected" for up to 20 s of a hang); the
    agent says something every 5 s, so the link is called down only after 8 s or more
    without a byte while its host should have sent one within 5 s."""
    silent_at_least = KEEPALIVE_INTERVAL_S * KEEPALIVE_COUNT_MAX
    silent_at_most = KEEPALIVE_INTERVAL_S * (KEEPALIVE_COUNT_MAX + 1)
    assert silent_at_least >= 8.0 and silent_at_most <= 10.0
    argv = ssh_argv(ssh_target(Sshd(Path("/nonexistent"))))
    assert f"ServerAliveInterval={KEEPALIVE_INTERVAL_S:.0f}" in argv
    assert f"ServerAliveCountMax={KEEPALIVE_COUNT_MAX}" in argv


async def test_a_hung_host_is_down_since_its_last_byte_not_since_it_was_noticed(
    sshd: Sshd, tmp_path: Path
) -> None:
    need(find_ssh() is not None, "the OpenSSH client is not installed")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lines = Lines()
    (run_dir / "metrics.jsonl").write_bytes(b"".join(lines.train(i, 1.0) for i in range(5)))
    # ssh gives up 4 to 6 s after the host's last packet
    host = OpenSshHost(ssh_target(sshd, keepalive_interval=2, keepalive_count_max=2))
    source = SshTransport(host, str(run_dir), backoff=(0.05, 0.1, 0.2, 0.5))
    pipeline = Pipeline()
    links: list[tuple[float, LinkChanged]] = []
    pump = asyncio.ensure_future(pipeline.pump(source, lambda e: links.append((time.time(), e))))
    ingest = asyncio.ensure_future(pipeline.ingest())
    frozen: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while pipeline.global_step != 4:
            assert time.monotonic() < deadline, f"never read the records: {links}"
            await asyncio.sleep(0.05)
        frozen_at = time.time()  # the host's last byte came at the latest now
        frozen = sshd.freeze_sessions()
        while pipeline.run.link_down_since is None:
            assert time.monotonic() < deadline + 30, f"the hang never noticed: {links}"
            await asyncio.sleep(0.05)
        noticed = next(at for at, e in links if e.link == Link.RECONNECTING)
        down = pipeline.run.link_down_since
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        pump.cancel()
        ingest.cancel()
        for task in (pump, ingest):
            with contextlib.suppress(BaseException):
                await task
        await host.close()
    assert frozen
    assert noticed - frozen_at >= 3.0, noticed - frozen_at  # ssh's keepalives took this
    # the link went down with the last byte (up to one agent tick before the freeze)
    assert down <= frozen_at + 0.5, (down - frozen_at, noticed - frozen_at)
    assert down >= frozen_at - 6.0, down - frozen_at
