"""What happened on the way, said after the end: stretches of non-finite loss, loss
spikes, resumes and steps not logged.

The verdict is about the run's end: a run whose loss was NaN for fifteen steps and then
recovered ends ``finished``. These keep its history visible — in ``summary`` (text and
JSON) and on the progress panel. Every step is numbered as "step N" shows it (1-based,
:func:`~eagle3_tui.model.derived.step_number`).

A *spike* is a logged loss far above the loss just before it: against the median of the
previous :data:`SPIKE_WINDOW` finite losses (at least :data:`SPIKE_MIN_BASE` of them), a
robust z-score (distance from that median in units of 1.4826 × its median absolute
deviation, the standard deviation a normal noise would have) of at least
:data:`SPIKE_Z`, *and* at least :data:`SPIKE_FACTOR` times that median. The z-score
alone alarms on a smooth curve (a tiny deviation); the factor alone on a noisy one near
zero; the fast early fall is below its trailing median, never above. Consecutive spiking
steps are one spike. A loss that stays up is a spike for about half a window, then the
median has followed it (the diverged verdict judges a loss that stays up).

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

from eagle3_tui.model.derived import step_number
from eagle3_tui.model.median import median
from eagle3_tui.model.state import RunState

F64 = npt.NDArray[np.float64]

LOSS = "train/loss"
SPIKE_WINDOW = 50
"""Finite losses before a step that make its baseline (its rolling median)."""
SPIKE_MIN_BASE = 20
"""No spike is called before this many finite losses."""
SPIKE_Z = 10.0
"""Robust z-score a spike reaches at least (normal noise: 10σ never happens)."""
SPIKE_FACTOR = 2.0
"""A spike is at least this many times its rolling median (positive losses)."""
MAD_TO_SIGMA = 1.4826
LEARN_EVERY = 1000
"""The logging interval is the median distance of the first this many logged steps."""
CHUNK = 20_000
"""Steps whose windows are reduced at once (each window a copy: 8 MB at 50 values)."""


def _stretch_of(count: int) -> str:
    return f"{count} logged step{'' if count == 1 else 's'}"


def _steps(first: int, last: int) -> str:
    return f"at step {first}" if first == last else f"from step {first} to {last}"


@dataclass(frozen=True, slots=True)
class NonFinite:
    """Steps whose loss was NaN or infinite, one after another."""

    first_step: int
    last_step: int
    logged_steps: int
    values: tuple[str, ...]
    """What the loss was, in the schema's words (``NaN``, ``Infinity``, ``-Infinity``),
    first seen first."""
    to_end: bool
    """The stretch runs to the last logged step (the run never recovered)."""
    metric: str = LOSS

    @property
    def said(self) -> str:
        after = "to the last logged step" if self.to_end else "finite again after"
        stretch = _steps(self.first_step, self.last_step)
        return f"loss {'/'.join(self.values)} {stretch} ({_stretch_of(self.logged_steps)}), {after}"


@dataclass(frozen=True, slots=True)
class Spike:
    """Steps whose loss jumped far above its rolling median (see the module)."""

    first_step: int
    last_step: int
    peak: float
    baseline: float
    """The rolling median of the losses before its first step."""
    z: float
    """The highest robust z-score of its steps."""
    metric: str = LOSS

    @property
    def factor(self) -> float:
        return self.peak / self.baseline if self.baseline > 0 else math.inf

    @property
    def said(self) -> str:
        return (
            f"loss spike {_steps(self.first_step, self.last_step)}: {self.peak:.4g}, "
            f"{self.factor:.1f}× its rolling median ({self.baseline:.4g})"
        )


@dataclass(frozen=True, slots=True)
class Resume:
    """The run went on in a new process (a ``resume`` event, or steps that went back)."""

    at: float
    first_step: int | None
    """The first step it logged then (None: none yet)."""
    redone: tuple[int, int] | None
    """Steps trained before and done again (first, last), if it went back."""
    superseded: bool = False
    """Another process started after it (its steps, if any, were logged before that)."""
    reached: int | None = None
    """The last step it logged (as shown), where that is short of ``redone``'s last: the
    steps to do again are not all done yet."""

    @property
    def said(self) -> str:
        if self.first_step is None and self.superseded:
            return "resumed, no step logged before the next start"
        if self.first_step is None:
            return "resumed (no step logged since)"
        again = ""
        if self.redone is not None:
            a, b = self.redone
            again = f" (steps {a} to {b} done again)"
            if self.reached is not None and self.reached < b:
                again = f" (steps {a} to {b} to be done again: up to {self.reached} so far)"
        return f"resumed at step {self.first_step}{again}"


@dataclass(frozen=True, slots=True)
class Gap:
    """Logged steps further apart than the run's logging interval: steps not logged."""

    after_step: int
    next_step: int
    missing: int
    """Steps (or, logging every ``every`` steps, records) between them not logged."""
    every: int = 1
    """The run's logging interval in steps (the median distance between logged steps)."""

    @property
    def said(self) -> str:
        what = "steps" if self.every == 1 else f"records (one every {self.every} steps)"
        if self.missing == 1:
            what = "step" if self.every == 1 else f"record (one every {self.every} steps)"
        return (
            f"{self.missing} {what} not logged between step {self.after_step} and {self.next_step}"
        )


Anomaly = NonFinite | Spike | Resume | Gap


@dataclass(slots=True)
class LossScan:
    """The loss column scanned so far: stretches and spikes as row ranges, kept between
    snapshot builds of one run (the app's ``SnapshotCache``) so a build scans only the
    rows that arrived since. A rewound or replaced table starts it over."""

    key: object = None
    rows: int = 0
    """Rows scanned."""
    nonfinite: list[list[float]] = field(default_factory=list)
    """[first row, last row] of each stretch of non-finite loss."""
    spikes: list[list[float]] = field(default_factory=list)
    """[first row, last row, peak, baseline, z] of each spike."""
    gaps: list[int] = field(default_factory=list)
    """Rows after which the logged steps jump by more than :attr:`every`."""
    every: int = 1
    """The run's logging interval: the median distance of its first logged steps."""

    def update(self, state: RunState) -> None:
        table = state.table
        key = (id(table), len(state.redos), state.redos[-1] if state.redos else None)
        if key != self.key:
            self.key, self.rows = key, 0
            self.nonfinite.clear()
            self.spikes.clear()
        self._scan_gaps(table.step_view())
        column = table.view(LOSS)
        n = len(table.steps)
        if column is None or n <= self.rows:
            self.rows = n
            return
        done = self.rows
        if table.has_nonfinite(LOSS):  # set by any NaN/inf the column holds
            bad = ~np.isfinite(column[done:])
            for a, b in _runs(bad):
                _extend(self.nonfinite, [float(done + a), float(done + b)])
        self._scan_spikes(column, done, n)
        self.rows = n

    def _scan_gaps(self, steps: npt.NDArray[np.int64]) -> None:
        n = len(steps)
        if n <= self.rows:
            return
        first = self.rows - 1
        if self.rows <= LEARN_EVERY + 1:  # the interval is still being learned: all again
            learned = np.diff(steps[: LEARN_EVERY + 1])
            self.every = max(1, int(median(learned))) if len(learned) else 1
            self.gaps.clear()
            first = 0
        diffs = np.diff(steps[first:])
        self.gaps += (np.flatnonzero(diffs > self.every) + first).tolist()

    def _scan_spikes(self, column: npt.NDArray[np.float32], done: int, n: int) -> None:
        start = max(0, done - 8 * SPIKE_WINDOW)  # the windows of the new rows, as a rule
        while True:
            values = column[start:n].astype(np.float64)
            finite = np.flatnonzero(np.isfinite(values))
            if start == 0 or int(np.searchsorted(finite, done - start)) >= SPIKE_WINDOW:
                break
            start = 0  # a long non-finite stretch before them: from the first row
        rows = finite + start
        f = values[finite]
        first = max(int(np.searchsorted(rows, done)), SPIKE_MIN_BASE)
        found: list[tuple[int, float, float, float]] = []  # position, loss, baseline, z
        at_all = _candidates(f, first)
        for lo in range(0, len(at_all), CHUNK):
            at = at_all[lo : lo + CHUNK]
            med, scale = _baselines(f, at)
            x = f[at]
            z = (x - med) / scale
            up = np.flatnonzero((z >= SPIKE_Z) & ((med <= 0) | (x >= SPIKE_FACTOR * med)))
            hits = (at[up].tolist(), x[up].tolist(), med[up].tolist(), z[up].tolist())
            found += zip(*hits, strict=True)
        group: list[tuple[int, float, float, float]] = []
        for hit in [*found, None]:  # consecutive positions: one spike
            if group and (hit is None or hit[0] != group[-1][0] + 1):
                peak = max(group, key=lambda h: h[1])
                top = max(h[3] for h in group)
                first_row, last_row = rows[group[0][0]], rows[group[-1][0]]
                _extend(self.spikes, [float(first_row), float(last_row), peak[1], group[0][2], top])
                group = []
            if hit is not None:
                group.append(hit)


def _candidates(f: F64, first: int) -> npt.NDArray[np.int64]:
    """The positions of ``f`` from ``first`` on that may be spikes, without a median per
    position: a window of the previous :data:`SPIKE_WINDOW` values lies within two
    consecutive blocks of that size, and its median is at least the (W/2)-th smallest
    value of those two blocks; a loss under :data:`SPIKE_FACTOR` times that bound is
    under that many times its median (a 1M-step column: ~20 ms, against ~2.6 s for a
    median per position). Each block's bound is repeated over the block's positions
    (no array of positions, of bounds by position: each 8 MB for 1M steps)."""
    w = SPIKE_WINDOW
    n = len(f)
    short = np.arange(first, min(w, n), dtype=np.int64)  # (their windows are shorter)
    start = max(first, w)
    if start >= n:
        return short
    padded = np.full(-(-n // w) * w, np.inf)
    padded[:n] = f
    blocks = padded.reshape(-1, w)
    pairs = np.concatenate((blocks[:-1], blocks[1:]), axis=1)
    k = w // 2 - 1
    low = np.partition(pairs, k, axis=1)[:, k]  # at most any window's median in the pair
    bound = np.repeat(low, w)[start - w : n - w]  # position p's: low[p // w - 1]
    tail = f[start:]
    maybe = (bound <= 0) | (tail >= SPIKE_FACTOR * bound)
    return np.concatenate((short, np.flatnonzero(maybe) + start))


def _baselines(f: F64, at: npt.NDArray[np.int64]) -> tuple[F64, F64]:
    """The rolling median and robust scale of the finite losses before each position
    ``at`` of ``f`` (the previous :data:`SPIKE_WINDOW` of them, fewer at the start)."""
    w = SPIKE_WINDOW
    med = np.empty(len(at))
    mad = np.empty(len(at))
    for j in np.flatnonzero(at < w).tolist():  # the first steps: every value before them
        before = f[: at[j]]
        med[j] = median(before)
        mad[j] = median(np.abs(before - med[j]))
    full = np.flatnonzero(at >= w)
    if len(full):
        windows = sliding_window_view(f, w)[at[full] - w]  # f[p - w : p], copied
        m = median(windows, 1)
        med[full] = m
        mad[full] = median(np.abs(windows - m[:, None]), 1)
    # a flat stretch has no spread: a step 0.1 % of its level above it is not far
    scale = np.maximum(MAD_TO_SIGMA * mad, 1e-3 * np.abs(med))
    return med, np.where(scale > 0, scale, np.finfo(np.float64).tiny)


def _runs(mask: npt.NDArray[np.bool_]) -> list[tuple[int, int]]:
    """(first, last) index of each run of True in ``mask``."""
    if not mask.any():
        return []
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1) - 1
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def _extend(groups: list[list[float]], new: list[float]) -> None:
    """Append ``new`` ([first row, last row, …]), or merge it into the last group when it
    continues it (scans of consecutive builds meet at a row boundary)."""
    if groups and groups[-1][1] + 1 == new[0]:
        last = groups[-1]
        last[1] = new[1]
        if len(last) > 2 and new[2] > last[2]:  # a spike: the higher peak, the higher z
            last[2] = new[2]
        if len(last) > 4:
            last[4] = max(last[4], new[4])
        return
    groups.append(new)


def find_anomalies(state: RunState, scan: LossScan | None = None) -> tuple[Anomaly, ...]:
    """The run's anomalies, in the order of their steps: non-finite stretches, spikes,
    resumes, steps not logged. ``scan``: kept by the caller between builds of one run
    (only new rows are scanned); without one the whole column is."""
    scan = scan if scan is not None else LossScan()
    scan.update(state)
    table = state.table
    steps = table.step_view()  # a view: read under the model's lock
    column = table.view(LOSS)
    n = len(steps)

    def shown(row: float) -> int:
        return int(steps[int(row)]) + 1  # step_number, of a row that exists

    found: list[tuple[float, Anomaly]] = []
    for a, b in scan.nonfinite:
        if b >= n or column is None:
            continue
        bad = column[int(a) : int(b) + 1]
        words = [_word(float(v)) for v in bad[: min(len(bad), 1000)]]
        values = tuple(dict.fromkeys(words))
        found.append(
            (a, NonFinite(shown(a), shown(b), int(b - a) + 1, values, to_end=int(b) == n - 1))
        )
    for a, b, peak, base, z in scan.spikes:
        if b < n:
            found.append((a, Spike(shown(a), shown(b), peak, base, z)))
    ts = table.ts_view()
    found += [(float(np.searchsorted(ts, r.at)), r) for r in _resumes(state, steps, ts)]
    for i in scan.gaps:
        if i + 1 < n:
            missing = round(int(steps[i + 1] - steps[i]) / scan.every) - 1
            if missing >= 1:
                found.append((i, Gap(shown(i), shown(i + 1), missing, scan.every)))
    found.sort(key=lambda item: item[0])
    return tuple(a for _, a in found)


def _word(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    return "Infinity" if v > 0 else "-Infinity"


def _resumes(state: RunState, steps: npt.NDArray[np.int64], ts: F64) -> list[Resume]:
    """Each ``resume`` event with the first step it logged and what it did again; a
    rewind of the steps without one (a new process from a checkpoint, no telemetry of
    its start) is a resume too."""
    out: list[Resume] = []
    redos = list(state.redos)
    starts = sorted(e.ts for e in state.events if e.event in ("start", "resume"))
    for event in state.events:
        if event.event != "resume":
            continue
        # its own steps: those before the next process started (a resume that died
        # before its first step is credited with none of the next one's)
        until = next((t for t in starts if t > event.ts), math.inf)
        i = int(np.searchsorted(ts, event.ts, side="left"))
        first = step_number(int(steps[i])) if i < len(steps) and ts[i] < until else None
        redo = next((r for r in redos if event.ts <= r.ts < until), None)
        if redo is not None:
            redos.remove(redo)
        again = (redo.first + 1, redo.last + 1) if redo is not None else None
        # the last step it logged (before the next start): how far its redoing got
        j = int(np.searchsorted(ts, until, side="left")) - 1 if until < math.inf else len(ts) - 1
        reached = step_number(int(steps[j])) if first is not None and j >= i else None
        out.append(Resume(event.ts, first, again, superseded=until < math.inf, reached=reached))
    last = step_number(int(steps[-1])) if len(steps) else None
    out += [Resume(r.ts, r.first + 1, (r.first + 1, r.last + 1), reached=last) for r in redos]
    return out
