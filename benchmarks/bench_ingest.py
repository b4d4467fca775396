"""Ingest, memory and downsampling of the model layer, against a plain json.loads loop.

    python benchmarks/bench_ingest.py [--steps-1m 1000000]

Prints, measured in this one run:
- 45,000-step log: a plain ``json.loads`` loop over the file's lines vs eagle3-tui's
  ingest into the run state (read, split, decode, store): time and ratio
  (target: ratio <= 0.25);
- the same with an 8-GPU sample per second interleaved;
- the training steps of a run with one lr per optimizer (Muon);
- resident memory of the run state after ingesting 1,000,000 steps (target: <= 200 MB);
- M4 downsampling time per series of 1,000,000 points (target: < 1 ms).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.records import mixed_lines, train_lines


def best_of(fn, repeat: int = 5) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def json_loop(path: Path) -> None:
    """The plain loop: iterate the file's lines, json.loads each."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            json.loads(line)


def json_loop_bytes(path: Path) -> None:
    """A tighter variant: read all bytes, split, json.loads each."""
    with open(path, "rb") as f:
        for line in f.read().splitlines():
            json.loads(line)


def ours(path: Path) -> None:
    """What `eagle3-tui summary` and the app's catch-up do: big reads, fed to the model."""
    from eagle3_tui.model.run import Run
    from eagle3_tui.transport.local import iter_chunks

    run = Run()
    for chunk in iter_chunks(path):
        run.feed(chunk.offset, chunk.data)
    assert run.state.train_steps > 0


def interleaved(
    a: Callable[[], object], b: Callable[[], object], repeat: int = 9
) -> tuple[list[float], list[float]]:
    """Times of each, measured alternately so that both see the same machine load."""
    ta: list[float] = []
    tb: list[float] = []
    for _ in range(repeat):
        for fn, out in ((a, ta), (b, tb)):
            gc.collect()
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
    return ta, tb


def compare(label: str, path: Path) -> float:
    """Best of 9 each, and the median of the 9 back-to-back pairs' ratios (this
    machine's speed drifts by up to 2x within minutes; a pair sees one speed)."""
    lines = path.read_bytes().count(b"\n")
    size = path.stat().st_size
    bases, mines = interleaved(lambda: json_loop(path), lambda: ours(path))
    base, mine = min(bases), min(mines)
    paired = statistics.median(m / b for b, m in zip(bases, mines, strict=True))
    tights, mines2 = interleaved(lambda: json_loop_bytes(path), lambda: ours(path), 5)
    tight, mine2 = min(tights), min(mines2)
    ratio = mine / base
    print(f"{label}: {lines:,} lines, {size / 1e6:.1f} MB")
    print(f"  json.loads loop (for line in file)   {base * 1000:8.1f} ms")
    print(
        f"  eagle3-tui ingest into the run state {mine * 1000:8.1f} ms   ratio {ratio:.3f}"
        f"  (median of paired runs {paired:.3f})  target <= 0.25"
    )
    print(
        f"  json.loads over bytes.splitlines()   {tight * 1000:8.1f} ms   "
        f"(ingest {mine2 * 1000:.1f} ms, ratio {mine2 / tight:.3f})"
    )
    return ratio


RSS_CHILD = """
import gc, os, sys, time
sys.path.insert(0, {root!r})
def rss():
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmRSS:'):
                return int(line.split()[1]) * 1024
from eagle3_tui.model.run import Run
from eagle3_tui.model.snapshot import build_snapshot, ViewParams
from benchmarks.records import train_lines
import numpy, msgspec
gc.collect()
before = rss()
run = Run()
offset = 0
buf = []
size = 0
t = time.perf_counter()
for line in train_lines({n}):
    buf.append(line); size += len(line)
    if size > 4_000_000:
        data = b''.join(buf); run.feed(offset, data); offset += len(data); buf = []; size = 0
data = b''.join(buf); run.feed(offset, data)
elapsed = time.perf_counter() - t
gc.collect()
after = rss()
snap = build_snapshot(run.state, time.time(), ViewParams(columns=120))
print(run.state.train_steps, before, after, run.state.table.nbytes(), elapsed)
"""


def rss_1m(n: int) -> None:
    root = str(Path(__file__).resolve().parent.parent)
    out = subprocess.run(
        [sys.executable, "-c", RSS_CHILD.format(root=root, n=n)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    steps, before, after, table, elapsed = (
        int(out[0]),
        int(out[1]),
        int(out[2]),
        int(out[3]),
        float(out[4]),
    )
    print(
        f"{steps:,}-step run state: RSS +{(after - before) / 2**20:.0f} MiB over the interpreter "
        f"(total {after / 2**20:.0f} MiB; typed columns {table / 2**20:.0f} MiB; "
        f"ingested in {elapsed:.1f} s)   target: <= 200 MB"
    )


def downsample_1m() -> None:
    import numpy as np

    from eagle3_tui.model.downsample import m4

    rng = np.random.default_rng(0)
    x = np.arange(1_000_000, dtype=np.float64)
    y = rng.random(1_000_000).astype(np.float32)  # the table's columns are float32
    y[123_456] = 50.0
    known = best_of(lambda: m4(x, y, 480, False), repeat=20)  # as the snapshot calls it
    checked = best_of(lambda: m4(x, y, 480), repeat=20)
    xs, ys = m4(x, y, 480, False)
    print(
        f"M4 downsampling, 1,000,000 points -> {len(xs)} (480 buckets): "
        f"{known * 1000:.2f} ms per series (finiteness known from the table; "
        f"{checked * 1000:.2f} ms when checked)   spike kept: {ys.max() == 50.0}   target: < 1 ms"
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=45_000)
    p.add_argument("--steps-1m", type=int, default=1_000_000)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "metrics.jsonl"
        path.write_bytes(b"".join(train_lines(a.steps)))
        compare(f"{a.steps:,} training steps", path)
        mixed = Path(d) / "mixed.jsonl"
        mixed.write_bytes(b"".join(mixed_lines(a.steps)))
        compare(
            f"{a.steps:,} steps + per second an 8-GPU, an 8-worker IO sample, a heartbeat", mixed
        )
        muon = Path(d) / "muon.jsonl"
        muon.write_bytes(
            re.sub(rb'"lr":([-0-9.e+]+)', rb'"lr":{"Muon":\1,"AdamW":\1}', path.read_bytes())
        )
        compare(f"{a.steps:,} training steps, one lr per optimizer (Muon + AdamW)", muon)
        del path, mixed, muon
    downsample_1m()
    rss_1m(a.steps_1m)
    print(f"(python {sys.version.split()[0]}, {os.cpu_count()} cpus)")


if __name__ == "__main__":
    main()
