"""Shared fixtures: the real tiny training, run once per session.

Tests that need a real part (speculators, sshd, tmux) skip with a reason when it
is missing here, and fail instead when EAGLE3_TUI_REQUIRE_ALL=1 (as in .ci/run),
so CI can never pass by skipping them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REQUIRE_ALL = os.environ.get("EAGLE3_TUI_REQUIRE_ALL") == "1"


@pytest.fixture(scope="session", autouse=True)
def _private_state_dirs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The suite never writes into the user's own index of runs or export folder: its
    trainings register their runs in a private ``XDG_STATE_HOME`` and exports go to a
    private ``XDG_DATA_HOME``, inherited by every process the tests start."""
    root = tmp_path_factory.mktemp("xdg")
    names = {"XDG_STATE_HOME": root / "state", "XDG_DATA_HOME": root / "data"}
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update({name: str(path) for name, path in names.items()})
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def need(condition: bool, reason: str) -> None:
    """Skip (or, under EAGLE3_TUI_REQUIRE_ALL=1, fail) when a real part is missing."""
    if condition:
        return
    if REQUIRE_ALL:
        pytest.fail(f"required for this run: {reason}")
    pytest.skip(reason)


def need_training() -> None:
    have = all(importlib.util.find_spec(m) is not None for m in ("torch", "speculators"))
    need(have, "torch and speculators are not installed (scripts/install.sh)")


def run_tiny(run_dir: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run the real tiny training to completion; its output is returned."""
    need_training()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", "eagle3_tui.train.tiny", "--run-dir", str(run_dir), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file; a last line without its newline is one still
    being written (a live writer's torn line): left for the next read."""
    text = path.read_text()
    lines = text.split("\n")
    torn = lines.pop()  # "" when the file ends with a newline
    out = [json.loads(line) for line in lines if line.strip()]
    if torn.strip():
        with contextlib.suppress(ValueError):
            out.append(json.loads(torn))
    return out


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny training (3 epochs) with telemetry: its run directory."""
    run_dir = tmp_path_factory.mktemp("tiny") / "run"
    proc = run_tiny(run_dir, "--epochs", "3")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run_dir


async def until(pilot: Any, predicate: Any, timeout: float = 10.0, what: str = "condition") -> None:
    """Let the app run until ``predicate()`` holds (no fixed sleeps in UI tests)."""
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await pilot.pause(0.02)
