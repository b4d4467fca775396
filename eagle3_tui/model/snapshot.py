"""An immutable picture of a run for the UI, built off the UI thread.

The app never touches :class:`~eagle3_tui.model.state.RunState`: a worker builds a
:class:`Snapshot` (plain tuples and numbers, downsampled to the plot width) and
posts it; widgets only read it.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from eagle3_tui.model.derived import smoothed, tau_of
from eagle3_tui.model.downsample import m4
from eagle3_tui.model.health import Diagnosis, Health, diagnose
from eagle3_tui.model.state import LogLine, RunState


@dataclass(frozen=True, slots=True)
class ViewParams:
    """What the UI wants drawn; the snapshot is built for it."""

    columns: int = 100
    """Plot width in terminal cells (each cell holds ~2 braille dots; M4 keeps 4 points)."""
    window: int | None = None
    """Show only the last ``window`` steps (None: the whole run)."""
    smoothing: float = 0.6
    """EMA weight per step, as TensorBoard's slider (0: off)."""


@dataclass(frozen=True, slots=True)
class Line:
    """One drawable line: points already reduced to the plot's width."""

    label: str
    x: tuple[float, ...]
    y: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the panels show, frozen at ``now``."""

    now: float
    diagnosis: Diagnosis
    global_step: int | None
    epoch: int | None
    ttt_steps: int
    latest: dict[str, float | None] = field(default_factory=dict)
    tau: float | None = None
    loss_lines: tuple[Line, ...] = ()
    acc_lines: tuple[Line, ...] = ()
    logs: tuple[LogLine, ...] = ()
    records: int = 0
    malformed: int = 0
    lost: int = 0

    @property
    def health(self) -> Health:
        return self.diagnosis.health


EMPTY = Snapshot(
    now=0.0,
    diagnosis=Diagnosis(Health.WAITING, "Waiting for the first record."),
    global_step=None,
    epoch=None,
    ttt_steps=0,
)


def _line(
    state: RunState, key: str, label: str, first_step: int, view: ViewParams, smooth: bool
) -> Line | None:
    s = state.series.get(key)
    if s is None or not len(s):
        return None
    steps_mv, values_mv = s.window(first_step)
    try:
        x = np.array(steps_mv, dtype=np.float64)
        y = np.array(values_mv, dtype=np.float64)
    finally:
        steps_mv.release()
        values_mv.release()
    if not len(x):
        return None
    if smooth:
        xs, ys = smoothed(x, y, view.smoothing, view.columns * 2)
    else:
        xs, ys = m4(x, y, view.columns)
    return Line(label, tuple(xs.tolist()), tuple(ys.tolist()))


def build_snapshot(state: RunState, now: float, view: ViewParams = ViewParams()) -> Snapshot:
    """Freeze ``state`` for drawing with ``view``."""
    last = state.global_step or 0
    first_step = max(0, last - view.window + 1) if view.window else 0
    latest = {key: s.last_value() for key, s in state.series.items()}
    loss_lines: list[Line] = []
    raw = _line(state, "train/loss", "loss", first_step, view, smooth=False)
    if raw is not None:
        loss_lines.append(raw)
        if view.smoothing > 0:
            sm = _line(state, "train/loss", "loss (smoothed)", first_step, view, smooth=True)
            if sm is not None:
                loss_lines.append(sm)
    val = _line(state, "val/loss_epoch", "val loss", first_step, view, smooth=False)
    if val is not None:
        loss_lines.append(val)
    acc_lines: list[Line] = []
    for k in range(state.ttt_steps):
        for kind in ("full", "cond"):
            line = _line(
                state,
                f"train/{kind}_acc_{k}",
                f"{kind}_acc_{k}",
                first_step,
                view,
                smooth=view.smoothing > 0,
            )
            if line is not None:
                acc_lines.append(line)
    tau = tau_of(latest, state.ttt_steps)
    return Snapshot(
        now=now,
        diagnosis=diagnose(state, now),
        global_step=state.global_step,
        epoch=state.epoch,
        ttt_steps=state.ttt_steps,
        latest=latest,
        tau=tau if tau is None or math.isfinite(tau) else None,
        loss_lines=tuple(loss_lines),
        acc_lines=tuple(acc_lines),
        logs=tuple(list(state.logs)[-200:]),
        records=state.records,
        malformed=state.malformed_count,
        lost=state.lost_records,
    )
