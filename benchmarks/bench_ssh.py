"""Streaming over SSH: eagle3-tui's transport against ``ssh HOST tail -F FILE``.

    python benchmarks/bench_ssh.py [--lines 400] [--interval 0.01] [--rounds 3]

Starts a private OpenSSH ``sshd`` on 127.0.0.1 (as the tests do) and prints,
measured in this one run over loopback:

- append-to-record latency, p50 and p95 (and their ratios): a writer thread appends one
  ~590-byte schema line every ``interval`` seconds with its ``perf_counter``
  time in it; the reader notes when the whole line reaches it. Baseline: the
  OpenSSH client running ``tail -F`` (started after the file exists, so it uses
  inotify), read through a pipe by this process. eagle3-tui: ``SshTransport``
  with the agent's inotify follow, chunks as the app gets them, carried by the
  ``ssh`` binary (what the monitor uses where one is installed) and, for
  comparison, by asyncssh in-process. Rounds alternate so all see the same load.
  Target: eagle3-tui p95 within 1.5x the baseline's.
- time to the first record after connect: from nothing to the first line of a
  file that already exists (TCP, key exchange, authentication, session, remote
  start-up), median of ``--connects`` tries each.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eagle3_tui.transport.base import Chunk
from eagle3_tui.transport.openssh import OpenSshHost
from eagle3_tui.transport.ssh import SshHost, SshTransport
from eagle3_tui.transport.target import SshOptions, SshTarget
from tests.transport.sshd import ALIAS, Sshd

PAD = "x" * 440  # brings a line to ~590 bytes, like a speculators train record


def line(seq: int) -> bytes:
    rec = {"v": 1, "seq": seq, "w": "bench", "t": time.perf_counter(), "kind": "log", "pad": PAD}
    return (json.dumps(rec) + "\n").encode()


def reset(path: Path) -> None:
    """The file with one warm-up line: the readers are following it before timing starts."""
    path.write_bytes(b'{"w":"warmup"}\n')


def writer(path: Path, n: int, interval: float, start: threading.Event) -> None:
    start.wait()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        for seq in range(n):
            os.write(fd, line(seq))
            time.sleep(interval)
    finally:
        os.close(fd)


class Lines:
    """Cuts whole lines out of a byte stream and records each line's latency."""

    def __init__(self, n: int) -> None:
        self.buf = b""
        self.n = n
        self.latencies: list[float] = []
        self.seen = 0
        self.done = asyncio.Event()

    def feed(self, data: bytes) -> None:
        now = time.perf_counter()
        self.buf += data
        *whole, self.buf = self.buf.split(b"\n")
        for raw in whole:
            rec = json.loads(raw)
            if rec.get("w") != "bench":
                continue
            self.latencies.append(now - rec["t"])
            self.seen += 1
            if self.seen >= self.n:
                self.done.set()


Follow = Callable[[Path, Lines, asyncio.Event], Coroutine[Any, Any, None]]
"""Follows a file until cancelled, feeding ``Lines``; sets the event once it streams."""


def ssh_cmd(sshd: Sshd, *remote: str) -> list[str]:
    return ["ssh", "-F", str(sshd.ssh_config), "-o", "BatchMode=yes", ALIAS, *remote]


async def run_round(
    follow: Follow,
    path: Path,
    n: int,
    interval: float,
) -> list[float]:
    reset(path)
    lines = Lines(n)
    ready = asyncio.Event()
    task = asyncio.ensure_future(follow(path, lines, ready))
    await asyncio.wait_for(ready.wait(), 30)
    start = threading.Event()
    t = threading.Thread(target=writer, args=(path, n, interval, start), daemon=True)
    t.start()
    start.set()
    await asyncio.wait_for(lines.done.wait(), 60 + n * interval * 4)
    t.join()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return lines.latencies


def baseline_follow(sshd: Sshd) -> Follow:
    async def follow(path: Path, lines: Lines, ready: asyncio.Event) -> None:
        proc = await asyncio.create_subprocess_exec(
            *ssh_cmd(sshd, "tail", "-n", "+1", "-F", str(path)),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            stdin=asyncio.subprocess.DEVNULL,
        )
        assert proc.stdout is not None
        try:
            first = await proc.stdout.readline()
            assert b"warmup" in first
            ready.set()
            while True:
                data = await proc.stdout.read(65536)
                if not data:
                    return
                lines.feed(data)
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()

    return follow


def eagle3_follow(target: SshTarget, client: str = "openssh") -> Follow:
    async def follow(path: Path, lines: Lines, ready: asyncio.Event) -> None:
        host: OpenSshHost | SshHost
        host = OpenSshHost(target) if client == "openssh" else SshHost(target)
        try:
            async for ev in SshTransport(host, str(path.parent)).stream(0):
                if isinstance(ev, Chunk):
                    if not ready.is_set():
                        ready.set()  # the warm-up line
                        continue
                    lines.feed(ev.data)
        finally:
            await host.close()

    return follow


async def first_record_baseline(sshd: Sshd, path: Path) -> float:
    t = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *ssh_cmd(sshd, "tail", "-n", "+1", "-F", str(path)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        stdin=asyncio.subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    await proc.stdout.readline()
    dt = time.perf_counter() - t
    proc.kill()
    await proc.wait()
    return dt


async def first_record_eagle3(target: SshTarget, path: Path, client: str) -> float:
    t = time.perf_counter()
    host: OpenSshHost | SshHost
    host = OpenSshHost(target) if client == "openssh" else SshHost(target)
    try:
        async for ev in SshTransport(host, str(path.parent)).stream(0):
            if isinstance(ev, Chunk):
                return time.perf_counter() - t
    finally:
        await host.close()
    raise RuntimeError("stream ended")


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1]


async def main_async(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="eagle3-bench-ssh-"))
    sshd = Sshd(root / "sshd", login_shell_rc=args.bashrc).start()
    target = SshTarget(ALIAS, options=SshOptions(config=(str(sshd.ssh_config),)))
    run_dir = root / "run"
    run_dir.mkdir()
    path = run_dir / "metrics.jsonl"
    clients = ("ssh tail -F", "eagle3-tui", "eagle3-tui/asyncssh")
    lat: dict[str, list[float]] = {name: [] for name in clients}
    rounds: dict[str, list[list[float]]] = {name: [] for name in clients}
    first: dict[str, list[float]] = {name: [] for name in clients}
    follows = {
        "ssh tail -F": baseline_follow(sshd),
        "eagle3-tui": eagle3_follow(target, "openssh"),
        "eagle3-tui/asyncssh": eagle3_follow(target, "asyncssh"),
    }
    try:
        for r in range(args.rounds):
            for name in clients:
                got = await run_round(follows[name], path, args.lines, args.interval)
                lat[name].extend(got)
                rounds[name].append(got)
                print(
                    f"round {r + 1} {name:<20} n={len(got)} p50 {1e3 * pct(got, 50):.3f} ms "
                    f"p95 {1e3 * pct(got, 95):.3f} ms",
                    flush=True,
                )
        for _ in range(args.connects):
            first["ssh tail -F"].append(await first_record_baseline(sshd, path))
            first["eagle3-tui"].append(await first_record_eagle3(target, path, "openssh"))
            first["eagle3-tui/asyncssh"].append(await first_record_eagle3(target, path, "asyncssh"))
    finally:
        sshd.stop()
    base = lat["ssh tail -F"]
    print()
    print(
        f"append-to-record latency over loopback sshd, {len(base)} lines each, "
        f"one every {1e3 * args.interval:.0f} ms ({'with' if args.bashrc else 'without'} "
        f"~/.bashrc on the host), load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs:"
    )
    print(f"  {'':<20} {'p50 ms':>8} {'p95 ms':>8} {'p50 x':>7} {'p95 x':>7}")
    for name in clients:
        xs = lat[name]
        r50, r95 = pct(xs, 50) / pct(base, 50), pct(xs, 95) / pct(base, 95)
        print(
            f"  {name:<20} {1e3 * pct(xs, 50):>8.3f} {1e3 * pct(xs, 95):>8.3f} "
            f"{r50:>6.2f}x {r95:>6.2f}x"
        )
    print("  p95 ratio per round (to the baseline's round just before), median of rounds:")
    for name in clients[1:]:
        per_round = [
            pct(mine, 95) / pct(theirs, 95)
            for mine, theirs in zip(rounds[name], rounds["ssh tail -F"], strict=True)
        ]
        print(f"  {name:<20} {statistics.median(per_round):>24.2f}x")
    r95 = pct(lat["eagle3-tui"], 95) / pct(base, 95)
    verdict = "meets" if r95 <= 1.5 else "MISSES"
    print(
        f"  eagle3-tui (the monitor's stream) at p95: {r95:.2f}x the baseline ({verdict} <= 1.5x)"
    )
    print(f"time to the first record after connect, median of {args.connects}:")
    for name in clients:
        print(f"  {name:<20} {1e3 * statistics.median(first[name]):8.1f} ms")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=400, help="lines per round and reader")
    p.add_argument("--interval", type=float, default=0.01, help="seconds between appends")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--connects", type=int, default=7, help="tries for time to first record")
    p.add_argument(
        "--bashrc",
        action="store_true",
        help="let the host's shell read ~/.bashrc on each exec (a realistic login shell)",
    )
    return asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
