"""A user's own speculators training script, as eagle3-tui has never seen it: the tiny
configuration of ``train/tiny.py`` (its data, model, loaders and CPU shims, imported
from the checkout's ``train/`` folder as the package ``train``, never as
``eagle3_tui.train``), with no handler on ``speculators.metrics`` and no import of
eagle3_tui. The attach tests launch it detached (``nohup``-style, output to a log)
and add telemetry to it live.

    python silent_training.py --out DIR [--data DIR] [--epochs 3] [--step-delay 0.1]
                              [--hang-when FILE] [--prepare-only] [--step-times FILE]

``--hang-when FILE``: the first training step after FILE appears blocks for good
inside :func:`wait_for_a_lost_rank` (as a collective waits for a rank that died).
``--data``: where the tiny verifier and dataset are (made there once; default
OUT/tiny); ``--prepare-only`` makes them and exits. ``--step-times FILE``: the wall
time of each training step's start, one per line (the attach benchmark reads the
pause it caused from the gaps).
Prints ``training started`` when the Trainer is built and about to train, and
``done global_step=N`` at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

# the checkout: train/ imports as the package ``train`` (its modules import one another
# relatively, so nothing of eagle3_tui comes with them)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def wait_for_a_lost_rank() -> None:
    """Blocks for good, as a collective whose peer died."""
    threading.Event().wait()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--step-delay", type=float, default=0.1)
    p.add_argument("--data", type=Path)
    p.add_argument("--hang-when", type=Path)
    p.add_argument("--prepare-only", action="store_true")
    p.add_argument("--step-times", type=Path)
    a = p.parse_args()
    import torch
    from speculators.train.trainer import TrainerConfig

    from train.cpu_shims import has_accelerator, trainer_class
    from train.tiny import TinyConfig, make_tiny_data, tiny_loaders, tiny_model

    cfg = TinyConfig(epochs=a.epochs)
    verifier_dir, data_dir = make_tiny_data(a.data or a.out / "tiny", cfg)
    if a.prepare_only:
        return 0
    cpu = not has_accelerator()
    model, train_kwargs, val_kwargs = tiny_model(verifier_dir, data_dir, cfg, cpu)
    calls = [0]
    times = open(a.step_times, "a", buffering=1) if a.step_times else None  # noqa: SIM115

    def pace(module: Any, *_: Any) -> None:
        if not module.training:
            return
        if times is not None:
            times.write(f"{time.time()}\n")
        if a.hang_when is not None and a.hang_when.exists():
            print(f"step {calls[0]} hangs now", flush=True)
            wait_for_a_lost_rank()
        calls[0] += 1
        time.sleep(a.step_delay)

    model.register_forward_pre_hook(pace)
    dtype = torch.float32 if cpu else torch.bfloat16
    train_loader, val_loader = tiny_loaders(verifier_dir, data_dir, cfg, dtype)
    config = TrainerConfig(
        lr=cfg.lr,
        num_epochs=cfg.epochs,
        save_path=str(a.out / "checkpoints"),
        resume_from_checkpoint=True,
        train_call_kwargs=train_kwargs,
        val_call_kwargs=val_kwargs,
        hidden_states_dtype=dtype,
        scheduler_type="none",
        log_freq=1,
        checkpoint_freq=1.0,
    )
    trainer = trainer_class()(model, config, train_loader, val_loader)
    print(f"training started pid={os.getpid()}", flush=True)
    trainer.run_training()
    print(f"done global_step={trainer.global_step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
