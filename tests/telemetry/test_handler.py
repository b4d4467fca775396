"""The handler on the speculators loggers: levels, dictConfig, ranks, messages."""

from __future__ import annotations

import logging
import logging.config
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.telemetry import Telemetry, attach
from eagle3_tui.telemetry import manifest as mf
from tests.conftest import need_training, read_jsonl, wait_until

METRICS = logging.getLogger("speculators.metrics")
MESSAGES = logging.getLogger("speculators")


def step_record(step: int, loss: float = 2.0) -> dict[str, Any]:
    return {
        "train": {"loss": loss, "full_acc_0": 0.5, "cond_acc_0": 0.5},
        "profile": {"step_ms": 10.0},
        "epoch": 0,
        "lr": 1e-3,
        "global_step": step,
    }


@pytest.fixture
def clean_logging(tmp_path: Path) -> Iterator[Path]:
    """Loggers as a fresh process has them; the run marker and index private to the test."""
    names = (mf.RUN_ID_ENV, mf.RUN_DIR_ENV, "RANK", "LOCAL_RANK", "XDG_STATE_HOME")
    saved = {name: os.environ.pop(name, None) for name in names}
    os.environ["XDG_STATE_HOME"] = str(tmp_path / "state")

    def reset() -> None:
        for lg in (METRICS, MESSAGES):
            for h in list(lg.handlers):
                lg.removeHandler(h)
            for f in list(lg.filters):
                lg.removeFilter(f)
            lg.setLevel(logging.NOTSET)
            lg.disabled = False
            lg.propagate = True

    reset()
    yield tmp_path / "run"
    reset()
    for name, value in saved.items():
        os.environ.pop(name, None)
        if value is not None:
            os.environ[name] = value


def session(run_dir: Path, **kw: Any) -> Telemetry:
    kw.setdefault("samplers", False)
    return attach(run_dir, **kw)


def kinds(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == kind]


def test_a_handler_alone_is_silent_which_is_why_attach_sets_levels(clean_logging: Path) -> None:
    assert not METRICS.isEnabledFor(logging.INFO)  # NOTSET inherits the root's WARNING
    t = session(clean_logging)
    try:
        assert METRICS.isEnabledFor(logging.INFO) and MESSAGES.isEnabledFor(logging.INFO)
        METRICS.info(step_record(0), extra={"step": 0})
    finally:
        t.close()
    (rec,) = kinds(clean_logging, "train")
    assert rec["step"] == 0 and rec["train"]["loss"] == 2.0  # once, though it propagates


def test_attach_before_setup_metric_logger_survives_its_dictconfig(clean_logging: Path) -> None:
    need_training()
    t = session(clean_logging)
    try:
        from speculators.train.logger import setup_metric_logger

        setup_metric_logger(loggers=[], run_name="t", output_dir=str(clean_logging / "logs"))
        assert t.handler in METRICS.handlers and t.handler in MESSAGES.handlers
        METRICS.info(step_record(7), extra={"step": 7})
        MESSAGES.info("Training epoch 1/1 started")
    finally:
        t.close()
    assert [r["step"] for r in kinds(clean_logging, "train")] == [7]
    logs = [r["msg"] for r in kinds(clean_logging, "log")]
    assert "Training epoch 1/1 started" in logs
    assert any("re-attached" in m and "dictConfig" in m for m in logs)
    assert t.reattached >= 1


def test_attach_after_setup_metric_logger(clean_logging: Path) -> None:
    need_training()
    from speculators.train.logger import setup_metric_logger

    setup_metric_logger(loggers=[], run_name="t", output_dir=str(clean_logging / "logs"))
    t = session(clean_logging)
    try:
        METRICS.info(step_record(3), extra={"step": 3})
        METRICS.info({"lr": 0.1, "model": {"layers": 1}}, extra={"hparams": True})
    finally:
        t.close()
    assert [r["step"] for r in kinds(clean_logging, "train")] == [3]
    assert kinds(clean_logging, "hparams")[0]["hparams"] == {"lr": 0.1, "model": {"layers": 1}}
    assert t.reattached == 0


def test_a_reset_the_hook_cannot_see_is_repaired_within_one_interval(clean_logging: Path) -> None:
    t = session(clean_logging, interval=0.1)
    try:
        original = getattr(logging.config.dictConfig, "__wrapped__", logging.config.dictConfig)
        # a library that kept the original dictConfig and disables every other logger
        original({"version": 1, "disable_existing_loggers": True, "root": {"level": "WARNING"}})
        for lg in (METRICS, MESSAGES):
            lg.handlers.clear()
            lg.setLevel(logging.WARNING)
        assert METRICS.disabled or t.handler not in METRICS.handlers
        wait_until(lambda: t.reattached, 30, "the periodic check to re-attach")
        assert t.reattached == 1
        METRICS.info(step_record(1), extra={"step": 1})
    finally:
        t.close()
    assert [r["step"] for r in kinds(clean_logging, "train")] == [1]
    assert any("periodic check" in r["msg"] for r in kinds(clean_logging, "log"))


def test_other_ranks_write_no_metrics_but_their_warnings(clean_logging: Path) -> None:
    os.environ["RANK"] = "3"
    t = session(clean_logging)
    try:
        assert t.rank == 3 and not t.handler.is_writer_rank
        METRICS.info(step_record(0), extra={"step": 0})
        MESSAGES.info("rank 3 says hello")
        MESSAGES.warning("rank 3 is worried")
    finally:
        t.finish()
        t.close()
    recs = read_jsonl(clean_logging / "metrics.jsonl")
    assert {r["kind"] for r in recs} == {"log"}
    assert [r["msg"] for r in recs] == ["rank 3 is worried"] and recs[0]["rank"] == 3
    assert not (clean_logging / "run.json").exists()


def test_a_bad_value_in_a_metric_dict_never_reaches_the_trainer(clean_logging: Path) -> None:
    class Bad:
        def __repr__(self) -> str:
            raise ValueError("no")

    MESSAGES.propagate = False  # pytest's capture handler on the root would repr() it
    t = session(clean_logging)
    try:
        METRICS.info({"train": {"loss": Bad(), "ok": 1.0}}, extra={"step": 0})
        MESSAGES.info("%d of %d", 1)  # wrong %-args: logging would print a traceback
    finally:
        t.close()
    (rec,) = kinds(clean_logging, "train")
    assert rec["train"] == {"loss": "<unrepresentable Bad>", "ok": 1.0}
    assert t.writer.stats.errors["unserializable"] == 1
    assert any("%d of %d" in r["msg"] for r in kinds(clean_logging, "log"))


def test_progress_line_every_n_steps(
    clean_logging: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t = session(clean_logging, progress_every=2, epochs=3)
    try:
        t.update_manifest(total_steps=6)
        for step in range(4):
            rec = step_record(step)
            rec["train"].update(full_acc_1=0.25, full_acc_2=0.125)
            METRICS.info(rec, extra={"step": step})
        METRICS.info({"val": {"loss_epoch": 1.5, "full_acc_0_epoch": 0.5}, "epoch": 0})
    finally:
        t.close()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[eagle3]")]
    assert lines[0] == "[eagle3] step 2/6 epoch 1/3 loss 2.0000 acc 0.50/0.25/0.12 tau 1.88"
    assert lines[1].startswith("[eagle3] step 4/6 epoch 1/3 loss 2.0000") and "it/s" in lines[1]
    assert lines[2] == "[eagle3] validation epoch 1/3 loss 1.5000 acc 0.50 tau 1.50"
