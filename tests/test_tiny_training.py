"""The real speculators Trainer (tiny, CPU) with telemetry attached: what it writes."""

from __future__ import annotations

import math
from pathlib import Path

from tests.conftest import read_jsonl, run_tiny

TTT = 3


def test_every_step_writes_loss_and_accuracies_in_range(tiny_run: Path) -> None:
    records = read_jsonl(tiny_run / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) >= 30
    for r in train:
        metrics = r["train"]
        assert math.isfinite(metrics["loss"]) and metrics["loss"] > 0
        for k in range(TTT):
            for name in (f"full_acc_{k}", f"cond_acc_{k}"):
                assert 0.0 <= metrics[name] <= 1.0, (name, metrics[name])
        # full_acc_k is a joint probability: it can only shrink with k
        assert metrics["full_acc_0"] >= metrics["full_acc_1"] >= metrics["full_acc_2"]


def test_steps_and_epochs_are_monotonic_and_each_epoch_is_validated(tiny_run: Path) -> None:
    records = read_jsonl(tiny_run / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    steps = [r["step"] for r in train]
    assert steps == list(range(len(steps))), "one record per step, 0-based, no gap"
    epochs = [r["epoch"] for r in train]
    assert epochs == sorted(epochs) and set(epochs) == {0, 1, 2}
    val = [r for r in records if r["kind"] == "val"]
    assert [r["epoch"] for r in val] == [0, 1, 2]
    for r in val:
        assert math.isfinite(r["val"]["loss_epoch"])
        last_train_step_of_epoch = max(t["step"] for t in train if t["epoch"] == r["epoch"])
        assert r["step"] == last_train_step_of_epoch + 1  # speculators logs the step after


def test_envelope_sequence_has_no_gaps_and_run_finishes(tiny_run: Path) -> None:
    records = read_jsonl(tiny_run / "metrics.jsonl")
    by_writer: dict[str, list[int]] = {}
    for r in records:
        assert r["v"] == 1 and isinstance(r["ts"], float) and r["rank"] == 0
        by_writer.setdefault(r["w"], []).append(r["seq"])
    for seqs in by_writer.values():
        assert seqs == list(range(len(seqs)))
    events = [r["event"] for r in records if r["kind"] == "lifecycle"]
    assert events[0] == "start" and events[-1] == "finish"


def test_the_same_trainer_without_telemetry_writes_no_metric_anywhere(tmp_path: Path) -> None:
    """The motivating failure: speculators.metrics has no handler and inherits WARNING."""
    run_dir = tmp_path / "silent"
    proc = run_tiny(run_dir, "--epochs", "1", "--no-telemetry")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the run really trained: its checkpoint exists
    assert (run_dir / "checkpoints" / "0" / "model.safetensors").exists()
    assert not (run_dir / "metrics.jsonl").exists()
    output = proc.stdout + proc.stderr
    for needle in ("full_acc", "cond_acc", "loss_0", "'loss'"):
        assert needle not in output
    # Only the library's checkpoint metadata mentions a metric: the best epoch's
    # validation summary. No per-step value is written anywhere.
    for path in run_dir.rglob("*"):
        if path.is_file() and path.suffix in {".jsonl", ".json", ".log", ".txt", ".yaml"}:
            text = path.read_text(errors="replace")
            if "full_acc_0" in text:
                assert path.name == "val_metrics.json" and '"full_acc_0"' not in text, path


def test_the_companion_indexes_every_training_step_with_its_values(tiny_run: Path) -> None:
    """metrics.cols, kept by the writer as the real Trainer logs: every training step's
    line, at its offset, with its sequence number, step and values (float32)."""
    import json

    import numpy as np

    from eagle3_tui.model.inflate import column as _column  # the client's own unpacking
    from eagle3_tui.telemetry.columns import COLUMNS_FILE, read_blocks

    data = (tiny_run / "metrics.jsonl").read_bytes()
    blocks = read_blocks((tiny_run / COLUMNS_FILE).read_bytes())
    assert blocks, "the writer kept a companion"
    seen = []
    for b in blocks:
        offsets, lengths = b.ints("@off"), b.ints("@len")
        for i, (off, n) in enumerate(zip(offsets, lengths, strict=True)):
            rec = json.loads(data[off : off + n])
            assert rec["kind"] == "train" and rec["seq"] == b.ints("seq")[i]
            assert rec["step"] == b.ints("step")[i]
            kind, packed = b.chunks["train.loss"]
            loss = _column(kind, packed, b.n)[i]
            assert loss == np.float32(rec["train"]["loss"])
            seen.append(off)
    train_offsets = []
    at = 0
    for line in data.splitlines(keepends=True):
        if json.loads(line)["kind"] == "train":
            train_offsets.append(at)
        at += len(line)
    assert seen == train_offsets, "every step, once, in order (the run closed its writer)"
