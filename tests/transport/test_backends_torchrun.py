"""The library's own CLI under torchrun (2 ranks, gloo on a CPU) with one of its metric
backends and no eagle3-tui telemetry: rank 0 alone writes the backend's files
(speculators' rank-0 filter); the training is one row whose metrics are read from them,
with the values the backend's own reader gives."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.transport.test_backends import (
    CLI_SCRIPT,
    cli_args,
    printed_losses,
    their_losses,
    their_store_losses,
)
from tests.transport.test_post_mortem import cli, ending

pytestmark = pytest.mark.slow


@pytest.mark.timeout(600)
@pytest.mark.parametrize("logger", ["tensorboard", "mlflow"])
def test_the_librarys_cli_under_torchrun_is_read_from_its_backend(
    tmp_path: Path, logger: str
) -> None:
    """``torchrun --nproc-per-node 2 train.py … --logger L``: rank 0 writes the backend's
    files (speculators' rank-0 filter); the training is one row, its metrics read from
    them with the values the backend's own reader gives."""
    if logger == "mlflow":
        pytest.importorskip("mlflow")
    from tests.torchrun import TORCHRUN, free_port

    work = tmp_path / "work"
    work.mkdir()
    extra = ("--logger", logger, "--log-dir", "logs", "--run-name", "cli_run")
    args = cli_args(work, 40, *extra)
    torchrun = [*TORCHRUN, "--nproc-per-node", "2", "--master-port", str(free_port())]
    env = {"HF_HOME": str(tmp_path / "hf"), "MLFLOW_TRACKING_URI": ""}
    logs = work / "logs" / "cli_run"

    def theirs() -> dict[int, float]:
        if logger == "tensorboard":
            return their_losses(logs)
        return their_store_losses(work, logger, env)

    (work / "train.py").write_text(CLI_SCRIPT)
    with (
        open(work / "train.log", "ab") as out,
        ending(
            subprocess.Popen(
                [*torchrun, "train.py", *args],
                cwd=work,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **env},
            )
        ) as launcher,
    ):
        wait_until(
            lambda: len(printed_losses(work / "train.log")) >= 4,  # rank 0 prints them too
            300,
            lambda: f"four steps printed; log:\n{(work / 'train.log').read_text()[-1500:]}",
            1.0,
        )
        _, runs, _ = cli("runs")
        [row] = [r for r in runs["live"] if r.get("cwd") == str(work)]
        assert row["launcher_pid"] == launcher.pid and len(row["ranks"]) == 2
        assert (row["telemetry"], row["handler"]) == (False, logger), row["evidence"]
        rc, out_, err = cli("summary", "--pid", str(row["pid"]))
        assert rc == 0 and "no handler" not in out_["reason"] + err
        assert out_["observed"]["handler"] == logger
        step, mine = out_["global_step"], out_["loss"]
        got = theirs()
        assert isinstance(step, int) and step in got
        assert mine == pytest.approx(got[step], rel=1e-6)
