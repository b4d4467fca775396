"""What the fleet screen costs: 10 live runs on 3 hosts, shown live in a real terminal.

    python benchmarks/bench_fleet.py [--seconds 60] [--runs 10] [--hosts 3]

As ``bench_watch.py``: three real OpenSSH sshd on 127.0.0.1 stand for three hosts, and
``--runs`` run directories on them are each fed as a live run writes (a training step
every 0.5 s; each second an 8-GPU sample, an 8-worker read sample and a heartbeat). The
fleet screen (``eagle3-tui fleet HOST:DIR …``, its defaults: a look every 10 s, the
table redrawn when a row changed) runs in a tmux window of 170×40. After a warm-up,
CPU time over ``--seconds`` is read from ``/proc``: the screen's process (and its
reaped children), and each host's (everything under its sshd). Printed: each as % of
one core, and the ratio to the goal.

Goal (issue 32): the fleet view following 10 runs on 3 hosts <= 1 % of a core.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_follow import cpu_seconds
from benchmarks.bench_watch import host_cpu, live_runs
from tests.transport.sshd import children

GOAL = 1.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=20.0)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--interval", type=float, default=None, help="the fleet's (its default)")
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    hosts, config, feeders, targets = live_runs(root, args.runs, args.hosts)
    session = f"bench-fleet-{os.getpid()}"
    argv = [sys.executable, "-m", "eagle3_tui", "fleet", "-F", str(config), *targets]
    if args.interval is not None:
        argv += ["--interval", str(args.interval)]
    env = f"XDG_STATE_HOME={root / 'state'} TERM=xterm-256color"
    cmd = f"env {env} {subprocess.list2cmdline(argv)}"
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "170", "-y", "40", cmd], check=True
    )
    try:
        pane = int(
            subprocess.run(
                ["tmux", "display", "-p", "-t", session, "#{pane_pid}"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        time.sleep(args.warmup)
        app = next((p for p in [pane, *children(pane)] if b"fleet" in cmdline(p)), pane)
        screen = subprocess.run(
            ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True
        ).stdout
        shown = sum(str(root / f"run{i}") in screen for i in range(args.runs))
        f0, h0, t0 = cpu_seconds(app), [host_cpu(h) for h in hosts], time.monotonic()
        time.sleep(args.seconds)
        f1, h1, t1 = cpu_seconds(app), [host_cpu(h) for h in hosts], time.monotonic()
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        for feeder in feeders:
            feeder.stop.set()
        for h in hosts:
            h.stop()
    wall = t1 - t0
    pct = 100 * (f1 - f0) / wall
    print(
        f"{args.runs} runs on {args.hosts} hosts, {wall:.0f} s measured after {args.warmup:.0f} s"
    )
    print(f"rows on the screen after the warm-up: {shown} of {args.runs}")
    print(f"fleet screen: {pct:.2f} % of a core (goal {GOAL} %: ratio {pct / GOAL:.2f})")
    for h, a, b in zip(hosts, h0, h1, strict=True):
        print(f"host {h.alias}: {100 * (b - a) / wall:.2f} % of a core")


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


if __name__ == "__main__":
    main()
