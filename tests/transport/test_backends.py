"""A training whose metrics go to speculators' own TensorBoard backend (issue 27): the
script configures its metric logging exactly as the library's CLI does for
``--logger tensorboard`` (``setup_metric_logger("tensorboard", RUN_NAME, LOG_DIR)``)
and is launched detached (``nohup … > train.log 2>&1``), with no eagle3-tui
handler. Its event files are read on the host: it is never called ``SILENT`` "no
handler", its loss and accuracies are the values TensorBoard's own loader reads from
the same files, its source is named. The training is the real tiny speculators
Trainer (``train/tiny.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


def test_tensorboard_backend_is_read_and_never_called_silent(
    tmp_path: Path, tiny_run: Path
) -> None:
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
    # compare: this run (its event files, once it ended) against one with telemetry
    done = subprocess.run(
        [EAGLE3_TUI, "compare", str(work), str(tiny_run), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["a"]["last_step"] == 16 and result["b"]["last_step"] == 72  # 1-based, as shown
    assert result["a"]["last_global_step"] == 15 and result["b"]["last_global_step"] == 71
    assert result["at_step"] == {"a": 16, "b": 16}
    rows = {r["metric"]: r for r in result["rows"]}
    assert {"loss", "full_acc_0", "cond_acc_2", "τ"} <= set(rows)


# ---- the library's own CLI entry point ---------------------------------------------

CLI_SCRIPT = textwrap.dedent(
    """
    # the library's own CLI entry point (speculators.train.cli.main), on a CPU
    import importlib
    import sys

    from speculators.train.config import TrainConfig

    from eagle3_tui.train.cpu_shims import trainer_class

    cli = importlib.import_module("speculators.train.cli")
    cli.Trainer = trainer_class()  # the CPU shims; on a GPU host nothing is replaced
    cli.main(TrainConfig.resolve(sys.argv[1:]))
    """
)


def cli_args(work: Path, epochs: int, *extra: str, flags: bool = True) -> list[str]:
    """The library CLI's arguments for the tiny verifier; ``flags`` False: without
    ``--save-path`` and ``--epochs`` (a ``--config`` file in ``extra`` has them)."""
    from eagle3_tui.train.tiny import TinyConfig, make_tiny_data

    verifier, data = make_tiny_data(work / "tiny", TinyConfig(rows=20))
    where = ("--save-path", "out/checkpoints", "--epochs", str(epochs)) if flags else ()
    return [
        *("--speculator-type", "eagle3", "--verifier-name-or-path", str(verifier)),
        *("--data-path", str(data), *where),
        *("--draft-attn-impl", "sdpa", "--loss-implementation", "eager"),
        *("--hidden-states-dtype", "float32", "--total-seq-len", "128", "--num-workers", "0"),
        *("--draft-vocab-size", "64", "--target-layer-ids", "0", "1", "2", "--ttt-steps", "3"),
        *("--on-missing", "raise", "--scheduler-type", "none", "--mask-token-id", "0"),
        *extra,
    ]


def printed_losses(log: Path) -> dict[int, float]:
    """The loss per global step as the CLI printed it (three digits)."""
    from eagle3_tui.agent.logparse import LineParser

    parser = LineParser()
    out: dict[int, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        for kind, payload, _ in parser.parse(line):
            if kind == "train":
                out[payload["step"]] = payload["train"]["loss"]
    return out


THEIR_STORE = textwrap.dedent(
    """
    import json, sys
    if sys.argv[1] == "mlflow":
        from mlflow.tracking import MlflowClient
        client = MlflowClient(sys.argv[2])
        [exp] = [e for e in client.search_experiments() if e.name == "speculators"]
        [run] = client.search_runs([exp.experiment_id])
        got = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "train/loss")}
    else:
        from trackio.sqlite_storage import SQLiteStorage
        got = {}
        for run in SQLiteStorage.get_runs("speculators"):
            for r in SQLiteStorage.get_logs("speculators", run):
                if "train/loss" in r:
                    got[r["step"]] = r["train/loss"]
    print(json.dumps(got))
    """
)


def their_store_losses(work: Path, logger: str, env: dict[str, str]) -> dict[int, float]:
    """The loss per step as MLflow's or trackio's own reader gives it."""
    (work / "their_reader.py").write_text(THEIR_STORE)
    done = subprocess.run(
        [sys.executable, "their_reader.py", logger, f"sqlite:///{work / 'mlflow.db'}"],
        cwd=work,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        return {}
    return {int(k): v for k, v in json.loads(done.stdout.splitlines()[-1]).items()}


def test_the_librarys_cli_is_attached_stopped_at_a_step_and_resumed_with_telemetry(
    tmp_path: Path,
) -> None:
    """The library's CLI with its default logger (``--logger ""``: its root logger prints
    every metric dict to its log, rich, three digits): read there, never "no handler";
    then as a user's own script: ``kill WORKDIR`` attaches telemetry first and stops it
    at a step boundary (its save the numbered checkpoint), ``resume`` relaunches the
    same command with telemetry, which continues at the next step. (Its backends:
    test_backends_ssh.py; under torchrun: test_backends_torchrun.py.)"""
    from eagle3_tui.agent import processes
    from tests.conftest import read_jsonl

    work = tmp_path / "work"
    work.mkdir()
    args = cli_args(work, 40)
    log = work / "train.log"
    with ending(launch(work, CLI_SCRIPT, *args)) as proc:
        wait_until(
            lambda: len(printed_losses(log)) >= 3,
            240,
            lambda: f"three steps printed; log:\n{log.read_text(errors='replace')[-1500:]}",
            0.3,
        )
        rc, out, err = cli("summary", "--pid", str(proc.pid))
        assert rc == 0 and out["health"] in ("running", "waiting"), (out["reason"], err)
        assert "no handler" not in out["reason"] + err
        assert out["observed"]["handler"] == "printed"
        assert not (work / "logs").exists()  # no backend writes
        step, printed = out["global_step"], printed_losses(log)
        assert step in printed and out["loss"] == pytest.approx(printed[step], abs=5e-4)
        _, runs, _ = cli("runs")
        [row] = [r for r in runs["live"] if r["pid"] == proc.pid]
        assert (row["telemetry"], row["handler"]) == (False, "printed")
        assert row["epochs"] == 40 and row["checkpoint_dir"] == str(work / "out" / "checkpoints")
        rc, report, err = cli("kill", str(work))
        assert rc == 0, (report, err)
        assert report["status"] == "stopped" and report["attached_first"]["status"] == "attached"
        stop = report["stop"]
        assert stop["how"] == "step_boundary" and stop["redo"]["steps"] == 0, stop
        assert proc.wait(60) == 0  # speculators' graceful exit
        run_dir = Path(report["run_dir"])
        saved = Path(stop["checkpoint"]["path"])
        state = json.loads((saved / "training_state.json").read_text())
        assert state["global_step"] == stop["global_step"]

    rc, resumed, err = cli("resume", str(run_dir))
    assert rc == 0 and resumed["status"] == "started" and resumed["confirmed"], (resumed, err)
    pid = int(resumed["pid"])
    try:

        def after_resume() -> list[dict[str, Any]]:
            records = read_jsonl(run_dir / "metrics.jsonl")
            marks = [
                i for i, r in enumerate(records)
                if r["kind"] == "lifecycle" and r["event"] == "resume" and r["pid"] == pid
            ]  # fmt: skip
            return [r for r in records[marks[0] :] if r["kind"] == "train"] if marks else []

        wait_until(
            lambda: len(after_resume()) >= 2,
            240,
            lambda: f"two steps after the resume:\n{log.read_text(errors='replace')[-2000:]}",
            0.5,
        )
        g = stop["global_step"]
        assert [r["step"] for r in after_resume()[:2]] == [g, g + 1]
        rc, again, err = cli("kill", str(run_dir))
        assert rc == 0 and again["status"] == "stopped", (again, err)
    finally:
        if processes.proc_stat(pid) is not None:
            os.killpg(pid, 9)
