"""Scenarios on recorded streams with a clock: what a run writes, second by second, and
what reaches the client through the app's own data path (``Pipeline`` fed by a
``ReplayTransport``: chunks and link changes), judged at each second.

Pure enough for the fast tests (``tests/model/test_scenarios.py``): no process, no
network; a scenario of several simulated minutes runs in well under a second.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from benchmarks.scenarios.timeline import Timeline
from eagle3_tui.app.pipeline import Pipeline
from eagle3_tui.exits import BY_HEALTH as EXIT_BY_HEALTH
from eagle3_tui.model.snapshot import ViewParams
from eagle3_tui.model.summary import summarize
from eagle3_tui.transport.base import Link, LinkChanged
from eagle3_tui.transport.replay import ReplayTransport

T0 = 1_800_000_000.0
VIEW = ViewParams(columns=40)


class Writer:
    """One writer of schema-v1 lines (the trainer's, or its sampler sidecar's)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seq = 0

    def line(self, ts: float, kind: str, **payload: Any) -> bytes:
        rec = {"v": 1, "seq": self.seq, "w": self.name, "ts": ts, "kind": kind, "rank": 0}
        self.seq += 1
        return (json.dumps({**rec, **payload}) + "\n").encode()


class Host:
    """The training host: a run writing its file, second by second."""

    def __init__(self, step_s: float = 0.5) -> None:
        self.t = 0.0
        self.step = 0
        self.step_s = step_s
        self.next_step = 0.0
        self.trainer = Writer("1000-trainer")
        self.sampler = Writer("1001-sidecar")
        self.file = bytearray()
        self.loss: Callable[[int], float] = lambda s: 3.0 / (1 + s / 50)
        self.training = False
        self.util = 0.0
        self.reads = 0.0

    @property
    def ts(self) -> float:
        return T0 + self.t

    def event(self, event: str, **fields: Any) -> None:
        self.file += self.trainer.line(self.ts, "lifecycle", event=event, **fields)

    def log(self, msg: str, level: str = "INFO") -> None:
        self.file += self.trainer.line(self.ts, "log", level=level, logger="speculators", msg=msg)

    def second(self) -> None:
        """One second of the run: its steps (if training), then the samplers' records."""
        end = self.t + 1.0
        while self.training and self.next_step < end:
            t = max(self.next_step, self.t)
            loss = self.loss(self.step)
            train = {"loss": loss, "loss_0": loss, "full_acc_0": 0.6, "cond_acc_0": 0.6}
            self.file += self.trainer.line(
                T0 + t,
                "train",
                step=self.step,
                global_step=self.step,
                epoch=0,
                lr=1e-3,
                train=train,
                profile={"step_ms": 1000 * self.step_s, "tokens_per_s": 8000.0, "fetch_frac": 0.02},
            )
            self.step += 1
            self.next_step = t + self.step_s
        self.t = end
        devices = [{"index": 0, "name": "NVIDIA H200", "util": self.util, "pids": [1000]}]
        self.file += self.sampler.line(self.ts, "gpu", status="ok", devices=devices)
        workers = [{"pid": 1002, "role": "worker", "read_bytes": self.reads, "files": []}]
        self.file += self.sampler.line(
            self.ts, "io", interval_s=1.0, workers=workers, bytes=self.reads, files_read=0
        )
        self.file += self.sampler.line(self.ts, "heartbeat", written=self.trainer.seq, dropped=0)

    def train(self, on: bool = True) -> None:
        self.training = on
        self.util, self.reads = (95.0, 4e6) if on else (0.0, 0.0)
        if on:
            self.next_step = self.t

    def start(self) -> None:
        """The script starts (pid 1000, step 0): its ``start`` event."""
        self.event("start", pid=1000, global_step=0)

    def finish(self) -> None:
        """The run ends: its steps and the GPU stop, the script writes ``finish``."""
        self.train(False)
        self.event("finish", step=self.step)


class Client:
    """The monitor's data path: a Pipeline fed by a ReplayTransport, on a given clock."""

    def __init__(self, host: Host, clock_offset: float = 0.0) -> None:
        self.host = host
        self.offset = clock_offset
        """The client's clock minus the host's."""
        self.replay = ReplayTransport([])
        self.pipeline = Pipeline(self.now)
        self.sent = 0
        self.up = True
        self.tasks: list[asyncio.Task[None]] = []

    def now(self) -> float:
        return self.host.ts + self.offset

    async def __aenter__(self) -> Client:
        self.tasks = [
            asyncio.ensure_future(self.pipeline.pump(self.replay, lambda _e: None)),
            asyncio.ensure_future(self.pipeline.ingest()),
        ]
        self.replay.push(LinkChanged(Link.CONNECTED, "gpu-box", size=0, host_time=self.host.ts))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self.tasks:
            task.cancel()

    async def link(self, up: bool, detail: str = "") -> None:
        """The link goes down or comes back now (the host's clock read as it does)."""
        if up:
            self.replay.push(
                LinkChanged(
                    Link.CONNECTED, "gpu-box", size=len(self.host.file), host_time=self.host.ts
                )
            )
        else:
            self.replay.push(LinkChanged(Link.RECONNECTING, detail, retry_in=5.0))
        self.up = up
        for _ in range(20):  # let the pump see it before the clock moves on
            await asyncio.sleep(0.0005)

    async def judge(self, timeline: Timeline) -> str:
        """Deliver what the host wrote (if the link is up), then judge at the client's now."""
        if self.up and len(self.host.file) > self.sent:
            self.replay.push(bytes(self.host.file[self.sent :]))
            self.sent = len(self.host.file)
        await self._settled()
        snap, _ = await self.pipeline.snapshot(self.now(), VIEW)
        timeline.record(self.host.t, snap.diagnosis.label, snap.diagnosis.reason)
        return snap.diagnosis.label

    async def _settled(self) -> None:
        """Wait until the pump and the ingest have moved everything pushed."""
        p = self.pipeline
        for _ in range(2000):
            await asyncio.sleep(0.0005)
            idle = self.replay._queue.empty() and not p._pending and not p._links
            read = p.run.reader.next_offset >= self.sent and p.run.link_down_since is None
            if idle and (not self.up or read):
                return
        raise TimeoutError("the pipeline did not settle")

    def summary(self) -> dict[str, Any]:
        return summarize(self.pipeline.run.state, self.now())


async def _run(host: Host, client: Client, timeline: Timeline, seconds: int) -> None:
    for _ in range(seconds):
        host.second()
        await client.judge(timeline)


# ---- the scenarios ----------------------------------------------------------------------


async def link_outage(hang: bool = False) -> Timeline:
    """A 60 s link outage while the run trains on (or, ``hang``: hangs during it)."""
    name = "60 s link outage, the run hangs during it" if hang else "60 s link outage"
    tl = Timeline(name)
    host = Host()
    async with Client(host) as client:
        host.start()
        host.train()
        await _run(host, client, tl, 60)
        tl.fault("link down", host.t, "LINK DOWN")
        tl.expect("RUNNING", "LINK DOWN")
        await client.link(False, "gpu-box: Connection to 10.0.0.5 port 22 timed out")
        await _run(host, client, tl, 30)
        if hang:
            tl.fault("trainer hangs (link still down)", host.t, "STALLED")
            host.train(False)
        await _run(host, client, tl, 30)
        tl.fault("link back", host.t, "STALLED" if hang else "RUNNING")
        await client.link(True)
        tl.expect(*(["LINK DOWN"] if hang else ["LINK DOWN", "RUNNING"]))
        await _run(host, client, tl, 1)
        tl.expect("STALLED" if hang else "RUNNING")
        if hang:
            await _run(host, client, tl, 10)
            tl.expected_final = "STALLED"
            return tl
        await _run(host, client, tl, 60)
        host.finish()
        tl.fault("finish", host.t, "FINISHED")
        tl.expect("RUNNING", "FINISHED")
        await _run(host, client, tl, 5)
        tl.expected_final = "FINISHED"
    return tl


async def nan_then_the_end() -> Timeline:
    tl = Timeline("NaN loss, then the run ends")
    host = Host()
    async with Client(host) as client:
        host.start()
        host.train()
        await _run(host, client, tl, 60)
        tl.fault("loss becomes NaN", host.t, "DIVERGED")
        host.loss = lambda s: float("nan")
        await _run(host, client, tl, 60)
        host.finish()
        tl.expect("DIVERGED")
        await _run(host, client, tl, 10)
        status = EXIT_BY_HEALTH[client.summary()["health"]]
        tl.notes.append(
            f"summary after the end: {client.summary()['reason'][:120]} (exit {status})"
        )
        tl.expected_final = "DIVERGED"
    return tl


async def resume_start_up() -> Timeline:
    """Stopped, then resumed: the new process takes 25 s to its first step, reading."""
    tl = Timeline("resume with a 25 s start-up (recorded)")
    host = Host()
    async with Client(host) as client:
        host.start()
        host.reads = 3e6  # loading: reads, no step yet
        await _run(host, client, tl, 12)
        host.train()
        await _run(host, client, tl, 48)
        host.log("Received SIGTERM — interrupting training to save checkpoint.", "WARNING")
        host.train(False)
        host.event("interrupt", step=host.step)
        tl.fault("SIGTERM", host.t, "STOPPED")
        tl.expect("RUNNING", "STOPPED")
        await _run(host, client, tl, 10)
        tl.expect("STOPPED")
        host.event("resume", pid=1003, global_step=host.step - 10)
        host.step -= 10  # speculators resumes from the last numbered checkpoint
        tl.fault("resume", host.t, "RUNNING")
        tl.expect("STOPPED", "WAITING")
        host.reads = 5e6
        await _run(host, client, tl, 25)
        host.train()
        tl.expect("WAITING", "RUNNING")
        await _run(host, client, tl, 40)
        host.finish()
        tl.fault("finish", host.t, "FINISHED")
        await _run(host, client, tl, 5)
        tl.expected_final = "FINISHED"
    return tl


async def skewed_clock() -> Timeline:
    """The client's clock 90 s ahead of the host's: no alarm from the difference."""
    tl = Timeline("the client's clock 90 s ahead of the host's")
    host = Host()
    async with Client(host, clock_offset=90.0) as client:
        host.start()
        host.train()
        await _run(host, client, tl, 120)
        tl.expected_final = "RUNNING"
    return tl


RECORDED: tuple[Callable[[], Awaitable[Timeline]], ...] = (
    lambda: link_outage(),
    lambda: link_outage(hang=True),
    resume_start_up,
    nan_then_the_end,
    skewed_clock,
)


async def run_all() -> list[Timeline]:
    return [await scenario() for scenario in RECORDED]
