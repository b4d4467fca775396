"""What keeping ``metrics.cols`` costs the writer (telemetry/columns.py).

    python benchmarks/bench_columns.py [--steps 20000] [--rounds 3]

The real :class:`JsonlWriter` writes ``--steps`` training steps as speculators logs
them (``write_deferred`` of 11 metrics, 10 profile timings, lr, epoch; random
doubles) with the companion and without it. Printed: the writer thread's CPU per
step (it encodes, writes and, with the companion, parses each step once more and
packs a block every 1024 steps; the training loop's side is the same either way),
and the companion's size against the JSON lines'. Medians of ``--rounds``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eagle3_tui.telemetry.columns import COLUMNS_FILE
from eagle3_tui.telemetry.writer import JsonlWriter

PROFILE = "fetch_ms fwd_ms bwd_ms opt_ms step_ms tokens_per_s fetch_frac queue_ms h2d_ms clip_ms"


def payload(rng: random.Random) -> dict[str, object]:
    train = {f"{m}_{k}": rng.random() for k in range(3) for m in ("loss", "full_acc", "cond_acc")}
    train |= {"loss": rng.random() * 6, "error_records": 0.0}
    return {
        "train": train,
        "profile": {p: rng.random() * 500 for p in PROFILE.split()},
        "epoch": 0,
        "lr": rng.random() * 1e-4,
    }


def one(steps: int, columns: bool) -> tuple[float, int, int]:
    """Writer-thread CPU seconds, JSON bytes, companion bytes."""
    rng = random.Random(0)
    items = [payload(rng) for _ in range(steps)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "metrics.jsonl"
        w = JsonlWriter(path, columns=columns)
        for i, p in enumerate(items):
            w.write_deferred("train", p, step=i)
            if i % 64 == 0:
                time.sleep(0.001)  # let the writer thread drain as it does between steps
        w.close()
        cpu = float(w.figures()["writer_cpu_s"])
        comp = path.with_name(COLUMNS_FILE)
        return cpu, path.stat().st_size, comp.stat().st_size if comp.exists() else 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=3)
    ns = p.parse_args()
    with_c, without, sizes = [], [], []
    for _ in range(ns.rounds):
        cpu0, _, _ = one(ns.steps, False)
        cpu1, jsonl, cols = one(ns.steps, True)
        without.append(cpu0 / ns.steps)
        with_c.append(cpu1 / ns.steps)
        sizes.append(cols / jsonl)
    a, b = statistics.median(without) * 1e6, statistics.median(with_c) * 1e6
    print(f"{ns.steps:,} steps, medians of {ns.rounds} rounds:")
    print(f"  writer thread CPU per step: {a:6.1f} µs without the companion, {b:6.1f} µs with")
    print(f"  the companion adds {b - a:.1f} µs a step ({b / a:.2f}x the writer thread's own work)")
    print(f"  companion size: {statistics.median(sizes):.3f} of the JSON lines'")


if __name__ == "__main__":
    main()
