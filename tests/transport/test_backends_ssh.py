"""The library's own CLI, launched headless over SSH with one of its metric backends
(``--logger tensorboard|mlflow|trackio``) and no eagle3-tui telemetry, on a host of its
own (sshd in a PID namespace): ``summary HOST`` reads its per-step loss and
accuracies from the backend's files on the host, the values the backend's own reader
gives, with the source named; the monitor over the same SSH shows them, its header
naming the source, never SILENT."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import need, need_training, wait_until
from tests.transport.conftest import cli
from tests.transport.sshd import ALIAS, Sshd, have_pid_namespaces, have_sshd
from tests.transport.test_backends import (
    CLI_SCRIPT,
    cli_args,
    printed_losses,
    their_losses,
    their_store_losses,
)

pytestmark = pytest.mark.slow

SOURCE = {
    "tensorboard": "metrics from TensorBoard event files",
    "mlflow": "metrics from MLflow's store",
    "trackio": "metrics from trackio's database",
    "wandb": "metrics from W&B's run file",
}


COLUMN = {"tensorboard": "TensorBoard", "mlflow": "MLflow", "trackio": "trackio", "wandb": "W&B"}
"""The runs listing's word for what writes the metrics."""


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    need(have_sshd(), "OpenSSH sshd is not installed (apt-get install openssh-server)")
    need(have_pid_namespaces(), "unshare --pid --mount-proc is not permitted here")
    need_training()
    server = Sshd(tmp_path_factory.mktemp("backends-host"), private=True)
    server.start()
    yield server
    server.stop()  # ends every process of the host (its PID namespace)


@pytest.mark.timeout(600)  # a training, SSH, the backend's own reader, the monitor
@pytest.mark.parametrize("logger", ["tensorboard", "mlflow", "trackio", "wandb"])
def test_a_backends_run_over_ssh_is_read_from_its_files(
    host: Sshd, tmp_path: Path, logger: str
) -> None:
    if logger != "tensorboard":
        pytest.importorskip(logger)
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(CLI_SCRIPT)
    if logger == "tensorboard":  # where it writes, from its --config file (flag over file)
        (work / "run.yaml").write_text(
            "train:\n  trainer:\n    epochs: 40\n    save_path: out/checkpoints  # here\n"
            "  logging:\n    logger: tensorboard\n    log_dir: 'logs'\n    run_name: ssh_run\n"
        )
        args = cli_args(work, 40, "--config", "run.yaml", flags=False)
    else:
        args = cli_args(work, 40, "--logger", logger, "--log-dir", "logs", "--run-name", "ssh_run")
    env = {"HF_HOME": str(tmp_path / "hf"), "MLFLOW_TRACKING_URI": ""}
    env |= {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(work / "logs")}
    command = shlex.join([sys.executable, "train.py", *args])
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    nohup = f"{assigns} nohup {command} > train.log 2>&1 < /dev/null &"
    line = f"cd {shlex.quote(str(work))} || exit 1; {nohup}"
    assert host.ssh(line).returncode == 0

    def theirs() -> dict[int, float]:
        if logger == "tensorboard":
            return their_losses(work / "logs" / "ssh_run")
        if logger == "wandb":
            from tests.agent.test_wandbfile import their_history

            files = list((work / "logs").glob("wandb/offline-run-*/run-*.wandb"))
            rows = their_history(files[0], {**os.environ, **env}) if files else []
            return {s: m["train/loss"] for m, s, _ in rows if "train/loss" in m and s is not None}
        return their_store_losses(work, logger, env)

    try:
        log = work / "train.log"  # its root logger prints each dict too: a cheap wait
        wait_until(
            lambda: len(printed_losses(log)) >= 4,
            300,
            lambda: f"four steps printed:\n{log.read_text(errors='replace')[-1500:]}",
            1.0,
        )
        proc = cli("summary", *host.args(), ALIAS, "--json")
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["observed"]["handler"] == logger, out["observed"]
        assert out["health"] in ("running", "waiting"), out["reason"]
        got = theirs()
        step = out["global_step"]
        assert isinstance(step, int) and step in got
        assert out["loss"] == pytest.approx(got[step], rel=1e-6)
        proc = cli("runs", *host.args(), ALIAS)
        [line] = [line for line in proc.stdout.splitlines() if str(work) in line]
        assert COLUMN[logger] in line and "metrics by speculators'" in line, proc.stdout
        proc = cli("runs", *host.args(), ALIAS, "--json")
        [row] = [r for r in json.loads(proc.stdout)["live"] if r.get("cwd") == str(work)]
        assert row["epochs"] == 40 and row["checkpoint_dir"] == str(work / "out" / "checkpoints")
        assert row["log_dir"] == str(work / "logs"), row
        if logger == "mlflow":  # the monitor, once: its header names the source
            monitor_shows(host, tmp_path, logger)
    finally:
        host.ssh(f"pkill -KILL -f {shlex.quote(str(work / 'tiny'))}")


def monitor_shows(host: Sshd, tmp_path: Path, logger: str) -> None:
    need(shutil.which("tmux") is not None, "tmux is not installed (apt-get install tmux)")
    from tests.app.test_tmux import Tmux

    tmux = Tmux(tmp_path / "tmux.sock")
    try:
        monitor = [sys.executable, "-m", "eagle3_tui", *host.args(), ALIAS]
        command = "env -u COLUMNS -u LINES TZ=UTC TERM=xterm-256color " + shlex.join(monitor)
        tmux.run("new-session", "-d", "-x", "160", "-y", "45", command)
        shown = tmux.wait(
            lambda s: SOURCE[logger] in s and "full acc" in s and "per TTT step" in s,
            120,
            f"{SOURCE[logger]} and its accuracies drawn",
        )
        flat = " ".join(shown.split())
        assert "SILENT" not in shown and "no handler" not in flat, shown
        assert "not available" not in shown, shown  # loss and acceptance both drawn
        ttt = re.search(r"^│ 0 +(\d\.\d+) +(\d\.\d+) +(\d\.\d+) │", shown, re.M)
        assert ttt is not None, shown  # the per-TTT-step table: loss, full, cond of k=0
        tmux.keys("q")
        tmux.wait(lambda s: SOURCE[logger] not in s, 30, "the app to quit")
    finally:
        tmux.run("kill-server")
