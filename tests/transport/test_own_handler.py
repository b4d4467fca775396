"""The user's own JSON handler gives one verdict everywhere (issue 26): a speculators
training whose script adds a ``logging.Handler`` of its own to ``speculators.metrics``,
writing ``json.dumps`` of each metric dict to ``metrics.jsonl`` in its working
directory, as a user would, launched detached (``nohup … > train.log 2>&1``). Its
metrics are read, it is never called "no handler" or ``SILENT``; ``runs`` says "own
JSON", not "telemetry yes"; after its complete finish ``summary WORKDIR`` says
``finished`` (exit 0), not ``STALLED``. The training is the real tiny speculators
Trainer (``train/tiny.py``)."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.conftest import read_jsonl, wait_until
from tests.transport.test_post_mortem import EAGLE3_TUI, cli, ending, launch

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    # my training script: the tiny EAGLE-3 draft, its metrics by my own JSON handler
    import json
    import logging
    import sys
    import time

    import speculators  # noqa: F401
    from eagle3_tui.train.tiny import build_trainer, parse_args


    class JsonHandler(logging.Handler):
        def __init__(self, path):
            super().__init__()
            self.out = open(path, "a")

        def emit(self, record):
            line = {"t": time.time(), "logger": record.name, "level": record.levelname,
                    "msg": record.msg}
            self.out.write(json.dumps(line) + "\\n")
            self.out.flush()


    if __name__ == "__main__":
        run_dir, cfg, _ = parse_args(sys.argv[1:])
        metrics = logging.getLogger("speculators.metrics")
        metrics.setLevel(logging.INFO)
        metrics.addHandler(JsonHandler("metrics.jsonl"))
        build_trainer(run_dir, cfg).run_training()
    """
)


def test_own_json_handler_is_read_and_its_finish_is_finished(tmp_path: Path) -> None:
    work = tmp_path / "work"
    metrics = work / "metrics.jsonl"
    args = ["--run-dir", "out", "--no-telemetry", "--log", "none"]
    args += ["--rows", "20", "--epochs", "2", "--step-delay", "0.3"]
    with ending(launch(work, SCRIPT, *args)) as proc:
        wait_until(
            lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 2,
            240,
            lambda: f"its handler's first lines; log:\n{(work / 'train.log').read_text()[-1500:]}",
            0.2,
        )
        # alive: its metrics are read, it has a handler
        rc, out, err = cli("summary", "--pid", str(proc.pid))
        assert rc == 0 and out["health"] in ("running", "waiting"), (out["reason"], err)
        assert "no handler" not in out["reason"] + err
        assert out["observed"]["handler"] == "json"
        assert out["observed"]["metrics_file"] == str(metrics)
        assert isinstance(out["global_step"], int) and isinstance(out["loss"], float)
        _, runs, _ = cli("runs")
        [row] = [r for r in runs["live"] if r["pid"] == proc.pid]
        assert (row["telemetry"], row["handler"]) == (False, "json")
        assert row["health"] in ("running", "waiting"), row["health_reason"]
        text = subprocess.run(
            [EAGLE3_TUI, "runs"], capture_output=True, text=True, timeout=60, check=False
        ).stdout
        [line] = [ln for ln in text.splitlines() if f" {proc.pid} " in ln]
        assert "own JSON" in line and " yes " not in line, line
        assert proc.wait(240) == 0, (work / "train.log").read_text()[-2000:]
    last = [r["msg"] for r in read_jsonl(metrics) if "train" in r["msg"]][-1]
    # after a complete finish: finished, with its last metrics
    rc, out, err = cli("summary", str(work))
    assert (rc, out["health"]) == (0, "finished"), (out["reason"], err)
    assert out["global_step"] == last["global_step"] == 15  # 2 epochs of 8 steps
    assert out["loss"] == pytest.approx(last["train"]["loss"])
    _, runs, _ = cli("runs")
    [ended] = [r for r in runs["ended"] if r["pid"] == proc.pid]
    assert (ended["telemetry"], ended["handler"]) == (False, "json")
