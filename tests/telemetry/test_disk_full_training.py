"""A full disk under a real tiny training (issue 24, item 6): while the run's filesystem
has no room, ``summary`` says DISK FULL (never "looks hung"), the trainer trains on; once
space returns, the telemetry writes how many records it could not write, exactly, and no
record is glued onto a torn line; the closing line says it.

The run directory is a real small tmpfs; the tiny training's data and checkpoints live on
the ordinary disk (links the test makes), so only the telemetry meets the full disk."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TINY, fill_filesystem, need_training, small_tmpfs, wait_until

pytestmark = pytest.mark.slow

EAGLE3_TUI = str(Path(sys.executable).parent / "eagle3-tui")
FULL_S = 45.0
"""How long the disk stays full: past the quiet limit (30 s), with room for a look."""


def _summary(run_dir: Path) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run(
        [EAGLE3_TUI, "summary", str(run_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    out: dict[str, Any] = json.loads(proc.stdout)
    return proc.returncode, out


def _lines(path: Path) -> list[dict[str, Any]]:
    """Every line of the file must be a whole record (at most one torn line, cut by the
    disk filling up, may stand alone: never a record glued onto it)."""
    out = []
    torn = 0
    for raw in path.read_bytes().split(b"\n")[:-1]:
        try:
            out.append(json.loads(raw))
        except ValueError:
            torn += 1
            assert raw.count(b'{"v":') <= 1, raw[:200]  # no second record inside it
    assert torn <= 1, torn
    return out


def test_a_full_disk_is_said_counted_exactly_and_survived(tmp_path: Path) -> None:
    need_training()
    with small_tmpfs(tmp_path / "small", "4m") as small:
        run_dir = small / "run"
        run_dir.mkdir()
        for name in ("tiny", "checkpoints"):  # the data and the saves on the big disk
            (tmp_path / name).mkdir()
            (run_dir / name).symlink_to(tmp_path / name)
        log = tmp_path / "train.out"
        args = (
            "--epochs",
            "8",
            "--step-delay",
            "0.25",
            "--log",
            "none",
            "--checkpoint-freq",
            "100",
        )
        with open(log, "ab") as output:
            proc = subprocess.Popen(
                [*TINY, "--run-dir", str(run_dir), *args],
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            metrics = run_dir / "metrics.jsonl"
            wait_until(
                lambda: metrics.exists() and b'"kind":"train"' in metrics.read_bytes(),
                240,
                lambda: log.read_text(errors="replace")[-2000:],
            )
            filler = small / "filler"
            fill_filesystem(filler)
            full_at = time.time()
            verdicts = []
            while time.time() - full_at < FULL_S:
                rc, out = _summary(run_dir)
                verdicts.append((round(time.time() - full_at), out["health"], rc))
                assert out["health"] != "stalled", (verdicts, out["reason"])
                time.sleep(2)
            assert proc.poll() is None, log.read_text(errors="replace")[-2000:]  # it trained on
            rc, out = _summary(run_dir)
            assert rc == 11 and out["health"] == "disk_full", (verdicts, out["reason"])
            assert "Disk full on the host" in out["reason"], out["reason"]
            filler.unlink()  # space is back
            assert proc.wait(300) == 0, log.read_text(errors="replace")[-3000:]
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait(30)
        records = _lines(metrics)
        gaps = [r for r in records if r.get("event") == "write_gap"]
        assert gaps, "no write_gap record"
        # exactly the records whose numbers never came, per writer
        for w in {r["w"] for r in records if "w" in r}:
            seqs = sorted(r["seq"] for r in records if r.get("w") == w)
            missing = (seqs[-1] - seqs[0] + 1) - len(seqs)
            said = sum(g["records"] for g in gaps if g["w"] == w)
            assert missing == said, (w, missing, said)
        rc, out = _summary(run_dir)
        assert out["health"] == "finished", out["reason"]
        assert out["lost_records"] == sum(g["records"] for g in gaps)
        assert "not written" in log.read_text(errors="replace")
