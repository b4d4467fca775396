"""Catching up with a long run over a slow link: eagle3-tui against ``ssh HOST cat``.

    python benchmarks/bench_catchup.py [--steps 200000] [--rate 12.5e6] [--rounds 3]

Starts a private OpenSSH ``sshd`` on 127.0.0.1 (as the tests do) behind a relay
(benchmarks/relay.py) that lets ``--rate`` bytes a second through each way (12.5e6:
100 Mbit/s) and counts them. The run's metrics.jsonl has ``--steps`` steps of
benchmarks/records.py's train records (~787 bytes each: 157 MB for 200,000 steps, the
issue's figure); ``--dt S`` adds the sidecar's GPU, I/O and heartbeat records every
second of S-second steps (mixed_lines: ~2.5 KB a step at S = 0.5).
Everything goes through the relay, connection set-up included, and prints:

- baseline: ``ssh HOST cat RUN/metrics.jsonl >/dev/null``, its time and bytes on the wire;
- ``eagle3-tui summary HOST:RUN --json`` (the real command, a process of its own):
  time until it has printed, and bytes on the wire;
- the monitor's first full frame: its data path (app/pipeline.py: the SSH stream
  carried by the ``ssh`` binary, the ingest in a worker thread) from nothing until
  the whole file as it was at connection time is in the model and a snapshot of it
  is built (what the panels draw; drawing them adds ~40-80 ms, benchmarks/bench_app.py);
  three ways: as the monitor asks (the steps as columns from the run's companion file,
  telemetry/columns.py, the other lines zlib-packed), zlib-packed lines only (no
  ``"columns"`` in the request), and plain (no ``"compress"`` either).

The file is written as lines (not by the real writer, which keeps the companion as
it writes), so its companion is made first with ``index_file(as_written=True)``: its
blocks closed where the live writer closes them (every 1,024 rows, or 300 s of the
lines' own time after a block's first line, whichever comes first).

Rounds alternate (baseline, summary, frame, zlib, plain, ...) so all see the same
load; medians, and medians of the per-round ratios to the baseline.
Targets (issue 15): summary and first frame <= 2.5 s, catch-up bytes <= 1/10 of the file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.records import mixed_lines, train_line, train_lines
from eagle3_tui.app.pipeline import Pipeline
from eagle3_tui.model.snapshot import ViewParams
from eagle3_tui.telemetry.column_log import index_file
from eagle3_tui.transport.base import Link, LinkChanged
from eagle3_tui.transport.openssh import OpenSshHost
from eagle3_tui.transport.ssh import SshTransport
from eagle3_tui.transport.target import SshOptions, SshTarget
from tests.transport.sshd import ALIAS, Sshd

HERE = Path(__file__).resolve().parent


def make_file(path: Path, steps: int, dt: float | None) -> int:
    cache = Path(tempfile.gettempdir()) / f"eagle3-bench-catchup-{steps}-{dt}.jsonl"
    if not cache.exists():
        t = time.perf_counter()
        part = cache.with_suffix(".part")
        lines = train_lines(steps) if dt is None else mixed_lines(steps, dt=dt)
        with open(part, "wb") as out:
            for line in lines:
                out.write(line)
        os.replace(part, cache)
        print(f"generated {cache} in {time.perf_counter() - t:.0f} s")
    if path.exists():
        path.unlink()
    shutil.copyfile(cache, path)  # a copy: the live tail is appended to it
    # the companion the writer keeps as it goes (telemetry/columns.py), for this copy
    t = time.perf_counter()
    blocks = index_file(str(path), as_written=True)  # blocks closed as a live writer's are
    print(f"indexed {blocks} blocks of steps in {time.perf_counter() - t:.0f} s")
    return path.stat().st_size


class SlowLink:
    """The relay process and its counters."""

    def __init__(self, target_port: int, rate: float, delay: float, root: Path) -> None:
        self.stats = root / "relay.json"
        self.proc = subprocess.Popen(
            [
                *(sys.executable, str(HERE / "relay.py"), str(target_port)),
                *("--rate", str(rate), "--delay", str(delay), "--stats", str(self.stats)),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def totals(self) -> dict[str, int]:
        while True:
            try:
                return dict(json.loads(self.stats.read_text()))
            except (OSError, ValueError):
                time.sleep(0.05)

    def idle(self) -> dict[str, int]:
        """The totals once no connection is open."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            t = self.totals()
            if t["open"] == 0:
                time.sleep(0.15)
                t = self.totals()
                if t["open"] == 0:
                    return t
            time.sleep(0.05)
        raise RuntimeError("a connection through the relay did not close")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def config_through(sshd: Sshd, port: int, root: Path) -> Path:
    cfg = root / "ssh_config_relay"
    text = sshd.ssh_config.read_text().replace(f"Port {sshd.port}", f"Port {port}")
    cfg.write_text(text)
    with open(sshd.known_hosts, "a") as f:
        f.write(f"[127.0.0.1]:{port} {sshd.host_public}\n")
    return cfg


def baseline(cfg: Path, path: Path) -> float:
    t = time.perf_counter()
    subprocess.run(
        ["ssh", "-F", str(cfg), "-o", "BatchMode=yes", ALIAS, f"cat {path}"],
        stdout=subprocess.DEVNULL,
        check=True,
    )
    return time.perf_counter() - t


def summary(cfg: Path, run_dir: Path, steps: int) -> float:
    t = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "eagle3_tui",
            "summary",
            "-F",
            str(cfg),
            f"{ALIAS}:{run_dir}",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    took = time.perf_counter() - t
    out = json.loads(proc.stdout)
    step = out.get("global_step")
    if not isinstance(step, int) or step < steps - 1:
        raise RuntimeError(f"summary saw step {step}, not {steps - 1}")
    return took


class Tail:
    """The live tail: a train record appended every ``every`` seconds while the client
    catches up; when each was written and where it ends in the file."""

    def __init__(self, path: Path, first_step: int, every: float = 0.25) -> None:
        self.path = path
        self.step = first_step
        self.every = every
        self.written: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        rng = random.Random(self.step)
        with open(self.path, "ab") as out:
            while not self.stop.wait(self.every):
                out.write(train_line(self.step, self.step, time.time(), rng))
                out.flush()
                self.written.append((time.perf_counter(), out.tell()))
                self.step += 1


async def first_frame(
    cfg: Path, run_dir: Path, how: str, tail: Tail
) -> tuple[float, int, list[tuple[bool, float]]]:
    """Seconds from nothing to the snapshot of the whole file as it was when the stream
    opened; the steps it shows; the lags of the records appended meanwhile and in the
    second after (whether written during the catch-up; seconds from write to ingestion)."""
    t = time.perf_counter()
    target = SshTarget(ALIAS, None, str(run_dir), SshOptions(config=(str(cfg),)))
    pipeline = Pipeline()
    size: list[int] = []
    arrived: list[tuple[float, int]] = []  # (when, offset ingested up to)

    def on_link(ev: LinkChanged) -> None:
        if ev.link == Link.CONNECTED and ev.size is not None:
            size.append(ev.size)
        elif ev.link == Link.REFUSED:
            raise RuntimeError(ev.detail)

    transport = SshTransport(
        OpenSshHost(target), str(run_dir), compress=how != "plain", columns=how == "frame"
    )
    tasks = [
        asyncio.ensure_future(pipeline.pump(transport, on_link)),
        asyncio.ensure_future(pipeline.ingest()),
    ]
    tail.thread.start()
    took: float | None = None
    steps = 0
    try:
        while took is None or time.perf_counter() - t < took + 1.0:
            for task in tasks:
                if task.done():
                    task.result()
            await asyncio.sleep(0.005)
            arrived.append((time.perf_counter(), pipeline.run.reader.next_offset))
            if (
                took is None
                and size
                and pipeline.run.reader.next_offset >= size[0]
                and not pipeline._pending
            ):
                await pipeline.snapshot(time.time(), ViewParams(columns=110))
                took = time.perf_counter() - t
                steps = pipeline.run.state.train_steps
    finally:
        tail.stop.set()
        tail.thread.join()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert took is not None
    lags = []
    for when, end in tail.written:
        got = next((a for a, off in arrived if off >= end and a >= when), None)
        if got is not None:
            lags.append((when - t < took, got - when))
    return took, steps, lags


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=200_000)
    p.add_argument("--dt", type=float, default=None, help="add sidecar records (1 Hz)")
    p.add_argument("--rate", type=float, default=12.5e6, help="bytes/s each way (100 Mbit/s)")
    p.add_argument("--delay", type=float, default=0.0, help="one-way latency, s")
    p.add_argument("--rounds", type=int, default=3)
    ns = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-catchup-") as tmp:
        root = Path(tmp)
        run_dir = root / "run"
        run_dir.mkdir()
        path = run_dir / "metrics.jsonl"
        size = make_file(path, ns.steps, ns.dt)
        print(f"{ns.steps:,} steps: {size / 1e6:.1f} MB; link {ns.rate * 8 / 1e6:.0f} Mbit/s")
        sshd = Sshd(root / "sshd").start()
        link = SlowLink(sshd.port, ns.rate, ns.delay, root)
        cfg = config_through(sshd, link.port, root)
        rows: dict[str, list[tuple[float, int]]] = {
            k: [] for k in ("cat", "summary", "frame", "zlib", "plain")
        }
        tails: dict[str, list[list[tuple[bool, float]]]] = {"frame": [], "zlib": [], "plain": []}
        next_step = ns.steps
        try:
            for r in range(ns.rounds):
                for name in rows:
                    before = link.idle()
                    if name == "cat":
                        took = baseline(cfg, path)
                    elif name == "summary":
                        took = summary(cfg, run_dir, ns.steps)
                    else:
                        tail = Tail(path, next_step)
                        took, steps, lags = asyncio.run(first_frame(cfg, run_dir, name, tail))
                        next_step = tail.step
                        if steps < ns.steps:
                            raise RuntimeError(f"the first frame has {steps} steps")
                        tails[name].append(lags)
                    after = link.idle()
                    wire = sum(after[k] - before[k] for k in ("up", "down"))
                    rows[name].append((took, wire))
                    print(
                        f"  round {r + 1} {name:8} {took:6.2f} s  {wire / 1e6:8.2f} MB on the wire"
                    )
        finally:
            link.stop()
            sshd.stop()
    base_t = [t for t, _ in rows["cat"]]
    base_b = [b for _, b in rows["cat"]]
    print(f"\nmedians of {ns.rounds} rounds ({size / 1e6:.1f} MB file):")
    labels = {
        "cat": "ssh HOST cat metrics.jsonl",
        "summary": "eagle3-tui summary",
        "frame": "first full frame",
        "zlib": "first full frame, zlib only",
        "plain": "first full frame, plain",
    }
    for name, label in labels.items():
        ts = [t for t, _ in rows[name]]
        bs = [b for _, b in rows[name]]
        tr = statistics.median(t / b for t, b in zip(ts, base_t, strict=True))
        br = statistics.median(b / c for b, c in zip(bs, base_b, strict=True))
        print(
            f"  {label:28} {statistics.median(ts):6.2f} s ({tr:5.2f}x cat)  "
            f"{statistics.median(bs) / 1e6:8.2f} MB on the wire ({br:5.3f}x cat, "
            f"{statistics.median(bs) / size:5.3f} of the file)"
        )
    for name in ("frame", "zlib", "plain"):
        during = [max((lag for d, lag in r if d), default=0.0) for r in tails[name]]
        late = [lag for r in tails[name] for d, lag in r if not d]
        print(
            f"  live tail ({labels[name]}; a record every 0.25 s): written during the catch-up, "
            f"the oldest arrived {statistics.median(during):.2f} s after its write (median "
            f"of rounds); written after it: median lag {statistics.median(late) * 1000:.0f} ms"
        )
    for name in ("summary", "frame"):
        t = statistics.median(x for x, _ in rows[name])
        b = statistics.median(x for _, x in rows[name]) / size
        ok = "ok" if t <= 2.5 and b <= 0.1 else "NOT MET"
        print(f"  target {name}: <= 2.5 s and <= 1/10 of the file: {ok}")


if __name__ == "__main__":
    main()
