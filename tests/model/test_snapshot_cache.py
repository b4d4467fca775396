"""The snapshot cache: a long run's lines reduce only the rows that arrived since the
last build, look as a full reduction does, and are dropped when the table is rewound."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from eagle3_tui.model.run import Run
from eagle3_tui.model.snapshot import (
    INCREMENTAL_ROWS,
    SnapshotCache,
    ViewParams,
    build_snapshot,
)
from tests.records import Lines

T0 = 1_800_000_000.0
ROWS = 3 * INCREMENTAL_ROWS


def long_run(rows: int = ROWS) -> tuple[Run, Lines]:
    """``rows`` steps: a few as records, the rest as columns (as a backlog is fed)."""
    lines = Lines(t0=T0, dt=0.5)
    run = Run()
    run.feed(0, b"".join(lines.train(s, 3.0) for s in range(10)))
    table = run.state.table
    steps = np.arange(10, rows, dtype=np.int64)
    rng = np.random.default_rng(0)
    columns: dict[str, np.ndarray[Any, np.dtype[np.float64]]] = {}
    for key in table.columns:
        base = np.frombuffer(table.columns[key], dtype=np.float32)[0]
        columns[key] = float(base) * (1 + 0.1 * rng.standard_normal(len(steps)))
    columns["train/loss"] = 3.0 - steps / rows + rng.standard_normal(len(steps)) * 0.05
    columns["train/loss"][rows // 2] = 9.0  # a spike: M4 keeps it
    table.extend_columns(steps, (T0 + steps * 0.5).astype(np.float64), columns)
    lines.at(T0 + rows * 0.5)
    return run, lines


def line(snap: object, kind: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    found = next(ln for ln in snap.loss_lines if ln.kind == kind)  # type: ignore[attr-defined]
    return found.x, found.y


def test_a_new_build_reduces_only_the_new_rows() -> None:
    run, lines = long_run()
    cache = SnapshotCache()
    view = ViewParams(columns=55)
    build_snapshot(run.state, T0, view, cache)
    first = cache.reduced_rows
    assert first >= ROWS * 10  # the first build reduces every plotted series once
    run.feed(10**9, b"".join(lines.train(s, 2.0) for s in range(ROWS, ROWS + 10)))
    snap = build_snapshot(run.state, T0, view, cache)
    assert cache.reduced_rows - first < first // 10  # the new rows and partial buckets
    assert line(snap, "raw")[0][-1] == ROWS + 9  # and the new step is in the line


def test_cached_lines_look_as_a_full_reduction() -> None:
    run, _ = long_run()
    view = ViewParams(columns=55)
    full = build_snapshot(run.state, T0, view)
    cached = build_snapshot(run.state, T0, view, SnapshotCache())
    fx, fy = line(full, "raw")
    cx, cy = line(cached, "raw")
    assert (cx[0], cx[-1], cy[-1]) == (fx[0], fx[-1], fy[-1])
    assert max(cy) == max(fy) == 9.0 and min(cy) == min(fy)  # the envelope, spike kept
    assert len(cy) <= 4 * 55 * 2 + 8
    fx, fy = line(full, "smoothed")
    cx, cy = line(cached, "smoothed")
    assert cx[-1] == fx[-1] and math.isclose(cy[-1], fy[-1], rel_tol=1e-9)
    assert 110 <= len(cy) <= 2 * 110 + 2
    assert max(abs(a - b) for a, b in zip(np.interp(fx, cx, cy), fy, strict=True)) < 0.05
    assert full.tau_line is not None and cached.tau_line is not None
    assert math.isclose(cached.tau_line.y[-1], full.tau_line.y[-1], rel_tol=1e-9)


def test_a_rewound_table_is_reduced_again() -> None:
    run, lines = long_run()
    cache = SnapshotCache()
    view = ViewParams(columns=55, smoothing=0.0)
    build_snapshot(run.state, T0, view, cache)
    run.feed(10**9, lines.train(ROWS - 5000, 1.0))  # a resume from an earlier step
    snap = build_snapshot(run.state, T0, view, cache)
    fresh = build_snapshot(run.state, T0, view, SnapshotCache())
    assert line(snap, "raw") == line(fresh, "raw")
    assert line(snap, "raw")[0][-1] == ROWS - 5000


def test_gpu_rows_are_reused_until_a_new_sample() -> None:
    run, lines = long_run(100)
    run.feed(10**9, lines.gpu(50.0, devices=8))
    cache = SnapshotCache()
    a = build_snapshot(run.state, T0, cache=cache)
    b = build_snapshot(run.state, T0 + 1, cache=cache)
    assert a.gpus is b.gpus and len(a.gpus) == 8
    run.feed(2 * 10**9, lines.gpu(60.0, devices=8))
    c = build_snapshot(run.state, T0 + 2, cache=cache)
    assert c.gpus is not b.gpus and c.gpus[0].util == 60.0


def test_lines_of_an_earlier_snapshot_are_kept_until_the_table_is_rewound() -> None:
    """``lines_of``: the earlier snapshot's lines as they were (nothing reduced), the
    rest of the picture new; a rewound table builds them anew all the same."""
    run, lines = long_run()
    cache = SnapshotCache()
    view = ViewParams(columns=55)
    first = build_snapshot(run.state, T0, view, cache)
    run.feed(10**9, b"".join(lines.train(s, 2.0) for s in range(ROWS, ROWS + 10)))
    reduced = cache.reduced_rows
    kept = build_snapshot(run.state, T0 + 1, view, cache, lines_of=first)
    assert reduced > 0 and cache.reduced_rows == reduced
    assert kept.loss_lines == first.loss_lines and kept.acc_lines == first.acc_lines
    assert kept.tau_line is first.tau_line and kept.ttt_loss_lines is first.ttt_loss_lines
    assert kept.global_step == ROWS + 9 and kept.latest["train/loss"] == 2.0  # the rest is new
    built = build_snapshot(run.state, T0 + 1, view, cache)
    assert line(built, "raw")[0][-1] == ROWS + 9
    run.feed(2 * 10**9, lines.train(ROWS - 5000, 1.0))  # a resume from an earlier step
    rewound = build_snapshot(run.state, T0 + 2, view, cache, lines_of=built)
    fresh = build_snapshot(run.state, T0 + 2, view, SnapshotCache())
    assert line(rewound, "raw") == line(fresh, "raw")
    assert line(rewound, "raw")[0][-1] == ROWS - 5000


def test_an_ended_runs_average_pace_is_kept_until_its_rows_change() -> None:
    run, lines = long_run(2000)
    run.feed(10**9, lines.event("finish", global_step=1999))
    cache = SnapshotCache()
    view = ViewParams(columns=55)

    def pace_of(snap: Any) -> tuple[float | None, float | None]:
        return snap.progress.steps_per_s, snap.progress.tokens_per_s

    first = build_snapshot(run.state, T0 + 5000, view, cache)
    again = build_snapshot(run.state, T0 + 5010, view, cache)
    fresh = build_snapshot(run.state, T0 + 5010, view, SnapshotCache())
    assert first.progress.steps_per_s is not None
    assert pace_of(first) == pace_of(again) == pace_of(fresh)
    # resumed from an earlier step at another pace, then finished: read anew
    lines.at(T0 + 6000)
    lines.dt = 2.0
    parts = [lines.event("start", global_step=1500)]
    parts += [lines.train(s, 1.0) for s in range(1500, 1600)]
    parts.append(lines.event("finish", global_step=1599))
    run.feed(2 * 10**9, b"".join(parts))
    after = build_snapshot(run.state, T0 + 7000, view, cache)
    fresh = build_snapshot(run.state, T0 + 7000, view, SnapshotCache())
    assert pace_of(after) == pace_of(fresh) != pace_of(first)
