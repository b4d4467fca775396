"""The agent's output: frames on stdout, and the one error it answers with.

``D <offset> <length>\\n`` followed by ``length`` bytes of a file at ``offset``;
``Z <offset> <length> <zlength>\\n`` followed by ``zlength`` bytes: those same
``length`` bytes at ``offset``, zlib-compressed on their own (sent only to a client
that asked for them: ``"compress": "zlib"`` in its request);
``C <offset> <length> <size>\\n`` followed by ``size`` bytes: the ``length`` bytes at
``offset`` as columns (their training steps) and the other lines (see
:mod:`eagle3_tui.agent.column_plan`; only to a client that asked: ``"columns"``);
``J <json>\\n`` an event (see :mod:`eagle3_tui.agent.names`).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from eagle3_tui.agent.names import EV_TICK


class AgentError(Exception):
    """A one-line answer: the run is missing, the request is refused..."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


_client_gone = False
_last_write = time.monotonic()


def client_gone() -> bool:
    """Whether a write found the client gone (the work goes on, unheard)."""
    return _client_gone


def _write_all(data: bytes) -> None:
    global _client_gone, _last_write
    if _client_gone:
        return
    view = memoryview(data)
    try:
        while view:
            n = os.write(1, view)
            view = view[n:]
    except OSError:  # the client went away (EPIPE): finish the work anyway
        _client_gone = True
    _last_write = time.monotonic()


def emit(event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, **fields}, separators=(",", ":"), sort_keys=True)
    _write_all(b"J " + line.encode() + b"\n")


def tick(every_s: float) -> None:
    """``tick`` (with the host's clock) when nothing was written for ``every_s``."""
    if time.monotonic() - _last_write >= every_s:
        emit(EV_TICK, now=time.time())


def emit_data(offset: int, data: bytes) -> None:
    _write_all(b"D %d %d\n" % (offset, len(data)) + data)


def emit_zdata(offset: int, length: int, packed: bytes) -> None:
    """``length`` bytes of the file at ``offset``, as ``zlib.compress`` packed them."""
    _write_all(b"Z %d %d %d\n" % (offset, length, len(packed)) + packed)


def emit_columns(offset: int, length: int, payload: bytes) -> None:
    """The ``length`` bytes at ``offset`` as a columns payload (agent/column_plan.py)."""
    _write_all(b"C %d %d %d\n" % (offset, length, len(payload)) + payload)
