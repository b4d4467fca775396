"""The per-step table: one shared step column, one float32 column per metric.

A million steps of 22 metrics take ~100 MB here (8 bytes a step for the step,
8 for its time, 4 per metric value), against ~800 MB as lists of floats. A
metric that first appears at a later step is back-filled with NaN; a step that
lacks a metric gets NaN. Values are float32 (7 significant digits, plenty for a
plot or a table cell); the latest values are also kept at full precision.

When a resumed run logs a step at or below the last one, everything from that
step on is dropped first: the later segment replaces the earlier one.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

import gc
import math
from array import array
from bisect import bisect_left
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from eagle3_tui.model.downsample import Floats

NAN = math.nan
F32_MAX = float(np.finfo(np.float32).max)
"""Beyond this a value is stored as an infinity."""


class StepTable:
    """Columns of values by strictly increasing global step."""

    __slots__ = ("_nonfinite", "columns", "latest", "steps", "ts")

    def __init__(self) -> None:
        self.steps = array("q")
        self.ts = array("d")
        self.columns: dict[str, array[float]] = {}
        self.latest: dict[str, float | None] = {}
        """The last value of each column at full precision (None when not a number)."""
        self._nonfinite: set[str] = set()

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def last_step(self) -> int | None:
        return self.steps[-1] if self.steps else None

    def truncate_from(self, step: int) -> int:
        """Drop rows at ``step`` and after; returns how many were dropped."""
        i = bisect_left(self.steps, step)
        n = len(self.steps) - i
        if n:
            del self.steps[i:]
            del self.ts[i:]
            for col in self.columns.values():
                del col[i:]
            self._nonfinite = {k for k in self._nonfinite if _has_nonfinite(self.columns[k])}
            for key, col in self.columns.items():
                self.latest[key] = col[-1] if col else None
        return n

    def _column(self, key: str, rows: int) -> array[float]:
        """The column of ``key``, created back-filled with NaN for ``rows`` rows."""
        col = self.columns.get(key)
        if col is None:
            col = self.columns[key] = array("f", [NAN]) * rows
        return col

    def _growable(self) -> None:
        """Before the table grows: a view let go but not yet freed (held in a reference
        cycle the collector has not reached) still exports its column, which then cannot
        grow (BufferError, seen once under a test suite's load): collected first. A view
        still in use stays one, and its error with it."""
        try:
            self.steps.append(0)
        except BufferError:
            gc.collect()
        else:
            self.steps.pop()

    def append_row(self, step: int, ts: float, values: dict[str, float | None]) -> None:
        """One step's values; the caller guarantees ``step`` > last step."""
        n = len(self.steps)
        self._growable()
        self.steps.append(step)
        self.ts.append(ts)
        for key, v in values.items():
            col = self._column(key, n)
            if v is None or not -F32_MAX <= v <= F32_MAX:  # NaN, ±inf, or inf as float32
                self._nonfinite.add(key)
            col.append(NAN if v is None else v)
            self.latest[key] = v
        if len(values) != len(self.columns):
            for key, col in self.columns.items():
                if len(col) == n:
                    col.append(NAN)
                    self.latest[key] = None

    def extend_columns(
        self,
        steps: npt.NDArray[np.int64],
        ts: Floats,
        columns: Mapping[str, Floats],
    ) -> None:
        """Many rows at once (the catch-up fast path); same precondition on steps.
        Values of any float dtype or byte order, strided or not: each is converted
        once, into its float32 column."""
        n = len(self.steps)
        self._growable()
        self.steps.frombytes(_raw(steps.astype(np.int64, copy=False)))
        self.ts.frombytes(_raw(ts.astype(np.float64, copy=False)))
        for key, values in columns.items():
            col = self._column(key, n)
            stored = values.astype(np.float32)
            col.frombytes(_raw(stored))
            self.latest[key] = float(values[-1])
            if not bool(np.isfinite(stored).all()):  # what is stored: 1e39 is inf here
                self._nonfinite.add(key)
        if len(columns) != len(self.columns):
            pad = array("f", [NAN]) * len(steps)
            for key, col in self.columns.items():
                if len(col) == n:
                    col.extend(pad)
                    self.latest[key] = None

    # ---- reading: numpy views of the columns ------------------------------------------
    # A view shares the column's memory: read it under the model's lock, and let it go
    # before the next append (an array exporting its buffer cannot grow).

    def step_view(self) -> npt.NDArray[np.int64]:
        """The step column, as an int64 view (no copy)."""
        return np.frombuffer(self.steps, dtype=np.int64)

    def ts_view(self) -> npt.NDArray[np.float64]:
        """The time column, as a float64 view (no copy)."""
        return np.frombuffer(self.ts, dtype=np.float64)

    def view(self, key: str) -> npt.NDArray[np.float32] | None:
        """``key``'s column as a float32 view (no copy); None when no step logged it."""
        col = self.columns.get(key)
        return None if col is None else np.frombuffer(col, dtype=np.float32)

    def views(self) -> dict[str, npt.NDArray[np.float32]]:
        """Every column as a float32 view, by key."""
        return {key: np.frombuffer(col, dtype=np.float32) for key, col in self.columns.items()}

    def floats(self, key: str, tail: int | None = None) -> npt.NDArray[np.float64] | None:
        """``key``'s column as a float64 copy, only its last ``tail`` rows when given
        (converting a million rows costs milliseconds); None when no step logged it."""
        values = self.view(key)
        if values is None:
            return None
        if tail is not None:
            values = values[max(0, len(values) - tail) :]
        return values.astype(np.float64)

    def has_nonfinite(self, key: str) -> bool:
        return key in self._nonfinite

    def nbytes(self) -> int:
        return (len(self.steps) * 16) + sum(len(c) * 4 for c in self.columns.values())


def _raw(values: npt.NDArray[np.generic]) -> memoryview:
    """The bytes of a contiguous array, without a copy."""
    return values.data.cast("B")


def _has_nonfinite(col: array[float]) -> bool:
    return not bool(np.isfinite(np.frombuffer(col, dtype=np.float32)).all())
