"""Downsampling for terminal plots that keeps spikes: M4 per bucket.

Stride sampling drops most of the tallest spikes; this keeps, for each of
``buckets`` equal runs of points, the first, min, max and last point (M4), so the
drawn envelope is exactly the envelope of the raw data. ~0.7 ms for 1M points.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
Floats = npt.NDArray[np.floating[Any]]
"""Values of any float width: a table column (float32) or a derived series (float64)."""

try:  # SIMD M4 in Rust: ~0.45 ms for 1M points, vs ~0.9 ms for the numpy path
    from tsdownsample import M4Downsampler

    _fast_m4: M4Downsampler | None = M4Downsampler()  # type: ignore[no-untyped-call]
except ImportError:  # pragma: no cover - numpy fallback below
    _fast_m4 = None


def m4_indices(y: Floats, buckets: int, nonfinite: bool | None = None) -> npt.NDArray[np.int64]:
    """Sorted indices of the first/min/max/last point of each bucket of ``y``.

    Non-finite values never win min/max (a bucket with only those keeps its first
    and last point, so the gap stays visible). ``nonfinite`` says whether ``y``
    holds any (a :class:`~eagle3_tui.model.table.StepTable` knows); None checks.
    """
    n = len(y)
    if buckets <= 0 or n <= 4 * buckets:
        return np.arange(n, dtype=np.int64)
    k = n // buckets
    body = buckets * k  # the last bucket also takes the remainder
    if nonfinite is None:
        nonfinite = not np.isfinite(y.sum())
    if not nonfinite and _fast_m4 is not None:
        idx = np.asarray(_fast_m4.downsample(y, n_out=4 * buckets), dtype=np.int64)
        # sorted, but it can repeat an index (first/min/max/last coincide) and may
        # omit the very last point: the line must end where the data ends
        keep = np.empty(len(idx), dtype=bool)
        keep[0] = True
        np.greater(idx[1:], idx[:-1], out=keep[1:])
        idx = idx[keep]
        return idx if idx[-1] == n - 1 else np.append(idx, n - 1)
    return _numpy_m4(y, buckets, k, body, nonfinite)


def _numpy_m4(y: Floats, buckets: int, k: int, body: int, nonfinite: bool) -> npt.NDArray[np.int64]:
    n = len(y)
    starts = np.arange(0, body, k, dtype=np.int64)
    block = y[:body].reshape(buckets, k)
    if nonfinite:  # rare: NaN-ignoring extremes, then the first position holding each
        finite = np.where(np.isfinite(block), block, np.nan)
        with np.errstate(invalid="ignore"):
            imin = (finite == np.fmin.reduce(finite, axis=1)[:, None]).argmax(axis=1)
            imax = (finite == np.fmax.reduce(finite, axis=1)[:, None]).argmax(axis=1)
    else:
        imin = block.argmin(axis=1)
        imax = block.argmax(axis=1)
    parts = [starts, imin + starts, imax + starts, starts + (k - 1)]
    if body < n:  # the remainder joins the last bucket
        tail = y[body:]
        fin = np.isfinite(tail)
        if fin.any():
            pos = np.flatnonzero(fin)
            parts.append(body + pos[[int(tail[pos].argmin()), int(tail[pos].argmax())]])
        parts.append(np.array([n - 1], dtype=np.int64))
    return np.unique(np.concatenate(parts))


def m4(x: F64, y: Floats, buckets: int, nonfinite: bool | None = None) -> tuple[F64, F64]:
    """``x`` and ``y`` reduced to at most ~4 points per bucket, spikes kept (the kept
    values as float64: a few thousand, whatever ``y`` was)."""
    idx = m4_indices(y, buckets, nonfinite)
    return x[idx], y[idx].astype(np.float64, copy=False)
