"""Where a stalled trainer is stuck, from its ``stack`` records.

Telemetry writes a ``stack`` record (``telemetry/stacks.py``) when the training
step stops advancing: the main thread's frames, innermost first, each with its
origin (``stdlib``, ``library``, ``user``). A location is told in one line, the
way a person reads a traceback for a hang: the innermost frame, the innermost
frame of the training's own code (when the innermost is the standard library's
or a package's), and the innermost speculators frame (where the library's loop
called it)::

    Condition.wait (threading.py:331) ← wait_for_a_lost_rank (train.py:97)
      ← Trainer.train_epoch (trainer.py:512)

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import msgspec

from eagle3_tui.model.records import DECODE_ERRORS, Record


class StackFrame(msgspec.Struct, kw_only=True, frozen=True, gc=False):
    """One frame of a ``stack`` record."""

    func: str
    file: str
    line: int
    origin: str = "user"


_frames_decoder = msgspec.json.Decoder(list[StackFrame], strict=False)


@dataclass(frozen=True, slots=True)
class StackSample:
    """The main thread's stack when the steps had stopped for ``quiet_s``."""

    ts: float
    step: int | None
    quiet_s: float | None
    thread: str
    frames: tuple[StackFrame, ...]


def stack_sample(rec: Record) -> StackSample | None:
    """The sample in a ``stack`` record; None when its frames do not decode."""
    if not len(rec.frames):
        return None
    try:
        frames = tuple(_frames_decoder.decode(rec.frames))
    except DECODE_ERRORS:
        return None
    if not frames:
        return None
    return StackSample(rec.ts, rec.step, rec.quiet_s, rec.thread or "MainThread", frames)


def _label(f: StackFrame) -> str:
    return f"{f.func} ({os.path.basename(f.file)}:{f.line})"


def key_frames(frames: tuple[StackFrame, ...]) -> list[StackFrame]:
    """The innermost frame, the innermost of the training's own code, the innermost of
    speculators: at most three, innermost first."""
    chosen = [frames[0]]
    user = next((f for f in frames if f.origin == "user"), None)
    if user is not None and user not in chosen:
        chosen.append(user)
    library = next(
        (f for f in frames if f"{os.sep}speculators{os.sep}" in f.file and f not in chosen), None
    )
    if library is not None and frames.index(library) > frames.index(chosen[-1]):
        chosen.append(library)
    return chosen


def stack_line(sample: StackSample) -> str:
    """``func (file:line) ← caller (file:line) ← …`` in one line."""
    return " ← ".join(_label(f) for f in key_frames(sample.frames))


def stuck_json(sample: StackSample) -> dict[str, Any]:
    """What ``summary --json`` says about the location."""
    return {
        "where": stack_line(sample),
        "thread": sample.thread,
        "since_step": sample.step,
        "quiet_s": sample.quiet_s,
        "recorded_at": sample.ts,
        "frames": [
            {"func": f.func, "file": f.file, "line": f.line, "origin": f.origin}
            for f in sample.frames
        ],
    }
