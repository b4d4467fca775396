"""A tiny, real EAGLE-3 training on the CPU: the speculators Trainer, unmodified.

    python -m eagle3_tui.train.tiny --run-dir runs/tiny [--epochs 3] [--workers 2]

It generates (once per run directory) a tiny Llama verifier and synthetic
training data in the library's on-disk format: ``datasets.save_to_disk`` rows with
``input_ids``/``loss_mask``/``seq_len`` and ``hidden_states/hs_<row>.safetensors``
holding the verifier's real hidden states for those tokens. Then it trains a
1-layer EAGLE-3 draft (hidden 64, vocab 256, draft vocab 64, ttt_steps 3) with
the library's ``Trainer`` and telemetry attached. Running it again on the same
run directory resumes from the last checkpoint, as speculators does.

``--no-telemetry`` runs the same Trainer the way a user script does by default:
no handler on ``speculators.metrics``, so no metric is written anywhere.

Under torchrun it trains on every rank, sharded with FSDP2 (the library's
``fsdp_shard``) over gloo on a CPU (``cpu_shims`` shim 6), e.g.::

    torchrun --standalone --nproc-per-node 2 -m eagle3_tui.train.tiny --run-dir runs/tiny2
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VOCAB = 256
HIDDEN = 64
DRAFT_VOCAB = 64
VERIFIER_LAYERS = 4
TARGET_LAYERS = [0, 1, 2]
TTT_STEPS = 3


@dataclass(frozen=True)
class TinyConfig:
    rows: int = 60
    seq_len: int = 48
    total_seq_len: int = 128
    epochs: int = 3
    workers: int = 0
    lr: float = 3e-3
    seed: int = 0
    step_delay: float = 0.0
    log_freq: int = 1
    checkpoint_freq: float = 1.0
    hang_at_step: int = -1
    debug_rank: int = -1
    """The rank the debug options apply to (-1: every rank)."""
    debug_control: str = ""


def _hang_hook(step: int) -> Any:
    """A forward pre-hook that blocks the training loop for good at training step
    ``step`` (tests: the samplers must keep reporting while the loop hangs)."""
    import threading

    forever = threading.Event()
    calls = [0]

    def hook(module: Any, *_: Any) -> None:
        if not module.training:
            return
        if calls[0] == step:
            print(f"[eagle3] debug: training step {step} now blocks forever", flush=True)
            forever.wait()
        calls[0] += 1

    return hook


def _debug_control_hook(path: str, rank: int) -> Any:
    """A forward pre-hook that reads ``path`` (tests): a line ``hang R`` blocks rank R's
    training loop for good, ``hang_val R`` its next validation forward, ``ignore_sigterm
    R`` makes rank R ignore SIGTERM (after speculators installed its handler), as a rank
    wedged in a C call would, ``nan R`` fills rank R's weights with NaN (its loss
    diverges)."""
    import signal
    import threading

    forever = threading.Event()
    done: set[str] = set()

    def hook(module: Any, *_inputs: Any) -> None:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError:
            return
        for line in lines:
            what, _, who = line.partition(" ")
            if who.strip() != str(rank) or what in done:
                continue
            if (what == "hang_val") == module.training:
                continue  # hang_val: in a validation (eval mode) only; the rest in training
            if what == "hang_val":
                done.add(what)
                print(f"[eagle3] debug: rank {rank} validation blocks forever now", flush=True)
                forever.wait()
            done.add(what)
            if what == "ignore_sigterm":
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                print(f"[eagle3] debug: rank {rank} ignores SIGTERM now", flush=True)
            elif what == "hang":
                print(f"[eagle3] debug: rank {rank} blocks forever now", flush=True)
                forever.wait()
            elif what == "nan":  # its weights NaN from here on: the loss diverges
                import torch

                with torch.no_grad():
                    for param in module.parameters():
                        param.fill_(float("nan"))
                print(f"[eagle3] debug: rank {rank} weights are NaN now", flush=True)

    return hook


def _rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def make_tiny_data(root: Path, cfg: TinyConfig) -> tuple[Path, Path]:
    """Write the verifier and the dataset under ``root`` unless already there.

    Under torchrun every rank calls this: the first to take the lock writes, the
    others find it complete (a run directory on a shared filesystem included).
    """
    import fcntl

    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _make_tiny_data(root, cfg)


def _make_tiny_data(root: Path, cfg: TinyConfig) -> tuple[Path, Path]:
    import torch

    verifier_dir = root / "verifier"
    data_dir = root / "data"
    done = root / ".complete"
    if done.exists():
        return verifier_dir, data_dir
    from datasets import Dataset
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    verifier = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            intermediate_size=2 * HIDDEN,
            num_hidden_layers=VERIFIER_LAYERS,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=4 * cfg.total_seq_len,
            tie_word_embeddings=False,
        )
    ).eval()
    verifier.save_pretrained(verifier_dir)
    (data_dir / "hidden_states").mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[Any]] = {"input_ids": [], "loss_mask": [], "seq_len": []}
    for i in range(cfg.rows):
        # Learnable sequences: an arithmetic progression mod a prime, random start/stride.
        start = int(torch.randint(0, VOCAB, (1,), generator=gen))
        stride = int(torch.randint(1, 12, (1,), generator=gen))
        ids = torch.tensor([(start + stride * k) % 251 for k in range(cfg.seq_len)])
        with torch.no_grad():
            out = verifier(ids[None], output_hidden_states=True)
        layers = [out.hidden_states[i + 1][0] for i in TARGET_LAYERS] + [out.hidden_states[-1][0]]
        hidden = torch.stack(layers, dim=1).float().contiguous()  # [L, n_aux + 1, H]
        save_file(
            {"token_ids": ids.contiguous(), "hidden_states": hidden},
            str(data_dir / "hidden_states" / f"hs_{i}.safetensors"),
        )
        rows["input_ids"].append(ids.tolist())
        rows["loss_mask"].append([1] * cfg.seq_len)
        rows["seq_len"].append(cfg.seq_len)
    dataset = Dataset.from_dict(rows)
    dataset.set_format("torch")
    dataset.save_to_disk(str(data_dir))
    done.write_text("ok\n")
    return verifier_dir, data_dir


def build_trainer(run_dir: Path, cfg: TinyConfig) -> Any:
    """Build the real speculators Trainer for the tiny configuration."""
    import torch
    from speculators.train.trainer import TrainerConfig

    from eagle3_tui.train.cpu_shims import has_accelerator, maybe_setup_distributed, trainer_class
    from eagle3_tui.train.observe import observe_transfer

    # before the process group: transformers saves only on rank 0 once one exists
    verifier_dir, data_dir = make_tiny_data(run_dir / "tiny", cfg)
    # under torchrun: the process group and the library's topology (the sampler shards by it)
    maybe_setup_distributed()
    distributed = "LOCAL_RANK" in os.environ
    cpu = not has_accelerator()
    model, train_kwargs, val_kwargs = tiny_model(verifier_dir, data_dir, cfg, cpu)
    if cfg.step_delay > 0:  # demo pacing, so a person can watch the curves move
        model.register_forward_pre_hook(lambda *_: time.sleep(cfg.step_delay))
    debug_here = cfg.debug_rank in (-1, _rank())
    if cfg.hang_at_step >= 0 and debug_here:
        model.register_forward_pre_hook(_hang_hook(cfg.hang_at_step))
    if cfg.debug_control:
        model.register_forward_pre_hook(_debug_control_hook(cfg.debug_control, _rank()))
    # float32 hidden states on CPU: bf16 autocast there is ~25x slower.
    dtype = torch.float32 if cpu else torch.bfloat16
    # the library's default transfer, reporting reads
    transfer = observe_transfer(None, data_dir)
    train_loader, val_loader = tiny_loaders(verifier_dir, data_dir, cfg, dtype, transfer)
    config = TrainerConfig(
        lr=cfg.lr,
        num_epochs=cfg.epochs,
        save_path=str(run_dir / "checkpoints"),
        resume_from_checkpoint=True,
        train_call_kwargs=train_kwargs,
        val_call_kwargs=val_kwargs,
        hidden_states_dtype=dtype,
        scheduler_type="none",
        log_freq=cfg.log_freq,
        checkpoint_freq=cfg.checkpoint_freq,
        fsdp_shard=distributed,
    )
    return trainer_class()(model, config, train_loader, val_loader)


def tiny_model(
    verifier_dir: Path, data_dir: Path, cfg: TinyConfig, cpu: bool
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The EAGLE-3 draft of the tiny verifier (seeded; its vocabulary mapped from the
    dataset's token counts) and the Trainer's call arguments for it; on a CPU the
    implementations that need no Triton or flex attention (shims 4 and 5).

    Imports only torch and speculators (relative to this folder), so a test's
    stand-in for a user's script can build the same model without eagle3_tui."""
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution
    from transformers import AutoConfig

    from .cpu_shims import CPU_MODEL_KWARGS

    torch.manual_seed(cfg.seed)
    d2t, t2d = build_vocab_mappings_from_distribution(_token_counts(data_dir), DRAFT_VOCAB, VOCAB)
    model_kwargs = CPU_MODEL_KWARGS if cpu else {}
    model = Eagle3DraftModel.from_training_args(
        verifier_config=AutoConfig.from_pretrained(verifier_dir),
        t2d=t2d,
        d2t=d2t,
        verifier_name_or_path=str(verifier_dir),
        draft_vocab_size=DRAFT_VOCAB,
        norm_before_residual=True,
        ttt_steps=TTT_STEPS,
        target_layer_ids=TARGET_LAYERS,
        draft_attn_impl=model_kwargs.get("draft_attn_impl", "simple_flex_attention"),
    )
    train_kwargs, val_kwargs = Eagle3DraftModel.get_trainer_kwargs(
        loss_fn="kl_div",
        loss_implementation=model_kwargs.get("loss_implementation", "fused"),
        ttt_steps=TTT_STEPS,
        ttt_step_loss_decay=1.0,
    )
    return model, train_kwargs, val_kwargs


def tiny_loaders(
    verifier_dir: Path, data_dir: Path, cfg: TinyConfig, dtype: Any, transfer: Any = None
) -> tuple[Any, Any]:
    """The library's train and validation loaders over the tiny dataset: every hidden
    state is on disk (``on_missing="raise"``: the vLLM endpoint is never asked);
    ``transfer`` None for the library's default."""
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.dataloader import create_train_val_loaders

    optional = {"transfer": transfer} if transfer is not None else {}
    return create_train_val_loaders(
        data_path=str(data_dir),
        total_seq_len=cfg.total_seq_len,
        hidden_states_dtype=dtype,
        **optional,
        vllm_endpoint="http://127.0.0.1:9/v1",  # never used: on_missing="raise"
        on_missing="raise",
        verifier_name_or_path=str(verifier_dir),
        request_timeout=1.0,
        max_retries=0,
        generation_validation_retries=0,
        max_consecutive_generation_failures=1,
        hidden_size=HIDDEN,
        num_target_layers=len(TARGET_LAYERS),
        num_workers=cfg.workers,
        prefetch_factor=2,
        preprocess=shift_batch,
        train_data_ratio=0.8,
        seed=cfg.seed,
    )


def _token_counts(data_dir: Path) -> dict[int, int]:
    from datasets import load_from_disk

    counts: dict[int, int] = {}
    for ids in load_from_disk(str(data_dir)).with_format(None)["input_ids"]:
        for t in ids:
            counts[t] = counts.get(t, 0) + 1
    return counts


def parse_args(argv: list[str] | None = None) -> tuple[Path, TinyConfig, argparse.Namespace]:
    from eagle3_tui.train.common import add_telemetry_args

    p = argparse.ArgumentParser(
        prog="python -m eagle3_tui.train.tiny", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--run-dir", type=Path, required=True, help="where metrics, checkpoints and data go"
    )
    p.add_argument("--epochs", type=int, default=TinyConfig.epochs)
    p.add_argument("--rows", type=int, default=TinyConfig.rows, help="synthetic dataset rows")
    p.add_argument(
        "--workers", type=int, default=TinyConfig.workers, help="dataloader worker processes"
    )
    p.add_argument("--lr", type=float, default=TinyConfig.lr)
    p.add_argument("--seed", type=int, default=TinyConfig.seed)
    p.add_argument(
        "--step-delay", type=float, default=0.0, help="seconds added to each forward (demo pacing)"
    )
    p.add_argument("--log-freq", type=int, default=TinyConfig.log_freq)
    p.add_argument(
        "--checkpoint-freq",
        type=float,
        default=TinyConfig.checkpoint_freq,
        help="epochs between checkpoints; below 1, a fraction of an epoch",
    )
    p.add_argument(
        "--no-telemetry", action="store_true", help="run as a bare user script would: silent"
    )
    p.add_argument("--debug-hang-at-step", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument(
        "--one-liner",
        action="store_true",
        help="end as the README's one-liner does: telemetry.finish() without arguments "
        "after run_training() returns",
    )
    p.add_argument("--debug-rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--debug-control", default="", help=argparse.SUPPRESS)
    add_telemetry_args(p, progress_every=10)
    a = p.parse_args(argv)
    cfg = TinyConfig(
        rows=a.rows,
        epochs=a.epochs,
        workers=a.workers,
        lr=a.lr,
        seed=a.seed,
        step_delay=a.step_delay,
        log_freq=a.log_freq,
        checkpoint_freq=a.checkpoint_freq,
        hang_at_step=a.debug_hang_at_step,
        debug_rank=a.debug_rank,
        debug_control=a.debug_control,
    )
    return a.run_dir, cfg, a


def main(argv: list[str] | None = None) -> int:
    run_dir, cfg, a = parse_args(argv)
    run_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if a.no_telemetry:  # exactly what a bare user script does: no handler anywhere
        build_trainer(run_dir, cfg).run_training()
        return 0

    from dataclasses import asdict

    from eagle3_tui.telemetry import attach
    from eagle3_tui.train.common import closing_line, setup_log, telemetry_kwargs

    log = setup_log(run_dir, a.log)
    telemetry = attach(
        run_dir,
        checkpoint_dir=run_dir / "checkpoints",
        epochs=cfg.epochs,
        resume_command=list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]),
        log_file=log.log_file,
        exclude_pids=[log.tee_pid] if log.tee_pid else [],
        **telemetry_kwargs(a),
    )
    try:
        trainer = build_trainer(run_dir, cfg)
        telemetry.watch_trainer(trainer)
        # what the library's CLI does with its configuration (log_run_config)
        logging.getLogger("speculators.metrics").info(
            {"launcher": "eagle3_tui.train.tiny", **asdict(cfg)}, extra={"hparams": True}
        )
        trainer.run_training()
    except BaseException as e:
        telemetry.finish("crash", error=f"{type(e).__name__}: {e}"[:2000])
        telemetry.close()
        raise
    if a.one_liner:  # attach(...); trainer.run_training(); telemetry.finish()
        telemetry.finish()
        telemetry.close()
        return 0
    expected = cfg.epochs * len(trainer.train_loader)
    # speculators returns normally after an interrupt (SIGTERM/SIGINT): it saved interrupted/
    done = trainer.global_step >= expected and not telemetry.interrupted
    telemetry.finish("finish" if done else "interrupt", step=trainer.global_step)
    telemetry.close()
    if _rank() == 0:
        print(closing_line(telemetry), file=sys.stderr, flush=True)
    from speculators.train.distributed import maybe_destroy_distributed

    maybe_destroy_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
