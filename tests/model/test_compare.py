"""Comparing two runs: alignment, differences at the same point, verdict, recipe diff."""

from __future__ import annotations

import json
import math

import pytest

from eagle3_tui.model.compare import (
    Comparison,
    Row,
    argv_flags,
    compare,
    comparison_json,
    format_comparison,
)
from eagle3_tui.model.run import Run
from eagle3_tui.model.state import RunState
from tests.records import Lines

T0 = 1_800_000_000.0


def acc_at(step: int, base: float) -> tuple[float, ...]:
    """Conditional accuracies that rise with training, per TTT step."""
    c = min(0.95, base + step / 20_000)
    return (c, c * 0.95, c * 0.9)


def make_run(
    n: int,
    base: float,
    *,
    every: int = 1,
    ttt: int = 3,
    writer: str = "w",
    tokens_per_s: float = 1000.0,
    step_s: float = 1.0,
    redo_at: int | None = None,
) -> RunState:
    lines = Lines(writer=writer, t0=T0, dt=0.0)
    parts = []

    def emit(step: int) -> None:
        acc = acc_at(step, base)[:ttt] if ttt <= 3 else acc_at(step, base) + (0.5,) * (ttt - 3)
        rec = lines.at(T0 + step * step_s).train(
            step, 3.0 - step / 2000, acc=acc, epoch=step // 500
        )
        parts.append(
            rec.replace(b'"tokens_per_s": 1000.0', f'"tokens_per_s": {tokens_per_s}'.encode())
        )

    for step in range(0, n, every):
        emit(step)
        if redo_at is not None and step == redo_at:
            for redo in range(redo_at - 50, redo_at + every, every):  # a resume redoes 50 steps
                emit(redo)
    run = Run()
    run.feed(0, b"".join(parts))
    return run.state


def row(c: Comparison, metric: str) -> Row:
    return next(r for r in c.rows if r.metric == metric)


def test_unequal_lengths_compare_at_the_furthest_common_step() -> None:
    new = make_run(1000, base=0.55)
    old = make_run(5000, base=0.45)
    c = compare(new, old)
    assert c.at == 999 and c.at_step_a == 999 and c.at_step_b == 999
    tau = row(c, "τ")
    assert tau.delta is not None and tau.delta > 0.1 and tau.better == "a"
    # shown 1-based, as everywhere (c.at and at_step_*: speculators' global_step)
    ahead = f"This run is ahead by {tau.delta:+.2f} τ at step 1,000 (same step)"
    assert c.verdict.startswith(ahead), c.verdict
    loss = row(c, "loss")
    assert loss.delta == pytest.approx(0.0, abs=1e-3)  # same loss curve by construction
    assert c.b.last_step == 4999 and c.a.tau_end is not None and c.b.tau_end is not None
    assert c.b.tau_end > c.a.tau_end


def test_a_run_behind_says_so() -> None:
    c = compare(make_run(800, base=0.40), make_run(800, base=0.60))
    assert "behind by 0." in c.verdict and row(c, "full_acc_0").better == "b"
    assert "-" not in c.verdict.partition("behind by ")[2][:6], c.verdict


def test_different_ttt_counts_compare_the_shared_steps_and_warn() -> None:
    c = compare(make_run(600, 0.5, ttt=3), make_run(600, 0.5, ttt=5))
    names = [r.metric for r in c.rows]
    assert "full_acc_2" in names and "full_acc_3" not in names
    assert "3 vs 5 TTT steps" in c.verdict
    delta = row(c, "τ").delta
    assert delta is not None and delta < 0


def test_different_log_freq_compares_like_with_like() -> None:
    every_step = make_run(2000, base=0.5)
    every_ten = make_run(2000, base=0.5, every=10)
    c = compare(every_step, every_ten)
    assert c.a.log_every == 1 and c.b.log_every == 10
    for r in c.rows:
        assert r.delta is not None and abs(r.delta) < 0.01, r  # the same curves


def test_resume_segments_use_the_final_values() -> None:
    plain = make_run(1000, base=0.5)
    resumed = make_run(1000, base=0.5, redo_at=600, writer="w2")
    assert resumed.redos and resumed.redos[0].first == 550
    c = compare(resumed, plain)
    assert c.at == 999
    for r in c.rows:
        assert r.delta is not None and abs(r.delta) < 1e-6, r


def test_tokens_axis_aligns_runs_with_different_batch_sizes() -> None:
    # twice the tokens per step: at the same token count, half the steps
    big = make_run(1000, base=0.5, tokens_per_s=2000.0)
    small = make_run(2000, base=0.5, tokens_per_s=1000.0)
    c = compare(big, small, axis="tokens")
    assert c.axis == "tokens"
    assert c.at_step_a is not None and c.at_step_b is not None
    assert c.at_step_b == pytest.approx(2 * c.at_step_a, abs=2)
    assert "200.0k tokens (same tokens)" in c.verdict


def test_time_axis_takes_out_stops() -> None:
    lines = Lines(t0=T0, dt=0.0)
    data = b"".join(lines.at(T0 + s).train(s, 1.0) for s in range(100))
    data += b"".join(lines.at(T0 + 3600 + s).train(s, 1.0) for s in range(100, 200))  # 1 h stop
    run = Run()
    run.feed(0, data)
    c = compare(run.state, make_run(300, 0.5), axis="time")
    assert c.at == pytest.approx(199.0)  # 199 s of training, not an hour
    assert "at 3 min of training (same time)" in c.verdict, c.verdict


def test_time_axis_takes_out_a_quick_kill_and_resume() -> None:
    """A kill and its resume 16 s apart (under the 60 s a gap must last to be a stop):
    the 16 s without a process counted as training time. A process's start ends a stop
    whatever its length."""
    from eagle3_tui.model.compare import axis_values

    lines = Lines(t0=T0, dt=0.0)
    data = lines.at(T0).event("start", pid=1)
    data += b"".join(lines.at(T0 + s).train(s, 1.0) for s in range(100))
    data += lines.at(T0 + 100).event("interrupt", step=100)
    data += lines.at(T0 + 114).event("resume", pid=2, step=100)
    data += b"".join(lines.at(T0 + 116 + s - 100).train(s, 1.0) for s in range(100, 200))
    run = Run()
    run.feed(0, data)
    x = axis_values(run.state, "time")
    assert x is not None and x[-1] == pytest.approx(199.0)  # not 215: 16 s of no process


def test_a_short_time_is_said_in_seconds() -> None:
    """A tiny run's minute of training read "mean over 0 min – 0 min of training"."""
    from eagle3_tui.model.compare import fmt_x

    assert fmt_x("time", 42.4) == "42 s of training"
    assert fmt_x("time", 150) == "2 min of training"
    assert fmt_x("time", 7200) == "2.0 h of training"


def test_hparam_diff_shows_only_what_differs() -> None:
    a, b = make_run(100, 0.5), make_run(100, 0.5)
    a.set_manifest(
        {
            "argv": ["python", "-m", "x", "--lr", "3e-4", "--epochs", "3", "--run-dir", "/a"],
            "epochs": 3,
            "pid": 1,
            "env": {"WORLD_SIZE": "8"},
        }
    )
    b.set_manifest(
        {
            "argv": ["python", "-m", "x", "--lr", "1e-3", "--epochs", "3", "--run-dir", "/b"],
            "epochs": 3,
            "pid": 2,
            "env": {"WORLD_SIZE": "4"},
        }
    )
    a.hparams.update({"optimizer": {"name": "muon"}, "seed": 0})
    b.hparams.update({"optimizer": {"name": "adamw"}, "seed": 0})
    diff = {k: (va, vb) for k, va, vb in compare(a, b).hparam_diff}
    assert diff == {
        "argv.--lr": ("3e-4", "1e-3"),
        "run.env.WORLD_SIZE": ("8", "4"),
        "hparams.optimizer.name": ("muon", "adamw"),
    }


def test_the_runs_own_bookkeeping_is_not_a_difference() -> None:
    """What every run's manifest has and always differs in says nothing of the recipe."""
    a, b = make_run(100, 0.5), make_run(100, 0.5)
    for state, n in ((a, 1), (b, 2)):
        state.set_manifest(
            {
                "pid": n,
                "sampler_pid": 100 + n,
                "finished_at": T0 + n,
                "first_started_at": T0 - n,
                "resumes": n,
                "env": {"EAGLE3_TUI_RUN_DIR": f"/runs/{n}", "WORLD_SIZE": "8"},
                "telemetry": {"bytes": 1000 * n, "written": 10 * n, "errors": {}},
                "epochs": 3,
            }
        )
    assert compare(a, b).hparam_diff == ()


def test_a_delta_shown_as_zero_calls_no_run_better() -> None:
    a, b = make_run(200, 0.5), make_run(200, 0.5)
    b.set_manifest({})
    c = compare(a, b)
    assert all(r.delta == 0 for r in c.rows)
    assert all(r.better is None for r in c.rows)
    lines = [line for line in format_comparison(c).splitlines() if "+0.0000" in line]
    assert lines and not any("▲" in line or "▼" in line for line in lines)
    from eagle3_tui.model.compare import Row

    assert Row("loss", 1.0, 1.00002, -0.00002, False).better is None  # shows as -0.0000
    assert Row("loss", 1.0, 1.0002, -0.0002, False).better == "a"


def test_argv_flags() -> None:
    assert argv_flags(["x", "--a", "1", "--b=2", "--flag", "--c", "3"]) == {
        "a": "1",
        "b": "2",
        "flag": "true",
        "c": "3",
    }


def test_nothing_to_compare_is_said_plainly() -> None:
    c = compare(RunState(), make_run(100, 0.5))
    assert c.at is None and c.rows == () and "nothing to compare" in c.verdict
    with pytest.raises(ValueError, match="unknown axis"):
        compare(RunState(), RunState(), axis="epochs")


def test_json_form_is_valid_json() -> None:
    new, old = make_run(300, 0.5), make_run(300, 0.4)
    new.val_by_epoch[0] = {"loss_epoch": math.nan}
    data = comparison_json(compare(new, old))
    text = json.dumps(data, allow_nan=False)
    assert data["validation"]["a"][0]["loss_epoch"] == "NaN"
    assert '"verdict": "This run is ahead by' in text


def test_a_run_that_logs_only_conditional_accuracies_has_tau_everywhere() -> None:
    """τ has one definition (model.derived.tau_series): a run without full_acc_k gets it
    from its cond_acc_k in the header value, the τ line and the comparison's verdict."""
    from eagle3_tui.model.snapshot import ViewParams, build_snapshot

    def cond_only(state_base: float) -> RunState:
        lines = Lines(writer="c", t0=T0, dt=1.0)
        out = []
        for step in range(400):
            c = min(0.95, state_base + step / 2000)
            rec = json.loads(lines.train(step, 3.0 - step / 400, acc=(c, c, c)))
            rec["train"] = {k: v for k, v in rec["train"].items() if not k.startswith("full_acc")}
            out.append(json.dumps(rec).encode() + b"\n")
        run = Run()
        run.feed(0, b"".join(out))
        return run.state

    a, b = cond_only(0.6), cond_only(0.5)
    assert not any(k.startswith("train/full_acc") for k in a.table.columns)
    snap = build_snapshot(a, T0 + 400, ViewParams(columns=100))
    c = min(0.95, 0.6 + 399 / 2000)
    assert snap.tau == pytest.approx(1 + c + c * c + c**3, rel=1e-5)
    assert snap.tau_line is not None  # drawn smoothed: near the latest value
    assert snap.tau_line.y[-1] == pytest.approx(snap.tau, rel=0.01)
    verdict = compare(a, b).verdict
    assert "ahead" in verdict and "τ" in verdict


def test_the_window_is_said_as_the_steps_it_averages() -> None:
    """``compare`` said "mean over step 52 – step 72" with a JSON window [52.28, 72.0],
    where its values were the means over steps 53-72: the window starts at the first
    step it holds, said and averaged alike."""
    import numpy as np

    a, b = make_run(73, base=0.4), make_run(73, base=0.6)
    c = compare(a, b)
    assert c.window is not None and c.window[0] == int(c.window[0]), c.window
    lo, hi = c.window
    doc = comparison_json(c)
    assert doc["window"] == [lo + 1, hi + 1]  # as shown: 1-based steps
    assert f"mean over step {int(lo) + 1:,} – step {int(hi) + 1:,}" in format_comparison(c)
    loss = next(r for r in c.rows if r.metric == "loss")
    steps = np.arange(73, dtype=float)
    inside = (steps >= lo) & (steps <= hi)
    expected = float(np.mean(3.0 - steps[inside] / 2000))
    assert loss.a is not None and abs(loss.a - expected) < 1e-4, (loss.a, expected)


def test_a_small_token_count_is_said_in_its_own_unit() -> None:
    """A tiny run's ~7k tokens read "0.0M tokens" on every label of the token axis."""
    from eagle3_tui.model.compare import fmt_x

    assert fmt_x("tokens", 7_168) == "7.2k tokens"
    assert fmt_x("tokens", 512) == "512 tokens"
    assert fmt_x("tokens", 3.5e6) == "3.5M tokens" and fmt_x("tokens", 2e9) == "2.00B tokens"


def test_a_diverged_run_is_never_called_better() -> None:
    """A run whose loss went NaN at step 111: its model predicts one token everywhere,
    full acceptance 1.0 and τ at its top. ``compare`` called it ahead ("+2.63 τ", every
    metric ▲) and never said it diverged; now it says so, and no run is better."""
    lines = Lines(writer="w", t0=T0, dt=1.0)
    parts = [
        lines.train(s, 2.0 - s / 1000, acc=(0.5, 0.3, 0.2))
        if s < 110
        else lines.train(s, math.nan, acc=(1.0, 1.0, 1.0))
        for s in range(200)
    ]
    run = Run()
    run.feed(0, b"".join(parts))
    bad, good = run.state, make_run(200, base=0.45)
    for this, other, who in ((bad, good, "This run"), (good, bad, "The previous run")):
        c = compare(this, other)
        assert c.verdict.startswith(f"{who}'s loss is not finite from step 111 (diverged)")
        assert "no run is called better at step 200" in c.verdict, c.verdict
        assert all(r.better is None for r in c.rows), c.rows
        assert "ahead" not in format_comparison(c) and "behind" not in format_comparison(c)
    # before the divergence, compared as ever
    early = Run()
    early.feed(0, b"".join(parts[:100]))
    assert "ahead" in compare(make_run(100, 0.6), early.state).verdict


def test_a_run_that_logged_no_step_is_said_so_and_its_unknown_hparams_are_no_difference() -> None:
    """``compare A F``, F dead before its first step: "nothing to compare yet" (it will
    never have a step), and every hparam of A listed as differing from F's "–"; a kill's
    bookkeeping (``run.stop_saves``) shown as a raw structure."""
    lines = Lines(t0=T0)
    a = state_of(
        lines.make("hparams", hparams={"epochs": 6, "lr": 0.01})
        + b"".join(lines.train(s, 1.0) for s in range(20))
    )
    a.set_manifest({"stop_saves": [{"at": T0, "from": "interrupted", "path": "3"}], "epochs": 6})
    dead = Lines(t0=T0)
    f = state_of(dead.event("start", pid=4242) + dead.event("crash", error="OOM"))
    f.set_manifest({"epochs": 6})
    c = compare(a, f)
    assert c.verdict == "The previous run logged no training step: nothing to compare.", c.verdict
    keys = {key for key, _, _ in c.hparam_diff}
    assert not any(k.startswith("hparams.") for k in keys), c.hparam_diff
    assert "run.stop_saves" not in keys, c.hparam_diff
    # what only steps tell (TTT steps, the logging interval) and nulls: unknown, not "0"
    f.set_manifest({"epochs": 6, "total_steps": None})
    a.set_manifest({"epochs": 6, "total_steps": 240})
    keys = {key for key, _, _ in compare(a, f).hparam_diff}
    assert not keys & {"ttt_steps", "log_every_steps", "run.total_steps"}, keys
    # its TTT steps, in the JSON and the text: not known, not "0"
    assert comparison_json(c)["b"]["ttt_steps"] is None, comparison_json(c)["b"]
    assert comparison_json(c)["a"]["ttt_steps"] == a.ttt_steps > 0
    assert "TTT steps not known" in format_comparison(c), format_comparison(c)
    assert "0 TTT steps" not in format_comparison(c), format_comparison(c)


def state_of(data: bytes) -> RunState:
    run = Run()
    run.feed(0, data)
    return run.state
