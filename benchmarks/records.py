"""Realistic metrics.jsonl lines, as the telemetry writes them for a speculators run.

A training line carries what speculators logs per step (11 train metrics for 3 TTT
steps, 10 profile timings, epoch, lr, global_step) in the schema-v1 envelope:
~590 bytes, as in the baselines of ../shared/notes/performance-baselines.md.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

TTT = 3


def record_line(kind: str, seq: int, ts: float, writer: str, **fields: Any) -> bytes:
    """One record as the telemetry writes it: the schema-v1 envelope, then ``fields``."""
    rec = {"v": 1, "seq": seq, "w": writer, "ts": ts, "kind": kind, "rank": 0, **fields}
    return json.dumps(rec, separators=(",", ":")).encode() + b"\n"


def train_line(
    step: int, seq: int, ts: float, rng: random.Random, steps_per_epoch: int = 15_000
) -> bytes:
    train: dict[str, float] = {}
    full = 1.0
    for k in range(TTT):
        cond = rng.uniform(0.3, 0.9)
        full *= cond
        train[f"loss_{k}"] = rng.uniform(0.5, 3.0)
        train[f"full_acc_{k}"] = full
        train[f"cond_acc_{k}"] = cond
    train["loss"] = sum(train[f"loss_{k}"] for k in range(TTT))
    train["error_records"] = 0.0
    fetch = rng.uniform(1, 40)
    step_ms = rng.uniform(400, 700)
    profile = {
        "fetch_ms": fetch,
        "fwd_ms": rng.uniform(100, 300),
        "bwd_ms": rng.uniform(200, 400),
        "opt_ms": rng.uniform(5, 20),
        "step_ms": step_ms,
        "tokens_per_s": 32768 / (step_ms / 1000),
        "fetch_frac": fetch / step_ms,
        "queue_ms": rng.uniform(0, 5),
        "h2d_ms": rng.uniform(0, 2),
        "clip_ms": rng.uniform(1, 3),
    }
    return record_line(
        "train",
        seq,
        ts,
        "4242-a1b2c3",
        train=train,
        profile=profile,
        epoch=step // steps_per_epoch,
        lr=1e-4 * rng.uniform(0.5, 1.0),
        global_step=step,
        step=step,
    )


def gpu_line(seq: int, ts: float, rng: random.Random, devices: int = 8) -> bytes:
    devs = [
        {
            "index": i,
            "uuid": f"GPU-{i:08x}",
            "name": "NVIDIA H100 80GB HBM3",
            "util": rng.uniform(90, 100),
            "mem_used": 7.0e10 + rng.uniform(0, 1e9),
            "mem_total": 8.5e10,
            "power_w": rng.uniform(550, 700),
            "temp_c": rng.uniform(55, 75),
            "pids": [4242 + i],
        }
        for i in range(devices)
    ]
    return record_line(
        "gpu",
        seq,
        ts,
        "4242-a1b2c3",
        status="ok",
        devices=devs,
    )


def io_line(seq: int, ts: float, rng: random.Random, workers: int = 8) -> bytes:
    ws: list[dict[str, Any]] = [
        {
            "pid": 5000 + i,
            "role": "worker",
            "read_bytes": rng.uniform(1e7, 5e7),
            "read_total": 1e10,
            "files": [f"/data/hidden_states/hs_{rng.randrange(10**6)}.safetensors"],
        }
        for i in range(workers)
    ]
    return record_line(
        "io",
        seq,
        ts,
        "4243-sidecar",
        interval_s=1.0,
        workers=ws,
        bytes=sum(w["read_bytes"] for w in ws),
        files_read=workers,
    )


def heartbeat_line(seq: int, ts: float) -> bytes:
    return record_line(
        "heartbeat",
        seq,
        ts,
        "4243-sidecar",
        written=seq,
        dropped=0,
        bytes=seq * 600,
        errors={},
        overhead_us={"p50": 6.5, "p99": 12.0},
        sampler_cpu_pct=0.8,
        trainer={"pid": 4242, "alive": True, "state": "R", "cpu_s": ts - 1.79e9},
    )


def train_lines(n: int, seed: int = 0, t0: float = 1.79e9, dt: float = 0.5) -> Iterator[bytes]:
    rng = random.Random(seed)
    for step in range(n):
        yield train_line(step, step, t0 + step * dt, rng)


def mixed_lines(
    n_steps: int, seed: int = 0, t0: float = 1.79e9, dt: float = 0.5
) -> Iterator[bytes]:
    """What a real run writes: a step every ``dt`` s from the trainer, and every
    second an 8-GPU sample, an 8-worker read sample and a heartbeat from the sidecar."""
    rng = random.Random(seed)
    side = 0
    next_tick = t0
    for step in range(n_steps):
        ts = t0 + step * dt
        while next_tick <= ts:
            for line in (
                gpu_line(side, next_tick, rng),
                io_line(side + 1, next_tick, rng),
                heartbeat_line(side + 2, next_tick),
            ):
                yield line.replace(b'"w":"4242-a1b2c3"', b'"w":"4243-sidecar"')
            side += 3
            next_tick += 1.0
        yield train_line(step, step, ts, rng)  # the trainer writes one line per step
