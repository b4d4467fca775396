"""Figures derived from the raw series: tau, smoothing, rates.

tau, the expected number of tokens accepted per draft cycle, is

    tau = 1 + sum_k full_acc_k

where ``full_acc_k`` is the probability that draft tokens 0..k are all accepted
(speculators logs it per TTT step). The verifier always contributes its one
token, hence the 1. When only conditional accuracies ``cond_acc_k`` (token k
accepted given 0..k-1 were) are known, ``full_acc_k = prod_{j<=k} cond_acc_j``;
speculators computes each ratio over different denominators, so the product of
the logged ``cond_acc`` can differ from the logged ``full_acc`` by a few points:
tau is always taken from ``full_acc`` when present.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]


def tau_from_full(full_acc: Sequence[float | None]) -> float | None:
    """1 + sum of full accuracies; None if any is missing or non-finite."""
    if not full_acc:
        return None
    total = 1.0
    for a in full_acc:
        if a is None or not math.isfinite(a):
            return None
        total += a
    return total


def tau_from_cond(cond_acc: Sequence[float | None]) -> float | None:
    """1 + sum_k prod_{j<=k} cond_acc_j; None if any is missing or non-finite."""
    if not cond_acc:
        return None
    total, prod = 1.0, 1.0
    for a in cond_acc:
        if a is None or not math.isfinite(a):
            return None
        prod *= a
        total += prod
    return total


def tau_of(
    latest: Mapping[str, float | None], ttt_steps: int, prefix: str = "train/"
) -> float | None:
    full = [latest.get(f"{prefix}full_acc_{k}") for k in range(ttt_steps)]
    if ttt_steps and all(v is not None for v in full):
        return tau_from_full(full)
    cond = [latest.get(f"{prefix}cond_acc_{k}") for k in range(ttt_steps)]
    return tau_from_cond(cond)


def ema(values: F64, weight: float) -> F64:
    """Debiased exponential moving average, as TensorBoard's smoothing slider.

    Non-finite values are skipped (the previous smoothed value is carried).
    """
    out = np.empty_like(values)
    last = 0.0
    n = 0
    w = float(weight)
    for i, v in enumerate(values.tolist()):
        if math.isfinite(v):
            last = last * w + (1.0 - w) * v
            n += 1
        out[i] = last / (1.0 - w**n) if n and w < 1.0 else (v if n == 0 else last)
    return out


def bucket_means(x: F64, y: F64, buckets: int) -> tuple[F64, F64, int]:
    """Last x and NaN-ignoring mean y of ``buckets`` equal runs of points.

    Returns ``(x_last, y_means, points_per_bucket)``; short inputs pass through.
    The x of a bucket is its last point's: an EMA fed the bucket's mean has then
    seen exactly the points up to that x.
    """
    n = len(y)
    if buckets <= 0 or n <= buckets:
        return x.astype(np.float64), y.astype(np.float64), 1
    k = n // buckets
    body = k * buckets
    xb = x[n - body + k - 1 :: k].astype(np.float64)  # each bucket's last x, no full copy
    yb = y[n - body :].reshape(buckets, k)
    with np.errstate(invalid="ignore", over="ignore"):
        ym = yb.mean(axis=1, dtype=np.float64)  # one pass; a non-finite value shows in its mean
    bad = ~np.isfinite(ym)
    if bad.any():  # only those buckets: the NaN-ignoring mean
        rows = yb[bad]
        finite = np.isfinite(rows)
        with np.errstate(invalid="ignore", divide="ignore"):
            ym[bad] = np.where(finite, rows, 0.0).sum(axis=1) / finite.sum(axis=1)
    return xb, ym, k


def smoothed(x: F64, y: F64, weight: float, buckets: int) -> tuple[F64, F64]:
    """A smoothed line of ``y`` over ``x`` with at most ``buckets`` points.

    The EMA runs over bucket means with the weight raised to the bucket size, so
    its time constant in steps is what ``weight`` gives per step, at any zoom.
    """
    xb, yb, k = bucket_means(x, y, buckets)
    if weight <= 0.0:
        return xb, yb
    return xb, ema(yb, weight**k)


# ---- pace ---------------------------------------------------------------------

RATE_WINDOW_S = 60.0


def _tail_rows(ts: F64, window_s: float) -> int:
    """Index of the first row within ``window_s`` of the last one."""
    if not len(ts):
        return 0
    return int(np.searchsorted(ts, ts[-1] - window_s, side="left"))


def rates(
    steps: npt.NDArray[np.int64],
    ts: F64,
    tokens_per_s: F64 | None,
    step_ms: F64 | None,
    window_s: float = RATE_WINDOW_S,
) -> tuple[float | None, float | None]:
    """Steps/s and tokens/s over the last ``window_s`` seconds of logged steps.

    Tokens per step are recovered from the profile (``tokens_per_s × step_ms``).
    """
    i = _tail_rows(ts, window_s)
    if len(ts) - i < 2:
        i = max(0, len(ts) - 2)
    if len(ts) - i < 2:
        return None, None
    dt = float(ts[-1] - ts[i])
    if dt <= 0:
        return None, None
    steps_per_s = float(steps[-1] - steps[i]) / dt
    tokens = None
    if tokens_per_s is not None and step_ms is not None:
        per_step = tokens_per_s[i + 1 :] * step_ms[i + 1 :] / 1000.0
        per_step = per_step[np.isfinite(per_step)]
        if len(per_step):
            tokens = float(per_step.sum()) / dt
    return steps_per_s, tokens


def steps_per_epoch(epoch_col: F64 | None, steps: npt.NDArray[np.int64]) -> int | None:
    """Infer steps per epoch from where the epoch column changes (global step of epoch e+1)."""
    if epoch_col is None or len(epoch_col) < 2:
        return None
    change = np.flatnonzero(np.diff(epoch_col) > 0)
    for i in change:
        next_epoch = epoch_col[i + 1]
        if np.isfinite(next_epoch) and next_epoch >= 1:
            return round(float(steps[i + 1]) / float(next_epoch))
    return None


def eta(
    step: int | None,
    epoch: int | None,
    spe: int | None,
    total_steps: int | None,
    steps_per_s: float | None,
) -> tuple[float | None, float | None]:
    """Seconds to the end of the current epoch and of the run (None when unknown)."""
    if step is None or not steps_per_s or steps_per_s <= 0:
        return None, None
    done = step + 1
    epoch_eta = None
    if spe and epoch is not None:
        epoch_eta = max(0.0, ((epoch + 1) * spe - done) / steps_per_s)
    run_eta = max(0.0, (total_steps - done) / steps_per_s) if total_steps else None
    return epoch_eta, run_eta


def mean_tail(values: F64 | None, n: int = 50) -> float | None:
    """Mean of the last ``n`` finite values."""
    if values is None or not len(values):
        return None
    tail = values[-n:]
    tail = tail[np.isfinite(tail)]
    return float(tail.mean()) if len(tail) else None
