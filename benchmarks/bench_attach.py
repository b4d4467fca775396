"""Live attach: how long until metrics flow, and how long the trainer is paused.

    python benchmarks/bench_attach.py [--trials 3] [--pause-trials 5] [--no-ssh]

1. The pause, measured by the victim itself: a Python process with PyTorch loaded
   whose main thread ticks every millisecond and notes every gap over 20 ms. Into it,
   alternately, a no-op line is queued (a) with the recipe of
   ``shared/notes/live-attach.md`` as written (``gdb -p PID``, every library's
   symbols loaded) and (b) with eagle3-tui's gdb script (only libpython's and libc's
   symbols). Printed: the main thread's longest stop for each, and the ratio.
2. The real ``attach`` on a user's own speculators training launched without
   telemetry (``tests/attach/silent_training.py``, tiny model on the CPU, a 50 ms pace
   per step, detached): plan, then the confirmed injection, through the agent on this
   machine and over a private sshd on 127.0.0.1 (alternating). Injections are made
   mid-epoch (an epoch's end validates and saves for seconds). Printed:
   confirmation -> first metric (from the moment the inject request leaves until the
   first training step's record is readable in ``metrics.jsonl``); what attach reports
   (gdb's stop from attach to detach, the attach code's time in the main thread); the
   step time the training lost from the confirmation to its first metric (the step
   intervals in between less as many median intervals).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eagle3_tui.agent import debugger, pyprocess
from eagle3_tui.transport.channel import Host, LocalHost
from eagle3_tui.transport.control import attach_plan, attach_run
from eagle3_tui.transport.replies import AttachPlan
from tests.transport.sshd import ALIAS, Sshd

SCRIPT = Path(__file__).resolve().parent.parent / "tests" / "attach" / "silent_training.py"
PACE_S = 0.05
STEPS_PER_EPOCH = 24  # 60 rows, 80 % for training, two 48-token rows per batch


def step_times(path: Path) -> list[float]:
    try:
        return [float(x) for x in path.read_text().split()]
    except (OSError, ValueError):
        return []


def wait_steps(path: Path, n: int, proc: subprocess.Popen[bytes], timeout: float = 300) -> None:
    """Until ``n`` more steps than now have started."""
    start = len(step_times(path))
    deadline = time.monotonic() + timeout
    while len(step_times(path)) < start + n:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the training ended or stalled before the benchmark could run")
        time.sleep(0.05)


def observed_pause(path: Path, t0: float, t1: float) -> float:
    """ms the training lost to what happened in [t0, t1]: the step intervals spanning it
    less as many median intervals of the 20 steps before (intervals across an epoch's
    end, which validate and save, are left out)."""
    times = step_times(path)
    gaps = [
        (times[i], times[i + 1]) for i in range(len(times) - 1) if (i + 1) % STEPS_PER_EPOCH != 0
    ]
    before = [b - a for a, b in gaps if b < t0][-20:]
    spanning = [b - a for a, b in gaps if b >= t0 and a <= t1]
    if not before or not spanning:
        return float("nan")
    return 1000.0 * max(0.0, sum(spanning) - len(spanning) * statistics.median(before))


def wait_mid_epoch(path: Path, proc: subprocess.Popen[bytes]) -> None:
    """Until a step early in an epoch has started (no validation or save is near)."""
    while len(step_times(path)) % STEPS_PER_EPOCH not in range(4, 9):
        if proc.poll() is not None:
            raise SystemExit("the training ended")
        time.sleep(0.01)


TICKER = """
import sys, time, torch
out = open(sys.argv[1], "a", buffering=1)
last = time.perf_counter()
while True:
    time.sleep(0.001)
    now = time.perf_counter()
    if now - last > 0.02:
        out.write(f"{time.time()} {1000 * (now - last):.1f}\\n")
    last = now
"""


def stops(path: Path, t0: float, t1: float) -> float:
    """The main thread's longest stop (ms) that ended in [t0, t1 + 1]."""
    worst = 0.0
    for line in path.read_text().splitlines():
        ended, ms = (float(x) for x in line.split())
        if t0 <= ended <= t1 + 1.0:
            worst = max(worst, ms)
    return worst


def pause_trials(root: Path, trials: int) -> tuple[list[float], list[float]]:
    """The main thread's stop while a no-op is queued: notes' recipe, eagle3-tui's."""
    gdb = shutil.which("gdb")
    assert gdb is not None
    log = root / "ticker.log"
    noop = root / "noop.py"
    noop.write_text("pass\n")
    proc = subprocess.Popen([sys.executable, "-c", TICKER, str(log)], stdin=subprocess.DEVNULL)
    plain: list[float] = []
    ours: list[float] = []
    try:
        deadline = time.monotonic() + 120
        while pyprocess.python_of(proc.pid) is None or not any(
            "libtorch" in m for m in pyprocess.mapped_files(proc.pid)
        ):
            assert time.monotonic() < deadline, "the ticker did not start"
            time.sleep(0.1)
        time.sleep(2)
        py = pyprocess.python_of(proc.pid)
        assert py is not None
        for _ in range(trials):
            t0 = time.time()
            plain_recipe(proc.pid)
            time.sleep(1.5)
            plain.append(stops(log, t0, time.time()))
            t0 = time.time()
            debugger.inject_gdb(gdb, proc.pid, str(noop), py.libpython)
            time.sleep(1.5)
            ours.append(stops(log, t0, time.time()))
    finally:
        proc.kill()
        proc.wait()
    return plain, ours


def plain_recipe(pid: int) -> None:
    """The notes' recipe as written, queuing ``pass``."""
    subprocess.run(
        [
            "gdb", "-p", str(pid), "-batch", "-nx",
            "-ex", "set $buf = (char*) mmap(0, 4096, 3, 0x22, -1, 0)",
            "-ex", 'call (void) strcpy($buf, "pass")',
            "-ex", "call (int) Py_AddPendingCall((int (*)(void *)) PyRun_SimpleString, $buf)",
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )  # fmt: skip


def first_metric_seen(run_dir: Path, timeout: float = 60) -> float:
    """When a training step's record is first readable in metrics.jsonl."""
    path = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            for line in path.read_text().splitlines():
                if '"kind":"train"' in line.replace(" ", ""):
                    return time.time()
        except OSError:
            pass
        time.sleep(0.005)
    return float("nan")


def launch(out: Path, data: Path, times: Path) -> subprocess.Popen[bytes]:
    """The user's training, detached, its output in its log, no telemetry."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3_TUI_")}
    with open(out / "train.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, str(SCRIPT), "--out", str(out), "--data", str(data),
             "--epochs", "50", "--step-delay", str(PACE_S), "--step-times", str(times)],
            cwd=out, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=env, start_new_session=True,
        )  # fmt: skip


def prepare(data: Path) -> None:
    subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(data), "--data", str(data), "--prepare-only"],
        check=True,
        capture_output=True,
    )


async def one_trial(host: Host, root: Path, data: Path, label: str) -> dict[str, Any]:
    out = root / label
    out.mkdir()
    times = out / "step_times"
    proc = launch(out, data, times)
    try:
        wait_steps(times, 10, proc)
        wait_mid_epoch(times, proc)
        run_dir = out / "eagle3"
        plan = await attach_plan(host, str(run_dir), proc.pid)
        assert isinstance(plan, AttachPlan), plan
        confirmed = time.time()
        task = asyncio.ensure_future(attach_run(host, plan, metric_wait_s=0.0))
        seen = await asyncio.to_thread(first_metric_seen, run_dir)
        result = await task
        assert result.status == "attached", result
        wait_steps(times, 2, proc)  # the interval that ends after the first metric
        attach_seen = observed_pause(times, confirmed, seen)
        return {
            "first_metric_s": seen - confirmed,
            "stopped_ms": float(result.stopped_ms or "nan"),
            "attach_ms": float(result.pause_ms or "nan"),
            "attach_seen_ms": attach_seen,
        }
    finally:
        proc.kill()  # its sidecar sees the pipe close and exits
        proc.wait()


def med(rows: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in rows))


async def main_async(args: argparse.Namespace) -> int:
    if shutil.which("gdb") is None:
        print("gdb is not installed", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-attach-") as tmp:
        root = Path(tmp)
        plain, ours = await asyncio.to_thread(pause_trials, root, args.pause_trials)
        print(
            f"queuing a no-op into a PyTorch process, its main thread stopped (median of "
            f"{args.pause_trials}): notes' recipe {statistics.median(plain):.0f} ms "
            f"{[round(x) for x in plain]}, eagle3-tui {statistics.median(ours):.0f} ms "
            f"{[round(x) for x in ours]}: "
            f"{statistics.median(plain) / max(1.0, statistics.median(ours)):.1f}x shorter",
            flush=True,
        )
        data = root / "data"
        prepare(data)
        hosts: list[tuple[str, Host]] = [("local", LocalHost())]
        sshd = None
        if not args.no_ssh and os.geteuid() == 0 and shutil.which("/usr/sbin/sshd"):
            from eagle3_tui.transport.ssh import SshHost
            from eagle3_tui.transport.target import SshOptions, SshTarget

            sshd = Sshd(root / "sshd").start()
            target = SshTarget(ALIAS, None, None, SshOptions(config=(str(sshd.ssh_config),)))
            hosts.append(("ssh", SshHost(target)))
        rows: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in hosts}
        try:
            for trial in range(args.trials):
                for name, host in hosts:
                    row = await one_trial(host, root, data, f"{name}-{trial}")
                    rows[name].append(row)
                    print(
                        f"trial {trial} {name:5}: first metric {row['first_metric_s']:.2f} s "
                        f"after confirmation; gdb stopped it {row['stopped_ms']:.0f} ms, attach "
                        f"ran {row['attach_ms']:.0f} ms in the main thread, the training lost "
                        f"{row['attach_seen_ms']:.0f} ms",
                        flush=True,
                    )
        finally:
            for _, host in hosts:
                await host.close()
            if sshd is not None:
                sshd.stop()
    print()
    for name, got in rows.items():
        print(f"{name} ({len(got)} trials, medians):")
        print(f"  confirmation -> first metric     {med(got, 'first_metric_s'):.2f} s")
        print(f"  process stopped by gdb           {med(got, 'stopped_ms'):.0f} ms (reported)")
        print(f"  attach code in the main thread   {med(got, 'attach_ms'):.0f} ms (reported)")
        print(
            f"  step time lost by the training   {med(got, 'attach_seen_ms'):.0f} ms (seen; "
            "noisy where other jobs share the CPUs: the sidecar's start competes too)"
        )
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=3, help="trainings attached to, per host")
    p.add_argument("--pause-trials", type=int, default=5, help="no-op injections of each kind")
    p.add_argument("--no-ssh", action="store_true", help="only this machine's agent")
    ns = p.parse_args()
    # the attached runs register in an index of their own, not the user's
    with tempfile.TemporaryDirectory(prefix="bench-attach-state-") as state:
        os.environ["XDG_STATE_HOME"] = state
        return asyncio.run(main_async(ns))


if __name__ == "__main__":
    sys.exit(main())
