"""The six narrow shims that let the unmodified speculators Trainer train on a CPU.

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

6. under torchrun, ``speculators.train.distributed.maybe_setup_distributed`` calls
   ``torch.accelerator.set_device_index(local_rank)`` and raises "No accelerator
   found" without one (it also picks the backend from the accelerator):
   :func:`maybe_setup_distributed_cpu` initialises the gloo backend instead and
   then fills the module's topology (``_local_rank``, ``_rank``, ``_world_size``,
   ``_is_distributed``, the DP/SP groups through the library's own
   ``_init_sp_process_groups``) as the original does. Both the library's name and
   the copy ``speculators.train.cli`` imported are replaced. FSDP2's
   ``fully_shard`` then runs on CPU over gloo as shipped.

(4) and (5) are arguments, not patches; :data:`CPU_MODEL_KWARGS` holds them.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
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
    # Patched modules are handled as Any: replacing their functions is the point.
    checkpointer: Any = importlib.import_module("speculators.train.checkpointer")
    trainer: Any = importlib.import_module("speculators.train.trainer")

    def mark(self: Any, name: str) -> None:
        if self.enabled:
            self._marks[name] = time.perf_counter()

    def now(self: Any) -> float | None:
        return time.perf_counter() if self.enabled else None

    trainer._StepTimer.mark = mark
    trainer._StepTimer.now = now
    checkpointer.get_current_device = lambda: "cpu"
    distributed: Any = importlib.import_module("speculators.train.distributed")
    distributed.maybe_setup_distributed = maybe_setup_distributed_cpu
    cli: Any = sys.modules.get("speculators.train.cli")
    if cli is not None:  # it imported the name before we replaced it
        cli.maybe_setup_distributed = maybe_setup_distributed_cpu
    _applied = True
    return True


def maybe_setup_distributed_cpu(sp_size: int = 1) -> None:
    """Shim 6: ``maybe_setup_distributed`` without an accelerator (gloo).

    Mirrors speculators 0.9's ``train/distributed.py``: nothing but the topology's
    ``_local_rank``/``_is_distributed`` unless torchrun set ``LOCAL_RANK``; then
    the process group (gloo instead of the accelerator's backend, no
    ``device_id``), ``_rank``/``_world_size`` from it, and the DP/SP groups by the
    library's own function.
    """
    import torch.distributed as dist
    from speculators.train import distributed as d

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    is_distributed = "LOCAL_RANK" in os.environ
    d._local_rank = local_rank
    d._is_distributed = is_distributed
    if not is_distributed:
        return
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    d._rank = dist.get_rank()
    d._world_size = dist.get_world_size()
    d._init_sp_process_groups(d._rank, d._world_size, sp_size)
    logging.getLogger("speculators").info(
        f"Started distributed with local_rank={local_rank}, dp_size={d._dp_size}, "
        f"sp_size={d._sp_size} (gloo on CPU: eagle3-tui shim 6)",
        extra={"override_rank0_filter": True},
    )


def maybe_setup_distributed() -> None:
    """The library's distributed set-up, or shim 6 where no accelerator exists."""
    if has_accelerator():
        from speculators.train.distributed import maybe_setup_distributed as original

        original()
        return
    apply_cpu_shims()
    maybe_setup_distributed_cpu()


def trainer_class() -> type:
    """The speculators Trainer, or its CPU subclass (shim 1) when no accelerator exists."""
    from speculators.train.trainer import Trainer

    if has_accelerator():
        return Trainer
    apply_cpu_shims()

    # misc: without speculators (a client's type check) Trainer is Any
    class CpuTrainer(Trainer):  # type: ignore[misc, unused-ignore]
        """Trainer whose device is "cpu" (shim 1)."""

        def setup_trainer(self) -> None:
            # the library declares an int (a CUDA index); .to() and autocast take "cpu"
            self.local_rank = "cpu"  # type: ignore[assignment, unused-ignore]
            self.device_type = "cpu"
            super().setup_trainer()  # type: ignore[no-untyped-call, unused-ignore]  # unannotated

    return CpuTrainer
