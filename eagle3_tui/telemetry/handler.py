"""A logging handler that turns speculators' metric dicts and messages into records.

The speculators Trainer logs a dict per step on ``speculators.metrics`` and
human messages on ``speculators``. Both loggers are NOTSET, so they inherit the
root's WARNING: a handler alone receives nothing. :func:`attach` in
``eagle3_tui.telemetry`` sets their level too.

The metric path is the hot one (every training step, in the training thread):
no handler lock (the writer has its own), no copy of the metrics beyond one
shallow dict, no ``json`` in Python — the writer encodes with one orjson call
and hands the line to its thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from eagle3_tui.telemetry.schema import Kind
from eagle3_tui.telemetry.stop import StepStop
from eagle3_tui.telemetry.writer import JsonlWriter

METRICS_LOGGER = "speculators.metrics"
MESSAGES_LOGGER = "speculators"
MAX_MESSAGE = 4000

_perf_ns = time.perf_counter_ns


def metric_payload(
    msg: Mapping[str, Any], record: logging.LogRecord
) -> tuple[str, Mapping[str, Any], int | None]:
    """Map one speculators metrics dict to (kind, payload, step); no copy of ``msg``."""
    attrs = record.__dict__
    if attrs.get("hparams"):
        return Kind.HPARAMS, {"hparams": msg}, None
    step = attrs.get("step")
    if not isinstance(step, int):
        step = None
    if "train" in msg:
        return Kind.TRAIN, msg, step
    if "val" in msg:
        return Kind.VAL, msg, step
    return Kind.TRAIN, msg, step


class TelemetryHandler(logging.Handler):
    """Writes metric dicts as ``train``/``val``/``hparams`` and messages as ``log``.

    ``on_message(text)`` is called with each message of the ``speculators``
    loggers (the telemetry session reads checkpoint and interrupt messages from
    it); ``on_metrics(kind, payload, step)``, when set, with each metric record
    written (the progress line). Neither may raise into the trainer: their errors are counted.
    The one exception ``emit`` lets out is speculators' ``TrainingInterruptedError`` at
    the step a kill asked to stop at (``step_stop``): ``Handler.handle`` does not catch,
    so it leaves ``metric_logger.info`` in ``train_epoch`` and the library saves
    ``interrupted/`` (``stop.py``).
    """

    def __init__(self, writer: JsonlWriter, *, is_writer_rank: bool = True) -> None:
        super().__init__(level=logging.INFO)
        self.writer = writer
        self.is_writer_rank = is_writer_rank
        self.on_message: Callable[[str], None] | None = None
        self.on_metrics: Callable[[str, Mapping[str, Any], int | None], None] | None = None
        self._last: logging.LogRecord | None = None
        self.last_step: int | None = None
        """The step of the last train record written."""
        self.step_stop: StepStop | None = None
        """The stop at a step boundary that ``eagle3-tui kill`` asks for (``stop.py``):
        looked at after each training step's metrics, on every rank."""

    def handle(self, record: logging.LogRecord) -> bool:
        # No handler lock: the writer locks. The handler sits on both speculators.metrics
        # and its parent speculators, so a propagated record arrives twice: pass it on once.
        if record is self._last:
            return False
        self._last = record
        if self.filters and not self.filter(record):
            return False
        t0 = _perf_ns()
        self.emit(record)
        self.writer.note_overhead(_perf_ns() - t0)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        trained: int | None = None  # a training step's metrics: where a stop may come
        try:
            msg = record.msg
            if record.name != METRICS_LOGGER or not (type(msg) is dict or isinstance(msg, Mapping)):
                self._emit_message(record)
                return
            if not self.is_writer_rank:  # not written; its step is in this rank's heartbeat
                step = record.__dict__.get("step")
                if isinstance(step, int) and "train" in msg:
                    self.last_step = step
            else:
                kind, payload, step = metric_payload(msg, record)
                self.writer.write_deferred(kind, payload, step)  # encoded by the writer thread
                if step is not None and kind == "train":
                    self.last_step = step
                if self.on_metrics is not None:
                    self.on_metrics(kind, payload, step)
            if isinstance(step, int) and "train" in msg:
                trained = step
        except Exception as e:  # never into the trainer
            self.writer._count_drop(e)
            return
        if trained is not None and self.step_stop is not None:
            # the one exception that leaves here: speculators' interrupt, at the stop step
            self.step_stop.at_step(trained, record, self)

    def _emit_message(self, record: logging.LogRecord) -> None:
        """A message of the ``speculators`` loggers as a ``log`` record (rank 0, and
        warnings of every rank)."""
        if not self.is_writer_rank and record.levelno < logging.WARNING:
            return
        try:
            text = record.getMessage()
        except Exception:  # bad %-args: keep what we can
            text = f"{record.msg!r} % {record.args!r}"
        if record.exc_info and record.exc_info[1] is not None:
            text = f"{text}\n{type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
        self.writer.write(
            Kind.LOG,
            {"level": record.levelname, "logger": record.name, "msg": text[:MAX_MESSAGE]},
        )
        if self.on_message is not None:
            self.on_message(text)

    def close(self) -> None:
        # logging.shutdown() and dictConfig() close every handler they know of; the
        # writer belongs to the telemetry session, which closes it at its end.
        super().close()
