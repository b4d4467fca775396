"""Derived figures (tau, smoothing, pace, ETA) and spike-keeping downsampling."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from eagle3_tui.model import downsample
from eagle3_tui.model.derived import (
    ema,
    eta,
    rates,
    smoothed,
    steps_per_epoch,
    tau_from_cond,
    tau_of,
)
from eagle3_tui.model.downsample import m4, m4_indices


def full(*acc: float) -> dict[str, float | None]:
    return {f"train/full_acc_{k}": a for k, a in enumerate(acc)}


def test_tau_is_one_plus_the_sum_of_full_accuracies() -> None:
    assert tau_of(full(0.8, 0.56, 0.336)) == pytest.approx(1 + 0.8 + 0.56 + 0.336)
    assert tau_of({}) is None
    assert tau_of(full(0.5, math.nan)) is None


def test_tau_from_conditional_accuracies_is_their_running_product() -> None:
    # cond 0.8, 0.7, 0.6 -> full 0.8, 0.56, 0.336
    assert tau_from_cond([0.8, 0.7, 0.6]) == pytest.approx(1 + 0.8 + 0.56 + 0.336)


def test_tau_prefers_logged_full_accuracies_over_the_product() -> None:
    """speculators' ratios have different denominators: the product can differ."""
    latest = {
        "train/full_acc_0": 0.6,
        "train/full_acc_1": 0.3,
        "train/cond_acc_0": 0.6,
        "train/cond_acc_1": 0.6,
    }
    assert tau_of(latest, 2) == pytest.approx(1.9)
    assert tau_from_cond([0.6, 0.6]) == pytest.approx(1.96)
    assert tau_of({"train/cond_acc_0": 0.6, "train/cond_acc_1": 0.6}, 2) == pytest.approx(1.96)


def test_ema_is_tensorboards_debiased_smoothing() -> None:
    w = 0.6
    values = np.array([1.0, 2.0, 3.0, math.nan, 5.0])
    out = ema(values, w)
    last, n, expected = 0.0, 0, []
    for v in values:
        if not math.isnan(v):
            last = last * w + (1 - w) * v
            n += 1
        expected.append(last / (1 - w**n))
    assert out.tolist() == pytest.approx(expected)
    assert out[0] == 1.0  # debiased: the first value is itself


def test_smoothing_has_the_same_time_constant_at_any_zoom() -> None:
    w = 0.999
    x = np.arange(100_000, dtype=np.float64)
    y = np.where(x < 50_000, 1.0, 2.0)
    for buckets in (100, 1000, 10_000):
        xs, ys = smoothed(x, y, w, buckets)
        for target in (50_999, 51_999, 53_999):
            i = int(np.searchsorted(xs, target))
            exact = 1.0 + (1.0 - w ** (xs[i] - 49_999))  # per-step EMA of the step function
            assert ys[i] == pytest.approx(exact, abs=0.02), (buckets, target)


def test_rates_and_eta() -> None:
    steps = np.arange(0, 121, dtype=np.int64)
    ts = (1000.0 + steps * 0.5).astype(np.float64)
    tps = np.full(121, 2000.0, dtype=np.float64)
    step_ms = np.full(121, 500.0, dtype=np.float64)
    steps_per_s, tokens_per_s = rates(steps, ts, tps, step_ms, window_s=60.0)
    assert steps_per_s == pytest.approx(2.0)
    assert tokens_per_s == pytest.approx(2000.0)
    epoch_eta, run_eta = eta(step=120, epoch=1, spe=100, total_steps=300, steps_per_s=2.0)
    assert epoch_eta == pytest.approx((200 - 121) / 2.0)
    assert run_eta == pytest.approx((300 - 121) / 2.0)
    assert eta(120, 1, None, None, 2.0) == (None, None)
    assert eta(120, 1, 100, 300, None) == (None, None)


def test_steps_per_epoch_is_inferred_from_the_epoch_column() -> None:
    steps = np.arange(0, 250, dtype=np.int64)
    assert steps_per_epoch((steps // 100).astype(np.float64), steps) == 100
    assert steps_per_epoch(np.zeros(50), steps[:50]) is None


def _first_change(epoch_col: np.ndarray, steps: np.ndarray) -> int | None:
    """steps_per_epoch as it read every row at once (before windows)."""
    for i in np.flatnonzero(np.diff(epoch_col) > 0):
        nxt = epoch_col[i + 1]
        if np.isfinite(nxt) and nxt >= 1:
            return round(float(steps[i + 1]) / float(nxt))
    return None


@pytest.mark.parametrize("at", [1, 100, 16_383, 16_384, 16_385, 49_151, 49_152, 49_153, 300_000])
def test_steps_per_epoch_finds_the_first_change_wherever_it_is(at: int) -> None:
    """Looked for in windows that double from the start: a change on a window's edge,
    after a NaN, or after a change to epoch 0 is found as reading every row found it."""
    n = 400_000
    steps = np.arange(n, dtype=np.int64)
    epoch = np.zeros(n)
    epoch[at:] = 3.0  # epoch 3 from row ``at``: 'at / 3' steps an epoch
    assert steps_per_epoch(epoch, steps) == round(at / 3) == _first_change(epoch, steps)
    epoch[at - 1] = np.nan  # NaN before the change: no change at ``at``, the next counts
    epoch[at + 7 :] = 5.0
    assert steps_per_epoch(epoch, steps) == round((at + 7) / 5) == _first_change(epoch, steps)
    assert steps_per_epoch(np.zeros(n), steps) is None is _first_change(np.zeros(n), steps)


# ---- downsampling -------------------------------------------------------------------


def test_m4_keeps_the_spike_that_stride_sampling_drops() -> None:
    x = np.arange(1_000_000, dtype=np.float64)
    y = np.random.default_rng(0).random(1_000_000)
    y[123_457] = 50.0
    y[987_653] = -7.0
    xs, ys = m4(x, y, 480)
    assert len(xs) <= 4 * 480 + 4
    assert ys.max() == 50.0 and ys.min() == -7.0
    assert xs[0] == 0 and xs[-1] == 999_999
    assert (np.diff(xs) > 0).all()
    assert y[::2084].max() < 50.0  # what stride sampling would have shown


finite_arrays = hnp.arrays(
    np.float64,
    st.integers(min_value=1, max_value=3000),
    elements=st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
)


@settings(max_examples=80, deadline=None)
@given(
    hnp.arrays(
        np.float64,
        st.integers(min_value=1, max_value=30_000),
        elements=st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
    ),
    st.integers(min_value=1, max_value=300),
)
def test_m4_envelope_equals_the_raw_envelope(y: np.ndarray, buckets: int) -> None:
    idx = m4_indices(y, buckets)
    assert (np.diff(idx) > 0).all() and idx[0] == 0 and idx[-1] == len(y) - 1
    assert y[idx].max() == y.max() and y[idx].min() == y.min()


@settings(max_examples=60, deadline=None)
@given(finite_arrays, st.integers(min_value=1, max_value=100), st.data())
def test_m4_with_gaps_ignores_nan_and_keeps_finite_extremes(
    y: np.ndarray, buckets: int, data: st.DataObject
) -> None:
    y = y.copy()
    holes = data.draw(st.lists(st.integers(0, len(y) - 1), max_size=len(y) // 2))
    y[holes] = math.nan
    idx = m4_indices(y, buckets, nonfinite=True)
    finite = y[np.isfinite(y)]
    kept = y[idx][np.isfinite(y[idx])]
    if len(finite):
        assert kept.max() == finite.max() and kept.min() == finite.min()


def test_the_numpy_fallback_keeps_the_same_envelope(monkeypatch: pytest.MonkeyPatch) -> None:
    y = np.random.default_rng(1).random(100_003)
    y[77_777] = 9.0
    fast = y[m4_indices(y, 120)]
    monkeypatch.setattr(downsample, "_fast_m4", None)
    slow = y[m4_indices(y, 120)]
    assert fast.max() == slow.max() == 9.0 and fast.min() == slow.min()
