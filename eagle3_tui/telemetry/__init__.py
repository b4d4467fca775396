"""Telemetry for the training host: makes a speculators run observable.

One call attaches it to a training script::

    from eagle3_tui.telemetry import attach
    telemetry = attach("runs/my-run")      # before or after building the Trainer
    telemetry.watch_trainer(trainer)       # optional: epochs, steps, checkpoint dir
    trainer.run_training()
    telemetry.finish()                     # optional: done at exit otherwise

It writes ``metrics.jsonl`` (schema in docs/ARCHITECTURE.md) and ``run.json``,
and samples GPUs, dataloader reads, checkpoints and its own health in a sidecar
process. Imports only the standard library (orjson and NVML when installed);
never textual or asyncssh.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eagle3_tui.telemetry.session import Telemetry, attach, install_dictconfig_hook

__all__ = ["Telemetry", "attach", "install_dictconfig_hook"]


def __getattr__(name: str) -> Any:
    """The session's names, imported when first used: the agent imports ``procs`` and
    ``topology`` from this package and must not pull in the writer (orjson) with them."""
    if name in __all__:
        from eagle3_tui.telemetry import session

        return getattr(session, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
