"""Reads, checkpoints, heartbeat; the sidecar through a GIL-holding hang and a SIGKILL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.telemetry import attach
from eagle3_tui.telemetry import manifest as mf
from eagle3_tui.telemetry.reads import READS_ENV, ReadsReceiver, socket_name
from eagle3_tui.telemetry.samplers import CheckpointWatcher, IoSampler
from eagle3_tui.telemetry.writer import JsonlWriter
from tests.conftest import read_jsonl, wait_until


def records(path: Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(path) if r["kind"] == kind]


# ---- reads ---------------------------------------------------------------------------

READER = """
import os, sys, time
from eagle3_tui.telemetry.reads import report_read
data, flag = sys.argv[1], sys.argv[2]
f = open(data, "rb")               # held open: /proc/PID/fd shows it
for i in range(3):
    f.seek(0)
    f.read()                       # rchar grows
    report_read(f"/data/hs_{i}.safetensors", 1000 + i)  # what an observed transfer sends
open(flag, "w").close()
time.sleep(60)
"""


def test_reads_per_worker_from_proc_and_from_the_transfer(tmp_path: Path) -> None:
    data = tmp_path / "shard-00000.arrow"
    data.write_bytes(b"x" * 200_000)
    name = socket_name(f"test-{os.getpid()}", os.getpid())
    receiver = ReadsReceiver(name)
    w = JsonlWriter(tmp_path / "m.jsonl", background=False)
    sampler = IoSampler(w, trainer_pid=os.getpid(), receiver=receiver, exclude=set)
    sampler.sample(time.time())  # the baseline: counters before the child reads
    flag = tmp_path / "done"
    child = subprocess.Popen(
        [sys.executable, "-c", READER, str(data), str(flag)],
        env=dict(os.environ, **{READS_ENV: name}),
    )
    try:
        wait_until(flag.exists, 60, "the reader child to start")
        wait_until(lambda: receiver.received >= 3, 60, "three reads reported")
        sampler.sample(time.time())
        sampler.sample(time.time())  # an interval with no reads
    finally:
        child.kill()
        child.wait()
        sampler.close()
        w.close()
    first, second = records(tmp_path / "m.jsonl", "io")[1:3]
    (worker,) = [e for e in first["workers"] if e["pid"] == child.pid]
    assert worker["role"] == "worker" and worker["source"] == "transfer"
    assert worker["read_bytes"] == 1000 + 1001 + 1002 == worker["read_total"]
    assert worker["rchar"] >= 3 * 200_000  # what /proc saw, whatever the transfer said
    assert str(data) in worker["files"]  # open right now, seen in /proc/PID/fd
    assert {f"/data/hs_{i}.safetensors" for i in range(3)} <= set(worker["files"])
    assert first["bytes"] >= 3003 and first["files_read"] >= 4
    (main,) = [e for e in first["workers"] if e["role"] == "main"]
    assert main["pid"] == os.getpid()
    (again,) = [e for e in second["workers"] if e["pid"] == child.pid]
    assert again["read_bytes"] == 0 and again["read_total"] == 3003


def test_report_read_without_a_receiver_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    from eagle3_tui.telemetry import reads

    monkeypatch.setenv(READS_ENV, "@eagle3-tui/nobody/listens/here")
    before = reads.unsent
    reads.report_read("/x", 1)
    assert reads.unsent == before + 1


# ---- checkpoints ---------------------------------------------------------------------


def _save(path: Path, *, state: bool = True, size: int = 300_000) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "model.safetensors").write_bytes(b"w" * size)
    (path / "config.json").write_text("{}")
    (path / "optimizer_state_dict.pt").write_bytes(b"o" * 2 * size)
    if state:
        (path / "training_state.json").write_text('{"epoch": 0, "local_step": 0}')


def test_a_checkpoint_save_from_start_to_best(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    w = JsonlWriter(tmp_path / "m.jsonl", background=False)
    cw = CheckpointWatcher(w, str(root))
    cw.sample(time.time())  # not there yet
    t0 = time.time()
    cw.on_message(f"Saving checkpoint to {root / '0'}", t0)
    (root / "0").mkdir(parents=True)
    (root / "0" / "model.safetensors").write_bytes(b"w" * 100_000)
    cw.sample(time.time())  # a save in progress: its size so far
    _save(root / "0")
    cw.sample(time.time())
    (root / "epoch0_end").symlink_to("0")
    cw.on_message(f"Checkpoint saved to {root / '0'}", t0 + 2.5)
    cw.sample(time.time())
    (root / "checkpoint_best").symlink_to("0", target_is_directory=True)
    cw.sample(time.time())
    cw.on_message(f"Saving checkpoint to {root / 'interrupted'}", t0 + 5)
    _save(root / "interrupted", state=False)
    cw.on_message(f"Checkpoint saved to {root / 'interrupted'}", t0 + 6)
    w.close()
    events = records(tmp_path / "m.jsonl", "ckpt")
    assert [e["event"] for e in events] == [
        "save_started",
        "save_progress",
        "save_progress",
        "save_finished",
        "completed",
        "best",
        "save_started",
        "save_finished",
        "interrupted",
    ]
    started, p1, p2, finished, completed, best, _, _, interrupted = events
    assert started["path"] == str(root / "0") and started["epoch"] == 0
    assert p1["bytes"] == 100_000 < p2["bytes"] == 900_000 + 2 + 29
    assert finished["bytes"] == p2["bytes"] and finished["duration_s"] == 2.5
    assert finished["complete"] is True and "training_state.json" in finished["files"]
    assert completed["link"] == "epoch0_end" and completed["epoch"] == 0 and completed["complete"]
    assert best["epoch"] == 0 and best["path"] == str((root / "0").resolve())
    assert interrupted["label"] == "interrupted" and interrupted["epoch"] is None
    assert interrupted["complete"] is True and interrupted["bytes"] > 0


def test_saves_without_the_trainers_messages_are_inferred(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    _save(root / "0")
    (root / "checkpoint_best").symlink_to("0")
    w = JsonlWriter(tmp_path / "m.jsonl", background=False)
    cw = CheckpointWatcher(w, str(root))
    cw.sample(time.time())  # what is already there
    _save(root / "1", size=50_000)
    written = max(f.stat().st_mtime for f in (root / "1").iterdir())
    looks = [time.time() + k for k in (1.0, 2.0, 3.0, 4.0)]  # one look a second
    for at in looks:
        cw.sample(at)
    w.close()
    inventory, started, progress, finished = records(tmp_path / "m.jsonl", "ckpt")
    # the looks say when it was seen, not how long it took (it read "in 2.0 s"): no
    # duration; its files' newest time is when it was written
    assert finished["duration_s"] is None
    assert finished["written_at"] == round(written, 3) < looks[0]
    assert inventory["event"] == "inventory" and inventory["best"] == "0"
    (found,) = inventory["checkpoints"]
    written_at = found.pop("written_at")  # its files' newest time: when it was saved
    assert found == {"name": "0", "epoch": 0, "bytes": 900_031, "complete": True}
    assert isinstance(written_at, float) and written_at <= looks[0]
    assert started["event"] == "save_started" and started["inferred"] and started["epoch"] == 1
    assert progress["event"] == "save_progress"
    assert finished["event"] == "save_finished" and finished["inferred"] and finished["complete"]


def test_a_half_written_checkpoint_is_not_complete(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    (root / "2").mkdir(parents=True)
    (root / "2" / "model.safetensors").write_bytes(b"w")
    w = JsonlWriter(tmp_path / "m.jsonl", background=False)
    cw = CheckpointWatcher(w, str(root))
    cw.sample(time.time())
    w.close()
    (inventory,) = records(tmp_path / "m.jsonl", "ckpt")
    assert inventory["checkpoints"][0]["complete"] is False


# ---- a whole session: thread host and sidecar ----------------------------------------


@pytest.fixture
def private_env(tmp_path: Path) -> Iterator[Path]:
    names = (mf.RUN_ID_ENV, mf.RUN_DIR_ENV, READS_ENV, "RANK", "LOCAL_RANK", "XDG_STATE_HOME")
    saved = {name: os.environ.pop(name, None) for name in names}
    os.environ["XDG_STATE_HOME"] = str(tmp_path / "state")
    yield tmp_path / "run"
    for name, value in saved.items():
        os.environ.pop(name, None)
        if value is not None:
            os.environ[name] = value


def _wait_for(path: Path, kind: str, n: int, timeout: float = 60) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        found = records(path, kind) if path.exists() else []
        if len(found) >= n or time.monotonic() > deadline:
            return found


def test_thread_samplers_report_the_writers_figures(private_env: Path) -> None:
    t = attach(private_env, samplers=["heartbeat", "io"], sampler_host="thread", interval=0.1)
    try:
        for i in range(10):
            t.writer.write("train", {"train": {"loss": 1.0}}, step=i)
        beats = _wait_for(private_env / "metrics.jsonl", "heartbeat", 3)
    finally:
        t.close()
    assert len(beats) >= 3
    last = beats[-1]
    assert last["source"] == "thread" and last["written"] >= 11 and last["dropped"] == 0
    assert last["stats_age_s"] is not None and last["stats_age_s"] < 1
    assert last["trainer"]["pid"] == os.getpid() and last["trainer"]["alive"]
    assert last["sampler_cpu_s"] >= 0 and "overhead_us" in last
    assert records(private_env / "metrics.jsonl", "io")


HOLDS_THE_GIL = """
import ctypes, sys, time
from eagle3_tui.telemetry import attach
t = attach(sys.argv[1], samplers=["heartbeat"], sampler_host=sys.argv[2], interval=0.2)
time.sleep(1.5)
print(time.time(), flush=True)
ctypes.PyDLL(None).sleep(4)   # C code that keeps the GIL: no thread of this process runs
print(time.time(), flush=True)
t.finish()
t.close()
"""


def _hold_the_gil(run_dir: Path, host: str) -> tuple[list[dict[str, Any]], float, float]:
    env = dict(os.environ, XDG_STATE_HOME=str(run_dir.parent / "state"))
    for name in (mf.RUN_ID_ENV, mf.RUN_DIR_ENV, READS_ENV):
        env.pop(name, None)
    proc = subprocess.run(
        [sys.executable, "-c", HOLDS_THE_GIL, str(run_dir), host],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    start, end = (float(x) for x in proc.stdout.split())
    return records(run_dir / "metrics.jsonl", "heartbeat"), start, end


def test_the_sidecar_keeps_beating_while_the_trainer_holds_the_gil(tmp_path: Path) -> None:
    beats, start, end = _hold_the_gil(tmp_path / "sidecar", "sidecar")
    during = [b for b in beats if start + 0.5 < b["ts"] < end]
    assert len(during) >= 5, [b["ts"] - start for b in beats]
    assert all(b["source"] == "sidecar" and b["trainer"]["alive"] for b in during)
    # the trainer's figures stopped coming: how a reader tells a stuck interpreter (from
    # 1.5 s into the hold: figures sent just before it may still be read in its first second)
    ages = [b["stats_age_s"] for b in during if b["ts"] > start + 1.5]
    assert ages and ages == sorted(ages) and ages[-1] > 2.0, ages


def test_a_thread_cannot_beat_while_the_gil_is_held(tmp_path: Path) -> None:
    """Why the sidecar is the default: the same hang silences the thread host."""
    beats, start, end = _hold_the_gil(tmp_path / "thread", "thread")
    assert beats and all(b["source"] == "thread" for b in beats)
    assert [b for b in beats if start + 0.5 < b["ts"] < end - 0.1] == []


KILLED = """
import os, signal, sys, time, logging
from eagle3_tui.telemetry import attach
t = attach(sys.argv[1], samplers=["heartbeat", "gpu"], interval=0.2)
logging.getLogger("speculators.metrics").info({"train": {"loss": 1.0}}, extra={"step": 41})
time.sleep(1.0)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_sidecar_reports_a_killed_trainer(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    for name in (mf.RUN_ID_ENV, mf.RUN_DIR_ENV, READS_ENV):
        env.pop(name, None)
    proc = subprocess.run(
        [sys.executable, "-c", KILLED, str(run_dir)], env=env, timeout=120, check=False
    )
    assert proc.returncode == -9
    crash = _wait_for(run_dir / "metrics.jsonl", "lifecycle", 2)[-1]
    assert crash["event"] == "crash" and crash["detected_by"] == "sidecar"
    assert crash["step"] == 41 and "without a finish event" in crash["error"]

    def settled() -> str | None:
        status = mf.read_manifest(run_dir / "run.json")["status"]
        return None if status == "running" else str(status)

    assert wait_until(settled, 30, "run.json to stop saying running") == "crashed"
    gpu = records(run_dir / "metrics.jsonl", "gpu")
    if not Path("/proc/driver/nvidia/version").exists():
        assert len(gpu) == 1 and gpu[0]["status"] == "no_driver"  # once, then it stopped
    assert json.loads((run_dir / "run.json").read_text())["sampler_pid"] > 0


def test_a_checkpoints_training_state_is_read_safely(tmp_path: Path) -> None:
    """A save's ``training_state.json`` (where the run was: progress without telemetry)
    comes with its ``save_finished``; one that is a FIFO, a link or not that JSON is left
    out, never waited on."""
    from eagle3_tui.telemetry.samplers import training_state

    good = tmp_path / "3"
    _save(good)
    (good / "training_state.json").write_text('{"epoch": 1, "local_step": 12, "global_step": 36}')
    assert training_state(good) == {"epoch": 1, "local_step": 12, "global_step": 36}
    fifo = tmp_path / "4"
    _save(fifo, state=False)
    os.mkfifo(fifo / "training_state.json")
    linked = tmp_path / "5"
    _save(linked, state=False)
    (linked / "training_state.json").symlink_to(good / "training_state.json")
    wrong = tmp_path / "6"
    _save(wrong)  # no global_step
    started = time.monotonic()
    assert [training_state(p) for p in (fifo, linked, wrong)] == [None, None, None]
    assert time.monotonic() - started < 5
    root = tmp_path / "ckpt"
    w = JsonlWriter(tmp_path / "m.jsonl", background=False)
    cw = CheckpointWatcher(w, str(root))
    cw.sample(time.time())
    cw.on_message(f"Saving checkpoint to {root / '7'}", time.time())
    _save(root / "7")
    (root / "7" / "training_state.json").write_text(
        '{"epoch": 0, "local_step": 6, "global_step": 6}'
    )
    cw.on_message(f"Checkpoint saved to {root / '7'}", time.time())
    w.close()
    finished = [r for r in records(tmp_path / "m.jsonl", "ckpt") if r["event"] == "save_finished"]
    assert finished[0]["training_state"] == {"epoch": 0, "local_step": 6, "global_step": 6}
