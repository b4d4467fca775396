"""A training whose metrics go to speculators' own TensorBoard backend (issue 27): the
script configures its metric logging exactly as the library's CLI does for
``--logger tensorboard`` (``setup_metric_logger("tensorboard", RUN_NAME, LOG_DIR)``)
and is launched detached (``nohup … > train.log 2>&1``), with no eagle3-tui
handler. Its event files are read on the host: it is never called ``SILENT`` "no
handler", its loss and accuracies are the values TensorBoard's own loader reads from
the same files, its source is named. The training is the real tiny speculators
Trainer (``train/tiny.py``)."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tests.transport.test_post_mortem import EAGLE3_TUI, cli, ending, launch

pytestmark = pytest.mark.slow

tb_loader = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

SCRIPT = textwrap.dedent(
    """
    # my training script: the tiny EAGLE-3 draft, metrics to TensorBoard as the CLI does
    import sys

    import speculators  # noqa: F401
    from speculators.train.logger import setup_metric_logger
    from eagle3_tui.train.tiny import build_trainer, parse_args

    if __name__ == "__main__":
        run_dir, cfg, _ = parse_args(sys.argv[1:])
        setup_metric_logger("tensorboard", "tiny_run", "logs")
        build_trainer(run_dir, cfg).run_training()
    """
)


def their_losses(log_dir: Path) -> dict[int, float]:
    if not log_dir.is_dir():
        return {}
    acc = tb_loader.EventAccumulator(str(log_dir))
    acc.Reload()
    if "train/loss" not in acc.Tags()["scalars"]:
        return {}
    return {e.step: e.value for e in acc.Scalars("train/loss")}


def test_tensorboard_backend_is_read_and_never_called_silent(tmp_path: Path) -> None:
    work = tmp_path / "work"
    logs = work / "logs" / "tiny_run"
    args = ["--run-dir", "out", "--no-telemetry", "--log", "none"]
    args += ["--rows", "20", "--epochs", "2", "--step-delay", "0.4"]
    with ending(launch(work, SCRIPT, *args)) as proc:
        wait_until(
            lambda: len(their_losses(logs)) >= 3,
            240,
            lambda: f"three steps in TensorBoard; log:\n{(work / 'train.log').read_text()[-1500:]}",
            0.3,
        )
        # alive: its metrics come from the event files; it has a handler
        rc, out, err = cli("summary", "--pid", str(proc.pid))
        assert rc == 0 and out["health"] in ("running", "waiting"), (out["reason"], err)
        assert "no handler" not in out["reason"] + err
        observed: dict[str, Any] = out["observed"]
        assert observed["handler"] == "tensorboard"
        [events] = list(logs.glob("events.out.tfevents.*"))
        assert observed["metrics_file"] == str(events)
        theirs = their_losses(logs)
        step = out["global_step"]
        assert isinstance(step, int) and step in theirs
        assert out["loss"] == pytest.approx(theirs[step], rel=1e-6)
        text = subprocess.run(
            [EAGLE3_TUI, "summary", "--pid", str(proc.pid)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout
        assert "TensorBoard" in text, text
        _, runs, _ = cli("runs")
        [row] = [r for r in runs["live"] if r["pid"] == proc.pid]
        assert (row["telemetry"], row["handler"]) == (False, "tensorboard")
        assert row["health"] in ("running", "waiting"), row["health_reason"]
        assert proc.wait(240) == 0, (work / "train.log").read_text()[-2000:]
    theirs = their_losses(logs)
    assert max(theirs) == 15  # 2 epochs of 8 steps, every one in its event file
