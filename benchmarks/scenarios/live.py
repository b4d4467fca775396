"""Scenarios with real processes: the tiny EAGLE-3 training (the real speculators
Trainer, CPU) with telemetry, faults injected as a user or the kernel would, the real
agent (``status`` every second, ``kill``, ``resume``) on this machine, and the
run's file read as the monitor reads it. Each judged every second on the real clock.

Other trainings may run on this machine at the same time: everything here goes by
the PIDs, directories and run ids these scenarios created.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchmarks.scenarios.timeline import Timeline
from eagle3_tui.api.reading import apply_status
from eagle3_tui.model.health import diagnose
from eagle3_tui.model.run import Run
from eagle3_tui.reports import format_kill
from eagle3_tui.transport.base import TargetError
from eagle3_tui.transport.calls import kill_run, resume_run, run_status
from eagle3_tui.transport.channel import LocalHost
from eagle3_tui.transport.replies import KillReport, Status

TICK_S = 1.0


def start_tiny(run_dir: Path, *args: str) -> subprocess.Popen[bytes]:
    """The tiny training in its own session, as a user would start it."""
    return subprocess.Popen(
        [sys.executable, "-m", "eagle3_tui.train.tiny", "--run-dir", str(run_dir), *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false"),
    )


class Monitor:
    """Reads the run's file as it grows and asks the host about the process, every tick."""

    def __init__(self, run_dir: Path, timeline: Timeline) -> None:
        self.run_dir = run_dir
        self.timeline = timeline
        self.run = Run()
        self.offset = 0
        self.t0 = time.monotonic()
        self.last: Any = None
        self.status: Status | None = None

    @property
    def t(self) -> float:
        return time.monotonic() - self.t0

    async def tick(self) -> str:
        data = await asyncio.to_thread(self._read)
        if data:
            self.run.feed(self.offset, data)
            self.offset += len(data)
        state = self.run.state
        try:
            self.status = await run_status(LocalHost(), str(self.run_dir))
        except TargetError:
            self.status = None  # no manifest yet
        if self.status is not None:
            apply_status(state, self.status, time.time())
        if not state.records and not state.malformed_count:
            return "-"  # nothing written yet: nothing to judge
        d = diagnose(state, time.time())
        self.last = d
        # an end is right from the moment its record exists (a scenario's expectations
        # move only when its script does)
        ends = {"FINISHED": '"event":"finish"', "STOPPED": '"event":"interrupt"'}
        if d.label in ends and self.has(ends[d.label]):
            self.timeline.right.add(d.label)
        self.timeline.record(self.t, d.label, d.reason)
        return d.label

    def _read(self) -> bytes:
        """What was appended to the run's file since the last read."""
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return b""
        with open(path, "rb") as f:
            f.seek(self.offset)
            return f.read()

    async def until(
        self, done: Callable[[], bool], limit_s: float, what: str, every: float = TICK_S
    ) -> None:
        deadline = time.monotonic() + limit_s
        while True:
            await self.tick()
            if done():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.timeline.name}: no {what} in {limit_s:.0f} s")
            await asyncio.sleep(every)

    async def ticks(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            await self.tick()
            await asyncio.sleep(TICK_S)

    def steps(self) -> int:
        return self.run.state.train_steps

    def has(self, text: str) -> bool:
        path = self.run_dir / "metrics.jsonl"
        return path.exists() and text.encode() in path.read_bytes()


def manifest(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "run.json").read_text()))


def complete(checkpoint: Path) -> bool:
    return (checkpoint / "training_state.json").exists()


async def _finish(mon: Monitor, proc: subprocess.Popen[bytes], label: str, limit_s: float) -> None:
    """Until the process ended and the verdict is ``label`` (a few ticks more)."""
    await mon.until(lambda: proc.poll() is not None, limit_s, "end of the training")
    await mon.until(lambda: mon.timeline.final == label, 30, label)
    await mon.ticks(3)


# ---- the scenarios --------------------------------------------------------------------------


async def healthy(root: Path) -> Timeline:
    tl = Timeline("healthy run: 3 epochs, a save every half epoch, validation each epoch")
    run_dir = root / "healthy"
    proc = start_tiny(run_dir, "--epochs", "3", "--checkpoint-freq", "0.5", "--step-delay", "0.1")
    mon = Monitor(run_dir, tl)
    try:
        await mon.until(lambda: proc.poll() is not None, 600, "end of the training")
        tl.expect("WAITING", "RUNNING", "FINISHED")
        await mon.until(lambda: tl.final == "FINISHED", 30, "FINISHED")
        await mon.ticks(3)
    finally:
        _stop(proc)
    state = mon.run.state
    saves = sum(1 for e in state.ckpt_events if e.event == "save_finished")
    tl.notes.append(
        f"{state.train_steps} steps, {saves} checkpoint saves, "
        f"{len(state.val_by_epoch)} validation epochs, exit status {proc.returncode}"
    )
    tl.expected_final = "FINISHED"
    return tl


async def _train_to_first_checkpoint(
    run_dir: Path, mon: Monitor, *args: str
) -> subprocess.Popen[bytes]:
    proc = start_tiny(run_dir, "--epochs", "3", "--step-delay", "0.15", *args)
    first = run_dir / "checkpoints" / "0"
    await mon.until(lambda: complete(first) and mon.steps() > 25, 600, "the first checkpoint")
    return proc


async def _kill(mon: Monitor, label: str) -> KillReport:
    """``k``: the agent's kill, the monitor judging meanwhile."""
    task = asyncio.ensure_future(kill_run(LocalHost(), str(mon.run_dir), grace_s=130.0))
    while not task.done():
        await mon.tick()
        await asyncio.wait([task], timeout=TICK_S)
    result = task.result()
    mon.timeline.notes.append(f"kill: {format_kill(result).splitlines()[0]}")
    return result


async def _stop_running(mon: Monitor) -> None:
    """``k`` on a running run: SIGTERM, RUNNING until it is STOPPED."""
    mon.timeline.fault("kill (SIGTERM)", mon.t, "STOPPED")
    mon.timeline.expect("RUNNING", "STOPPED")
    await _kill(mon, "STOPPED")


async def resume(root: Path) -> Timeline:
    tl = Timeline("stopped (k), resumed (r), runs to its end")
    run_dir = root / "resume"
    mon = Monitor(run_dir, tl)
    proc = await _train_to_first_checkpoint(run_dir, mon)
    try:
        await _stop_running(mon)
        await mon.until(lambda: tl.final == "STOPPED", 30, "STOPPED")
        tl.expect("STOPPED")
        started = await resume_run(LocalHost(), str(run_dir), 30.0)
        tl.fault("resume", mon.t, "RUNNING")
        tl.expect("STOPPED", "WAITING", "RUNNING")
        pid = int(started.pid or 0)
        await mon.until(lambda: not _alive(pid) or tl.final == "FINISHED", 600, "the end")
        tl.expect("RUNNING", "FINISHED")
        await mon.until(lambda: tl.final == "FINISHED", 30, "FINISHED")
        tl.fault("end", mon.t, "FINISHED")
        await mon.ticks(2)
    finally:
        _stop(proc)
    tl.notes.append(f"start-ups (s): {[round(s, 1) for s in mon.run.state.startups]}")
    tl.expected_final = "FINISHED"
    return tl


async def sigterm_one_liner(root: Path) -> Timeline:
    tl = Timeline("SIGTERM to a script ending with the README's telemetry.finish()")
    run_dir = root / "one-liner"
    proc = start_tiny(run_dir, "--epochs", "3", "--step-delay", "0.2", "--one-liner")
    mon = Monitor(run_dir, tl)
    try:
        await mon.until(lambda: mon.steps() > 10, 600, "training steps")
        tl.fault("SIGTERM", mon.t, "STOPPED")
        tl.expect("RUNNING", "STOPPED")
        os.kill(proc.pid, signal.SIGTERM)
        await _finish(mon, proc, "STOPPED", 180)
        tl.expect("STOPPED")
    finally:
        _stop(proc)
    status = manifest(run_dir)["status"]
    tl.notes.append(f"exit status {proc.returncode}; run.json status {status}")
    if status != "interrupted":
        tl.wrong_labels.append((mon.t, f"run.json {status}", "should be interrupted"))
    tl.expected_final = "STOPPED"
    return tl


async def kill_during_start_up(root: Path) -> Timeline:
    tl = Timeline("stopped (k), resumed, killed again during its start-up")
    run_dir = root / "startup-kill"
    mon = Monitor(run_dir, tl)
    proc = await _train_to_first_checkpoint(run_dir, mon)
    try:
        await _stop_running(mon)
        tl.expect("STOPPED")
        started = await resume_run(LocalHost(), str(run_dir), 30.0)
        tl.fault("resume", mon.t, "WAITING")
        tl.expect("STOPPED", "WAITING")
        await mon.until(lambda: mon.has('"event":"resume"'), 60, "the resume event")
        tl.fault("kill during start-up", mon.t, "STOPPED")
        result = await _kill(mon, "STOPPED")
        report = format_kill(result)
        ours = result.checkpoints.interrupted
        tl.notes.append("report: " + " | ".join(x.strip() for x in report.splitlines()[-2:]))
        if ours is None or ours.new is not False or "nothing written" not in report:
            tl.wrong_labels.append((mon.t, "kill report", "claims an earlier checkpoint"))
        await mon.until(lambda: tl.final == "STOPPED", 30, "STOPPED")
        await mon.ticks(2)
        tl.expected_final = "STOPPED"
        tl.notes.append(f"run.json status {manifest(run_dir)['status']}; pid {started.pid}")
    finally:
        _stop(proc)
    return tl


async def sigkill_with_workers(root: Path) -> Timeline:
    tl = Timeline("SIGKILL to a trainer with 2 dataloader workers (as the OOM killer)")
    run_dir = root / "sigkill"
    proc = start_tiny(run_dir, "--epochs", "3", "--step-delay", "0.1", "--workers", "2")
    mon = Monitor(run_dir, tl)
    try:
        await mon.until(lambda: mon.steps() > 10, 600, "training steps")
        tl.fault("SIGKILL", mon.t, "DEAD")
        tl.expect("RUNNING", "DEAD")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        await mon.until(lambda: tl.final == "DEAD", 30, "DEAD")
        tl.expect("DEAD")
        named = [x for x in mon.run.state.liveness.leftovers]
        tl.notes.append(
            "left behind: "
            + (", ".join(f"pid {x.pid} {x.comm} {x.rss_bytes or 0:,} B" for x in named) or "none")
        )
        if named and f"pid {named[0].pid}" not in (mon.last.reason if mon.last else ""):
            tl.wrong_labels.append((mon.t, "DEAD", "the leftovers are not named"))
        result = await _kill(mon, "DEAD")
        after = await run_status(LocalHost(), str(run_dir))
        tl.notes.append(
            f"k ended {len(result.processes)} process(es); left after: {len(after.leftovers)}"
        )
        if after.leftovers:
            tl.wrong_labels.append((mon.t, "leftovers", "k did not end them"))
        await mon.ticks(2)
    finally:
        _stop(proc)
    tl.expected_final = "DEAD"
    return tl


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Never leave a scenario's training behind (only the processes it started)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


LIVE: tuple[Callable[[Path], Awaitable[Timeline]], ...] = (
    healthy,
    resume,
    sigterm_one_liner,
    kill_during_start_up,
    sigkill_with_workers,
)
