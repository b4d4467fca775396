"""A logging handler that turns speculators' metric dicts and messages into records.

The speculators Trainer logs a dict per step on ``speculators.metrics`` and
human messages on ``speculators``. Both loggers are NOTSET, so they inherit the
root's WARNING: a handler alone receives nothing. :func:`attach` in
``eagle3_tui.telemetry`` sets their level too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from eagle3_tui.telemetry.schema import Kind
from eagle3_tui.telemetry.writer import JsonlWriter

METRICS_LOGGER = "speculators.metrics"
MESSAGES_LOGGER = "speculators"


def metric_payload(msg: Mapping[str, Any], record: logging.LogRecord) -> tuple[str, dict[str, Any]]:
    """Map one speculators metrics dict to (kind, payload)."""
    step = getattr(record, "step", None)
    if getattr(record, "hparams", False):
        return Kind.HPARAMS, {"hparams": dict(msg)}
    payload = dict(msg)
    if step is not None:
        payload["step"] = step
    if "train" in msg:
        return Kind.TRAIN, payload
    if "val" in msg:
        return Kind.VAL, payload
    return Kind.TRAIN, payload


class TelemetryHandler(logging.Handler):
    """Writes metric dicts as ``train``/``val``/``hparams`` and messages as ``log``."""

    def __init__(self, writer: JsonlWriter, *, is_writer_rank: bool = True) -> None:
        super().__init__(level=logging.INFO)
        self.writer = writer
        self.is_writer_rank = is_writer_rank
        self._last: logging.LogRecord | None = None

    def handle(self, record: logging.LogRecord) -> bool:  # no handler lock: the writer locks
        # The handler sits on both speculators.metrics and its parent speculators, so
        # a propagated metric record arrives twice: pass it on once.
        if record is self._last or not self.filter(record):
            return False
        self._last = record
        self.emit(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.msg
            if record.name == METRICS_LOGGER and isinstance(msg, Mapping):
                if not self.is_writer_rank:
                    return
                kind, payload = metric_payload(msg, record)
                self.writer.write(kind, payload)
                return
            if not self.is_writer_rank and record.levelno < logging.WARNING:
                return
            text = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                text = f"{text}\n{type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
            self.writer.write(
                Kind.LOG,
                {"level": record.levelname, "logger": record.name, "msg": text[:4000]},
            )
        except Exception:  # never into the trainer
            self.writer.stats.dropped += 1
