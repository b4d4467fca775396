"""Live attach: how long the trainer is paused, and how long until metrics flow.

    python benchmarks/bench_attach.py [--trials 2] [--pause-trials 20] [--no-ssh]

1. The main thread's pause, measured by the victim itself and as reported: a Python
   process with PyTorch loaded whose main thread either spins (busy) or sleeps 1 ms at
   a time (asleep) and notes every gap in its loop. Into each, a no-op line is queued
   ``--pause-trials`` times by eagle3-tui's injector (agent/ptrace.py) and, where gdb
   can call into a process on this machine, by eagle3-tui's gdb script (only
   libpython's and libc's symbols). Printed: median and worst of the stop each
   reported (the injector: the main thread stopped to let go; gdb: attach to detach)
   and of the longest gap the victim saw. Where gdb cannot call here (gdb 12/13 on a
   CPU with AMX) it says so and prints the injector's figures alone.
2. The real ``attach`` on a user's own speculators training launched without
   telemetry (``tests/attach/silent_training.py``, tiny model on the CPU, a 50 ms pace
   per step, detached): plan, then the confirmed injection, through the agent on this
   machine and over a private sshd on 127.0.0.1, by each mechanism. Injections are
   made mid-epoch (an epoch's end validates and saves for seconds). Printed:
   confirmation -> first metric (from the moment the inject request leaves until the
   first training step's record is readable in ``metrics.jsonl``); what attach reports
   (the stop, the attach code's time in the main thread); the step time the training
   lost from the confirmation to its first metric (the step intervals in between less
   as many median intervals).
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
from eagle3_tui.transport.calls import attach_plan, attach_run
from eagle3_tui.transport.channel import Host, LocalHost
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


VICTIM = """
import sys, time, torch
out = open(sys.argv[1], "a", buffering=1)
open(sys.argv[1] + ".ready", "w").close()
busy = sys.argv[2] == "busy"
last = time.perf_counter()
while True:
    if busy:
        sum(range(50))
        limit = 0.0002
    else:
        time.sleep(0.001)
        limit = 0.0012
    now = time.perf_counter()
    if now - last > limit:
        out.write(f"{time.time()} {1000 * (now - last):.3f}\\n")
    last = now
"""
"""A PyTorch process whose main thread notes every gap in its loop: busy (Python
arithmetic, a gap over 0.2 ms) or asleep (1 ms sleeps, one taking over 1.2 ms)."""


def longest_gap(path: Path, t0: float, t1: float) -> float:
    """The victim's longest gap (ms) that ended in [t0, t1 + 0.2 s]."""
    worst = 0.0
    for line in path.read_text().splitlines():
        ended, ms = (float(x) for x in line.split())
        if t0 <= ended <= t1 + 0.2:
            worst = max(worst, ms)
    return worst


def victim(root: Path, kind: str) -> tuple[subprocess.Popen[bytes], Path, str | None]:
    log = root / f"victim-{kind}.log"
    proc = subprocess.Popen(
        [sys.executable, "-c", VICTIM, str(log), kind], stdin=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 120
    while not Path(f"{log}.ready").exists():
        assert time.monotonic() < deadline and proc.poll() is None, "the victim did not start"
        time.sleep(0.1)
    time.sleep(1)
    py = pyprocess.python_of(proc.pid)
    assert py is not None
    return proc, log, py.libpython


def pause_trials(
    root: Path, trials: int, gdb: str | None
) -> dict[tuple[str, str], dict[str, list[float]]]:
    """A no-op line queued ``trials`` times into a busy and a sleeping victim by each
    mechanism (gdb: where it can call into a process here): the stop each reported (the
    injector: main thread stopped to let go; gdb: attach to detach) and the longest gap
    the victim saw; ``none``: the longest gap it sees in as long a window with nothing
    done (the machine's own noise)."""
    noop = root / "noop.py"
    noop.write_text("pass\n")
    out: dict[tuple[str, str], dict[str, list[float]]] = {}
    for kind in ("busy", "asleep"):
        proc, log, libpython = victim(root, "busy" if kind == "busy" else "sleep")
        try:
            for mechanism in ("none", "ptrace", "gdb") if gdb else ("none", "ptrace"):
                got: dict[str, list[float]] = {"reported": [], "seen": []}
                for _ in range(trials):
                    t0 = time.time()
                    if mechanism == "none":
                        done = {"queued": True, "stopped_ms": 0.0}
                    elif mechanism == "ptrace":
                        done = debugger.inject_ptrace(proc.pid, str(noop), libpython)
                    else:
                        assert gdb is not None
                        done = debugger.inject_gdb(gdb, proc.pid, str(noop), libpython)
                    t1 = time.time()
                    assert done["queued"], done
                    time.sleep(0.3)
                    got["reported"].append(float(done["stopped_ms"]))
                    got["seen"].append(longest_gap(log, t0, t1))
                out[(kind, mechanism)] = got
        finally:
            proc.kill()
            proc.wait()
    return out


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


async def one_trial(
    host: Host, root: Path, data: Path, label: str, mechanism: str
) -> dict[str, Any]:
    out = root / label
    out.mkdir()
    times = out / "step_times"
    proc = launch(out, data, times)
    try:
        wait_steps(times, 10, proc)
        wait_mid_epoch(times, proc)
        run_dir = out / "eagle3"
        asked = "gdb" if mechanism == "gdb" else None
        plan = await attach_plan(host, str(run_dir), proc.pid, mechanism=asked)
        assert isinstance(plan, AttachPlan) and plan.mechanism == mechanism, plan
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


def usable_gdb() -> str | None:
    """gdb, when it can call into a process on this machine; else says why not."""
    gdb = shutil.which("gdb")
    problem = "gdb is not on PATH" if gdb is None else debugger.gdb_call_problem(gdb)
    if problem is None:
        return gdb
    print(f"gdb cannot be compared here: {problem}", flush=True)
    print("the injector's figures alone follow", flush=True)
    return None


def print_pauses(pauses: dict[tuple[str, str], dict[str, list[float]]], trials: int) -> None:
    print(f"main thread's pause while a no-op line is queued ({trials} injections each):")
    for (kind, mechanism), got in pauses.items():
        who = {"none": "nothing", "ptrace": "injector"}.get(mechanism, mechanism)
        for what, values in got.items():
            if mechanism == "none" and what == "reported":
                continue
            print(
                f"  {kind:6} {who:8} {what:8}  median {statistics.median(values):7.2f} ms  "
                f"worst {max(values):7.2f} ms",
                flush=True,
            )
    for kind in ("busy", "asleep"):
        if (kind, "gdb") in pauses:
            ratio = statistics.median(pauses[(kind, "gdb")]["seen"]) / max(
                0.01, statistics.median(pauses[(kind, "ptrace")]["seen"])
            )
            print(f"  {kind}: the injector's pause is {ratio:.0f}x shorter than gdb's (seen)")


async def main_async(args: argparse.Namespace) -> int:
    gdb = usable_gdb()
    mechanisms = ["ptrace", "gdb"] if gdb else ["ptrace"]
    with tempfile.TemporaryDirectory(prefix="bench-attach-") as tmp:
        root = Path(tmp)
        pauses = await asyncio.to_thread(pause_trials, root, args.pause_trials, gdb)
        print_pauses(pauses, args.pause_trials)
        if args.trials < 1:
            return 0
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
        rows: dict[tuple[str, str], list[dict[str, Any]]] = {
            (name, m): [] for name, _ in hosts for m in mechanisms
        }
        try:
            for trial in range(args.trials):
                for name, host in hosts:
                    for m in mechanisms:
                        row = await one_trial(host, root, data, f"{name}-{m}-{trial}", m)
                        rows[(name, m)].append(row)
                        print(
                            f"trial {trial} {name:5} {m:6}: first metric "
                            f"{row['first_metric_s']:.2f} s after confirmation; stopped "
                            f"{row['stopped_ms']:.1f} ms, attach ran {row['attach_ms']:.0f} ms "
                            f"in the main thread, the training lost "
                            f"{row['attach_seen_ms']:.0f} ms",
                            flush=True,
                        )
        finally:
            for _, host in hosts:
                await host.close()
            if sshd is not None:
                sshd.stop()
    print()
    for (name, m), got in rows.items():
        print(f"{name}, {'injector' if m == 'ptrace' else 'gdb'} ({len(got)} trials, medians):")
        print(f"  confirmation -> first metric     {med(got, 'first_metric_s'):.2f} s")
        print(f"  stopped by the injection         {med(got, 'stopped_ms'):.1f} ms (reported)")
        print(f"  attach code in the main thread   {med(got, 'attach_ms'):.0f} ms (reported)")
        print(
            f"  step time lost by the training   {med(got, 'attach_seen_ms'):.0f} ms (seen; "
            "noisy where other jobs share the CPUs: the sidecar's start competes too)"
        )
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--trials", type=int, default=2, help="trainings attached to, per host and mechanism"
    )
    p.add_argument(
        "--pause-trials", type=int, default=20, help="no-op injections per victim and mechanism"
    )
    p.add_argument("--no-ssh", action="store_true", help="only this machine's agent")
    ns = p.parse_args()
    # the attached runs register in an index of their own, not the user's
    with tempfile.TemporaryDirectory(prefix="bench-attach-state-") as state:
        os.environ["XDG_STATE_HOME"] = state
        return asyncio.run(main_async(ns))


if __name__ == "__main__":
    sys.exit(main())
