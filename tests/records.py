"""Builders of schema-v1 lines for tests (the same shape the telemetry writes)."""

from __future__ import annotations

import json
from typing import Any


class Lines:
    """Makes envelope-complete JSON lines with increasing seq and ts."""

    def __init__(self, writer: str = "w1", t0: float = 1_000_000.0, dt: float = 1.0) -> None:
        self.writer = writer
        self.seq = 0
        self.ts = t0
        self.dt = dt

    def make(self, kind: str, **payload: Any) -> bytes:
        rec = {
            "v": 1,
            "seq": self.seq,
            "w": self.writer,
            "ts": self.ts,
            "kind": kind,
            "rank": 0,
            **payload,
        }
        self.seq += 1
        self.ts += self.dt
        return (json.dumps(rec) + "\n").encode()

    def train(
        self,
        step: int,
        loss: float,
        acc: tuple[float, ...] = (0.5, 0.3, 0.2),
        epoch: int = 0,
        **extra: Any,
    ) -> bytes:
        metrics: dict[str, Any] = {"loss": loss}
        full = 1.0
        for k, a in enumerate(acc):
            metrics[f"loss_{k}"] = loss / len(acc)
            metrics[f"cond_acc_{k}"] = a
            full *= a
            metrics[f"full_acc_{k}"] = full
        return self.make(
            "train",
            step=step,
            global_step=step,
            epoch=epoch,
            train=metrics,
            profile={"step_ms": 100.0, "fetch_ms": 5.0, "fetch_frac": 0.05, "tokens_per_s": 1000.0},
            lr=0.001,
            **extra,
        )

    def val(self, step: int, epoch: int, loss: float) -> bytes:
        return self.make(
            "val", step=step, epoch=epoch, val={"loss_epoch": loss, "full_acc_0_epoch": 0.4}
        )

    def event(self, event: str, **fields: Any) -> bytes:
        return self.make("lifecycle", event=event, **fields)
