"""The snapshot's per-TTT-step loss lines (drawn under the loss by the monitor)."""

from __future__ import annotations

from eagle3_tui.model.run import Run
from eagle3_tui.model.snapshot import ViewParams, build_snapshot
from tests.records import Lines

T0 = 1_800_000_000.0


def test_each_ttt_step_has_a_loss_line_reduced_windowed_and_smoothed_like_the_loss() -> None:
    lines = Lines(t0=T0, dt=0.5)
    run = Run()
    run.feed(0, b"".join(lines.train(s, 3.0 - s / 1000) for s in range(2000)))
    snap = build_snapshot(run.state, T0 + 1000, ViewParams(columns=50, smoothing=0.6))
    assert [line.label for line in snap.ttt_loss_lines] == ["loss_0", "loss_1", "loss_2"]
    assert all(line.kind == "smoothed" and len(line.x) <= 100 for line in snap.ttt_loss_lines)
    assert snap.ttt_loss_lines[0].x[-1] == 1999
    raw = build_snapshot(run.state, T0 + 1000, ViewParams(columns=50, window=100, smoothing=0))
    assert all(line.kind == "raw" and line.x[0] == 1900 for line in raw.ttt_loss_lines)
    assert abs(raw.ttt_loss_lines[1].y[-1] - (3.0 - 1.999) / 3) < 1e-6
