"""Stalled means stalled, without telemetry too (issue 25): a handler-less training that
hangs with 2 dataloader workers is ``STALLED`` within the bound in ``summary``, ``runs``
and the monitor, never ``SILENT`` "while its workers read data files" at 0 B/s; and
where it is stuck is read from outside (py-spy) into the banner and ``summary --json``.

A user's own script (it imports speculators: that is how discovery knows it), launched
as in the story (``nohup … > train.log 2>&1``), hangs for good at training step 6."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.agent.stuck import PY_SPY_ENV
from eagle3_tui.model.verdict import MIN_QUIET_S
from eagle3_tui.telemetry import procs
from tests.app.test_tmux import Tmux
from tests.conftest import need, need_training, wait_until

pytestmark = pytest.mark.slow

HANG_AT = 6
SCRIPT = textwrap.dedent(
    """
    # my training script: the tiny EAGLE-3 draft, no monitoring of any kind
    import sys

    import speculators  # noqa: F401
    from eagle3_tui.train.tiny import main

    if __name__ == "__main__":  # (its dataloader workers import this file again)
        sys.exit(main(sys.argv[1:]))
    """
)
EAGLE3_TUI = str(Path(sys.executable).parent / "eagle3-tui")
BIN = str(Path(sys.executable).parent)
"""Where the suite's py-spy is installed (with the package's test extras)."""


def _env(with_py_spy: bool) -> dict[str, str]:
    """The CLI's environment: the suite's py-spy on PATH, or named as missing (the agent
    also looks beside its own interpreter, which is the suite's)."""
    env = dict(os.environ, PATH=os.pathsep.join([BIN, os.environ.get("PATH", "/usr/bin:/bin")]))
    if not with_py_spy:
        env[PY_SPY_ENV] = str(Path(BIN) / "no-py-spy-here")
    return env


@pytest.fixture
def hung(tmp_path: Path) -> Iterator[tuple[int, float, Path]]:
    """The training, hung: its PID, when the hang began (its log says so), its work dir."""
    need_training()
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(SCRIPT)
    args = ["--run-dir", str(work / "run"), "--no-telemetry", "--log", "none"]
    args += ["--workers", "2", "--epochs", "50", "--debug-hang-at-step", str(HANG_AT)]
    log = work / "train.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "train.py", *args],
            cwd=work,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(
            lambda: "now blocks forever" in log.read_text(errors="replace"),
            240,
            lambda: f"the hang; log:\n{log.read_text(errors='replace')[-2000:]}",
            0.1,
        )
        yield proc.pid, time.time(), work
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def _summary(pid: int, env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run(
        [EAGLE3_TUI, "summary", "--pid", str(pid), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert proc.stdout, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return proc.returncode, out


def _runs_row(pid: int, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run(
        [EAGLE3_TUI, "runs", "--json"], capture_output=True, text=True, timeout=60, env=env
    )
    rows = [r for r in json.loads(proc.stdout)["live"] if r["pid"] == pid]
    assert rows, proc.stdout
    row: dict[str, Any] = rows[0]
    return row


def test_a_hang_with_workers_is_stalled_everywhere_with_its_stack(
    hung: tuple[int, float, Path], tmp_path: Path
) -> None:
    pid, began, _work = hung
    workers = [
        p for p in procs.descendants(pid) if (st := procs.stat(p)) and st.comm == "pt_data_worker"
    ]
    assert len(workers) == 2, workers
    need(shutil.which("py-spy", path=BIN) is not None, "py-spy (pip install '.[test]')")
    bound = MIN_QUIET_S  # max(30 s, 5 x step time): a tiny step takes well under 6 s
    verdicts: list[tuple[float, str, str]] = []
    without = _env(with_py_spy=False)  # first as on a host without py-spy
    while True:
        rc, out = _summary(pid, without)
        verdicts.append((time.time() - began, out["health"], out["reason"]))
        if out["health"] == "stalled":
            break
        assert out["health"] in ("running", "waiting", "silent"), verdicts
        assert time.time() - began < bound + 30, verdicts
    took = verdicts[-1][0]
    assert rc == 4 and took <= bound + 10, verdicts  # + one 2.5 s look, the polling
    reason = out["reason"]
    assert "read data" not in reason and "workers read" not in reason, reason
    assert out["stuck"] is None and "pip install py-spy" in (out.get("stuck_unavailable") or "")
    assert "pip install py-spy" in reason, reason
    # with py-spy: where it is stuck, the hang's own frame, read from outside
    env = _env(with_py_spy=True)
    rc, out = _summary(pid, env)
    assert rc == 4 and out["stuck"] is not None, out
    assert "hook" in out["stuck"]["where"] or "wait" in out["stuck"]["where"], out["stuck"]
    assert "stuck in" in out["reason"], out["reason"]
    # runs: the same verdict for the same process
    row = _runs_row(pid, env)
    assert row["health"] == "stalled", row
    # the monitor: the banner says stalled, and where
    tmux = Tmux(tmp_path / "tmux.sock")
    tmux.run(
        *("new-session", "-d", "-x", "120", "-y", "40"),  # the README's picture's size
        *("env", "-u", "COLUMNS", "-u", "LINES", f"PATH={env['PATH']}"),
        EAGLE3_TUI,
        "--pid",
        str(pid),
    )
    try:
        screen = tmux.wait(lambda s: "STALLED" in s and "stuck in" in s, 60, "STALLED, stuck in")
        assert "SILENT" not in screen
    finally:
        tmux.run("kill-server")
