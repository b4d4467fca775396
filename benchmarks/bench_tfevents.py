"""Reading a long run's TensorBoard event files on the host: the agent's reader
(agent/tfevents.py through observe.EventFollower, standard library) against
TensorBoard's own loader of the same directory (its ``EventAccumulator``, the anchor)
and ``cat`` of the files (the floor: the bytes alone).

    python benchmarks/bench_tfevents.py [--steps 200000] [--rounds 3]

The file holds what speculators' TensorBoard backend writes per step: one scalar event
per flattened key of the train dict (15 keys: loss, three losses and six accuracies
of the TTT steps, two profile figures, epoch, lr, global_step), framed and encoded as
PyTorch's ``SummaryWriter`` does (float32 ``simple_value``; checked here against
TensorBoard's loader), written by a fast encoder (the real writer takes ~1.5 ms a
step). Rounds alternate; medians and the medians of per-round ratios.
"""

from __future__ import annotations

import argparse
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eagle3_tui.agent import tfevents
from eagle3_tui.agent.observe import EventFollower

KEYS = (
    "train/loss", "train/loss_0", "train/loss_1", "train/loss_2",
    "train/full_acc_0", "train/full_acc_1", "train/full_acc_2",
    "train/cond_acc_0", "train/cond_acc_1", "train/cond_acc_2",
    "profile/step_ms", "profile/fetch_ms", "epoch", "lr", "global_step",
)  # fmt: skip


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    head = _varint(number << 3 | wire)
    return head + (_varint(len(payload)) + payload if wire == 2 else payload)


def event(wall: float, step: int, tag: str, value: float) -> bytes:
    value_msg = _field(1, 2, tag.encode()) + _field(2, 5, struct.pack("<f", value))
    summary = _field(1, 2, value_msg)
    return (
        _field(1, 1, struct.pack("<d", wall)) + _field(2, 0, _varint(step)) + _field(5, 2, summary)
    )


def frame(body: bytes) -> bytes:
    head = struct.pack("<Q", len(body))
    return (
        head
        + struct.pack("<I", tfevents.masked_crc(head))
        + body
        + struct.pack("<I", tfevents.masked_crc(body))
    )


def write_run(path: Path, steps: int) -> None:
    t0 = 1_796_000_000.0
    with open(path, "wb") as f:
        f.write(frame(_field(1, 1, struct.pack("<d", t0)) + _field(3, 2, b"brain.Event:2")))
        for step in range(steps):
            wall = t0 + step * 0.5
            values = {k: 1.0 / (1 + step + i) for i, k in enumerate(KEYS)}
            values.update(epoch=step // 1000, global_step=step, lr=3e-4)
            f.write(b"".join(frame(event(wall, step, k, v)) for k, v in values.items()))


class Count:
    def __init__(self) -> None:
        self.train = 0

    def write(self, kind: str, *_: object, **__: object) -> bool:
        self.train += kind == "train"
        return True


def ours(path: Path) -> tuple[float, int]:
    t = time.perf_counter()
    sink = Count()
    f = EventFollower(str(path), sink)  # type: ignore[arg-type]
    while True:
        before = f._read_to
        f.poll(0.0)
        if f._read_to == before:
            break
    return time.perf_counter() - t, sink.train


def theirs(folder: Path) -> tuple[float, int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    t = time.perf_counter()
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return time.perf_counter() - t, len(acc.Scalars("train/loss"))


def cat(path: Path) -> float:
    t = time.perf_counter()
    subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = folder / "events.out.tfevents.1796000000.host.4242.0"
        write_run(path, a.steps)
        size = path.stat().st_size
        print(f"{a.steps:,} steps, {len(KEYS)} scalars a step: {size / 1e6:.1f} MB")
        rows: dict[str, list[float]] = {"cat": [], "ours": [], "tensorboard": []}
        for _ in range(a.rounds):
            rows["cat"].append(cat(path))
            s, n = ours(path)
            assert n == a.steps, (n, a.steps)
            rows["ours"].append(s)
            s, n = theirs(folder)
            assert n == a.steps, (n, a.steps)
            rows["tensorboard"].append(s)
        for name, times in rows.items():
            print(f"{name:12s} median {statistics.median(times):8.3f} s")
        ratio = statistics.median(
            o / t for o, t in zip(rows["ours"], rows["tensorboard"], strict=True)
        )
        print(f"ours / TensorBoard's loader: {ratio:.2f}x (median of per-round ratios)")


if __name__ == "__main__":
    main()
