"""Comparing two runs: "is the new drafter better than the last one?"

Both runs are aligned on one axis:

* ``step``: the global step (the default);
* ``tokens``: training tokens seen, summed per logged step from the profile
  (``tokens_per_s × step_ms``), so runs with different batch sizes line up;
* ``time``: training wall time since the first step, with stops (gaps longer
  than ``max(60 s, 20 × the median step time)``, and the time from a process's
  last step to the next process's first, a kill and its resume however quick)
  counted as one ordinary step.

Values are compared *at the same point*: the furthest point both runs reached,
each run's metric averaged over the same window before it (so a run that logs
every 10 steps compares fairly with one that logs every step, and one noisy
step does not decide). τ = 1 + Σ full_acc_k uses each run's own TTT steps; when
the counts differ the verdict says so, since more draft tokens raise τ by
themselves.

Over 600 lines: the alignment, its window, the verdict and the recipe's differences
are one comparison, each read with the others (and its JSON and text made of them).

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from eagle3_tui.model.derived import epoch_number, smoothed, step_number, tau_of, tau_series
from eagle3_tui.model.downsample import m4
from eagle3_tui.model.median import median
from eagle3_tui.model.snapshot import Line, ValRow, ViewParams
from eagle3_tui.model.state import RunState

F64 = npt.NDArray[np.float64]
AXES = ("step", "tokens", "time")
AXIS_LABEL = {"step": "global step", "tokens": "training tokens", "time": "training time (s)"}
AXIS_COUNTS = {"tokens": "token counts", "time": "timestamps"}
"""What a run lacks when it cannot be placed on an axis."""
GAP_MIN_S = 60.0
GAP_STEPS = 20.0
WINDOW_MIN_POINTS = 20
"""At least this many logged points of the sparser run fall in the comparison window."""

# manifest fields that always differ between runs and say nothing about the recipe
_VOLATILE = frozenset(
    {
        "run_id",
        "pid",
        "pgid",
        "sid",
        "start_ticks",
        "boot_id",
        "started_at",
        "updated_at",
        "status",
        "launcher_pid",
        "run_dir",
        "cwd",
        "argv",
        "resume_command",
        "log_file",
        "metrics_file",
        "schema",
        "env.EAGLE3_TUI_RUN_ID",
        "env.MASTER_PORT",
        "env.TORCHELASTIC_RUN_ID",
        "checkpoint_dir",
        "env.EAGLE3_TUI_RUN_DIR",
        "sampler_pid",
        "finished_at",
        "first_started_at",
        "resumes",
        # a process's or a kill's bookkeeping, not how the run was trained
        "stop",
        "stop_saves",
        "restart",
        "resume_env_file",
        "attached_at",
        "copy_of",
    }
)
_VOLATILE_PREFIXES = ("telemetry.",)
"""The writer's own counters at the end of a run (bytes, written, errors, …)."""
DELTA_DIGITS = 4
"""Deltas are shown to 4 decimals: one that rounds to ±0.0000 calls no run better."""


@dataclass(frozen=True, slots=True)
class Side:
    """What one run reached."""

    label: str
    last_step: int | None
    ttt_steps: int
    tau_end: float | None
    loss_end: float | None
    log_every: int | None
    """Steps between logged records (1 = every step)."""


@dataclass(frozen=True, slots=True)
class Row:
    """One metric of both runs at the comparison point; ``delta`` = this − previous."""

    metric: str
    a: float | None
    b: float | None
    delta: float | None
    higher_is_better: bool

    @property
    def better(self) -> str | None:
        """ "a", "b" or None (equal or unknown)."""
        if self.delta is None or not math.isfinite(self.delta):
            return None
        if round(self.delta, DELTA_DIGITS) == 0:  # shown as +0.0000: even
            return None
        return "a" if (self.delta > 0) == self.higher_is_better else "b"


@dataclass(frozen=True, slots=True)
class Comparison:
    axis: str
    a: Side
    b: Side
    at: float | None
    """The comparison point on the axis (None: the runs share no range)."""
    at_step_a: int | None
    at_step_b: int | None
    window: tuple[float, float] | None
    rows: tuple[Row, ...]
    verdict: str
    loss_lines: tuple[Line, ...]
    acc_lines: tuple[Line, ...]
    tau_lines: tuple[Line, ...]
    val_a: tuple[ValRow, ...]
    val_b: tuple[ValRow, ...]
    hparam_diff: tuple[tuple[str, str, str], ...]
    """(key, this run's value, the previous run's value) for keys that differ."""
    axis_note: str = ""
    """Why the runs are aligned on another axis than the one asked for ("" when not)."""

    @property
    def axis_label(self) -> str:
        return AXIS_LABEL[self.axis]


# ---- axes ---------------------------------------------------------------------------


def axis_values(state: RunState, axis: str) -> F64 | None:
    """The x of every logged step on ``axis`` (None when the run cannot say)."""
    steps = state.table.step_view().astype(np.float64)
    if axis == "step":
        return steps
    if axis == "tokens":
        tps, ms = state.table.floats("profile/tokens_per_s"), state.table.floats("profile/step_ms")
        if tps is None or ms is None:
            return None
        per_step = np.nan_to_num(tps * ms / 1000.0, nan=0.0, posinf=0.0, neginf=0.0)
        if not per_step.any():
            return None
        # a record every k steps stands for the k steps since the previous one
        span = np.diff(steps, prepend=steps[0] - 1 if len(steps) else 0.0)
        return np.cumsum(per_step * np.maximum(span, 1.0))
    if axis == "time":
        ts = state.table.ts_view().copy()
        if len(ts) < 2:
            return ts - ts[0] if len(ts) else ts
        dt = np.diff(ts)
        ok = dt[(dt > 0) & np.isfinite(dt)]
        med = float(median(ok)) if len(ok) else 0.0
        limit = max(GAP_MIN_S, GAP_STEPS * med)
        stop = (dt > limit) | (dt < 0)
        # a process's start (a resume) after a row: the time between is no training, however short
        starts = [e.ts for e in state.events if e.event in ("start", "resume")]
        if starts:
            after = np.searchsorted(ts, np.asarray(starts, dtype=np.float64), side="left")
            gaps = after[(after >= 1) & (after < len(ts))] - 1
            stop[gaps] = True
        dt = np.where(stop, med, dt)  # a stop counts as one step
        return np.concatenate([[0.0], np.cumsum(dt)])
    raise ValueError(f"unknown axis {axis!r} (one of {', '.join(AXES)})")


def _log_every(state: RunState) -> int | None:
    steps = state.table.step_view()
    if len(steps) < 2:
        return None
    return int(median(np.diff(steps[-200:])))


# ---- values at a point ----------------------------------------------------------------


def _window_mean(x: F64, y: F64, lo: float, hi: float) -> float | None:
    i, j = np.searchsorted(x, lo, side="left"), np.searchsorted(x, hi, side="right")
    seg = y[i:j]
    seg = seg[np.isfinite(seg)]
    return float(seg.mean()) if len(seg) else None


def _tau_series(state: RunState) -> F64 | None:
    ttt = range(state.ttt_steps)
    full = [state.table.floats(f"train/full_acc_{k}") for k in ttt]
    return tau_series(full, [state.table.floats(f"train/cond_acc_{k}") for k in ttt])


def _metrics(state: RunState, ttt: int) -> list[tuple[str, str, bool]]:
    """(display name, column, higher is better) in table order."""
    out = [("loss", "train/loss", False)]
    for k in range(ttt):
        out.append((f"full_acc_{k}", f"train/full_acc_{k}", True))
        out.append((f"cond_acc_{k}", f"train/cond_acc_{k}", True))
    return out


def _point(xa: F64, xb: F64) -> tuple[float, tuple[float, float]] | None:
    """The furthest x both runs reached, and a fair window before it."""
    if not len(xa) or not len(xb):
        return None
    at = float(min(xa[-1], xb[-1]))
    start = float(max(xa[0], xb[0]))
    if at < start:
        return None
    # the window holds >= WINDOW_MIN_POINTS points of the sparser run and ~2 % of the range
    density = []
    for x in (xa, xb):
        i = int(np.searchsorted(x, start))
        j = int(np.searchsorted(x, at, side="right"))
        n = max(1, j - i)
        density.append((at - start) / n if n > 1 else 0.0)
    width = max(max(density) * WINDOW_MIN_POINTS, 0.02 * (at - start))
    lo = max(start, at - width)
    return at, (lo, at)


# ---- lines ----------------------------------------------------------------------------


def _lines(
    label: str, x: F64, y: F64 | None, view: ViewParams, kind: str, smooth: bool
) -> Line | None:
    if y is None or not len(x):
        return None
    # both runs whole: a step window of the run's own plots, cut from each run's own
    # end, cut one run's line short of the other's (the monitor's [ is not offered here)
    if smooth and view.smoothing > 0:
        xs, ys = smoothed(x, y, view.smoothing, view.columns * 2)
    else:
        xs, ys = m4(x, y, view.columns)
    return Line(label, tuple(xs.tolist()), tuple(ys.tolist()), kind)


# ---- hyperparameters --------------------------------------------------------------------


def _flatten(obj: Any, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}{k}."))
    elif obj is not None:  # (null: not known, as a value left out: "–")
        out[prefix.rstrip(".")] = str(obj)
    return out


def argv_flags(argv: Sequence[str]) -> dict[str, str]:
    """``--name value`` / ``--name=value`` / ``--flag`` pairs of a command line."""
    flags: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--") and len(arg) > 2:
            if "=" in arg:
                k, v = arg[2:].split("=", 1)
                flags[k] = v
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                flags[arg[2:]] = argv[i + 1]
                i += 1
            else:
                flags[arg[2:]] = "true"
        i += 1
    return flags


def recipe(state: RunState) -> dict[str, str]:
    """What describes how a run was trained: hparams records, manifest, CLI flags."""
    out = {f"hparams.{k}": v for k, v in _flatten(state.hparams).items()}
    manifest = {
        k: v
        for k, v in _flatten(state.manifest).items()
        if k not in _VOLATILE and not k.startswith(_VOLATILE_PREFIXES)
    }
    out.update({f"run.{k}": v for k, v in manifest.items()})
    argv = state.manifest.get("argv")
    if isinstance(argv, list):
        flags = argv_flags([str(a) for a in argv])
        flags.pop("run-dir", None)
        out.update({f"argv.--{k}": v for k, v in flags.items()})
    if state.ttt_steps:  # (none before its first step: not known, not 0)
        out["ttt_steps"] = str(state.ttt_steps)
    log_every = _log_every(state)
    if log_every is not None:
        out["log_every_steps"] = str(log_every)
    return out


def hparam_diff(a: RunState, b: RunState) -> tuple[tuple[str, str, str], ...]:
    """The recipe's entries that differ; where one run logged no ``hparams`` record at
    all (it died before its first step), its hparams are unknown, not different ("–"
    beside every one of the other's): they are left out."""
    ra, rb = recipe(a), recipe(b)
    keys = sorted(set(ra) | set(rb))
    if not a.hparams or not b.hparams:
        keys = [k for k in keys if not k.startswith("hparams.")]
    for r, state in ((ra, a), (rb, b)):  # a run without a step: what its steps say unknown
        if state.global_step is None:
            keys = [k for k in keys if k in r or k not in ("ttt_steps", "log_every_steps")]
    # a manifest's field one run's does not have (null, or older telemetry): not known
    keys = [k for k in keys if not k.startswith("run.") or (k in ra and k in rb)]
    return tuple((k, ra.get(k, "–"), rb.get(k, "–")) for k in keys if ra.get(k) != rb.get(k))


# ---- the comparison ---------------------------------------------------------------------


def _side(state: RunState, label: str) -> Side:
    tau = _tau_series(state)
    last_tau = None
    if tau is not None and len(tau):
        finite = tau[np.isfinite(tau)]
        last_tau = float(finite[-1]) if len(finite) else None
    return Side(
        label,
        state.global_step,
        state.ttt_steps,
        last_tau,
        state.latest("train/loss"),
        _log_every(state),
    )


def fmt_x(axis: str, x: float) -> str:
    if axis == "step":
        return f"step {x + 1:,.0f}"  # as every view shows a step (x: global_step)
    if axis == "tokens":  # a tiny run's thousands read as such, not "0.0M tokens"
        if x < 1e3:
            return f"{x:,.0f} tokens"
        if x < 1e6:
            return f"{x / 1e3:,.1f}k tokens"
        return f"{x / 1e6:,.1f}M tokens" if x < 1e9 else f"{x / 1e9:,.2f}B tokens"
    if x >= 5400:
        return f"{x / 3600:.1f} h of training"
    if x >= 120:
        return f"{x / 60:.0f} min of training"
    return f"{x:.0f} s of training"  # a short run's seconds, not "0 min – 0 min"


def _diverged_by(state: RunState, x: F64, at: float) -> int | None:
    """The first step (as shown) at or before the point on the axis whose loss is not
    finite: from there the run's accuracies say nothing (a NaN model predicts one token
    everywhere: full acceptance 1.0, τ at its top). None: none."""
    loss = state.table.floats("train/loss")
    if loss is None:
        return None
    upto = min(int(np.searchsorted(x, at, side="right")), len(loss))
    bad = np.flatnonzero(~np.isfinite(loss[:upto]))
    if not len(bad):
        return None
    return step_number(int(state.table.step_view()[int(bad[0])]))


def _verdict(
    cmp_rows: list[Row],
    axis: str,
    at: float | None,
    a: Side,
    b: Side,
    diverged: tuple[int | None, int | None] = (None, None),
) -> str:
    if at is None:
        for who, side in (("This run", a), ("The previous run", b)):
            if side.last_step is None:
                return f"{who} logged no training step: nothing to compare."
        return f"The runs share no range on the {AXIS_LABEL[axis]} axis: nothing to compare yet."
    where = f"at {fmt_x(axis, at)} (same {'step' if axis == 'step' else axis})"
    said = [
        f"{who}'s loss is not finite from step {step:,} (diverged)"
        for who, step in (("This run", diverged[0]), ("The previous run", diverged[1]))
        if step is not None
    ]
    if said:
        why = "accuracies after a non-finite loss say nothing"
        return f"{'; '.join(said)}: {why}, no run is called better {where}."
    tau = next((r for r in cmp_rows if r.metric == "τ"), None)
    loss = next((r for r in cmp_rows if r.metric == "loss"), None)
    caveat = ""
    if a.ttt_steps and b.ttt_steps and a.ttt_steps != b.ttt_steps:  # (0: no step, not known)
        caveat = f"; note: {a.ttt_steps} vs {b.ttt_steps} TTT steps, which moves τ by itself"
    if tau is not None and tau.delta is not None and math.isfinite(tau.delta):
        if abs(tau.delta) < 0.005:
            return f"Even: τ within ±0.005 {where}{caveat}."
        if tau.delta > 0:
            return f"This run is ahead by {tau.delta:+.2f} τ {where}{caveat}."
        # (its sign in the word: "behind by -0.10 τ" read as a double negative)
        return f"This run is behind by {-tau.delta:.2f} τ {where}{caveat}."
    if loss is not None and loss.delta is not None and math.isfinite(loss.delta):
        word = "lower" if loss.delta < 0 else "higher"
        return f"This run's loss is {abs(loss.delta):.4g} {word} {where}{caveat}."
    return f"No comparable metric {where}."


def compare(
    a: RunState,
    b: RunState,
    *,
    axis: str = "step",
    view: ViewParams | None = None,
    labels: tuple[str, str] = ("this run", "previous run"),
) -> Comparison:
    """Compare run ``a`` (this one) with run ``b`` (the previous one)."""
    if axis not in AXES:
        raise ValueError(f"unknown axis {axis!r} (one of {', '.join(AXES)})")
    view = view or ViewParams()
    side_a, side_b = _side(a, labels[0]), _side(b, labels[1])
    xa, xb = axis_values(a, axis), axis_values(b, axis)
    axis_note = ""
    if xa is None or xb is None:
        axis_used = "step"
        which = (
            "neither run has"
            if xa is None and xb is None
            else ("this run has" if xa is None else "the previous run has")
        )
        axis_note = f"{which} no {AXIS_COUNTS[axis]}: aligned by {AXIS_LABEL['step']}"
        xa, xb = axis_values(a, "step"), axis_values(b, "step")
        assert xa is not None and xb is not None
    else:
        axis_used = axis
    point = _point(xa, xb)
    rows: list[Row] = []
    at_step_a = at_step_b = None
    window = None
    if point is not None:
        at, window = point
        if axis_used == "step":  # steps are whole: the window from the first step it holds
            window = (float(math.ceil(window[0])), window[1])
        lo, hi = window
        steps_a = a.table.step_view()
        steps_b = b.table.step_view()
        at_step_a = int(steps_a[max(0, int(np.searchsorted(xa, at, side="right")) - 1)])
        at_step_b = int(steps_b[max(0, int(np.searchsorted(xb, at, side="right")) - 1)])
        shared_ttt = min(a.ttt_steps, b.ttt_steps)
        diverged = (_diverged_by(a, xa, at), _diverged_by(b, xb, at))
        judged = diverged == (None, None)  # a diverged run's figures decide nothing
        for name, key, higher in _metrics(a, shared_ttt):
            ca, cb = a.table.floats(key), b.table.floats(key)
            va = None if ca is None else _window_mean(xa, ca, lo, hi)
            vb = None if cb is None else _window_mean(xb, cb, lo, hi)
            delta = va - vb if va is not None and vb is not None and judged else None
            rows.append(Row(name, va, vb, delta, higher))
        ta, tb = _tau_series(a), _tau_series(b)
        va = None if ta is None else _window_mean(xa, ta, lo, hi)
        vb = None if tb is None else _window_mean(xb, tb, lo, hi)
        tau_delta = va - vb if va is not None and vb is not None and judged else None
        rows.append(Row("τ", va, vb, tau_delta, True))
    else:
        at = None
        diverged = (None, None)
    loss_lines, acc_lines, tau_lines = [], [], []
    for state, x, side in ((a, xa, side_a), (b, xb, side_b)):
        line = _lines(
            f"loss · {side.label}", x, state.table.floats("train/loss"), view, "smoothed", True
        )
        if line is not None:
            loss_lines.append(line)
        for k in range(state.ttt_steps):
            y = state.table.floats(f"train/full_acc_{k}")
            line = _lines(f"full_acc_{k} · {side.label}", x, y, view, "smoothed", True)
            if line is not None:
                acc_lines.append(line)
        line = _lines(f"τ · {side.label}", x, _tau_series(state), view, "derived", True)
        if line is not None:
            tau_lines.append(line)
    return Comparison(
        axis=axis_used,
        a=side_a,
        b=side_b,
        at=at,
        at_step_a=at_step_a,
        at_step_b=at_step_b,
        window=window,
        rows=tuple(rows),
        verdict=_verdict(rows, axis_used, at, side_a, side_b, diverged),
        loss_lines=tuple(loss_lines),
        acc_lines=tuple(acc_lines),
        tau_lines=tuple(tau_lines),
        val_a=_val_rows(a),
        val_b=_val_rows(b),
        axis_note=axis_note,
        hparam_diff=hparam_diff(a, b),
    )


def _val_rows(state: RunState) -> tuple[ValRow, ...]:
    return tuple(
        ValRow(e, state.val_steps.get(e), dict(v)) for e, v in sorted(state.val_by_epoch.items())
    )


def comparison_json(c: Comparison) -> dict[str, Any]:
    """JSON-ready form (non-finite values as strings) for ``eagle3-tui compare --json``."""

    def num(x: float | None) -> float | str | None:
        if x is None:
            return None
        if math.isfinite(x):
            return x
        return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")

    def shown(x: float | None) -> float | None:
        return x + 1 if x is not None and c.axis == "step" else x

    def side(s: Side) -> dict[str, Any]:
        return {
            "label": s.label,
            "last_step": step_number(s.last_step),  # 1-based, as shown
            "last_global_step": s.last_step,  # speculators' counter (0-based)
            "ttt_steps": s.ttt_steps or None,  # null: no step logged, not known
            "tau_end": num(s.tau_end),
            "loss_end": num(s.loss_end),
            "log_every": s.log_every,
        }

    def val(rows: tuple[ValRow, ...]) -> list[dict[str, Any]]:
        return [
            {
                "epoch": epoch_number(r.epoch),  # 1-based, as shown (speculators': 0-based)
                "step": r.step,
                **{k: num(v) for k, v in r.values.items()},
            }
            for r in rows
        ]

    return {
        "axis": c.axis,
        "a": side(c.a),
        "b": side(c.b),
        # on the step axis, steps as shown (1-based); tokens and seconds as they are
        "at": num(shown(c.at)),
        "at_step": {"a": step_number(c.at_step_a), "b": step_number(c.at_step_b)},
        "window": [shown(x) for x in c.window] if c.window else None,
        "rows": [
            {
                "metric": r.metric,
                "a": num(r.a),
                "b": num(r.b),
                "delta": num(r.delta),
                "better": r.better,
            }
            for r in c.rows
        ],
        "verdict": c.verdict,
        "validation": {"a": val(c.val_a), "b": val(c.val_b)},
        "hparam_diff": [{"key": k, "a": va, "b": vb} for k, va, vb in c.hparam_diff],
    }


def _f(x: float | None, digits: int = 4) -> str:
    if x is None:
        return "–"
    if not math.isfinite(x):
        return str(x)
    return f"{x:.{digits}f}"


def format_comparison(c: Comparison) -> str:
    """The comparison for a person: verdict, the table, validation, what differs."""
    out = [c.verdict, ""]
    if c.at is not None and c.window is not None:
        lo, hi = c.window
        out.append(
            f"compared at {fmt_x(c.axis, c.at)}: mean over {fmt_x(c.axis, lo)} – "
            f"{fmt_x(c.axis, hi)} (this run's step {step_number(c.at_step_a)}, previous "
            f"run's step {step_number(c.at_step_b)})"
        )
        width = max(len(r.metric) for r in c.rows) if c.rows else 6
        out.append(f"  {'metric':<{width}}  {'this run':>10}  {'previous':>10}  {'Δ':>9}")
        for r in c.rows:
            mark = {"a": "  ▲ this", "b": "  ▼ prev"}.get(r.better or "", "")
            delta = "–" if r.delta is None else f"{r.delta:+.{DELTA_DIGITS}f}"
            out.append(f"  {r.metric:<{width}}  {_f(r.a):>10}  {_f(r.b):>10}  {delta:>9}{mark}")
    out.append("")
    for side, rows in ((c.a, c.val_a), (c.b, c.val_b)):
        end = (
            f"step {step_number(side.last_step)}, τ {_f(side.tau_end, 3)}"
            if side.last_step is not None
            else "–"
        )
        ttt = f"{side.ttt_steps} TTT steps" if side.ttt_steps else "TTT steps not known"
        out.append(f"{side.label}: reached {end}; {ttt}")
        for vr in rows:
            val_tau = tau_of(vr.values, prefix="", suffix="_epoch")
            out.append(
                f"  epoch {epoch_number(vr.epoch)}: val loss {_f(vr.values.get('loss_epoch'))}  "
                f"full_acc_0 {_f(vr.values.get('full_acc_0_epoch'))}  τ {_f(val_tau, 3)}"
            )
    if c.hparam_diff:
        out.append("")
        out.append("what differs (this run | previous run):")
        for key, va, vb in c.hparam_diff:
            out.append(f"  {key}: {va} | {vb}")
    return "\n".join(out)
