"""A long run's history in brief: what a glance (agent/glance.py) says of the training
steps before the ones it read whole.

Per column block of the companion (up to 1,024 steps, telemetry/columns.py), or per
run of blocks a writer's digest stands for (16 of them): its first and last step, its
rows, its first and last time, and per column ``[first, min, index of the min, max,
index of the max, last, mean]``. A chart of the whole run draws four points an
entry (first, min, max, last, in step order: what M4 keeps of them) before the
table's rows; τ comes from the entries' mean accuracies. It stands in only until
the whole file has been read (app/pipeline.py), and nothing but the charts uses it:
every count, verdict and figure comes from lines that were read.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]

FIRST, MIN, IMIN, MAX, IMAX, LAST, MEAN = range(7)


def table_key(path: str) -> str:
    """The step table's key of a companion column (``train.loss`` -> ``train/loss``)."""
    return path.replace(".", "/", 1)


@dataclass(frozen=True, slots=True, eq=False)
class History:
    """The digest as arrays: one row a block, in step order."""

    first: F64
    last: F64
    rows: F64
    t_first: F64
    t_last: F64
    stats: dict[str, F64]
    """Table key -> (blocks, 7) array; NaN where a block has no such column."""

    @property
    def blocks(self) -> int:
        return len(self.first)

    @property
    def steps(self) -> int:
        return int(self.rows.sum())

    def points(self, key: str, lo: float, hi: float) -> tuple[F64, F64] | None:
        """Four points a block of ``key`` whose steps lie in ``[lo, hi)``, in step
        order: its first, min, max and last values at their steps (a min or max row's
        step is placed by its row in the block)."""
        s = self.stats.get(key)
        if s is None:
            return None
        sel = (self.first >= lo) & (self.last < hi) & np.isfinite(s[:, FIRST])
        if not sel.any():
            return None
        first, last, rows, st = self.first[sel], self.last[sel], self.rows[sel], s[sel]
        span = (last - first) / np.maximum(rows - 1, 1)
        xs = np.stack([first, first + span * st[:, IMIN], first + span * st[:, IMAX], last], 1)
        ys = np.stack([st[:, FIRST], st[:, MIN], st[:, MAX], st[:, LAST]], 1)
        order = np.argsort(xs, axis=1, kind="stable")
        xs = np.take_along_axis(xs, order, 1).reshape(-1)
        ys = np.take_along_axis(ys, order, 1).reshape(-1)
        return xs, ys

    def means(self, key: str, lo: float, hi: float) -> tuple[F64, F64] | None:
        """Each block's mean of ``key`` at its middle step, for blocks in ``[lo, hi)``."""
        s = self.stats.get(key)
        if s is None:
            return None
        sel = (self.first >= lo) & (self.last < hi)
        if not sel.any():
            return None
        return (self.first[sel] + self.last[sel]) / 2.0, s[sel, MEAN]


def _number(v: Any) -> float | None:
    if type(v) is int or type(v) is float:
        try:
            f = float(v)
        except OverflowError:  # an int no float holds
            return None
        return f if math.isfinite(f) else None
    return None


def _stats_rows(values: list[Any], good: list[int]) -> F64:
    """Of a column's stats (one list a block), the ``good`` blocks' as rows; a row that
    is not seven finite numbers is NaN. All at once where every entry is a list of
    seven ints or floats (a 1M-step run's digest: ~10,000 lists), else one by one."""
    plain = {type(s) for s in values} == {list} and {len(s) for s in values} == {7}
    if plain and {type(v) for s in values for v in s} <= {int, float}:
        try:
            arr = np.array(values, dtype=np.float64)[good]
        except OverflowError:
            arr = None
        if arr is not None:
            arr[~np.isfinite(arr).all(axis=1)] = np.nan
            return arr
    out = np.full((len(good), 7), np.nan)
    for row, i in enumerate(good):
        s = values[i]
        if isinstance(s, list) and len(s) == 7:
            nums = [_number(v) for v in s]
            if all(v is not None for v in nums):
                out[row] = nums
    return out


def history_of(digest: Any) -> History | None:
    """The digest a glance sent, as a :class:`History`; None when it is not one (a
    block or a column that is not as it must be is left out, not guessed)."""
    if not isinstance(digest, dict):
        return None
    blocks = digest.get("blocks")
    stats = digest.get("stats")
    if not isinstance(blocks, list) or not isinstance(stats, dict) or not blocks:
        return None
    good: list[int] = []
    rows: list[list[float]] = []
    for i, b in enumerate(blocks):
        if not isinstance(b, list) or len(b) < 5:
            continue
        nums = [_number(v) for v in b[:5]]
        if any(v is None for v in nums):
            continue
        first, last, n = nums[0], nums[1], nums[2]
        assert first is not None and last is not None and n is not None
        if n < 1 or last < first or (rows and first <= rows[-1][1]):
            continue  # out of step order: not a history of one run
        good.append(i)
        rows.append([float(v) for v in nums if v is not None])
    if not rows:
        return None
    arr = np.asarray(rows, dtype=np.float64)
    columns: dict[str, F64] = {}
    for path, values in stats.items():
        if not isinstance(path, str) or not isinstance(values, list):
            continue
        if len(values) != len(blocks):
            continue
        columns[table_key(path)] = _stats_rows(values, good)
    return History(arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3], arr[:, 4], columns)
