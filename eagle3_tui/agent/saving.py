"""Whether the run is writing a checkpoint now, from its own records; a kill waits for
that save to finish before it signals.

speculators' SIGTERM handler raises at once, wherever the trainer is: a kill that lands
in the middle of an epoch's save leaves that numbered checkpoint torn (the weights newer
than ``training_state.json``), and ``interrupted/`` is not always written after it
(under torchrun the ranks meet the interrupt in different places of the save). A resume
then has no complete newest checkpoint. Measured in this project's two-node test: a
kill during the epoch save, no ``interrupted/``, "training_state.json is older than the
weights (save interrupted)". So the kill first waits, bounded, for a save the records
show started and not finished. Standard library only (the agent runs on the host).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eagle3_tui.agent.frames import emit
from eagle3_tui.agent.names import EV_PROGRESS
from eagle3_tui.telemetry.parsing import parse_json
from eagle3_tui.telemetry.safefs import open_file

TAIL_BYTES = 4 << 20
"""How much of the end of ``metrics.jsonl`` is read: a save in progress writes a
``save_progress`` record every second or so, so its latest is always within this."""
SAVE_POLL_S = 0.5
SAVE_TELL_S = 5.0
"""How often the client is told what the kill waits for."""
STALE_S = 60.0
"""A save whose records and files have both been still this long is not waited for:
the sampler that would write its end is gone (a killed sidecar), or the trainer hangs."""
_ENDS = frozenset({"start", "resume", "interrupt", "finish", "crash"})
"""Lifecycle events after which no earlier save can still be running."""


def metrics_tail(metrics: Path) -> bytes | None:
    """The last :data:`TAIL_BYTES` of ``metrics.jsonl`` from its first whole line, read
    as a regular file (a FIFO planted there never hangs a kill); None when it cannot
    be read."""
    try:
        with open_file(metrics) as f:
            size = f.seek(0, 2)
            start = max(0, size - TAIL_BYTES)
            f.seek(start)
            data = f.read(size - start)
    except OSError:
        return None
    return data[data.find(b"\n") + 1 :] if start else data  # a cut first line is skipped


def save_in_progress(metrics: Path) -> dict[str, Any] | None:
    """The checkpoint save the run's records show started (``save_started`` or
    ``save_progress``) and not finished, the newest if several: ``{"path", "since",
    "last"}`` (its first and latest records' times); None when there is none or the
    file cannot be read. A torn or malformed line is skipped."""
    data = metrics_tail(metrics)
    if data is None:
        return None
    saves: dict[str, float] = {}
    last: dict[str, float] = {}
    for line in data.split(b"\n"):
        if b'"ckpt"' not in line and b'"lifecycle"' not in line and b'"train"' not in line:
            continue
        try:
            rec = parse_json(line)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        kind, event = rec.get("kind"), rec.get("event")
        ts = rec.get("ts")
        if kind == "lifecycle" and event in _ENDS:
            saves.clear()
        elif kind == "train" and isinstance(ts, (int, float)) and saves:
            # speculators saves in the training loop: a step logged after a save began
            # means that save is over, whatever became of the record of its end
            saves = {p: since for p, since in saves.items() if since >= float(ts)}
        elif kind == "ckpt" and isinstance(rec.get("path"), str):
            when = float(ts) if isinstance(ts, (int, float)) else 0.0
            if event in ("save_started", "save_progress"):
                saves.setdefault(rec["path"], when)
                last[rec["path"]] = when
            elif event == "save_finished":
                saves.pop(rec["path"], None)
    if not saves:
        return None
    path = max(saves, key=lambda p: saves[p])
    return {"path": path, "since": saves[path], "last": last[path]}


def is_stale(save: dict[str, Any], now: float) -> bool:
    """Whether a save's records and its directory's files have all been still for
    ``STALE_S`` (wall-clock time: the records' clock is this host's)."""
    newest = float(save.get("last") or 0.0)
    try:
        with os.scandir(save["path"]) as entries:
            for e in entries:
                try:
                    newest = max(newest, e.stat(follow_symlinks=False).st_mtime)
                except OSError:
                    continue
    except OSError:
        pass
    return now - newest > STALE_S


def wait_for_save(
    metrics: Path,
    alive: Callable[[], bool],
    wait_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    wall: Callable[[], float] = time.time,
) -> dict[str, Any] | None:
    """If a save is in progress, wait up to ``wait_s`` for it to finish (or the trainer,
    ``alive``, to end, or the save to go still: :func:`is_stale`), telling the client
    every ``SAVE_TELL_S``. Returns what was waited for, ``{"path", "waited_s",
    "finished"}``, or None when no save was in progress."""
    save = save_in_progress(metrics)
    if save is None or is_stale(save, wall()):
        return None
    if wait_s <= 0:
        return {"path": save["path"], "waited_s": 0.0, "finished": False}
    first = save["path"]
    t0 = told = clock()
    emit(EV_PROGRESS, step="save", path=first, elapsed=0.0, wait_s=wait_s)
    while save is not None and alive() and clock() - t0 < wait_s and not is_stale(save, wall()):
        sleep(SAVE_POLL_S)
        save = save_in_progress(metrics)
        if save is not None and clock() - told >= SAVE_TELL_S:
            told = clock()
            emit(EV_PROGRESS, step="save", path=save["path"], elapsed=told - t0, wait_s=wait_s)
    return {"path": first, "waited_s": round(clock() - t0, 1), "finished": save is None}
