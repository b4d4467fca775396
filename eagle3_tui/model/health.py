"""Health of a run, decided from the evidence, with one sentence saying why.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from eagle3_tui.model.state import RunState


class Health(enum.Enum):
    """What a run is doing. The value is what ``summary`` prints."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    SILENT = "silent"
    STALLED = "stalled"
    DEAD = "dead"
    DIVERGED = "diverged"


@dataclass(frozen=True, slots=True)
class Diagnosis:
    health: Health
    reason: str


def diagnose(state: RunState, now: float) -> Diagnosis:
    """The run's health from its records alone (process evidence comes later)."""
    events = state.lifecycle_events()
    last_event = events[-1] if events else ""
    if last_event == "finish":
        return Diagnosis(Health.FINISHED, f"Training finished at step {state.global_step}.")
    if last_event == "crash":
        return Diagnosis(Health.DEAD, "The trainer raised an exception and exited.")
    loss = state.latest("train/loss")
    if loss is not None and not math.isfinite(loss):
        return Diagnosis(Health.DIVERGED, f"The loss is {loss} at step {state.global_step}.")
    if state.train_records == 0:
        return Diagnosis(Health.WAITING, "No training step has been logged yet.")
    return Diagnosis(Health.RUNNING, f"Step {state.global_step} logged.")
