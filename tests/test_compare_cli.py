"""`eagle3-tui compare`: a live tiny training against a finished one, headless."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import need_training, wait_until


def train_records(path: Path) -> int:
    try:
        return sum(1 for line in path.read_bytes().splitlines() if b'"kind":"train"' in line)
    except FileNotFoundError:
        return 0


def test_a_live_run_against_a_finished_one(tiny_run: Path, tmp_path: Path) -> None:
    need_training()
    live_dir = tmp_path / "live"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "eagle3_tui.train.tiny",
            "--run-dir",
            str(live_dir),
            "--epochs",
            "2",
            "--lr",
            "0.01",
            "--step-delay",
            "0.2",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:

        def eight_steps() -> bool:
            assert proc.poll() is None, "the live training ended early"
            return train_records(live_dir / "metrics.jsonl") >= 8

        wait_until(eight_steps, 180, "eight training steps", interval=0.2)
        out = subprocess.run(
            [sys.executable, "-m", "eagle3_tui", "compare", str(live_dir), str(tiny_run), "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        assert proc.poll() is None, "the comparison must have been made while the run was live"
        live_step = result["a"]["last_step"]  # 1-based, as summary says it
        assert live_step >= 8 and result["b"]["last_step"] == 72
        assert result["b"]["last_global_step"] == 71  # speculators' counter
        said = subprocess.run(
            [sys.executable, "-m", "eagle3_tui", "summary", str(tiny_run), "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        summary = json.loads(said.stdout)  # one numbering: compare and summary agree
        assert (summary["step"], summary["global_step"]) == (72, 71), said.stdout[:300]
        assert result["at_step"] == {"a": live_step, "b": live_step}  # same step
        metrics = {r["metric"] for r in result["rows"]}
        assert {"loss", "full_acc_0", "cond_acc_2", "τ"} <= metrics
        assert f"at step {live_step} (same step)" in result["verdict"]
        diff = {d["key"]: (d["a"], d["b"]) for d in result["hparam_diff"]}
        assert diff["argv.--lr"] == ("0.01", "–")  # the finished run used the default
        assert diff["argv.--epochs"] == ("2", "3")
        assert [v["epoch"] for v in result["validation"]["b"]] == [1, 2, 3]  # 1-based, as shown
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def test_a_run_with_no_valid_record_is_not_compared(tmp_path: Path) -> None:
    """``compare GOOD GARBAGE``, the second file all malformed lines (``summary`` of it
    exits 10): exit 0 and a table of "what differs" made of nothing. Now one line saying
    why, with summary's exit status, either way round."""
    from tests.records import Lines

    good, garbage = tmp_path / "good", tmp_path / "garbage"
    good.mkdir()
    garbage.mkdir()
    lines = Lines()
    (good / "metrics.jsonl").write_bytes(b"".join(lines.train(s, 2.0) for s in range(20)))
    (garbage / "metrics.jsonl").write_bytes(b"not json at all\n" * 40)
    for pair in ((good, garbage), (garbage, good)):
        proc = subprocess.run(
            [sys.executable, "-m", "eagle3_tui", "compare", *map(str, pair)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 10, proc.stdout + proc.stderr
        assert proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stdout + proc.stderr
        assert f"{garbage}: No valid record in 40 malformed lines" in proc.stderr, proc.stderr
