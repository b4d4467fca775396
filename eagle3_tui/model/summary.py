"""The state of a run as one plain dict: what ``eagle3-tui summary`` prints.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

import math
from typing import Any

from eagle3_tui.model.health import diagnose
from eagle3_tui.model.state import RunState


def _num(x: float | None) -> float | str | None:
    if x is None:
        return None
    if math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def summarize(state: RunState, now: float) -> dict[str, Any]:
    diagnosis = diagnose(state, now)
    metrics = {key: _num(s.last_value()) for key, s in sorted(state.series.items()) if len(s)}
    return {
        "health": diagnosis.health.value,
        "reason": diagnosis.reason,
        "global_step": state.global_step,
        "epoch": state.epoch,
        "metrics": metrics,
        "records": state.records,
        "malformed_lines": state.malformed_count,
        "lost_records": state.lost_records,
    }


def format_text(summary: dict[str, Any]) -> str:
    """The summary for a person: a few aligned lines."""

    def f(x: Any) -> str:
        if isinstance(x, float):
            return f"{x:.4f}"
        return "–" if x is None else str(x)

    m = summary["metrics"]
    lines = [
        f"health   {summary['health']}: {summary['reason']}",
        f"step     {f(summary['global_step'])}   epoch {f(summary['epoch'])}",
        f"loss     {f(m.get('train/loss'))}",
    ]
    k = 0
    while f"train/full_acc_{k}" in m:
        full, cond = m.get(f"train/full_acc_{k}"), m.get(f"train/cond_acc_{k}")
        lines.append(f"ttt {k}    full_acc {f(full)}   cond_acc {f(cond)}")
        k += 1
    lines.append(
        f"records  {summary['records']}   malformed lines {summary['malformed_lines']}"
        f"   lost records {summary['lost_records']}"
    )
    return "\n".join(lines)
