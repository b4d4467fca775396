"""A real tiny training whose ``metrics.jsonl`` is deleted, replaced by another run's file,
or truncated while it runs: the run ends with a file that holds only this run's records
after the change, says what happened (the ``file`` event) first, moves the foreign file
aside intact, and has every training step logged after the change exactly once.

Two writers of the run share the file (the trainer and its sampler sidecar, every
0.5 s): whichever notices first makes the new file, the other adopts it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.telemetry import procs
from eagle3_tui.telemetry.manifest import launch_env
from eagle3_tui.telemetry.writer import JsonlWriter
from tests.conftest import LiveRun, live_training, wait_until

pytestmark = pytest.mark.slow

STEPS = 2 * 24  # 2 epochs of 24 steps
ARGS = ("--epochs", "2", "--step-delay", "0.25", "--interval", "0.5", "--log", "none")


def records(data: bytes) -> list[dict[str, Any]]:
    """Every line, parsed: a line that does not parse fails the test (nothing glued)."""
    return [json.loads(line) for line in data.splitlines()]


def steps(recs: list[dict[str, Any]]) -> list[int]:
    return [r["step"] for r in recs if r["kind"] == "train"]


@contextmanager
def training_until_a_step(tmp_path: Path, step: int) -> Iterator[LiveRun]:
    """A tiny training, handed over once its ``step``-th training step is in the file."""
    run_dir = tmp_path / "run"
    with live_training(run_dir, ARGS, dict(os.environ, **launch_env(run_dir))) as run:
        metrics = run_dir / "metrics.jsonl"

        def logged() -> bool:
            assert run.proc.poll() is None, run.log()
            return metrics.exists() and metrics.read_bytes().count(b'"kind":"train"') >= step

        wait_until(logged, 240, lambda: f"training step {step}: {run.log()}", interval=0.1)
        yield run


def finished(run: LiveRun) -> list[dict[str, Any]]:
    """Wait for the training and its sidecar to end; the final file's records."""
    assert run.proc.wait(240) == 0, run.log()
    sidecar = int(run.manifest().get("sampler_pid") or 0)
    wait_until(lambda: not (sidecar and procs.alive(sidecar)), 30, "the sidecar to end")
    return records((run.run_dir / "metrics.jsonl").read_bytes())


def ours_after(run: LiveRun, recs: list[dict[str, Any]], change: str) -> dict[str, Any]:
    """The file's first line is this run's ``file`` event of ``change`` (the only one),
    and every record in it is a writer of this run's; the event."""
    run_id = run.manifest()["run_id"]
    first = recs[0]
    assert first["kind"] == "lifecycle" and first["event"] == "file", first
    assert first["change"] == change and first["run_id"] == run_id
    assert [r for r in recs if r.get("event") == "file"] == [first]
    assert not [r for r in recs if r.get("event") == "write_gap"]
    pid = str(run.proc.pid)
    assert {r["w"].split("-")[0] for r in recs} <= {pid, str(run.manifest()["sampler_pid"])}
    return first


def kept_open(path: Path) -> Callable[[], bytes]:
    """The file's content at the end, read through a descriptor opened now (the inode,
    wherever its name goes)."""
    fd = os.open(path, os.O_RDONLY)

    def read() -> bytes:
        try:
            return os.pread(fd, 1 << 30, 0)
        finally:
            os.close(fd)

    return read


def test_metrics_deleted_mid_run(tmp_path: Path) -> None:
    with training_until_a_step(tmp_path, 5) as run:
        metrics = run.run_dir / "metrics.jsonl"
        old = kept_open(metrics)
        metrics.unlink()
        recs = finished(run)
        before = records(old())
    event = ours_after(run, recs, "deleted")
    assert event["written_before"] > 0 and event["previous"]["size"] > 0
    assert sorted(steps(before) + steps(recs)) == list(range(STEPS))  # each step once
    assert steps(recs) == list(range(steps(recs)[0], STEPS))
    assert "it was deleted at" in run.log()


def test_metrics_replaced_by_another_runs_file_mid_run(tmp_path: Path) -> None:
    foreign = tmp_path / "other.jsonl"
    w = JsonlWriter(foreign, run_id="another-run", writer_id="other-1", background=False)
    for i in range(20):
        w.write("train", {"train": {"loss": 9.0 - i * 0.1}}, step=i)
    w.close()
    theirs = foreign.read_bytes()
    with training_until_a_step(tmp_path, 5) as run:
        metrics = run.run_dir / "metrics.jsonl"
        old = kept_open(metrics)
        os.replace(foreign, metrics)  # mv other.jsonl metrics.jsonl
        recs = finished(run)
        before = records(old())
    (moved,) = sorted(metrics.parent.glob("metrics.jsonl.replaced-*"))
    assert moved.read_bytes() == theirs  # intact: none of this run's records in it
    event = ours_after(run, recs, "replaced")
    assert event["moved_to"] == moved.name
    assert sorted(steps(before) + steps(recs)) == list(range(STEPS))
    assert steps(recs) == list(range(steps(recs)[0], STEPS))
    assert "it was replaced at" in run.log() and moved.name in run.log()


def test_metrics_truncated_mid_run(tmp_path: Path) -> None:
    with training_until_a_step(tmp_path, 5) as run:
        metrics = run.run_dir / "metrics.jsonl"
        size = metrics.stat().st_size
        os.truncate(metrics, 0)
        truncated_at = time.time()
        recs = finished(run)
    events = [r for r in recs if r.get("event") == "file"]
    assert events and {e["change"] for e in events} == {"truncated"}
    assert all(e["noticed"] >= truncated_at and e["previous"]["size"] <= size for e in events)
    assert not [r for r in recs if r.get("event") == "write_gap"]
    after = steps(recs)
    assert after == list(range(after[0], STEPS)) and after[0] > 0  # every later step, once
    trainer = [r["seq"] for r in recs if r["w"].startswith(f"{run.proc.pid}-")]
    assert trainer == list(range(trainer[0], trainer[0] + len(trainer)))  # nothing lost
    assert "it was truncated at" in run.log()
