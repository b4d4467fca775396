"""Telemetry through the real tiny CPU training (speculators' own Trainer).

Three trainings, shared between the tests of this module:

* ``full``: 2 epochs, no dataloader worker: every kind of record, checkpoints,
  the trainer's own reads, the manifest, the headless log;
* ``enospc``: 1 epoch whose metrics file is on a full filesystem (a file of a full
  tmpfs, bind-mounted there): training completes, drops are counted;
* ``hung``: the same run directory resumed with a dataloader worker and a training
  step that blocks for good: GPU (recorded readings), the worker's reads and
  heartbeats keep coming, ``run.json`` matches the live process; then SIGTERM:
  the interrupt is recorded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.telemetry import manifest as mf
from eagle3_tui.telemetry import procs
from eagle3_tui.telemetry.reads import READS_ENV
from eagle3_tui.telemetry.samplers import dir_contents
from tests.conftest import fill_filesystem, need_training, read_jsonl, small_tmpfs, wait_until

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parent / "fixtures"
STEPS_PER_EPOCH = 24  # 60 rows, 80 % for training, packed into 128-token batches


@dataclass
class Run:
    run_dir: Path
    argv: list[str]
    returncode: int | None = None
    output: str = ""
    records: list[dict[str, Any]] = field(default_factory=list)
    live: dict[str, Any] = field(default_factory=dict)

    def kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == kind]


def _env(tmp: Path, run_dir: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", XDG_STATE_HOME=str(tmp / "state"), **extra)
    for name in (mf.RUN_ID_ENV, mf.RUN_DIR_ENV, READS_ENV):
        env.pop(name, None)
    env.update(mf.launch_env(run_dir))  # what a launcher does before exec
    return env


def _start(tmp: Path, run_dir: Path, *args: str, **env: str) -> tuple[subprocess.Popen[bytes], Run]:
    need_training()
    argv = [sys.executable, "-m", "eagle3_tui.train.tiny", "--run-dir", str(run_dir), *args]
    log = open(tmp / f"{run_dir.name}.out", "wb")  # noqa: SIM115 - closed by _finish
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, env=_env(tmp, run_dir, **env), cwd=tmp
    )
    return proc, Run(run_dir, argv)


def _finish(tmp: Path, proc: subprocess.Popen[bytes], run: Run, timeout: float = 400) -> Run:
    try:
        run.returncode = proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    run.output = (tmp / f"{run.run_dir.name}.out").read_text(errors="replace")
    _settle(run.run_dir)
    metrics = run.run_dir / "metrics.jsonl"
    run.records = read_jsonl(metrics)
    return run


def _settle(run_dir: Path, timeout: float = 30) -> None:
    """Wait until the sidecar has written its last heartbeat (it exits just after)."""
    try:
        pid = int(mf.read_manifest(run_dir / "run.json").get("sampler_pid") or 0)
    except (OSError, ValueError):
        return
    deadline = time.monotonic() + timeout
    while pid and procs.alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("telemetry-training")


@pytest.fixture(scope="module")
def full(tmp: Path) -> Run:
    proc, run = _start(
        tmp,
        tmp / "full",
        *("--epochs", "2", "--workers", "0", "--interval", "0.5", "--progress-every", "5"),
    )
    return _finish(tmp, proc, run)


# ---- full -----------------------------------------------------------------------------


def test_the_run_completes(full: Run) -> None:
    assert full.returncode == 0, full.output[-4000:]


def test_every_kind_of_record_appears(full: Run) -> None:
    kinds = {r["kind"] for r in full.records}
    assert kinds == {
        "train",
        "val",
        "hparams",
        "log",
        "gpu",
        "io",
        "ckpt",
        "heartbeat",
        "lifecycle",
    }
    gpu = full.kind("gpu")
    if gpu[0]["status"] == "no_driver":  # this machine: said once, then quiet
        assert len(gpu) == 1 and gpu[0]["error"]
    events = [r["event"] for r in full.kind("lifecycle")]
    assert events == ["start", "finish"]
    assert full.kind("lifecycle")[-1]["step"] == 2 * STEPS_PER_EPOCH
    assert full.kind("hparams")[0]["hparams"]["launcher"] == "eagle3_tui.train.tiny"


def test_sequence_numbers_have_no_gaps_for_either_writer(full: Run) -> None:
    by_writer: dict[str, list[int]] = {}
    for r in full.records:
        assert r["v"] == 1 and r["rank"] == 0 and isinstance(r["ts"], float)
        by_writer.setdefault(r["w"], []).append(r["seq"])
    assert len(by_writer) == 2  # the trainer and its sidecar
    assert sum(w.endswith("-sidecar") for w in by_writer) == 1
    for seqs in by_writer.values():
        assert seqs == list(range(len(seqs)))


def test_each_checkpoint_save_is_started_and_finished_with_its_size(full: Run) -> None:
    ckpt = full.kind("ckpt")
    root = full.run_dir / "checkpoints"
    for epoch in (0, 1):
        path = str(root / str(epoch))
        started = [c for c in ckpt if c["event"] == "save_started" and c["path"] == path]
        finished = [c for c in ckpt if c["event"] == "save_finished" and c["path"] == path]
        assert len(started) == len(finished) == 1, ckpt
        assert "inferred" not in finished[0]  # from the trainer's own messages
        assert finished[0]["ts"] >= started[0]["ts"]
        assert finished[0]["epoch"] == epoch and finished[0]["complete"] is True
        on_disk = dir_contents(root / str(epoch))[0]
        later = root / str(epoch) / "val_metrics.json"  # written after the save, by validation
        on_disk -= later.stat().st_size if later.exists() else 0
        assert finished[0]["bytes"] == on_disk > 100_000
        assert 0 <= finished[0]["duration_s"] < 60
        completed = [c for c in ckpt if c["event"] == "completed" and c["epoch"] == epoch]
        assert completed and completed[0]["link"] == f"epoch{epoch}_end"
    assert any(c["event"] == "best" for c in ckpt)


def test_reads_of_the_main_process_name_the_files(full: Run) -> None:
    """With no dataloader worker the trainer reads the samples itself."""
    trainer_pid = full.kind("lifecycle")[0]["pid"]
    main = [w for r in full.kind("io") for w in r["workers"] if w["pid"] == trainer_pid]
    assert main and all(w["role"] == "main" for w in main)
    observed = [w for w in main if w["source"] == "transfer" and w["read_bytes"] > 0]
    files = {Path(f).name for w in observed for f in w["files"]}
    assert any(f.startswith("hs_") and f.endswith(".safetensors") for f in files)
    hs_size = (full.run_dir / "tiny" / "data" / "hidden_states" / "hs_0.safetensors").stat().st_size
    total = sum(w["read_bytes"] for w in observed)
    assert total >= 2 * STEPS_PER_EPOCH * hs_size  # at least one sample per step and epoch


def test_heartbeats_carry_the_writers_figures(full: Run) -> None:
    beats = full.kind("heartbeat")
    assert len(beats) >= 5 and all(b["source"] == "sidecar" for b in beats)
    last = beats[-1]
    trainer_lines = [r for r in full.records if not r["w"].endswith("-sidecar")]
    assert 0 < last["written"] <= len(trainer_lines)
    assert last["dropped"] == 0 and last["errors"] == {}
    assert last["overhead_us"]["p50"] > 0 and last["overhead_us"]["n"] > 0
    assert 0 <= last["sampler_cpu_pct"] < 100 and last["sampler_cpu_s"] > 0


def test_the_manifest_describes_the_finished_run(full: Run, tmp: Path) -> None:
    m = mf.read_manifest(full.run_dir / "run.json")
    assert m["status"] == "finished" and m["resumes"] == 0
    assert m["epochs"] == 2 and m["steps_per_epoch"] == STEPS_PER_EPOCH
    assert m["total_steps"] == 2 * STEPS_PER_EPOCH
    assert m["checkpoint_dir"] == str((full.run_dir / "checkpoints").resolve())
    assert m["resume_command"] == full.argv and m["argv"] == full.argv
    assert m["log_file"] == "train.log" and m["cwd"] == str(tmp)
    assert m["telemetry"]["dropped"] == 0 and m["telemetry"]["written"] > 0
    index = read_jsonl(tmp / "state" / "eagle3-tui" / "runs.jsonl")
    assert any(e["run_id"] == m["run_id"] and e["run_dir"] == m["run_dir"] for e in index)


def test_the_headless_log_is_never_silent(full: Run) -> None:
    log = (full.run_dir / "train.log").read_text(errors="replace")
    for text in (log, full.output):  # written to the file and still to stdout
        assert f"[eagle3] step 5/{2 * STEPS_PER_EPOCH} epoch 1/2 loss " in text
        assert f"[eagle3] step {2 * STEPS_PER_EPOCH}/{2 * STEPS_PER_EPOCH} epoch 2/2" in text
        assert "[eagle3] validation epoch 2/2 loss " in text
        assert "[eagle3] telemetry: " in text and ", 0 not written" in text


# ---- a full disk, then a hang in the resumed run -----------------------------------------


@pytest.fixture(scope="module")
def enospc(tmp: Path) -> Iterator[Run]:
    run_dir = tmp / "resumed"
    with small_tmpfs(tmp / "full-fs", "64k") as fs:
        (fs / "metrics.jsonl").touch()
        fill_filesystem(fs / "filler")
        run_dir.mkdir()
        (run_dir / "metrics.jsonl").touch()
        bind = ["mount", "--bind", str(fs / "metrics.jsonl"), str(run_dir / "metrics.jsonl")]
        subprocess.run(bind, check=True)
        try:
            proc, run = _start(tmp, run_dir, "--epochs", "1", "--interval", "0.5")
            yield _finish(tmp, proc, run)
        finally:
            subprocess.run(["umount", "-l", str(run_dir / "metrics.jsonl")], check=False)


def test_a_full_disk_never_stops_the_training(enospc: Run) -> None:
    assert enospc.returncode == 0, enospc.output[-4000:]
    assert (enospc.run_dir / "checkpoints" / "0" / "model.safetensors").exists()
    m = mf.read_manifest(enospc.run_dir / "run.json")
    assert m["status"] == "finished"
    assert m["telemetry"]["written"] == 0 and m["telemetry"]["dropped"] >= STEPS_PER_EPOCH
    assert m["telemetry"]["errors"].get("ENOSPC", 0) >= 1
    assert "not written (ENOSPC: " in enospc.output  # the closing line says so


@pytest.fixture(scope="module")
def hung(tmp: Path, enospc: Run) -> Iterator[Run]:
    run_dir = enospc.run_dir
    # lazily: a look at the host's trainings from the other test worker (runs, fleet
    # localhost) may hold the file open a moment, and umount then fails (busy)
    subprocess.run(["umount", "-l", str(run_dir / "metrics.jsonl")], check=True)
    (run_dir / "metrics.jsonl").unlink()  # the disk has room again
    proc, run = _start(
        tmp,
        run_dir,
        *("--epochs", "2", "--workers", "1", "--interval", "0.3", "--debug-hang-at-step", "3"),
        EAGLE3_TUI_NVML_FIXTURE=str(FIXTURES / "nvml_8x_h200.json"),
    )
    try:
        out = tmp / f"{run_dir.name}.out"

        def hung() -> bool:
            assert proc.poll() is None, out.read_text(errors="replace")[-4000:]
            return b"now blocks forever" in out.read_bytes()

        wait_until(hung, 300, "the training to reach the hang", interval=0.2)
        hang_ts = time.time()
        metrics = run_dir / "metrics.jsonl"

        def five_heartbeats() -> bool:  # after the hang began
            assert proc.poll() is None, out.read_text(errors="replace")[-4000:]
            late = [r for r in read_jsonl(metrics) if r["ts"] > hang_ts]
            return sum(1 for r in late if r["kind"] == "heartbeat") >= 5

        wait_until(five_heartbeats, 120, "five heartbeats during the hang", interval=0.2)
        run.live = {
            "pid": proc.pid,
            "hang_ts": hang_ts,
            "manifest": mf.read_manifest(run_dir / "run.json"),
            "stat": procs.stat(proc.pid),
            "cmdline": procs.cmdline(proc.pid),
            "cwd": os.readlink(f"/proc/{proc.pid}/cwd"),
            "environ": Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0"),
            "pgid": os.getpgid(proc.pid),
            "sid": os.getsid(proc.pid),
            "records": read_jsonl(metrics),
        }
        os.kill(proc.pid, signal.SIGTERM)  # what `eagle3-tui kill` does: the trainer, not the group
        _finish(tmp, proc, run, timeout=180)
        yield run
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_resumed_run_says_where_it_resumed_from(hung: Run, enospc: Run) -> None:
    (resume,) = [r for r in hung.kind("lifecycle") if r["event"] == "resume"]
    assert resume["checkpoint"] == str((hung.run_dir / "checkpoints" / "0").resolve())
    assert resume["global_step"] == STEPS_PER_EPOCH and resume["pid"] == hung.live["pid"]
    m = hung.live["manifest"]
    assert m["run_id"] == mf.read_manifest(enospc.run_dir / "run.json")["run_id"]
    assert m["resumes"] == 1 and m["status"] == "running"


def test_samplers_keep_reporting_while_a_training_step_hangs(hung: Run) -> None:
    records = hung.live["records"]
    last_train = max(r["ts"] for r in records if r["kind"] == "train")
    assert last_train < hung.live["hang_ts"]
    after = [r for r in records if r["ts"] > hung.live["hang_ts"]]
    for kind in ("gpu", "io", "heartbeat"):
        assert sum(r["kind"] == kind for r in after) >= 3, kind
    gpu = [r for r in after if r["kind"] == "gpu"][-1]
    assert gpu["status"] in ("ok", "error") and len(gpu["devices"]) == 8  # recorded readings
    beat = [r for r in after if r["kind"] == "heartbeat"][-1]
    assert beat["trainer"]["alive"] and beat["trainer"]["state"] in ("S", "R")
    assert beat["stats_age_s"] < 5  # the trainer's writer thread still publishes: GIL free
    io = [r for r in after if r["kind"] == "io"][-1]
    assert any(w["role"] == "worker" for w in io["workers"])


def test_reads_name_the_worker_and_its_files(hung: Run) -> None:
    workers = [w for r in hung.kind("io") for w in r["workers"] if w["role"] == "worker"]
    assert workers and {w["pid"] for w in workers}.isdisjoint({hung.live["pid"]})
    observed = [w for w in workers if w["source"] == "transfer" and w["read_bytes"] > 0]
    assert observed, "no interval with a worker's transfer read"  # before: /proc's rchar
    files = {Path(f).name for w in observed for f in w["files"]}
    assert any(f.startswith("hs_") and f.endswith(".safetensors") for f in files)
    assert all(w["read_total"] >= w["read_bytes"] for w in workers)


def test_the_manifest_matches_the_live_process(hung: Run, tmp: Path) -> None:
    m, live = hung.live["manifest"], hung.live
    assert m["pid"] == live["pid"]
    assert m["start_ticks"] == live["stat"].start_ticks
    assert m["boot_id"] == procs.boot_id()
    assert m["pgid"] == live["pgid"] and m["sid"] == live["sid"]
    assert m["argv"] == live["cmdline"] == hung.argv
    assert m["cwd"] == live["cwd"] == str(tmp)
    assert m["python"] == sys.executable
    assert f"{mf.RUN_ID_ENV}={m['run_id']}".encode() in live["environ"]
    assert m["env"][mf.RUN_ID_ENV] == m["run_id"]
    assert m["sampler_pid"] != m["pid"] and m["log_file"] == "train.log"


def test_sigterm_during_the_hang_is_an_interrupt_with_a_saved_checkpoint(hung: Run) -> None:
    assert hung.returncode == 0, hung.output[-4000:]  # speculators exits 0 after saving
    events = [r["event"] for r in hung.kind("lifecycle")]
    assert events == ["resume", "interrupt"]
    ckpt = hung.kind("ckpt")
    (interrupted,) = [c for c in ckpt if c["event"] == "interrupted"]
    assert interrupted["complete"] is True and interrupted["bytes"] > 100_000
    assert any(c["event"] == "save_finished" and c.get("label") == "interrupted" for c in ckpt)
    assert mf.read_manifest(hung.run_dir / "run.json")["status"] == "interrupted"


# ---- the general launcher: the library's own CLI --------------------------------------------


def test_the_launcher_runs_the_library_cli_with_telemetry(full: Run, tmp: Path) -> None:
    """``speculators train`` itself (its setup_metric_logger, its log_run_config), on CPU."""
    tiny = full.run_dir / "tiny"
    run_dir = tmp / "launched"
    argv = [
        *(sys.executable, "-m", "eagle3_tui.train.launch", "--run-dir", str(run_dir)),
        *("--progress-every", "5", "--interval", "0.5", "--"),
        *("--speculator-type", "eagle3", "--verifier-name-or-path", str(tiny / "verifier")),
        *("--data-path", str(tiny / "data"), "--save-path", str(run_dir / "checkpoints")),
        *("--epochs", "1", "--draft-attn-impl", "sdpa", "--loss-implementation", "eager"),
        *("--hidden-states-dtype", "float32", "--total-seq-len", "128", "--num-workers", "0"),
        *("--draft-vocab-size", "64", "--target-layer-ids", "0", "1", "2", "--ttt-steps", "3"),
        *("--on-missing", "raise", "--scheduler-type", "none", "--mask-token-id", "0"),
    ]
    proc = subprocess.run(
        argv, capture_output=True, text=True, env=_env(tmp, run_dir), timeout=400, check=False
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    _settle(run_dir)
    records = read_jsonl(run_dir / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    m = mf.read_manifest(run_dir / "run.json")
    assert m["status"] == "finished" and m["resume_command"] == argv
    assert len(train) == m["total_steps"] == m["steps_per_epoch"] > 0 and m["epochs"] == 1
    assert m["checkpoint_dir"] == str((run_dir / "checkpoints").resolve())
    hparams = [r for r in records if r["kind"] == "hparams"]
    assert len(hparams) == 1  # the CLI's log_run_config, through its own dictConfig
    logs = [r["msg"] for r in records if r["kind"] == "log"]
    assert any("re-attached" in msg and "dictConfig" in msg for msg in logs)
    ckpt = {r["event"] for r in records if r["kind"] == "ckpt"}
    assert {"save_started", "save_finished", "completed", "best"} <= ckpt
    assert [r["event"] for r in records if r["kind"] == "lifecycle"] == ["start", "finish"]
    assert "[eagle3] step 5/" in proc.stdout and "[eagle3] telemetry: " in proc.stdout
