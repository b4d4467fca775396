"""A training without telemetry, watched from outside: how soon it is called silent,
and what watching it costs.

    python benchmarks/bench_observed.py [--step-delay 0.2] [--runs 1] [--seconds 120]

Launches the user's own script of ``tests/transport/test_observed.py`` (the real
speculators Trainer, no telemetry, no handler) detached with its output in
``train.log``, and watches it as the monitor does (``ObservedTransport`` over this
machine's agent, the model fed and judged every 0.5 s). Prints:

1. when each piece of evidence first reached the model (dataloader workers reading,
   an epoch bar, a checkpoint written) and when the verdict became SILENT: the delay
   from the first evidence against the bound ``max(30 s, 5 × step time)``, and the
   verdicts seen before (no false alarm: only ``waiting``);
2. what one ``summary WORKDIR`` takes (discovery, choice, 2.5 s observation);
3. the cost of a discovery scan of this machine (ms, with the number of processes);
4. the agent's CPU while it observes (% of one core at 1 s intervals).

Numbers are for comparison within one run; the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eagle3_tui.agent import discover
from eagle3_tui.model.health import diagnose
from eagle3_tui.model.observed_health import quiet_limit
from eagle3_tui.model.run import Run
from eagle3_tui.model.verdict import Health
from eagle3_tui.telemetry import procs
from eagle3_tui.transport.base import Chunk
from eagle3_tui.transport.channel import LocalHost
from eagle3_tui.transport.observed import ObservedTransport
from eagle3_tui.transport.replies import ProcessRow, decode
from tests.transport.test_observed import TRAIN_PY


def launch(work: Path, delay: float) -> subprocess.Popen[bytes]:
    from eagle3_tui.train.tiny import TinyConfig, make_tiny_data

    make_tiny_data(work / "tiny", TinyConfig())
    (work / "train.py").write_text(TRAIN_PY)
    with open(work / "train.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "train.py", str(work / "tiny"), "1000", str(delay)],
            cwd=work,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def find_row(work: Path, timeout: float = 120) -> ProcessRow:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [t for t in discover.scan()[0] if t.cwd == str(work)]
        if found:
            return decode(ProcessRow, discover._rows(found)[0])
        time.sleep(0.5)
    raise SystemExit("the training was not found")


def first_evidence(run: Run, since: float) -> dict[str, float]:
    state = run.state
    seen: dict[str, float] = {}
    reads = [p.ts for p in state.samplers.io_history if p.worker_bytes > 0 or p.files_read > 0]
    if reads:
        seen["reads"] = min(reads)
    if state.bars:
        seen["epoch bar"] = (
            min(b.ts for b in state.bars if b.ts >= since)
            if any(b.ts >= since for b in state.bars)
            else state.bars[0].ts
        )
    writes = [e.ts for e in state.ckpt_events if e.event != "inventory" and e.ts >= since]
    if writes:
        seen["checkpoint"] = min(writes)
    return seen


async def watch(row: ProcessRow, seconds: float) -> dict[str, Any]:
    run = Run()
    source = ObservedTransport(LocalHost(), row)
    verdicts: list[tuple[float, Health]] = []
    silent_at: float | None = None
    agent_cpu: list[float] = []

    stream = source.stream(0)

    async def pump() -> None:
        async for ev in stream:
            if isinstance(ev, Chunk):
                run.feed(ev.offset, ev.data)

    task = asyncio.create_task(pump())
    started = time.time()
    me = os.getpid()
    try:
        while time.time() - started < seconds:
            await asyncio.sleep(0.5)
            now = time.time()
            h = diagnose(run.state, now).health
            verdicts.append((now, h))
            if h == Health.SILENT and silent_at is None:
                silent_at = now
            agents = [p for p in procs.descendants(me) if "eagle3-tui-agent" in procs.cmdline(p)]
            for p in agents[:1]:
                st = procs.stat(p)
                if st is not None:
                    agent_cpu.append(st.cpu_s)
            if silent_at is not None and now - silent_at > 5:
                break
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        aclose = getattr(stream, "aclose", None)  # the agent channel closed, its process reaped
        if aclose is not None:
            await aclose()
    window = max(1e-9, time.time() - started)
    return {
        "run": run,
        "verdicts": verdicts,
        "silent_at": silent_at,
        "agent_cpu_pct": (agent_cpu[-1] - agent_cpu[0]) / window * 100
        if len(agent_cpu) > 1
        else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--step-delay", type=float, default=0.2)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=150.0)
    a = ap.parse_args()
    # whatever registers a run does so in an index of its own, not the user's
    os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="e3-bench-observed-state-")
    for i in range(a.runs):
        work = Path(tempfile.mkdtemp(prefix="e3-bench-observed-"))
        proc = launch(work, a.step_delay)
        launched = time.time()
        try:
            row = find_row(work)
            found = time.time() - launched
            result = asyncio.run(watch(row, a.seconds))
            run: Run = result["run"]
            started = row.started or launched
            seen = first_evidence(run, started)
            print(f"run {i + 1}: found by discovery {found:.1f} s after launch")
            for what, ts in sorted(seen.items(), key=lambda kv: kv[1]):
                print(f"  evidence {what:<11} at +{ts - started:5.1f} s (trainer start = 0)")
            silent = result["silent_at"]
            limit = quiet_limit(run.state)
            before = sorted(
                {h.value for t, h in result["verdicts"] if silent is None or t < silent}
            )
            if silent is None or not seen:
                print(f"  no SILENT verdict within {a.seconds:.0f} s; verdicts: {before}")
            else:
                first = min(seen.values())
                print(
                    f"  SILENT at +{silent - started:5.1f} s: {silent - first:.1f} s after the "
                    f"first evidence; bound max(30 s, 5 x step) = {limit:.0f} s "
                    f"(ratio {(silent - first) / limit:.2f}); verdicts before: {before}"
                )
            if result["agent_cpu_pct"] is not None:
                print(f"  agent CPU while observing: {result['agent_cpu_pct']:.1f} % of a core")
            t = time.perf_counter()
            out = subprocess.run(
                [sys.executable, "-m", "eagle3_tui", "summary", str(work), "--json"],
                capture_output=True,
                text=True,
                check=False,
            )
            print(f"  summary WORKDIR: {time.perf_counter() - t:.2f} s, exit {out.returncode}")
            t = time.perf_counter()
            n = len(procs.all_stats())
            trainings = discover.scan()[0]
            print(
                f"  discovery scan: {(time.perf_counter() - t) * 1000:.0f} ms for {n} processes "
                f"({len(trainings)} trainings found)"
            )
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


if __name__ == "__main__":
    main()
