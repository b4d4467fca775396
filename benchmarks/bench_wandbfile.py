"""Reading a long W&B run file on the host: the agent's reader (agent/wandbfile.py,
standard library) against W&B's own reader of the same file (wandb-core's, as
``wandb leet inspect --json`` runs it: wandb 0.31 has no Python reader left), against
the agent's framing with W&B's protobuf classes (``Record.FromString`` and
``json.loads`` of each value: what a reader with wandb installed would do), and
``cat`` of the file (the floor: the bytes alone).

    python benchmarks/bench_wandbfile.py [--steps 20000] [--rounds 3]

The file is written by the real wandb, offline, as speculators' ``WandbHandler`` logs
(``run.log(flat_dict, step=step)``): the train dict of 15 keys per step (loss, three
losses and six accuracies of the TTT steps, two profile figures, epoch, lr,
global_step) and a validation dict per 1000 steps. Writing it takes a while (~2 ms a
step here); it is kept under ``--dir`` for the next run. Rounds alternate; medians and
the medians of per-round ratios.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eagle3_tui.agent import wandbfile

WRITER = """
import sys, wandb
steps = int(sys.argv[2])
run = wandb.init(dir=sys.argv[1], name="bench", config={})
for step in range(steps):
    flat = {"train/loss": 2.0 / (step + 1), "epoch": step // 1000, "lr": 3e-4,
            "profile/step_ms": 250.0 + step % 7, "profile/fetch_ms": 3.5, "global_step": step}
    for i in range(3):
        flat[f"train/loss_{i}"] = 1.0 / (step + i + 1)
        flat[f"train/full_acc_{i}"] = step / steps / (i + 1)
        flat[f"train/cond_acc_{i}"] = 0.9 - i / 10
    run.log(flat, step=step)
    if step % 1000 == 999:
        run.log({"val/loss_epoch": 1.0 / (step + 1), "epoch": step // 1000}, step=step + 1)
run.finish()
"""


def env(home: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DIR": str(home),
    }


def run_file(where: Path, steps: int) -> Path:
    """The run file of ``steps`` steps under ``where`` (written once, then kept)."""
    found = sorted(where.glob(f"s{steps}/wandb/*/run-*.wandb"))
    if found:
        return found[-1]
    (where / f"s{steps}").mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", WRITER, str(where / f"s{steps}"), str(steps)],
        env=env(where),
        check=True,
    )
    print(f"wrote {steps} steps with wandb in {time.perf_counter() - t0:.1f} s")
    return sorted(where.glob(f"s{steps}/wandb/*/run-*.wandb"))[-1]


def ours(path: Path) -> int:
    """Rows read as a follower reads: :data:`READ_BYTES` looks from the kept offset, each
    row made into speculators' dicts."""
    framing = wandbfile.Framing()
    dicts = 0
    offset = 0
    with open(path, "rb") as f:
        while True:
            f.seek(offset)
            data = f.read(wandbfile.READ_BYTES)
            rows, used = wandbfile.history(data, framing, offset)
            for row in rows:
                dicts += len(wandbfile.metric_dicts(*row))
            if not used:
                break
            offset += used
    return dicts


def with_protobuf(path: Path) -> int:
    """The same framing, the records decoded by wandb's own protobuf classes."""
    pb = importlib.import_module("wandb.proto.wandb_internal_pb2")
    bodies, _ = wandbfile.records(path.read_bytes(), wandbfile.Framing())
    rows = 0
    for body in bodies:
        rec = pb.Record.FromString(body)
        if rec.HasField("history"):
            values = {
                (i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                for i in rec.history.item
            }
            rows += bool(values)
    return rows


def theirs(path: Path, home: Path) -> int:
    """W&B's own reader: ``wandb leet inspect --json`` (wandb-core), its history lines."""
    out = subprocess.run(
        [str(Path(sys.executable).parent / "wandb"), "leet", "inspect", "--json", str(path)],
        env=env(home),
        capture_output=True,
        check=True,
    ).stdout
    return out.count(b'"type":"history"')


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/bench_wandbfile"))
    args = ap.parse_args()
    path = run_file(args.dir, args.steps)
    size = path.stat().st_size
    print(f"{path.name}: {size / 1e6:.1f} MB, {args.steps} steps")
    times: dict[str, list[float]] = {"ours": [], "protobuf": [], "wandb": [], "cat": []}
    counts: dict[str, int] = {}
    readers: dict[str, Callable[[], int]] = {
        "ours": lambda: ours(path),
        "protobuf": lambda: with_protobuf(path),
        "wandb": lambda: theirs(path, args.dir),
        "cat": lambda: len(subprocess.run(["cat", str(path)], capture_output=True).stdout),
    }
    for _ in range(args.rounds):
        for name, fn in readers.items():
            t0 = time.perf_counter()
            counts[name] = fn()
            times[name].append(time.perf_counter() - t0)
    expected = args.steps + args.steps // 1000
    assert counts["ours"] == expected, (counts, expected)  # dicts: train + validation
    assert counts["wandb"] == counts["protobuf"] == args.steps + 1, counts  # rows (a last val)
    for name, t in times.items():
        print(f"{name:>9}: {statistics.median(t):6.3f} s")
    for other in ("wandb", "protobuf", "cat"):
        ratio = statistics.median(a / b for a, b in zip(times["ours"], times[other], strict=True))
        print(f"ours / {other}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
