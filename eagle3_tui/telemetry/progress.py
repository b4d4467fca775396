"""A plain one-line progress summary every N steps, for headless logs.

    [eagle3] step 120/1800 epoch 2/3 loss 2.3100 acc 0.52/0.31/0.18 tau 2.01 12.3 it/s

``acc`` is ``full_acc_k`` for each TTT step k (the probability that draft
tokens 0..k are all accepted) and ``tau = 1 + Σ_k full_acc_k`` the expected
tokens per draft cycle. Standard library only.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:  # an alias for annotations only: the trainer's Python may be 3.8
    Bounds = Callable[[], tuple[int | None, int | None]]


def _num(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    try:
        return float(v.item()) if hasattr(v, "item") else None
    except Exception:
        return None


def _fmt(x: float | None, digits: int) -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return str(x)
    return f"{x:.{digits}f}"


def acceptance(metrics: Mapping[str, Any], suffix: str = "") -> list[float | None]:
    out: list[float | None] = []
    k = 0
    while f"full_acc_{k}{suffix}" in metrics:
        out.append(_num(metrics[f"full_acc_{k}{suffix}"]))
        k += 1
    return out


def tau(acc: list[float | None]) -> float | None:
    if not acc or any(a is None for a in acc):
        return None
    return 1.0 + sum(a for a in acc if a is not None)


class ProgressPrinter:
    """Prints a summary line of every ``every``-th train record and of each validation."""

    def __init__(
        self,
        every: int,
        bounds: Bounds = lambda: (None, None),
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every = max(1, every)
        self.bounds = bounds
        self.stream = stream
        self.clock = clock
        self._last_t: float | None = None
        self._last_step: int | None = None

    def on_metrics(self, kind: str, payload: Mapping[str, Any], step: int | None = None) -> None:
        if kind == "train":
            if step is None:
                step = payload.get("step", payload.get("global_step"))
            if isinstance(step, int) and (
                (step + 1) % self.every == 0 or step + 1 == self.bounds()[0]
            ):
                self._print(self.train_line(payload, step))
        elif kind == "val":
            self._print(self.val_line(payload))

    def train_line(self, payload: Mapping[str, Any], step: int) -> str:
        total, epochs = self.bounds()
        metrics = payload.get("train") or {}
        now = self.clock()
        rate = None
        if self._last_t is not None and self._last_step is not None and now > self._last_t:
            rate = (step - self._last_step) / (now - self._last_t)
        self._last_t, self._last_step = now, step
        parts = [f"[eagle3] step {step + 1}" + (f"/{total}" if total else "")]
        epoch = payload.get("epoch")
        if isinstance(epoch, int):
            parts.append(f"epoch {epoch + 1}" + (f"/{epochs}" if epochs else ""))
        parts.append(f"loss {_fmt(_num(metrics.get('loss')), 4)}")
        acc = acceptance(metrics)
        if acc:
            parts.append("acc " + "/".join(_fmt(a, 2) for a in acc))
            parts.append(f"tau {_fmt(tau(acc), 2)}")
        if rate is not None:
            parts.append(f"{rate:.1f} it/s")
        return " ".join(parts)

    def val_line(self, payload: Mapping[str, Any]) -> str:
        _, epochs = self.bounds()
        metrics = payload.get("val") or {}
        epoch = payload.get("epoch")
        parts = ["[eagle3] validation"]
        if isinstance(epoch, int):
            parts.append(f"epoch {epoch + 1}" + (f"/{epochs}" if epochs else ""))
        parts.append(f"loss {_fmt(_num(metrics.get('loss_epoch')), 4)}")
        acc = acceptance(metrics, "_epoch")
        if acc:
            parts.append("acc " + "/".join(_fmt(a, 2) for a in acc))
            parts.append(f"tau {_fmt(tau(acc), 2)}")
        return " ".join(parts)

    def _print(self, line: str) -> None:
        stream = self.stream or sys.stderr
        try:
            stream.write(line + "\n")
            stream.flush()
        except Exception:  # a closed or broken stream must not stop training
            pass
