"""The command line as a user meets it: one-line errors, exit statuses, JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3_tui.cli import main
from tests.records import Lines


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eagle3_tui", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_version_and_help() -> None:
    from eagle3_tui import __version__

    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"eagle3-tui {__version__}"
    proc = run_cli("--help")
    assert proc.returncode == 0 and "summary RUN_DIR" in proc.stdout and "demo" in proc.stdout


@pytest.mark.parametrize(
    ("setup", "message", "status"),
    [
        ("missing", "no such run directory", 2),
        ("empty_dir", "no metrics.jsonl here", 2),
        ("empty_file", "metrics.jsonl is empty", 2),
        ("a_file", "not a directory", 25),  # not what it should be: its own status
    ],
)
def test_summary_of_a_bad_target_is_one_line_and_non_zero(
    tmp_path: Path, setup: str, message: str, status: int
) -> None:
    target = tmp_path / "run"
    if setup == "empty_dir":
        target.mkdir()
    elif setup == "empty_file":
        target.mkdir()
        (target / "metrics.jsonl").write_bytes(b"")
    elif setup == "a_file":
        target.write_text("x")
    proc = run_cli("summary", str(target), "--json")
    assert proc.returncode == status
    assert proc.stdout == ""
    assert (
        proc.stderr.count("\n") == 1 and message in proc.stderr and "Traceback" not in proc.stderr
    )


def test_summary_json_has_the_documented_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = Lines()
    data = b"".join(lines.train(s, 3.0 - s * 0.1, epoch=s // 5) for s in range(10))
    data += b"{torn json\n" + lines.event("finish")
    (tmp_path / "metrics.jsonl").write_bytes(data)
    assert main(["summary", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["health"] == "finished"
    # "step" and "epoch" as the text shows them (1-based); "global_step" is speculators' (0-based)
    assert out["step"] == 10 and out["global_step"] == 9 and out["epoch"] == 2
    assert out["records"] == 11 and out["malformed_lines"] == 1
    assert out["metrics"]["train/loss"] == pytest.approx(2.1)
    assert out["metrics"]["train/cond_acc_2"] == pytest.approx(0.2)
    assert out["metrics"]["train/full_acc_2"] == pytest.approx(0.5 * 0.3 * 0.2)


def test_summary_of_the_real_tiny_run(tiny_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(tiny_run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["health"] == "finished" and out["malformed_lines"] == 0 and out["lost_records"] == 0
    assert 0.0 <= out["metrics"]["train/full_acc_0"] <= 1.0


def test_a_progress_line_said_again_is_printed_once(capsys: pytest.CaptureFixture[str]) -> None:
    """A kill waiting for a step boundary said "asked the trainer to stop at its next step
    boundary ..." at every look: 12-23 times the same line in a log. Once now; a new
    line, or a figure that moved, is printed."""
    from eagle3_tui.cli.common import print_progress
    from eagle3_tui.transport.channel import Event

    asked = Event("progress", {"step": "stop", "phase": "asked", "wait_s": 60.0})
    for _ in range(5):
        print_progress(asked)
    print_progress(Event("progress", {"step": "timeout", "pid": 7, "grace_s": 130}))
    print_progress(asked)
    err = capsys.readouterr().err.splitlines()
    assert [line.split(" ")[0] for line in err] == ["asked", "pid", "asked"], err


def test_runs_given_a_directory_says_it_takes_hosts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``runs /some/dir`` said "cannot resolve host name (and it is not a local directory
    either)" of a local directory."""
    assert main(["runs", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path}: a directory here, and runs takes hosts" in err, err
    assert f"eagle3-tui summary {tmp_path}" in err and "resolve" not in err, err
