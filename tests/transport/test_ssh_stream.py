"""Streaming a run file over a real sshd: exactly once through killed sessions and a hung
link, truncation and replacement noticed, a missing file waited for with inotify."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.model.reader import LineReader, Restarted
from eagle3_tui.model.records import Malformed
from eagle3_tui.model.segments import segment_items
from eagle3_tui.model.verdict import MIN_QUIET_S
from eagle3_tui.transport.base import Chunk, Link, LinkChanged, StreamEvent
from eagle3_tui.transport.channel import AGENT_TAG, STREAM_IDLE_S
from eagle3_tui.transport.openssh import OpenSshHost, find_ssh
from eagle3_tui.transport.ssh import SshHost, SshTransport
from eagle3_tui.transport.target import SshTarget
from tests.conftest import need
from tests.records import Lines
from tests.transport.conftest import cli, ssh_target
from tests.transport.sshd import Sshd

pytestmark = pytest.mark.slow

FAST_BACKOFF = (0.05, 0.1, 0.2, 0.5)


@pytest.fixture(params=["asyncssh", "openssh"])
def client(request: pytest.FixtureRequest) -> str:
    """What carries the stream: asyncssh in-process, or the ssh binary (the monitor's
    default where one is installed)."""
    if request.param == "openssh":
        need(find_ssh() is not None, "the OpenSSH client (ssh) is not installed")
    return str(request.param)


def stream_host(client: str, target: SshTarget) -> SshHost | OpenSshHost:
    return OpenSshHost(target) if client == "openssh" else SshHost(target)


class Follower:
    """Consumes a transport's stream like the app does, keeping what a test checks."""

    def __init__(self, stream: AsyncIterator[StreamEvent]) -> None:
        self.stream = stream
        self.reader = LineReader()
        self.records: list[Any] = []  # Record-like: kind, seq, w, step (event, pid)
        self.restarts: list[Restarted] = []
        self.malformed: list[Any] = []
        self.links: list[LinkChanged] = []

    @classmethod
    def ssh(cls, host: SshHost | OpenSshHost, run_dir: Path | str) -> Follower:
        """Following ``run_dir`` over ``host`` from its start, reconnecting fast."""
        return cls(SshTransport(host, str(run_dir), backoff=FAST_BACKOFF).stream(0))

    async def close(self) -> None:
        """Ends the stream (its connection's reader with it)."""
        await self.stream.aclose()  # type: ignore[attr-defined]

    async def until(self, predicate: object, timeout: float = 60.0, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        while not predicate():  # type: ignore[operator]
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError
                ev = await asyncio.wait_for(anext(self.stream), left)
            except TimeoutError:
                raise AssertionError(
                    f"timed out waiting for {what}: {len(self.records)} records, "
                    f"{len(self.malformed)} malformed {self.malformed[:2]}, "
                    f"links {[(x.link.value, x.detail) for x in self.links][-6:]}"
                ) from None
            if isinstance(ev, Chunk):
                if ev.span >= 0:  # a columns frame
                    items = segment_items(self.reader, ev.offset, ev.span, ev.data)
                else:
                    items = self.reader.feed(ev.offset, ev.data)
                for item in items:
                    if isinstance(item, Restarted):
                        self.restarts.append(item)
                    elif isinstance(item, Malformed):
                        self.malformed.append(item)
                    else:  # a Record, or one of the model's lean or deferred forms of one
                        resolve = getattr(item, "resolve", None)
                        rec = resolve() if resolve is not None else item
                        (self.malformed if isinstance(rec, Malformed) else self.records).append(rec)
            elif isinstance(ev, LinkChanged):
                self.links.append(ev)

    def seqs(self) -> list[int]:
        return [r.seq for r in self.records]

    def count(self, link: Link) -> int:
        return sum(1 for x in self.links if x.link == link)


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as out:
        out.write(data)


async def drop_mid_catch_up(
    f: Follower, sshd: Sshd, path: Path, lines: Lines, n: int, size: int
) -> bytes:
    """Kills the SSH sessions while ``f`` is still catching up on ``n`` records
    (``size`` bytes), appends 100 more records meanwhile and waits until all of them
    arrived; returns what was appended."""
    assert 0 < f.reader.next_offset < size, "the catch-up is under way"
    assert sshd.kill_sessions() >= 1
    more = b"".join(lines.train(n + i, 1.0) for i in range(100))
    append(path, more)  # the live tail goes on meanwhile
    await f.until(lambda: len(f.records) >= n + 100, what="every record", timeout=120)
    return more


def append_lines(path: Path, lines: Lines, n: int, pause: float, torn_every: int = 7) -> None:
    """Append ``n`` train records, one ``os.write`` each, every ``torn_every``-th in two."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        for i in range(n):
            data = lines.train(i, 2.0 - i * 1e-3)
            if i % torn_every == 3:
                os.write(fd, data[:25])
                time.sleep(pause)
                os.write(fd, data[25:])
            else:
                os.write(fd, data)
            time.sleep(pause)
    finally:
        os.close(fd)


def waits(f: Follower) -> list[LinkChanged]:
    """The reconnections' waits (a countdown each; their attempts say none)."""
    return [x for x in f.links if x.link == Link.RECONNECTING and x.retry_in is not None]


def tries(f: Follower) -> list[LinkChanged]:
    """The reconnections' attempts ("reconnecting…", no countdown)."""
    return [x for x in f.links if x.link == Link.RECONNECTING and x.retry_in is None]


async def test_every_record_exactly_once_while_sessions_are_killed(
    sshd: Sshd, tmp_path: Path, client: str
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    n = 600
    writer = threading.Thread(
        target=append_lines, args=(run_dir / "metrics.jsonl", Lines(), n, 0.004), daemon=True
    )
    host = stream_host(client, ssh_target(sshd))
    f = Follower.ssh(host, run_dir)
    try:
        await f.until(lambda: f.count(Link.WAITING) >= 1, what="the waiting state")
        writer.start()
        kills = 0
        for k in range(1, 5):  # kill the sessions four times while lines keep coming
            await f.until(  # the k-th connection is up: a loaded machine reconnects late
                lambda k=k: len(f.records) >= k * n // 6 and f.count(Link.CONNECTED) >= k,
                what=f"{k * n // 6} records and connection {k}",
            )
            kills += sshd.kill_sessions()
        await f.until(  # (the 4th wait's attempt too: said a moment after its countdown)
            lambda: len(f.records) >= n and len(waits(f)) >= 4 and len(tries(f)) >= 4,
            what=f"all {n} records and the 4th reconnection",
        )
    finally:
        await f.close()
        await host.close()
        writer.join(30)
    assert kills >= 4
    assert len(waits(f)) >= 4 and all((x.retry_in or 0) > 0 for x in waits(f))
    # each wait is followed by its attempt, said without a countdown ("reconnecting…")
    assert len(tries(f)) >= 4, f.links
    assert f.seqs() == list(range(n)), "a record was lost or repeated"
    assert f.restarts == []
    assert f.reader.complete_offset == (run_dir / "metrics.jsonl").stat().st_size


async def test_a_hung_connection_is_dropped_by_keepalive_and_the_stream_resumes(
    sshd: Sshd, tmp_path: Path, client: str
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = run_dir / "metrics.jsonl"
    lines = Lines()
    path.write_bytes(b"".join(lines.train(i, 1.0) for i in range(5)))
    target = ssh_target(sshd, keepalive_interval=0.3, keepalive_count_max=2)
    host = stream_host(client, target)
    f = Follower.ssh(host, run_dir)
    frozen: list[int] = []
    try:
        await f.until(lambda: len(f.records) == 5, what="the first records")
        frozen = sshd.freeze_sessions()  # no FIN, no RST: only keepalive can tell
        append(path, b"".join(lines.train(i, 1.0) for i in range(5, 10)))
        await f.until(lambda: len(f.records) == 10, what="the records after the hang")
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await f.close()
        await host.close()
    assert frozen
    assert f.count(Link.RECONNECTING) >= 1
    assert f.seqs() == list(range(10))


def freeze_agents(sshd: Sshd) -> list[int]:
    """SIGSTOP the agents under this sshd (the connection and sshd stay up)."""
    frozen = []
    for pid in sshd.session_tree():
        with contextlib.suppress(OSError):
            if AGENT_TAG.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGSTOP)
                frozen.append(pid)
    return frozen


async def test_a_frozen_agent_is_a_lost_link_before_a_quiet_run_could_be_called_stalled(
    sshd: Sshd, tmp_path: Path
) -> None:
    """A follow agent SIGSTOPped on the host (sshd, the connection and its keepalives all
    fine): no more records come, so without a word from the agent the run would read
    quiet, then stalled. Its ticks stop: the stream calls the link lost sooner than the
    shortest quiet limit, and a new agent reads on from where the frozen one stopped."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = run_dir / "metrics.jsonl"
    lines = Lines()
    path.write_bytes(b"".join(lines.train(i, 1.0) for i in range(5)))
    host = stream_host("openssh" if find_ssh() is not None else "asyncssh", ssh_target(sshd))
    f = Follower.ssh(host, run_dir)
    frozen: list[int] = []
    try:
        await f.until(lambda: len(f.records) == 5, what="the first records")
        quiet = time.monotonic()  # the last byte came at the latest now
        frozen = freeze_agents(sshd)
        append(path, b"".join(lines.train(i, 1.0) for i in range(5, 10)))
        await f.until(lambda: f.count(Link.RECONNECTING) >= 1, 40, "the frozen agent noticed")
        noticed = time.monotonic() - quiet
        await f.until(lambda: len(f.records) == 10, what="the records through a new agent")
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await f.close()
        await host.close()
    assert len(frozen) == 1
    lost = next(x for x in f.links if x.link == Link.RECONNECTING)
    assert "not a byte from the host's agent for 20 s" in lost.detail
    # down since the last byte, not since it was noticed
    assert lost.silent_s is not None and lost.silent_s >= STREAM_IDLE_S
    assert STREAM_IDLE_S <= noticed < MIN_QUIET_S, noticed
    assert f.seqs() == list(range(10))


async def test_truncation_and_replacement_are_noticed_also_while_disconnected(
    sshd: Sshd, tmp_path: Path, client: str
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = run_dir / "metrics.jsonl"
    path.write_bytes(Lines("old").train(0, 1.0) + Lines("old").train(1, 1.0))
    host = stream_host(client, ssh_target(sshd))
    f = Follower.ssh(host, run_dir)
    try:
        await f.until(lambda: len(f.records) == 2, what="two records")
        path.write_bytes(Lines("trunc").train(0, 1.0))  # truncated in place
        await f.until(lambda: len(f.records) == 3, what="the record after truncation")
        assert len(f.restarts) == 1 and f.records[-1].w == "trunc"
        new = run_dir / "new.jsonl"
        new.write_bytes(b"".join(Lines("new").train(i, 1.0) for i in range(3)))
        os.replace(new, path)
        await f.until(lambda: len(f.records) == 6, what="the replacement's records")
        assert len(f.restarts) == 2 and [r.w for r in f.records[3:]] == ["new"] * 3
        # replaced while no connection is up: noticed on reconnect by the file's identity
        sshd.kill_sessions()
        away = run_dir / "away.jsonl"
        away.write_bytes(b"".join(Lines("away").train(i, 1.0) for i in range(4)))
        os.replace(away, path)
        await f.until(lambda: len(f.records) == 10, what="the records written while away")
    finally:
        await f.close()
        await host.close()
    assert len(f.restarts) == 3
    assert [r.w for r in f.records[6:]] == ["away"] * 4


def agent_inotify_watches(sshd: Sshd) -> list[str]:
    """The inotify watches held by the agents running under this sshd (from /proc)."""
    out = []
    for pid in sshd.session_tree():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if AGENT_TAG.encode() not in cmdline:
            continue
        for fd in Path(f"/proc/{pid}/fdinfo").iterdir():
            try:
                out += [x for x in fd.read_text().splitlines() if x.startswith("inotify wd:")]
            except OSError:
                continue
    return out


async def test_a_file_that_does_not_exist_yet_is_waited_for_with_inotify(
    sshd: Sshd, tmp_path: Path, client: str
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    host = stream_host(client, ssh_target(sshd))
    f = Follower.ssh(host, run_dir)
    try:
        await f.until(lambda: f.count(Link.WAITING) == 1, what="the waiting state")
        assert f.links[-1].detail.endswith("metrics.jsonl")
        # the agent waits on an inotify watch of the run directory, not a polling loop
        assert len(agent_inotify_watches(sshd)) >= 1
        (run_dir / "metrics.jsonl").write_bytes(Lines().train(0, 1.0))
        await f.until(lambda: len(f.records) == 1, what="the first record")
    finally:
        await f.close()
        await host.close()
    assert [x.link for x in f.links] == [Link.CONNECTING, Link.WAITING, Link.CONNECTED]


async def test_a_missing_run_directory_is_refused_in_the_stream(
    sshd: Sshd, tmp_path: Path, client: str
) -> None:
    host = stream_host(client, ssh_target(sshd))
    events = []
    try:
        async for ev in SshTransport(host, str(tmp_path / "nope")).stream(0):
            events.append(ev)
    finally:
        await host.close()
    assert isinstance(events[-1], LinkChanged) and events[-1].link == Link.REFUSED
    assert "no such run directory" in events[-1].detail


def test_summary_and_runs_of_the_latest_run_on_the_host(private_sshd: Sshd, tmp_path: Path) -> None:
    """No live training of the SSH user on the host: HOST alone means its latest run (a
    private host: the shared machine has other tests' live trainings)."""
    sshd = private_sshd
    run_dir = tmp_path / "latest"
    run_dir.mkdir()
    lines = Lines()
    (run_dir / "metrics.jsonl").write_bytes(
        b"".join(lines.train(i, 3.0 - 0.1 * i) for i in range(8)) + lines.event("finish")
    )
    index = sshd.state_home / "eagle3-tui" / "runs.jsonl"
    index.parent.mkdir(parents=True, exist_ok=True)
    entry = {"run_id": f"latest-{time.time_ns()}", "run_dir": str(run_dir), "host": "h"}
    with open(index, "a") as out:
        out.write(json.dumps({**entry, "run_dir": str(tmp_path / "gone")}) + "\n")
        out.write(json.dumps({**entry, "started_at": time.time(), "pid": 1}) + "\n")
    proc = cli("summary", *sshd.args(), "e3-test", "--json")  # no RUN_DIR: the latest run
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["global_step"] == 7 and out["records"] == 9 and out["lost_records"] == 0
    proc = cli("runs", *sshd.args(), "e3-test")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1].endswith(str(run_dir))
    proc = cli("summary", *sshd.args(), f"e3-test:{tmp_path / 'nope'}")
    assert proc.returncode == 2 and "no such run directory" in proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stdout == ""


async def test_the_app_monitors_a_run_over_ssh(sshd: Sshd, tmp_path: Path) -> None:
    from eagle3_tui.app.app import MonitorApp
    from tests.conftest import until

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lines = Lines()
    (run_dir / "metrics.jsonl").write_bytes(b"".join(lines.train(i, 2.0) for i in range(12)))
    host = SshHost(ssh_target(sshd))
    app = MonitorApp(SshTransport(host, str(run_dir)))
    try:
        async with app.run_test(size=(120, 30)) as pilot:
            await until(pilot, lambda: app.pipeline.run.state.records == 12, 30, "12 records")
            assert app.link.link == Link.CONNECTED
            assert "e3-test:" in app.source.label
    finally:
        await host.close()


async def test_a_changed_host_key_is_refused_then_read_on_once_it_is_put_back(
    sshd: Sshd, tmp_path: Path, client: str
) -> None:
    """A host key that no longer matches known_hosts: refused, saying what to check and
    how, with no data read; tried again slowly (the stream ended for good before, and
    a key put back was never seen): once known_hosts holds the host's key, it reads on."""
    from eagle3_tui.transport.sshlib import asyncssh

    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {other}\n")
    (tmp_path / "metrics.jsonl").write_bytes(Lines().train(0, 1.0))
    target = ssh_target(sshd, known_hosts=(str(known),))
    host = stream_host(client, target)
    transport = SshTransport(host, str(tmp_path))
    transport.refusal_retry_s = 0.5
    events: list[StreamEvent] = []
    try:
        async with asyncio.timeout(60):
            async for ev in transport.stream(0):
                events.append(ev)
                if isinstance(ev, LinkChanged) and ev.link == Link.REFUSED:
                    known.write_text(sshd.known_hosts.read_text())  # the key put back
                if isinstance(ev, Chunk):
                    break
    finally:
        await host.close()
    refused = [e for e in events if isinstance(e, LinkChanged) and e.link == Link.REFUSED]
    assert refused and refused[0].retry_in == 0.5
    detail = refused[0].detail
    assert "CHANGED" in detail or "verification failed" in detail, detail
    assert "(tried again every 0.5 s)" in detail, detail
    assert f"ssh-keygen -R '[127.0.0.1]:{sshd.port}'" in detail, detail
    before = events.index(refused[0])
    assert not any(isinstance(e, Chunk) for e in events[:before])
    assert isinstance(events[-1], Chunk)
