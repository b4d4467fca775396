"""What a run's records leave in its state as values: log lines, lifecycle events,
checkpoints, redone steps, long activities.

Each is kept by :class:`~eagle3_tui.model.state.RunState` (in bounded histories
where a run can write many) and read by the health judgement and the snapshot.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from eagle3_tui.model.records import Record


@dataclass(frozen=True, slots=True)
class LogLine:
    ts: float
    level: str
    logger: str
    msg: str


@dataclass(frozen=True, slots=True)
class Redo:
    """A resume that went back: steps ``first..last`` had been trained and are redone."""

    first: int
    last: int
    ts: float


@dataclass(frozen=True, slots=True)
class Event:
    """A lifecycle event (start, resume, interrupt, finish, crash)."""

    ts: float
    event: str
    step: int | None
    writer: str
    pid: int | None
    error: str | None
    rank: int = 0
    exit_status: int | None = None
    host: str | None = None
    done: int | None = None
    """The steps done by then, as every view shows a step ("after step N"): ``step`` is
    the record's own (a 0-based ``step`` where it has one, else its ``global_step``)."""

    @property
    def shown_step(self) -> int | None:
        return self.done if self.done is not None else self.step


@dataclass(frozen=True, slots=True)
class CkptEvent:
    ts: float
    event: str
    path: str
    epoch: int | str | None
    bytes: float | None
    duration_s: float | None
    complete: bool | None
    at: float | None = None
    """When the save was written, where a save seen by polling says it (its files'
    newest time; ``ts`` is when it was seen): None to use ``ts``."""

    @property
    def when(self) -> float:
        return self.at if self.at is not None else self.ts


def renamed_saves(events: list[CkptEvent], notes: object) -> list[CkptEvent]:
    """``events`` with each stop's save named as a kill renamed it: the manifest's
    ``stop_saves`` (telemetry/manifest.py) say a save of ``from`` (its ``interrupted/``)
    became the numbered checkpoint ``path``, at ``at``; a save of that name is renamed
    by the first such note after it (a later stop saves ``interrupted/`` again). A
    note is only believed of a checkpoint in the same directory, named by a number."""
    moves: list[tuple[float, str, str]] = []
    for note in notes if isinstance(notes, list) else ():
        if not isinstance(note, dict):
            continue
        old, new, at = note.get("from"), note.get("path"), note.get("at")
        if not (isinstance(old, str) and isinstance(new, str) and isinstance(at, float | int)):
            continue
        head, _, name = new.rstrip("/").rpartition("/")
        if name.isdigit() and head == old.rstrip("/").rpartition("/")[0] and math.isfinite(at):
            moves.append((float(at), old, new))
    if not moves:
        return events
    moves.sort()
    out = []
    for e in events:
        if e.event in ("save_finished", "interrupted"):
            later = (new for at, old, new in moves if old == e.path and at >= e.when)
            moved = next(later, None)
            if moved is not None:
                e = replace(e, path=moved)
        out.append(e)
    return out


@dataclass(frozen=True, slots=True)
class SavedProgress:
    """Where a checkpoint says the run was: ``steps_done`` (its ``global_step``), the
    0-based epoch under way after it, when it was saved."""

    ts: float
    steps_done: int
    epoch: int


@dataclass(slots=True)
class Activity:
    """Something long that legitimately stops metrics: a save or a validation epoch."""

    what: str
    since: float
    detail: str = ""


WRITTEN_AT_WINDOW_S = 3600.0
"""How far before its record a polled save's file time is believed (a file's time is
the host's to set: an older one, or one after the record, is not the save's)."""


MAX_INVENTORY = 10_000
"""Checkpoints an ``inventory`` lists that are taken, at most."""


def inventory_events(rec: Record) -> list[CkptEvent]:
    """The checkpoints an ``inventory`` found in the run's checkpoint directory when its
    telemetry began (a training attached to mid-way had saved some): each as a save
    finished when its files were last written (``written_at``; one without that time is
    left out: the record's own time is not when it was saved), and the best one. The
    monitor said "none saved yet" beside ``checkpoints/0`` and ``/1``."""
    root, found = rec.path, rec.checkpoints
    if not isinstance(root, str) or not isinstance(found, list) or rec.ts is None:
        return []
    out: list[CkptEvent] = []
    for c in found[:MAX_INVENTORY]:
        if not isinstance(c, dict):
            continue
        name, at, nbytes = c.get("name"), _number(c.get("written_at")), _number(c.get("bytes"))
        if not isinstance(name, str) or not (name.isdigit() or name == "interrupted"):
            continue
        if at is None or at > rec.ts:
            continue
        epoch, complete = c.get("epoch"), c.get("complete")
        out.append(
            CkptEvent(
                at,
                "save_finished",
                f"{root.rstrip('/')}/{name}",
                epoch if type(epoch) is int else None,
                nbytes if nbytes is not None and nbytes >= 0 else None,
                None,
                complete if isinstance(complete, bool) else None,
                at,
            )
        )
    out.sort(key=lambda e: e.ts)
    best = rec.best
    if isinstance(best, str) and best.isdigit() and out:
        out.append(CkptEvent(rec.ts, "best", f"{root.rstrip('/')}/{best}", None, None, None, None))
    return out


def _number(x: object) -> float | None:
    """A finite number of JSON (not a bool), as a float."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


def save_written_at(rec: Record) -> float | None:
    at = rec.written_at
    if not isinstance(at, float | int) or not math.isfinite(at) or rec.ts is None:
        return None
    return float(at) if rec.ts - WRITTEN_AT_WINDOW_S <= at <= rec.ts else None


def saved_progress_of(rec: Record) -> SavedProgress | None:
    """A saved checkpoint's ``training_state`` as progress: speculators' ``local_step`` is
    the steps done in ``epoch``; 0 (an epoch's end) means the next epoch comes."""
    st = rec.training_state
    if rec.event not in ("save_finished", "completed") or not isinstance(st, dict):
        return None
    steps, epoch, local = st.get("global_step"), st.get("epoch"), st.get("local_step")
    if not all(type(v) is int and 0 <= v < 1 << 40 for v in (steps, epoch, local)):
        return None
    assert isinstance(steps, int) and isinstance(epoch, int) and isinstance(local, int)
    at = save_written_at(rec) or rec.ts
    return SavedProgress(at, steps, epoch if local > 0 else epoch + 1) if at else None
