"""Telemetry for the training host: makes a speculators run observable.

One call attaches it to a training script::

    from eagle3_tui.telemetry import attach
    telemetry = attach("runs/my-run")      # before or after building the Trainer
    trainer.run_training()
    telemetry.finish()

Imports only the standard library (orjson and NVML when installed); never textual
or asyncssh.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from eagle3_tui.telemetry.handler import MESSAGES_LOGGER, METRICS_LOGGER, TelemetryHandler
from eagle3_tui.telemetry.schema import METRICS_FILE, Kind
from eagle3_tui.telemetry.writer import JsonlWriter

__all__ = ["Telemetry", "attach"]


def _env_rank() -> int:
    for name in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(name)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                pass
    return 0


class Telemetry:
    """An attached telemetry session: its writer and handler."""

    def __init__(self, run_dir: Path, writer: JsonlWriter, handler: TelemetryHandler) -> None:
        self.run_dir = run_dir
        self.writer = writer
        self.handler = handler
        self._finished = False

    def ensure_attached(self) -> None:
        """(Re)attach the handler and levels; idempotent."""
        for name in (METRICS_LOGGER, MESSAGES_LOGGER):
            logger = logging.getLogger(name)
            if self.handler not in logger.handlers:
                logger.addHandler(self.handler)
            if logger.getEffectiveLevel() > logging.INFO:
                logger.setLevel(logging.INFO)

    def event(self, event: str, **fields: object) -> None:
        """Write a lifecycle event (start, resume, interrupt, finish, crash...)."""
        self.writer.write(Kind.LIFECYCLE, {"event": event, **fields})

    def finish(self, status: str = "finished", **fields: object) -> None:
        if self._finished:
            return
        self._finished = True
        self.event(status, **fields)

    def detach(self) -> None:
        for name in (METRICS_LOGGER, MESSAGES_LOGGER):
            logging.getLogger(name).removeHandler(self.handler)
        self.writer.close()


def attach(run_dir: str | os.PathLike[str], *, rank: int | None = None) -> Telemetry:
    """Attach telemetry that writes ``run_dir/metrics.jsonl``; returns the session."""
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    rank = _env_rank() if rank is None else rank
    writer = JsonlWriter(path / METRICS_FILE, rank=rank)
    handler = TelemetryHandler(writer, is_writer_rank=rank == 0)
    telemetry = Telemetry(path, writer, handler)
    telemetry.ensure_attached()
    telemetry.event("start", pid=os.getpid())
    return telemetry
