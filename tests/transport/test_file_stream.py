"""metrics.jsonl replaced, deleted and truncated under a live writer, and a real full disk
(a tmpfs): through the real transports (this machine's directory, and a real sshd) into
the app's pipeline, what the monitor's state holds and what its verdict says."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from eagle3_tui.app.pipeline import Pipeline, Source
from eagle3_tui.app.widgets.log import counts
from eagle3_tui.model.files import MIN_ROOM
from eagle3_tui.model.health import diagnose
from eagle3_tui.model.run import Run
from eagle3_tui.model.snapshot import build_snapshot
from eagle3_tui.model.verdict import Health
from eagle3_tui.transport.local import LocalTransport
from eagle3_tui.transport.openssh import OpenSshHost, find_ssh
from eagle3_tui.transport.ssh import SshHost, SshTransport
from tests.conftest import need, wait_until_async
from tests.records import Lines
from tests.transport.conftest import cli, ssh_target
from tests.transport.sshd import ALIAS, Sshd

pytestmark = pytest.mark.slow

WRITER = Path(__file__).with_name("metrics_writer.py")
RUN_ID = "run-A"
CLOCK = r"\d\d:\d\d:\d\d"


# ---- the parts: a writer, a monitor, a way to the run --------------------------------


@contextlib.contextmanager
def live_writer(run_dir: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The small trainer's writer (tests/transport/metrics_writer.py) on ``run_dir``."""
    proc = subprocess.Popen([sys.executable, str(WRITER), str(run_dir), RUN_ID])
    try:
        yield proc
    finally:
        (run_dir / "pause").unlink(missing_ok=True)
        (run_dir / "stop").touch()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def paused(run_dir: Path) -> None:
    """The writer waits between two ticks (it cannot be caught halfway through one)."""
    (run_dir / "pause").touch()
    await wait_for(lambda: (run_dir / "paused").exists(), "the writer to pause")


async def resumed(run_dir: Path) -> None:
    (run_dir / "pause").unlink()
    await wait_for(lambda: not (run_dir / "paused").exists(), "the writer to go on")


async def wait_for(done: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    await wait_until_async(done, timeout, what, interval=0.02)


class Monitor:
    """The app's data path on a real transport: its pipeline's pump and ingest."""

    def __init__(self, source: Source) -> None:
        self.pipe = Pipeline()
        self.tasks = [
            asyncio.create_task(self.pipe.pump(source, lambda _link: None)),
            asyncio.create_task(self.pipe.ingest()),
        ]

    @property
    def run(self) -> Run:
        return self.pipe.run

    async def until(self, done: Callable[[Run], bool], what: str, timeout: float = 60.0) -> None:
        """Until ``done(run)`` holds, read under the model's lock (never mid-feed)."""
        deadline = time.monotonic() + timeout
        while True:
            for task in self.tasks:
                if task.done():
                    task.result()  # the stream's failure, raised here
            async with self.pipe.lock:
                if done(self.run):
                    return
                state = self.run.state
                seen = (
                    f"{state.train_steps} steps, notices {[n.outcome for n in state.file_notices]}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {seen}")
            await asyncio.sleep(0.05)

    def notices(self) -> list[str]:
        state = self.run.state
        return [state.file_sentence(n) for n in state.file_notices]

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


@pytest.fixture(params=["local", "ssh"])
async def follow(request: pytest.FixtureRequest) -> AsyncIterator[Callable[[Path], Source]]:
    """How the monitor reaches the run: this machine's directory, or over a real sshd
    (the ``ssh`` binary where installed, as the monitor streams by default)."""
    if request.param == "local":
        yield LocalTransport
        return
    sshd: Sshd = request.getfixturevalue("sshd")
    target = ssh_target(sshd)
    host = OpenSshHost(target) if find_ssh() is not None else SshHost(target)
    try:
        yield lambda run_dir: SshTransport(host, str(run_dir), backoff=(0.1, 0.2, 0.5))
    finally:
        await host.close()


def another_run() -> bytes:
    """Another run's metrics.jsonl, finished after 72 steps."""
    other = Lines("trainer-9", time.time() - 90_000, 1.0)
    return b"".join(
        [
            other.event("start", pid=99, global_step=0, run_id="run-B"),
            *(other.train(s, 5.0, epoch=s // 9) for s in range(72)),
            other.event("finish", step=72),
        ]
    )


def only_this_run(run: Run) -> None:
    """The state shown is this run's alone, whole: every step once, in order, no record
    lost, nothing of the other run."""
    state = run.state
    steps = state.table.step_view().tolist()
    assert not state.foreign and steps == list(range(len(steps)))
    assert state.redos == [] and set(state.writers) == {"trainer-1"}
    assert state.events == [] and state.lost_records == 0


# ---- the file changed -------------------------------------------------------------------


async def test_replaced_deleted_truncated_under_a_live_writer(
    tmp_path: Path, follow: Callable[[Path], Source]
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = run_dir / "metrics.jsonl"
    with live_writer(run_dir):
        await wait_for(path.exists, "the writer's file")
        mon = Monitor(follow(run_dir))
        try:
            await mon.until(lambda run: run.state.train_steps >= 20, "the first steps")

            # another run's file moved into place while the trainer is between two steps
            await paused(run_dir)
            incoming = run_dir / "incoming.jsonl"
            incoming.write_bytes(another_run())
            os.replace(incoming, path)
            await mon.until(
                lambda run: run.state.foreign and run.state.global_step == 71, "the other file"
            )
            other = build_snapshot(mon.run.state, time.time()).other_file
            assert other is not None and re.fullmatch(
                f"metrics.jsonl replaced at {CLOCK}: now showing the file there \\(another "
                "run: run id run-B\\); the earlier history is not this file's",
                other,
            ), other
            steps = mon.run.shelved[-1].train_steps
            await resumed(run_dir)  # the trainer moves it aside and writes its own again
            await mon.until(
                lambda run: not run.state.foreign and run.state.train_steps >= steps + 10,
                "this run's file again",
            )
            only_this_run(mon.run)
            assert re.fullmatch(
                f"metrics.jsonl replaced at {CLOCK} by another file \\(moved aside to "
                "metrics.jsonl.replaced-1 by the trainer\\); this run's history continues "
                "\\(nothing lost\\); the other file's history is set aside",
                mon.notices()[-1],
            ), mon.notices()
            aside = (run_dir / "metrics.jsonl.replaced-1").read_bytes().splitlines()
            assert json.loads(aside[0])["run_id"] == "run-B" and len(aside) == 74  # kept whole

            # deleted: said at once; the trainer makes it again
            await paused(run_dir)
            path.unlink()
            await mon.until(
                lambda run: mon.notices()[-1].endswith(
                    "no file there yet (the history read before is shown)"
                ),
                "the deletion",
            )
            steps = mon.run.state.train_steps
            await resumed(run_dir)
            await mon.until(
                lambda run: (
                    run.state.train_steps >= steps + 10 and "recreated" in mon.notices()[-1]
                ),
                "the recreated file",
            )
            only_this_run(mon.run)
            assert re.fullmatch(
                f"metrics.jsonl deleted at {CLOCK}; the trainer recreated it \\(nothing lost\\)",
                mon.notices()[-1],
            ), mon.notices()

            # truncated: the history read before is kept
            await paused(run_dir)
            size = path.stat().st_size
            await mon.until(lambda run: run.reader.next_offset == size, "all of it read")
            os.truncate(path, 0)
            await mon.until(
                lambda run: "truncated" in mon.notices()[-1], "the truncation", timeout=30
            )
            steps = mon.run.state.train_steps
            await resumed(run_dir)
            await mon.until(lambda run: run.state.train_steps >= steps + 10, "steps after it")
            only_this_run(mon.run)
            assert re.fullmatch(
                f"metrics.jsonl truncated at {CLOCK} \\({size:,} bytes gone from the host; "
                "the history read before is kept\\); nothing lost",
                mon.notices()[-1],
            ), mon.notices()
            assert len(mon.notices()) == 4
            verdict = diagnose(mon.run.state, time.time())
            assert verdict.health is Health.RUNNING, verdict
        finally:
            await mon.close()


# ---- a full disk ---------------------------------------------------------------------


@contextlib.contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` mounted at ``where`` (root)."""
    need(os.geteuid() == 0, "mounting a tmpfs needs root")
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    need(mounted.returncode == 0, f"mount -t tmpfs was refused: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(path: Path) -> int:
    """A file that takes every byte left on its filesystem; its size."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    written = 0
    try:
        block = b"\0" * 65536
        while True:
            try:
                written += os.write(fd, block)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                if len(block) == 1:
                    return written
                block = block[: len(block) // 2]
    finally:
        os.close(fd)


async def test_a_full_disk_is_disk_full_not_a_hang(
    tmp_path: Path, follow: Callable[[Path], Source], request: pytest.FixtureRequest
) -> None:
    with tmpfs(tmp_path / "disk", "8m") as disk:
        run_dir = disk / "run"
        run_dir.mkdir()
        with live_writer(run_dir):
            await wait_for((run_dir / "metrics.jsonl").exists, "the writer's file")
            mon = Monitor(follow(run_dir))
            try:
                await mon.until(
                    lambda run: run.state.train_steps >= 20 and bool(run.state.disk),
                    "the first steps and the room on the disk",
                )
                assert mon.run.state.disk[0].room > MIN_ROOM
                fill(disk / "filler")  # the disk is full: every write of the trainer fails

                def reported_full(run: Run) -> bool:
                    state = run.state
                    disk_now = state.disk.get(0)
                    last = state.last_ts or 0.0
                    return (
                        disk_now is not None
                        and disk_now.room < MIN_ROOM
                        and disk_now.at > last + 1.5
                    )

                await mon.until(reported_full, "a report of the full disk after the last record")
                state = mon.run.state
                quiet_at = (state.last_ts or 0.0) + 31 - state.liveness.clock_offset
                verdict = diagnose(state, quiet_at)  # 31 s without a record, judged
                assert verdict.health is Health.DISK_FULL, verdict
                assert re.fullmatch(
                    r"Disk full on the host \((\d+ B|[\d.]+ KiB) free on the run's filesystem\): "
                    r"metrics cannot be written; (how many records were not written is not "
                    r"known until space returns|[\d,]+ records not written so far \(the "
                    f"writers' count at {CLOCK}\\)).",
                    verdict.reason,
                ), verdict.reason
                assert verdict.label == "DISK FULL" and "hung" not in verdict.reason

                # the headless summary, 31 s into the silence, says it too (exit status 11)
                await wait_for(lambda: time.time() > quiet_at + 1, "31 s of silence", timeout=60)
                summary = headless_summary(request, run_dir)
                assert summary.returncode == 11, summary.stdout + summary.stderr
                said = json.loads(summary.stdout)
                assert said["health"] == "disk_full" and said["disk"]["room"] < MIN_ROOM

                # space returns: the trainer's first line says what it could not write
                steps = state.train_steps
                (disk / "filler").unlink()
                await mon.until(
                    lambda run: bool(run.state.write_gaps) and run.state.train_steps >= steps + 10,
                    "the records after the gap",
                )
                after = mon.run.state
                gap = after.write_gaps[0]
                assert gap.reason == "ENOSPC" and gap.records > 0
                assert after.lost_records == gap.records  # the gap, counted once
                assert gap.last_seq - gap.first_seq + 1 == gap.records
                assert diagnose(after, time.time()).health is Health.RUNNING
                snap = build_snapshot(after, time.time())
                assert f"{gap.records} lost" in counts(snap).plain
                assert re.fullmatch(
                    f"{gap.records:,} records? not written \\(disk full\\) between {CLOCK} and "
                    f"{CLOCK}",
                    snap.write_gaps[0].sentence(),
                )
            finally:
                await mon.close()


def headless_summary(
    request: pytest.FixtureRequest, run_dir: Path
) -> subprocess.CompletedProcess[str]:
    """``eagle3-tui summary --json`` of the run the way the test follows it."""
    if request.node.callspec.params["follow"] == "local":
        return cli("summary", str(run_dir), "--json")
    sshd: Sshd = request.getfixturevalue("sshd")
    return cli("summary", *sshd.args(), f"{ALIAS}:{run_dir}", "--json")


async def test_a_run_directory_without_its_file_is_waited_for_and_said_so(tmp_path: Path) -> None:
    """metrics.jsonl deleted under a live run (its run.json there): ``summary`` said "is
    telemetry attached to the trainer?" and the monitor refused to open (exit 2), though
    an open monitor waits for the file then. The monitor opened now waits as well; the
    others say what is missing and why."""
    from eagle3_tui.transport.base import Chunk, Link, LinkChanged, TargetError
    from eagle3_tui.transport.local import LocalTransport, check_run_dir

    (tmp_path / "run.json").write_text('{"run_id": "r1", "pid": 1}')
    with pytest.raises(TargetError) as said:
        check_run_dir(tmp_path)
    assert "no metrics.jsonl here, though its run.json is" in str(said.value), said.value
    assert check_run_dir(tmp_path, wait_for_file=True) == tmp_path / "metrics.jsonl"
    stream = LocalTransport(tmp_path).stream()
    seen: list[object] = []
    try:
        while not any(isinstance(x, LinkChanged) for x in seen):  # (its disk's room first)
            seen.append(await asyncio.wait_for(stream.__anext__(), 10))
        (tmp_path / "metrics.jsonl").write_bytes(b'{"v":1}\n')
        while not any(isinstance(x, Chunk) for x in seen):
            seen.append(await asyncio.wait_for(stream.__anext__(), 10))
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    links = [x.link for x in seen if isinstance(x, LinkChanged)]
    assert links == [Link.WAITING, Link.LOCAL], seen  # waited for, then read
