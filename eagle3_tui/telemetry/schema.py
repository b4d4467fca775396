"""The JSON-lines schema written on the training host (version 1).

Every line is one JSON object ending in ``\\n`` with these envelope fields:

``v``     schema version (int)
``seq``   sequence number, per writer, 0, 1, 2, ... with no gaps
``w``     writer id (str): one per process that writes (trainer rank, resumed run, ...)
``ts``    wall-clock time, seconds since the epoch (float)
``kind``  one of :class:`Kind`
``rank``  the distributed rank of the writer (0 when not distributed)

and a payload whose fields depend on ``kind`` (see docs/ARCHITECTURE.md).
Non-finite floats are written as the strings ``"NaN"``, ``"Infinity"`` and
``"-Infinity"`` so that every line is valid JSON.

Standard library only: this module is imported inside the trainer.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Any, Final

SCHEMA_VERSION: Final = 1

METRICS_FILE: Final = "metrics.jsonl"
MANIFEST_FILE: Final = "run.json"
LOG_FILE: Final = "train.log"

# ---- speculators' messages that the tools read (speculators 0.9's Checkpointer) ------
SAVING_CHECKPOINT: Final = "Saving checkpoint to "
CHECKPOINT_SAVED: Final = "Checkpoint saved to "
SAVING_RE: Final = re.compile(f"^{SAVING_CHECKPOINT}(.+)$")
"""A ``log`` record's message as a save begins; group 1: the checkpoint's path."""
SAVED_RE: Final = re.compile(f"^{CHECKPOINT_SAVED}(.+)$")
"""A ``log`` record's message once a save is complete; group 1: the checkpoint's path."""


class Kind:
    """The ``kind`` of a record."""

    TRAIN: Final = "train"
    VAL: Final = "val"
    HPARAMS: Final = "hparams"
    LOG: Final = "log"
    GPU: Final = "gpu"
    IO: Final = "io"
    CKPT: Final = "ckpt"
    HEARTBEAT: Final = "heartbeat"
    LIFECYCLE: Final = "lifecycle"
    # written by the agent observing a run without telemetry (agent/observe.py)
    PROC: Final = "proc"
    PROGRESS: Final = "progress"
    # where a quiet trainer's threads are (telemetry/stacks.py)
    STACK: Final = "stack"

    ALL: Final = frozenset(
        {TRAIN, VAL, HPARAMS, LOG, GPU, IO, CKPT, HEARTBEAT, LIFECYCLE, PROC, PROGRESS, STACK}
    )


NAN: Final = "NaN"
POS_INF: Final = "Infinity"
NEG_INF: Final = "-Infinity"


def nonfinite_token(x: float) -> str:
    """The string written in place of a non-finite float."""
    if math.isnan(x):
        return NAN
    return POS_INF if x > 0 else NEG_INF


def safe_repr(obj: Any, limit: int = 200) -> str:
    """``repr(obj)`` cut to ``limit``; a placeholder when ``repr`` itself raises."""
    try:
        return repr(obj)[:limit]
    except Exception:
        return f"<unrepresentable {type(obj).__name__}>"


def scalar_or_list(obj: Any) -> Any:
    """A tensor, numpy array or numpy scalar as a number or a (nested) list.

    Raises TypeError for anything else: the writer's fast path (orjson's
    ``default=`` hook) then takes the slow path, which counts the value as
    unserializable and writes its ``repr``.
    """
    if isinstance(obj, float):  # float subclasses (numpy.float64)
        return float(obj)
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, (set, frozenset)):
        return list(obj)[:1000]
    item = getattr(obj, "item", None)
    if callable(item):
        numel = getattr(obj, "numel", None)
        n = numel() if callable(numel) else getattr(obj, "size", 1)
        if n == 1:
            return item()
        tolist = getattr(obj, "tolist", None)
        if callable(tolist) and isinstance(n, int) and n <= 1000:
            return tolist()
    raise TypeError(f"not JSON serializable: {type(obj).__qualname__}")


def to_jsonable(obj: Any, _depth: int = 0) -> Any:
    """Turn ``obj`` into plain JSON values: finite floats, strings, lists, dicts.

    Tensors and numpy scalars become numbers (or lists when small), non-finite
    floats become the strings above, anything else unknown becomes its ``repr``
    (or a placeholder when even that raises). Never raises.
    """
    t = type(obj)
    if t is float:
        return obj if obj - obj == 0.0 else nonfinite_token(obj)
    if t is int or t is str or t is bool or obj is None:
        return obj
    if _depth > 8:
        return safe_repr(obj)
    try:
        if isinstance(obj, Mapping):
            return {str(k): to_jsonable(v, _depth + 1) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [to_jsonable(v, _depth + 1) for v in obj[:1000]]
        if isinstance(obj, str):
            return str(obj)
        return to_jsonable(scalar_or_list(obj), _depth + 1)
    except Exception:  # a value the trainer logged must never break the trainer
        return safe_repr(obj)
