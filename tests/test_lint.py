"""ruff and mypy (strict) over the code, as part of the test suite that CI runs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.conftest import mypy_result, need

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_check_and_format() -> None:
    need(shutil.which("ruff") is not None, "ruff is not installed (pip install '.[test]')")
    for args in (["check"], ["format", "--check"]):
        proc = subprocess.run(
            ["ruff", *args, "eagle3_tui", "train", "tests", "benchmarks"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_strict() -> None:
    status, output = mypy_result(timeout=600)  # started as the suite began (conftest.py)
    assert status == 0, output[-7000:]
