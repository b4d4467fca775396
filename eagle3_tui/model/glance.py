"""A long run opened at a glance: a :class:`~eagle3_tui.model.run.Run` of its events
and its newest lines, with its history in brief, until the whole file is read.

What a glance is and when there is one: agent/glance.py. Here its pieces become a
run state as reading the file would make it, but for three things: the training
steps before the tail are a digest (:class:`~eagle3_tui.model.history.History`,
drawn by the charts, counted nowhere); the lines before the tail that are not events
(steps, samples) are not there, so records lost or repeated are counted only among
the tail's lines; and an event line that is a training step (a NaN loss, an odd
shape) is left to the whole read (the table holds the tail's steps, in a row).

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from eagle3_tui.model.history import History, history_of
from eagle3_tui.model.reader import Item
from eagle3_tui.model.records import Deferred, Malformed, Record, TrainStep
from eagle3_tui.model.run import Run


@dataclass(frozen=True, slots=True, eq=False)
class GlanceData:
    """A glance as it arrived (from the agent, or this machine's file)."""

    size: int
    """The file's size when it was glanced at: the whole read is caught up past it."""
    tail_from: int
    tail: bytes
    marks: tuple[tuple[int, bytes], ...]
    """(offset, line) of each event before the tail, in file order."""
    digest: Any
    """The digest as sent (checked by :func:`~eagle3_tui.model.history.history_of`)."""


def _is_step(item: Item) -> bool:
    if isinstance(item, TrainStep):
        return True
    if isinstance(item, Deferred):
        return item.kind == "train"
    return isinstance(item, Record) and item.kind == "train"


def glance_run(data: GlanceData) -> tuple[Run, History] | str:
    """The run a glance stands for, and its history in brief; or why it cannot stand
    for the run (then it is read whole)."""
    if not (0 <= data.tail_from <= data.size) or len(data.tail) != data.size - data.tail_from:
        return "the glance's tail is not the file's end"
    history = history_of(data.digest)
    if history is None:
        return "the glance's digest is not one"
    run = Run()
    state, reader = run.unsettled, run.reader
    state.writers.partial = True  # events only: their sequence numbers jump
    last = -1
    for offset, line in data.marks:
        if offset <= last or offset + len(line) > data.tail_from or not line.endswith(b"\n"):
            return "the glance's events are not in file order"
        last = offset
    items = [i for i in reader.decode_pieces(data.marks) if not _is_step(i) and _ok(i)]
    state.apply_all(items)
    state.writers.partial = False
    state.writers.clear()  # the tail's lines are counted from their first, as a new reader's
    reader.skip(0, data.tail_from, 0)
    run.feed(data.tail_from, data.tail)
    loss = state.table.view("train/loss")
    if loss is not None and len(loss) and not math.isfinite(float(loss[0])):
        # a stretch of non-finite losses from the tail's first step: since when is told
        # only by the lines before it (a verdict must not say a later step)
        return "the tail begins inside a stretch of non-finite losses"
    state.history = history
    return run, history


def _ok(item: Item) -> bool:
    """A marked line that decodes as a record (one that does not is the whole read's
    to count: its place in the file's line numbers is not known here)."""
    return not isinstance(item, Malformed)
