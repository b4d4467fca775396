"""What ``eagle3-tui watch`` costs: 10 live runs on 3 hosts, followed for a while.

    python benchmarks/bench_watch.py [--seconds 60] [--runs 10] [--hosts 3]

Three real OpenSSH sshd on 127.0.0.1 (``tests/transport/sshd.py``) stand for three
hosts; on them ``--runs`` run directories, each fed as a live run writes (a training
step every 0.5 s and, each second, an 8-GPU sample, an 8-worker read sample and a
heartbeat: ``bench_follow.Feeder``) with a live manifest (this process as its trainer,
so its probes are answered as a real run's). One watcher (``eagle3-tui watch
HOST:DIR …`` with its defaults) follows them all. After a warm-up, CPU time over
``--seconds`` of wall time is read from ``/proc``: the watcher's (itself and its reaped
children), and each host's (every process under its sshd: the per-connection sshd,
the agents; reaped ones through their parents). Printed: each as % of one core, and
the ratio to the goal.

Goals (issue 30): <= 0.5 % of a core on the watcher's machine; <= 0.2 % per host.
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

from benchmarks.bench_follow import Feeder, cpu_seconds
from eagle3_tui.telemetry.manifest import build_manifest, new_run_id, write_manifest
from tests.transport.sshd import Sshd, children

WATCHER_GOAL, HOST_GOAL = 0.5, 0.2


def host_cpu(sshd: Sshd) -> float:
    """CPU seconds of everything under the host's sshd listener (live and reaped)."""
    assert sshd.proc is not None
    total = 0.0
    todo = [sshd.proc.pid]
    while todo:
        pid = todo.pop()
        try:
            total += cpu_seconds(pid, children=False)
            raw = Path(f"/proc/{pid}/stat").read_text()
            f = raw[raw.rfind(")") + 2 :].split()
            total += (int(f[13]) + int(f[14])) / os.sysconf("SC_CLK_TCK")  # reaped children
        except (OSError, IndexError):
            continue
        todo.extend(children(pid))
    return total


def live_runs(
    root: Path, runs: int, hosts: int
) -> tuple[list[Sshd], Path, list[Feeder], list[str]]:
    """``hosts`` sshd (aliases h0, h1…, one ssh config for all) and ``runs`` run
    directories on them, each fed as a live run writes: the hosts, the config, the
    feeders (set ``stop`` to end them) and the targets (``hN:DIR``)."""
    servers = [Sshd(root / f"host{i}", alias=f"h{i}").start() for i in range(hosts)]
    config = root / "ssh_config"
    config.write_text("".join(h.ssh_config.read_text() for h in servers))
    feeders: list[Feeder] = []
    targets = []
    for i in range(runs):
        host = servers[i % len(servers)]
        run_dir = root / f"run{i}"
        run_dir.mkdir()
        write_manifest(run_dir / "run.json", build_manifest(run_dir, run_id=new_run_id()))
        feeder = Feeder(run_dir / "metrics.jsonl", 0, 0)
        feeder.start()
        feeders.append(feeder)
        targets.append(f"{host.alias}:{run_dir}")
    return servers, config, feeders, targets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=20.0)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--hosts", type=int, default=3)
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-watch-"))
    hosts, config, feeders, targets = live_runs(root, args.runs, args.hosts)
    env = dict(os.environ, XDG_STATE_HOME=str(root / "state"))
    log = open(root / "watch.log", "wb")  # noqa: SIM115 - the child's
    watcher = subprocess.Popen(
        [sys.executable, "-m", "eagle3_tui", "watch", "-F", str(config), *targets],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        time.sleep(args.warmup)
        w0, h0, t0 = cpu_seconds(watcher.pid), [host_cpu(h) for h in hosts], time.monotonic()
        time.sleep(args.seconds)
        w1, h1, t1 = cpu_seconds(watcher.pid), [host_cpu(h) for h in hosts], time.monotonic()
    finally:
        watcher.terminate()
        watcher.wait(30)
        for feeder in feeders:
            feeder.stop.set()
        for h in hosts:
            h.stop()
    wall = t1 - t0
    watcher_pct = 100 * (w1 - w0) / wall
    print(
        f"{args.runs} runs on {args.hosts} hosts, {wall:.0f} s measured after {args.warmup:.0f} s"
    )
    print(
        f"watcher: {watcher_pct:.2f} % of a core "
        f"(goal {WATCHER_GOAL} %: ratio {watcher_pct / WATCHER_GOAL:.2f})"
    )
    for h, a, b in zip(hosts, h0, h1, strict=True):
        pct = 100 * (b - a) / wall
        ratio = pct / HOST_GOAL
        print(f"host {h.alias}: {pct:.2f} % of a core (goal {HOST_GOAL} %: ratio {ratio:.2f})")
    said = (root / "watch.log").read_text(errors="replace").strip().splitlines()
    print(f"watcher said {len(said)} line(s); the last: {said[-1] if said else '-'}")


if __name__ == "__main__":
    main()
