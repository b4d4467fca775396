"""Snapshots for the UI and summaries for scripts."""

from __future__ import annotations

import json
import math

from eagle3_tui.exits import BY_HEALTH as EXIT_BY_HEALTH
from eagle3_tui.model.run import Run
from eagle3_tui.model.snapshot import ViewParams, build_snapshot
from eagle3_tui.model.summary import format_text, summarize
from tests.records import Lines

T0 = 1_800_000_000.0


def run_of(data: bytes) -> Run:
    run = Run()
    run.feed(0, data)
    return run


def sample_run() -> Run:
    lines = Lines(t0=T0, dt=0.5)
    data = b"".join(lines.train(s, 3.0 - s / 1000, epoch=s // 500) for s in range(2000))
    data += lines.val(500, 0, 2.5) + lines.val(1000, 1, 2.0)
    data += (
        lines.gpu(93.0) + lines.io(3e6) + lines.ckpt("save_finished", "/c/1", bytes=2e9, epoch=1)
    )
    data += lines.log("Training epoch 4/8 started")
    return run_of(data)


def test_lines_are_reduced_to_the_plot_width_and_windowed() -> None:
    run = sample_run()
    snap = build_snapshot(run.state, T0 + 1000, ViewParams(columns=50, smoothing=0.6))
    raw = next(line for line in snap.loss_lines if line.kind == "raw")
    assert len(raw.x) <= 4 * 50 + 4 and raw.x[0] == 0 and raw.x[-1] == 1999
    smooth = next(line for line in snap.loss_lines if line.kind == "smoothed")
    assert len(smooth.x) <= 100
    val = next(line for line in snap.loss_lines if line.kind == "val")
    assert val.x == (500.0, 1000.0) and val.y == (2.5, 2.0)
    assert {line.label for line in snap.acc_lines} == {
        f"{k}_acc_{i}" for k in ("full", "cond") for i in range(3)
    }
    assert snap.tau_line is not None
    windowed = build_snapshot(run.state, T0 + 1000, ViewParams(columns=50, window=100))
    wraw = next(line for line in windowed.loss_lines if line.kind == "raw")
    assert wraw.x[0] == 1900 and wraw.x[-1] == 1999
    assert all(line.x[0] >= 1900 for line in windowed.acc_lines)


def test_progress_pace_eta_and_samplers() -> None:
    run = sample_run()
    snap = build_snapshot(run.state, T0 + 1000, ViewParams())
    p = snap.progress
    # shown 1-based (step 2000 = 2000 steps done; epoch 4 of 8); speculators' counters 0-based
    assert p.step == 2000 and p.global_step == 1999 and p.epoch == 4 and p.epochs_total == 8
    assert p.steps_per_epoch == 500 and p.total_steps == 4000
    assert p.steps_per_s is not None and math.isclose(p.steps_per_s, 2.0, rel_tol=1e-6)
    late = T0 + 1000 - (run.state.last_train_ts or 0.0)  # counted down from its last step
    assert p.eta_run_s is not None and math.isclose(p.eta_run_s, 2000 / 2.0 - late, rel_tol=1e-6)
    assert p.fetch_frac is not None and math.isclose(p.fetch_frac, 0.05, rel_tol=1e-6)
    assert [g.util for g in snap.gpus] == [93.0, 93.0]
    assert snap.io is not None and snap.io.recent_files == ("hs_1.safetensors",)
    assert snap.checkpoints[-1].path == "/c/1"
    assert snap.tau is not None and math.isclose(snap.tau, 1 + 0.5 + 0.15 + 0.03, rel_tol=1e-6)


def test_summary_is_json_ready_and_names_everything() -> None:
    lines = Lines(t0=T0)
    data = b"".join(lines.train(s, 1.0) for s in range(30))
    data += lines.make("train", step=30, lr=1e-3, epoch=0, train={"loss": "NaN", "full_acc_0": 0.1})
    data += b"not json\n" + lines.no_driver()
    run = run_of(data)
    summary = summarize(run.state, lines.ts)
    text = json.dumps(summary, allow_nan=False)  # valid JSON: no NaN tokens
    assert summary["health"] == "diverged" and summary["loss"] == "NaN"
    assert summary["malformed_lines"] == 1 and summary["gpus"]["status"] == "no_driver"
    assert [t["step"] for t in summary["ttt"]] == [0, 1, 2]
    assert EXIT_BY_HEALTH[summary["health"]] == 6
    assert "no NVIDIA driver" in format_text(summary)
    assert '"records": 32' in text


def test_a_finished_run_has_no_eta() -> None:
    lines = Lines(t0=T0)
    data = b"".join(lines.train(s, 1.0, epoch=s // 10) for s in range(30)) + lines.event(
        "finish", step=30
    )
    snap = build_snapshot(run_of(data).state, lines.ts, ViewParams())
    assert snap.health.value == "finished"
    assert snap.progress.eta_run_s is None and snap.progress.eta_epoch_s is None
