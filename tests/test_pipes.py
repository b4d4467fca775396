"""Every command in a pipe whose reader goes away (``| head -1``): no traceback, the
command's own exit status, and the work done all the same."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import need_training

pytestmark = pytest.mark.slow


def into_closed_pipe(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run ``eagle3-tui ARGS`` with stdout a pipe whose reader is already gone: every
    write fails (EPIPE), as after ``head -1`` has read its line and exited."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "eagle3_tui", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=env,
        )
    finally:
        os.close(write_end)
    _, err = proc.communicate(timeout=180)
    return proc.returncode, err.decode(errors="replace")


@pytest.fixture
def env(tmp_path: Path, tiny_run: Path) -> dict[str, str]:
    """An index of runs with the finished tiny run in it (not the user's own index)."""
    need_training()
    state = tmp_path / "state" / "eagle3-tui"
    state.mkdir(parents=True)
    manifest = json.loads((tiny_run / "run.json").read_text())
    entry = {k: manifest[k] for k in ("run_id", "run_dir", "host", "pid", "started_at")}
    (state / "runs.jsonl").write_text(json.dumps(entry) + "\n")
    return dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"), PYTHONUNBUFFERED="1")


def test_every_command_into_a_closed_pipe(
    env: dict[str, str], tiny_run: Path, tmp_path: Path
) -> None:
    no_checkpoint = tmp_path / "stopped"  # a stopped run with nothing to resume from
    no_checkpoint.mkdir()
    manifest = json.loads((tiny_run / "run.json").read_text())
    manifest |= {"run_dir": str(no_checkpoint), "checkpoint_dir": str(no_checkpoint / "ckpt")}
    (no_checkpoint / "run.json").write_text(json.dumps(manifest))
    shutil.copy(tiny_run / "metrics.jsonl", no_checkpoint / "metrics.jsonl")
    run = str(tiny_run)
    expected = {
        ("summary", run): 0,  # finished
        ("summary", run, "--json"): 0,
        ("compare", run, str(no_checkpoint)): 0,  # a run with itself is refused: its copy
        ("runs",): 0,
        ("runs", "--json"): 0,
        ("kill", run): 0,  # nothing of the run remains
        ("resume", str(no_checkpoint)): 9,  # refused: no complete checkpoint
        ("--help",): 0,
        ("summary", "--help"): 0,
        ("summary", str(tmp_path / "missing")): 2,
    }
    for args, status in expected.items():
        rc, err = into_closed_pipe(list(args), env)
        assert "Traceback" not in err and "BrokenPipe" not in err, (args, err)
        assert rc == status, (args, rc, err)


def test_summary_piped_into_head(env: dict[str, str], tiny_run: Path) -> None:
    """As a user types it, with the shell's pipefail telling the command's status."""
    bash = shutil.which("bash")
    assert bash is not None
    command = f"set -o pipefail; {sys.executable} -m eagle3_tui summary {tiny_run} | head -1"
    proc = subprocess.run(
        [bash, "-c", command], capture_output=True, text=True, env=env, timeout=180, check=False
    )
    assert proc.stderr == "" and proc.returncode == 0
    assert proc.stdout.startswith("health   finished") and proc.stdout.count("\n") == 1
