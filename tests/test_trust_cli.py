"""``summary``'s exit statuses for what issue 13 found wrong: a file of garbage (10,
documented), a run that diverged and ran to its end (6)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from eagle3_tui.cli import main
from tests.records import Lines


def test_a_file_of_random_bytes_exits_unreadable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "metrics.jsonl").write_bytes(os.urandom(5 * 1024 * 1024))
    assert main(["summary", str(tmp_path)]) == 10
    out = capsys.readouterr().out
    assert out.startswith("health   unreadable: No valid record in ")


def test_one_50_mb_line_is_one_malformed_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "metrics.jsonl").write_bytes(b'{"kind": "' + b"z" * (50 * 2**20) + b'"}\n')
    assert main(["summary", str(tmp_path), "--json"]) == 10
    out = json.loads(capsys.readouterr().out)
    assert out["health"] == "unreadable" and out["malformed_lines"] == 1


def test_nan_then_the_end_exits_diverged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = Lines()
    data = b"".join(lines.train(s, 2.0) for s in range(60))
    data += b"".join(lines.train(s, float("nan")) for s in range(60, 80))
    data += lines.event("finish", step=80)
    (tmp_path / "metrics.jsonl").write_bytes(data)
    assert main(["summary", str(tmp_path), "--json"]) == 6
    out = json.loads(capsys.readouterr().out)
    assert out["health"] == "diverged" and out["step"] == 80
    assert "finished after 80 steps" in out["reason"] and "since step 61" in out["reason"]
