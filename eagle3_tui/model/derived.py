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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from eagle3_tui.model.downsample import Floats

if TYPE_CHECKING:
    from eagle3_tui.model.state import RunState

F64 = npt.NDArray[np.float64]


def tau_series(
    full: Sequence[npt.NDArray[np.floating[Any]] | None],
    cond: Sequence[npt.NDArray[np.floating[Any]] | None] = (),
) -> F64 | None:
    """τ, the expected tokens per draft cycle, point by point: ``1 + Σ_k full_acc_k``.
    A run that logs only the conditional accuracies gets it from them
    (``full_acc_k = Π_{j≤k} cond_acc_j``). None when neither set is complete.

    The one definition of τ: the header, the TTT table, the plots, ``summary`` and
    ``compare`` all call it (or :func:`tau_of`, its value for one point)."""
    for values, running in ((full, False), (cond, True)):
        columns = [c for c in values if c is not None]
        if not values or len(columns) < len(values):
            continue
        acc: F64 = np.vstack(columns).astype(np.float64)
        if running:
            acc = np.cumprod(acc, axis=0, dtype=np.float64)
        out: F64 = (1.0 + acc.sum(axis=0)).astype(np.float64, copy=False)
        return out
    return None


def _point(value: float | None) -> F64 | None:
    return None if value is None else np.array([value], dtype=np.float64)


def _scalar(series: F64 | None) -> float | None:
    if series is None or not len(series) or not math.isfinite(series[0]):
        return None
    return float(series[0])


def tau_from_cond(cond_acc: Sequence[float | None]) -> float | None:
    """τ from one point's conditional accuracies; None if any is missing or non-finite."""
    return _scalar(tau_series((), [_point(a) for a in cond_acc]))


def tau_of(
    latest: Mapping[str, float | None],
    ttt_steps: int | None = None,
    prefix: str = "train/",
    suffix: str = "",
) -> float | None:
    """τ of one point from its ``{prefix}full_acc_{k}{suffix}`` values (the conditional
    ones where those are missing). ``ttt_steps`` None: as many TTT steps as the point
    has (validation values: ``prefix=""``, ``suffix="_epoch"``)."""
    if ttt_steps is None:
        ttt_steps = 0
        while any(
            f"{prefix}{name}_{ttt_steps}{suffix}" in latest for name in ("full_acc", "cond_acc")
        ):
            ttt_steps += 1
    full = [_point(latest.get(f"{prefix}full_acc_{k}{suffix}")) for k in range(ttt_steps)]
    cond = [_point(latest.get(f"{prefix}cond_acc_{k}{suffix}")) for k in range(ttt_steps)]
    return _scalar(tau_series(full, cond))


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


def bucket_means(x: F64, y: Floats, buckets: int) -> tuple[F64, F64, int]:
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


def smoothed(x: F64, y: Floats, weight: float, buckets: int) -> tuple[F64, F64]:
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


@dataclass(frozen=True, slots=True)
class Pace:
    """How fast the run goes: the one definition every view uses (the health
    sentences and quiet limit, the progress panel, the ETA, ``summary`` text and JSON).

    Measured over the last minute of logged steps *of the current process* (since its
    start or resume event): a resume's downtime is no part of its pace. A step's time
    is the mean wall time per step (``1 / steps_per_s``), not the median of the gaps
    between records, which bursty data loading makes several times shorter.
    """

    steps_per_s: float | None
    tokens_per_s: float | None
    record_s: float | None
    """Mean wall time between logged steps (``log_freq`` steps apart)."""

    @property
    def step_s(self) -> float | None:
        """Mean wall time per step."""
        return 1.0 / self.steps_per_s if self.steps_per_s else None


NO_PACE = Pace(None, None, None)


def pace(
    steps: npt.NDArray[np.int64],
    ts: F64,
    tokens_per_s: F64 | None,
    step_ms: F64 | None,
    window_s: float = RATE_WINDOW_S,
    since: float | None = None,
) -> Pace:
    """The pace over the last ``window_s`` seconds of logged steps, only rows at or
    after ``since`` (the current process's start); the last two rows when the window
    holds fewer. Tokens per step are recovered from the profile (``tokens_per_s ×
    step_ms``)."""
    # rows are in step order, and so in time order (a resume's redone steps replace
    # the later rows of the process before it)
    first = int(np.searchsorted(ts, since, side="left")) if since is not None else 0
    i = max(first, _tail_rows(ts, window_s))
    if len(ts) - i < 2:
        i = max(first, len(ts) - 2)
    if len(ts) - i < 2:
        return NO_PACE
    dt = float(ts[-1] - ts[i])
    if dt <= 0:
        return NO_PACE
    steps_per_s = float(steps[-1] - steps[i]) / dt
    if steps_per_s <= 0:
        return NO_PACE
    tokens = None
    if tokens_per_s is not None and step_ms is not None:
        per_step = tokens_per_s[i + 1 :] * step_ms[i + 1 :] / 1000.0
        per_step = per_step[np.isfinite(per_step)]
        if len(per_step):
            tokens = float(per_step.sum()) / dt
    return Pace(steps_per_s, tokens, dt / (len(ts) - 1 - i))


def rates(
    steps: npt.NDArray[np.int64],
    ts: F64,
    tokens_per_s: F64 | None,
    step_ms: F64 | None,
    window_s: float = RATE_WINDOW_S,
) -> tuple[float | None, float | None]:
    """Steps/s and tokens/s over the last ``window_s`` seconds (see :func:`pace`)."""
    p = pace(steps, ts, tokens_per_s, step_ms, window_s)
    return p.steps_per_s, p.tokens_per_s


PACE_ROWS = 5000
"""Rows the pace looks at, at most: the last minute of a fast run, without converting
a million-row column."""


def run_pace(state: RunState) -> Pace:
    """The pace of ``state``'s current process (see :class:`Pace`)."""
    table = state.table
    steps, ts = table.step_view(), table.ts_view()  # views: read under the model's lock
    n = min(len(steps), PACE_ROWS)
    tail = slice(len(steps) - n, None)
    start = state.process_start()
    return pace(
        steps[tail],
        ts[tail],
        table.floats("profile/tokens_per_s", n),
        table.floats("profile/step_ms", n),
        since=start.ts if start is not None and start.ts else None,
    )


def average_pace(state: RunState) -> Pace:
    """The pace of ``state``'s current process over all its logged steps, from its
    start or resume to its last step: what a run that ended ran at (its last minute's
    pace would read as a current one). Reads every row of the process (a 1M-step
    process: ~10 ms)."""
    table = state.table
    steps, ts = table.step_view(), table.ts_view()  # views: read under the model's lock
    start = state.process_start()
    first = int(np.searchsorted(ts, start.ts, side="left")) if start is not None else 0
    n = len(steps) - first
    return pace(
        steps[first:],
        ts[first:],
        table.floats("profile/tokens_per_s", n),
        table.floats("profile/step_ms", n),
        window_s=math.inf,
    )


# ---- numbering ------------------------------------------------------------------


def step_number(global_step: int | None) -> int | None:
    """The step as every view shows it ("step N/T"): 1-based, so N is also the number
    of steps done. speculators' ``global_step`` (in the records, the plots' x axis and
    ``summary --json``'s ``global_step``) counts from 0: step N is ``global_step`` N−1."""
    return None if global_step is None else global_step + 1


def epoch_number(epoch: int | None) -> int | None:
    """The epoch as every view shows it ("epoch E/N"): 1-based; speculators' ``epoch``
    counts from 0."""
    return None if epoch is None else epoch + 1


def steps_done(state: RunState) -> int | None:
    """Steps done, as "step N" shows it: the last logged step's number, or what the
    process's end event says when it is further (``finish``/``interrupt`` carry
    speculators' ``global_step`` after its last step; a ``log_freq`` above 1 logs
    fewer steps than it does)."""
    done = step_number(state.global_step)
    end = state.ending()
    if end is not None and end.event != "crash" and isinstance(end.step, int):
        done = max(done or 0, end.step)
    return done


def io_rates(ts: F64, read_bytes: F64, files: F64) -> tuple[float | None, float | None]:
    """Bytes and files read per second over the given sampler intervals (each sample
    covers the interval before its ``ts``). A file counts only in an interval that
    read bytes: files held open or mapped by a stuck worker are not being read."""
    if len(ts) < 2:
        return None, None
    interval = float(ts[-1] - ts[0]) / (len(ts) - 1)
    if interval <= 0:
        return None, None
    span = interval * len(ts)
    read = np.where(read_bytes > 0, files, 0.0)
    return float(read_bytes.sum()) / span, float(read.sum()) / span


SPE_FIRST_ROWS = 1 << 14
"""The rows :func:`steps_per_epoch` looks at first (then twice as many each time)."""


def steps_per_epoch(epoch_col: Floats | None, steps: npt.NDArray[np.int64]) -> int | None:
    """Infer steps per epoch from where the epoch column changes (global step of epoch
    e+1), at its first such change. Looked for from the first rows on, in windows that
    double: the first change is near the start, and a picture a second of a 1M-step
    run no longer compares every row (2.6 ms a picture)."""
    if epoch_col is None or len(epoch_col) < 2:
        return None
    n = len(epoch_col)
    lo, width = 0, SPE_FIRST_ROWS
    while lo < n - 1:
        hi = min(n, lo + width + 1)  # windows share a row: every change is in one
        for i in np.flatnonzero(np.diff(epoch_col[lo:hi]) > 0):
            next_epoch = epoch_col[lo + i + 1]
            if np.isfinite(next_epoch) and next_epoch >= 1:
                return round(float(steps[lo + i + 1]) / float(next_epoch))
        lo, width = hi - 1, width * 2
    return None


def eta(
    step: int | None,
    epoch: int | None,
    spe: int | None,
    total_steps: int | None,
    steps_per_s: float | None,
) -> tuple[float | None, float | None]:
    """Seconds to the end of the current epoch and of the run (None when unknown), from
    the last logged ``global_step`` and the 0-based ``epoch`` (speculators' counters)."""
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
