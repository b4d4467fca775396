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

import contextlib
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from eagle3_tui.telemetry import manifest as mf
from eagle3_tui.telemetry.handler import MESSAGES_LOGGER, METRICS_LOGGER, TelemetryHandler
from eagle3_tui.telemetry.schema import MANIFEST_FILE, METRICS_FILE, Kind
from eagle3_tui.telemetry.writer import JsonlWriter

__all__ = ["Telemetry", "attach"]

_STATUS_OF_EVENT = {"finish": "finished", "interrupt": "interrupted", "crash": "crashed"}
_EVENT_ALIASES = {"finished": "finish", "interrupted": "interrupt", "crashed": "crash"}


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
    """An attached telemetry session: its writer, handler and manifest."""

    def __init__(self, run_dir: Path, writer: JsonlWriter, handler: TelemetryHandler) -> None:
        self.run_dir = run_dir
        self.writer = writer
        self.handler = handler
        self.run_id = ""
        self.rank = writer.rank
        self.manifest_path = run_dir / MANIFEST_FILE
        self.manifest: dict[str, Any] | None = None
        self.trainer: Any = None
        self._finished = False

    # ---- logging ----------------------------------------------------------------
    def ensure_attached(self) -> bool:
        """(Re)attach the handler and levels; idempotent. Returns whether it changed anything."""
        changed = False
        for name in (METRICS_LOGGER, MESSAGES_LOGGER):
            logger = logging.getLogger(name)
            if self.handler not in logger.handlers:
                logger.addHandler(self.handler)
                changed = True
            if logger.getEffectiveLevel() > logging.INFO:
                logger.setLevel(logging.INFO)
                changed = True
            if logger.disabled:
                logger.disabled = False
                changed = True
        return changed

    # ---- records ----------------------------------------------------------------
    def event(self, event: str, **fields: object) -> None:
        """Write a lifecycle event (start, resume, interrupt, finish, crash...)."""
        self.writer.write(Kind.LIFECYCLE, {"event": event, **fields})

    # ---- manifest ---------------------------------------------------------------
    @property
    def writes_manifest(self) -> bool:
        return self.rank == 0

    def update_manifest(self, **fields: Any) -> None:
        """Set fields of ``run.json`` (rank 0 only); never raises into the trainer."""
        if not self.writes_manifest or self.manifest is None:
            return
        self.manifest.update(fields)
        self.manifest["updated_at"] = time.time()
        try:
            mf.write_manifest(self.manifest_path, self.manifest)
        except OSError as e:
            self._warn(f"cannot update {self.manifest_path}: {e}")

    def watch_trainer(self, trainer: Any) -> None:
        """Learn the run's bounds from a speculators ``Trainer``: checkpoint dir,
        epochs, steps per epoch (and total), the global step it starts from."""
        self.trainer = trainer
        config = getattr(trainer, "config", None)
        fields: dict[str, Any] = {}
        save_path = getattr(config, "save_path", None)
        if save_path is not None:
            fields["checkpoint_dir"] = str(Path(save_path).resolve())
        epochs = getattr(config, "num_epochs", None)
        if isinstance(epochs, int):
            fields["epochs"] = epochs
        try:
            steps = len(trainer.train_loader)
        except Exception:  # an iterable loader has no length
            steps = None
        if isinstance(steps, int):
            fields["steps_per_epoch"] = steps
        e, s = fields.get("epochs"), fields.get("steps_per_epoch")
        if e is not None and s is not None:
            fields["total_steps"] = e * s
        max_steps = getattr(config, "max_steps", None)
        if isinstance(max_steps, int) and max_steps > 0:
            fields["total_steps"] = min(fields.get("total_steps", max_steps), max_steps)
        if fields:
            self.update_manifest(**fields)

    def _warn(self, text: str) -> None:
        self.writer.write(
            Kind.LOG, {"level": "WARNING", "logger": "eagle3_tui.telemetry", "msg": text}
        )
        with contextlib.suppress(Exception):  # a closed stderr
            print(f"eagle3-tui telemetry: {text}", file=sys.stderr)

    # ---- end --------------------------------------------------------------------
    def finish(self, status: str = "finish", **fields: object) -> None:
        """Write the final lifecycle event (finish, interrupt or crash) and the manifest
        status. Idempotent."""
        if self._finished:
            return
        self._finished = True
        event = _EVENT_ALIASES.get(status, status)
        if "step" not in fields and self.trainer is not None:
            step = getattr(self.trainer, "global_step", None)
            if isinstance(step, int):
                fields["step"] = step
        if self.rank == 0 or event == "crash":
            self.event(event, **fields)
        self.update_manifest(status=_STATUS_OF_EVENT.get(event, event), finished_at=time.time())

    def detach(self) -> None:
        for name in (METRICS_LOGGER, MESSAGES_LOGGER):
            logging.getLogger(name).removeHandler(self.handler)
        self.writer.close()


def attach(
    run_dir: str | os.PathLike[str],
    *,
    rank: int | None = None,
    trainer: Any = None,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    epochs: int | None = None,
    steps_per_epoch: int | None = None,
    resume_command: list[str] | None = None,
    log_file: str | None = None,
    samplers: bool = True,
) -> Telemetry:
    """Attach telemetry that writes ``run_dir/metrics.jsonl`` and ``run_dir/run.json``.

    Returns the session. On a run directory that already has a manifest (a
    resume), the run keeps its id and a ``resume`` event is written instead of
    ``start``. Never raises for an I/O problem after the directory exists.
    """
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    rank = _env_rank() if rank is None else rank
    run_id = mf.resolve_run_id(path)
    # inherited by the dataloader workers spawned later
    os.environ[mf.RUN_ID_ENV] = run_id
    os.environ[mf.RUN_DIR_ENV] = str(path.resolve())
    writer = JsonlWriter(path / METRICS_FILE, rank=rank)
    handler = TelemetryHandler(writer, is_writer_rank=rank == 0)
    telemetry = Telemetry(path, writer, handler)
    telemetry.run_id = run_id
    telemetry.ensure_attached()

    previous: dict[str, Any] | None = None
    try:
        previous = mf.read_manifest(path / MANIFEST_FILE)
    except (OSError, ValueError):
        previous = None
    if trainer is not None:
        save_path = getattr(getattr(trainer, "config", None), "save_path", None)
        checkpoint_dir = checkpoint_dir if checkpoint_dir is not None else save_path
    ckpt_dir = str(Path(checkpoint_dir).resolve()) if checkpoint_dir is not None else None
    if ckpt_dir is None and previous is not None:
        ckpt_dir = previous.get("checkpoint_dir")
    if rank == 0:
        manifest = mf.build_manifest(
            path,
            run_id=run_id,
            resume_command=resume_command,
            checkpoint_dir=ckpt_dir,
            epochs=epochs,
            steps_per_epoch=steps_per_epoch,
            log_file=log_file,
        )
        if previous is not None:
            for key in ("checkpoint_dir", "epochs", "steps_per_epoch", "total_steps", "log_file"):
                if manifest.get(key) is None and previous.get(key) is not None:
                    manifest[key] = previous[key]
            manifest["first_started_at"] = previous.get(
                "first_started_at", previous.get("started_at")
            )
            manifest["resumes"] = int(previous.get("resumes", 0) or 0) + 1
        else:
            manifest["first_started_at"] = manifest["started_at"]
            manifest["resumes"] = 0
        telemetry.manifest = manifest
        try:
            mf.write_manifest(telemetry.manifest_path, manifest)
            mf.register_run(manifest)
        except OSError as e:
            telemetry._warn(f"cannot write the run manifest or index: {e}")
    if trainer is not None:
        telemetry.watch_trainer(trainer)

    if rank != 0:
        pass  # lifecycle events of the run come from rank 0 (a crash from any rank)
    elif previous is None:
        telemetry.event("start", pid=os.getpid(), global_step=0, run_id=run_id)
    else:
        checkpoint, step = mf.resume_point(ckpt_dir)
        if trainer is not None and isinstance(getattr(trainer, "global_step", None), int):
            step = trainer.global_step
        telemetry.event(
            "resume", pid=os.getpid(), checkpoint=checkpoint, global_step=step, run_id=run_id
        )
    return telemetry
