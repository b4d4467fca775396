"""The five narrow shims that let the unmodified speculators Trainer train on a CPU.

speculators 0.9 assumes an accelerator in a few places. Each shim below is applied
only when ``torch.accelerator`` reports none, and each one names the line it
replaces, so that a GPU host runs the library exactly as shipped:

1. ``Trainer.__init__`` moves the model with ``.to(self.local_rank)`` (an int, i.e.
   a CUDA index) and autocasts on ``device_type`` "cuda": :class:`CpuTrainer` sets
   both to "cpu" in ``setup_trainer()``, which runs before ``setup_model()``.
2. ``_StepTimer.mark/now`` call ``torch.accelerator.synchronize()`` on every logged
   step: replaced by versions without the synchronize.
3. ``speculators.train.checkpointer.get_current_device`` returns "cuda:0" with no
   accelerator, which breaks resume: it returns "cpu".
4. the fused losses need Triton: callers pass ``loss_implementation="eager"``.
5. flex attention has no CPU backward: callers pass ``draft_attn_impl="sdpa"``.

(4) and (5) are arguments, not patches; :data:`CPU_MODEL_KWARGS` holds them.
"""

from __future__ import annotations

import time
from typing import Any

import torch

CPU_MODEL_KWARGS: dict[str, str] = {"loss_implementation": "eager", "draft_attn_impl": "sdpa"}


def has_accelerator() -> bool:
    return bool(torch.accelerator.is_available())


_applied = False


def apply_cpu_shims() -> bool:
    """Patch (2) and (3) when there is no accelerator; returns whether it did."""
    global _applied
    if has_accelerator():
        return False
    if _applied:
        return True
    import speculators.train.checkpointer as checkpointer
    import speculators.train.trainer as trainer

    def mark(self: Any, name: str) -> None:
        if self.enabled:
            self._marks[name] = time.perf_counter()

    def now(self: Any) -> float | None:
        return time.perf_counter() if self.enabled else None

    trainer._StepTimer.mark = mark
    trainer._StepTimer.now = now
    checkpointer.get_current_device = lambda: "cpu"
    _applied = True
    return True


def trainer_class() -> type:
    """The speculators Trainer, or its CPU subclass (shim 1) when no accelerator exists."""
    from speculators.train.trainer import Trainer

    if has_accelerator():
        return Trainer
    apply_cpu_shims()

    class CpuTrainer(Trainer):  # type: ignore[misc, valid-type]
        """Trainer whose device is "cpu" (shim 1)."""

        def setup_trainer(self) -> None:
            self.local_rank = "cpu"
            self.device_type = "cpu"
            super().setup_trainer()

    return CpuTrainer
