"""A user's own speculators training script, as eagle3-tui has never seen it: the tiny
CPU configuration of ``train/tiny.py`` rebuilt from the library's pieces, with no
handler on ``speculators.metrics`` and no import of eagle3_tui. The attach tests
launch it detached (``nohup``-style, output to a log) and add telemetry to it live.

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

VOCAB, HIDDEN, DRAFT_VOCAB, TTT_STEPS = 256, 64, 64, 3
TARGET_LAYERS = [0, 1, 2]
ROWS, SEQ_LEN, TOTAL_SEQ_LEN = 60, 48, 128


def make_data(root: Path) -> tuple[Path, Path]:
    import torch
    from datasets import Dataset
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    verifier_dir, data_dir = root / "verifier", root / "data"
    if (root / ".complete").exists():
        return verifier_dir, data_dir
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    verifier = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            intermediate_size=2 * HIDDEN,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=4 * TOTAL_SEQ_LEN,
            tie_word_embeddings=False,
        )
    ).eval()
    verifier.save_pretrained(verifier_dir)
    (data_dir / "hidden_states").mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[Any]] = {"input_ids": [], "loss_mask": [], "seq_len": []}
    for i in range(ROWS):
        start = int(torch.randint(0, VOCAB, (1,), generator=gen))
        stride = int(torch.randint(1, 12, (1,), generator=gen))
        ids = torch.tensor([(start + stride * k) % 251 for k in range(SEQ_LEN)])
        with torch.no_grad():
            out = verifier(ids[None], output_hidden_states=True)
        layers = [out.hidden_states[j + 1][0] for j in TARGET_LAYERS] + [out.hidden_states[-1][0]]
        save_file(
            {"token_ids": ids.contiguous(), "hidden_states": torch.stack(layers, 1).contiguous()},
            str(data_dir / "hidden_states" / f"hs_{i}.safetensors"),
        )
        rows["input_ids"].append(ids.tolist())
        rows["loss_mask"].append([1] * SEQ_LEN)
        rows["seq_len"].append(SEQ_LEN)
    dataset = Dataset.from_dict(rows)
    dataset.set_format("torch")
    dataset.save_to_disk(str(data_dir))
    (root / ".complete").write_text("ok\n")
    return verifier_dir, data_dir


def cpu_trainer() -> type:
    """speculators' Trainer with the CPU shims (see eagle3_tui/train/cpu_shims.py)."""
    import importlib

    # Any: replacing their functions is the point
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

    from speculators.train.trainer import Trainer

    class CpuTrainer(Trainer):
        def setup_trainer(self) -> None:
            # the library declares an int (a CUDA index); .to() and autocast take "cpu"
            self.local_rank = "cpu"  # type: ignore[assignment]
            self.device_type = "cpu"
            super().setup_trainer()  # type: ignore[no-untyped-call]  # speculators: unannotated

    return CpuTrainer


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
    from datasets import load_from_disk
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.dataloader import create_train_val_loaders
    from speculators.train.trainer import TrainerConfig
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution
    from transformers import AutoConfig

    verifier_dir, data_dir = make_data(a.data or a.out / "tiny")
    if a.prepare_only:
        return 0
    torch.manual_seed(0)
    counts: dict[int, int] = {}
    for ids in load_from_disk(str(data_dir)).with_format(None)["input_ids"]:
        for t in ids:
            counts[t] = counts.get(t, 0) + 1
    d2t, t2d = build_vocab_mappings_from_distribution(counts, DRAFT_VOCAB, VOCAB)
    model = Eagle3DraftModel.from_training_args(
        verifier_config=AutoConfig.from_pretrained(verifier_dir),
        t2d=t2d,
        d2t=d2t,
        verifier_name_or_path=str(verifier_dir),
        draft_vocab_size=DRAFT_VOCAB,
        norm_before_residual=True,
        ttt_steps=TTT_STEPS,
        target_layer_ids=TARGET_LAYERS,
        draft_attn_impl="sdpa",
    )
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
    train_kwargs, val_kwargs = Eagle3DraftModel.get_trainer_kwargs(
        loss_fn="kl_div", loss_implementation="eager", ttt_steps=TTT_STEPS, ttt_step_loss_decay=1.0
    )
    train_loader, val_loader = create_train_val_loaders(
        data_path=str(data_dir),
        total_seq_len=TOTAL_SEQ_LEN,
        hidden_states_dtype=torch.float32,
        vllm_endpoint="http://127.0.0.1:9/v1",
        on_missing="raise",
        verifier_name_or_path=str(verifier_dir),
        request_timeout=1.0,
        max_retries=0,
        generation_validation_retries=0,
        max_consecutive_generation_failures=1,
        hidden_size=HIDDEN,
        num_target_layers=len(TARGET_LAYERS),
        num_workers=0,
        prefetch_factor=2,
        preprocess=shift_batch,
        train_data_ratio=0.8,
        seed=0,
    )
    config = TrainerConfig(
        lr=3e-3,
        num_epochs=a.epochs,
        save_path=str(a.out / "checkpoints"),
        resume_from_checkpoint=True,
        train_call_kwargs=train_kwargs,
        val_call_kwargs=val_kwargs,
        hidden_states_dtype=torch.float32,
        scheduler_type="none",
        log_freq=1,
        checkpoint_freq=1.0,
    )
    trainer = cpu_trainer()(model, config, train_loader, val_loader)
    print(f"training started pid={os.getpid()}", flush=True)
    trainer.run_training()
    print(f"done global_step={trainer.global_step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
