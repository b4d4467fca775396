"""Fake runs for the control tests: processes that behave like a trainer and its workers,
manifests for processes the test started, and checkpoints shaped like speculators'."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path
from typing import Any

from eagle3_tui.agent import processes
from eagle3_tui.telemetry import manifest as mf
from eagle3_tui.telemetry import procs


def write_checkpoint(d: Path, global_step: int = 20) -> None:
    """A checkpoint directory shaped like speculators writes it (tiny, but whole)."""
    d.mkdir(parents=True)
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    (d / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 16)
    with zipfile.ZipFile(d / "optimizer_state_dict.pt", "w") as z:
        z.writestr("archive/data.pkl", b"x" * 100)
    (d / "config.json").write_text("{}")
    (d / "training_state.json").write_text(
        json.dumps({"epoch": 0, "local_step": 0, "global_step": global_step})
    )


TRAINER = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    from pathlib import Path
    from eagle3_tui.telemetry import attach

    run_dir = Path(sys.argv[1])
    attach(run_dir, checkpoint_dir=run_dir / "checkpoints", samplers=False,
           resume_command=[sys.executable, *sys.argv])
    # a worker that ends when its parent does (as dataloader workers do)
    worker = subprocess.Popen([sys.executable, "-c",
        "import os, time\\np = os.getppid()\\nwhile os.getppid() == p: time.sleep(0.05)"])
    # an escaped worker: its own session, reparented away at once, deaf to SIGTERM
    escape = ("import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              "open(os.environ['ESCAPED_PID'], 'w').write(str(os.getpid())); time.sleep(600)")
    subprocess.Popen([sys.executable, "-c",
        "import subprocess, sys; subprocess.Popen([sys.executable, '-c', sys.argv[1]], "
        "start_new_session=True)", escape]).wait()
    saved = run_dir / "saved"
    def on_term(*_):
        time.sleep(0.3)  # "saving the checkpoint"
        saved.write_text("ok")
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    while not os.path.exists(os.environ["ESCAPED_PID"]):
        time.sleep(0.02)
    (run_dir / "ready").write_text(str(worker.pid))
    while True:
        time.sleep(0.1)
    """
)


def start_fake_trainer(run_dir: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    script = run_dir.parent / "fake_trainer.py"
    script.write_text(TRAINER)
    run_dir.mkdir(parents=True, exist_ok=True)
    env = dict(env, ESCAPED_PID=str(run_dir.parent / "escaped.pid"))
    proc = subprocess.Popen(
        [sys.executable, str(script), str(run_dir)],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not (run_dir / "ready").exists():
        assert proc.poll() is None, "the fake trainer died"
        assert time.monotonic() < deadline, "the fake trainer did not start"
        time.sleep(0.05)
    return proc


def alive(pid: int) -> bool:
    p = processes.proc_stat(pid)
    return p is not None and not p.zombie


def marker_processes(run_id: str) -> list[int]:
    marker = f"{mf.RUN_ID_ENV}={run_id}".encode()
    return [
        pid
        for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
        if alive(pid) and processes.has_marker(pid, marker) and pid != os.getpid()
    ]


def fake_manifest(run_dir: Path, pid: int, run_id: str, **fields: Any) -> dict[str, Any]:
    """A manifest for a process the test started (``pid`` may be gone already)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    m = mf.build_manifest(run_dir, run_id=run_id)
    m.update(pid=pid, pgid=pid, sid=pid, start_ticks=procs.start_ticks(pid), **fields)
    mf.write_manifest(run_dir / "run.json", m)
    return m


RESUMED = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    run_dir = Path(sys.argv[1])
    m = json.loads((run_dir / "run.json").read_text())
    stat = Path("/proc/self/stat").read_text()
    m["pid"] = os.getpid()  # as attach() does in a resumed trainer
    m["start_ticks"] = int(stat[stat.rfind(")") + 2 :].split()[19])
    (run_dir / "run.json").write_text(json.dumps(m))
    (run_dir / "resumed.json").write_text(json.dumps({
        "pid": os.getpid(), "sid": os.getsid(0), "cwd": os.getcwd(),
        "marker": os.environ.get("EAGLE3_TUI_RUN_ID"), "flag": os.environ.get("FLAG")}))
    print("resumed output")
    time.sleep(60)
    """
)


def dead_pid() -> int:
    """The PID of a process that has come and gone."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def register(state_home: Path, run_id: str, run_dir: Path) -> None:
    """Add a run to the per-user index under ``state_home`` (as attach() does)."""
    index = state_home / "eagle3-tui" / "runs.jsonl"
    index.parent.mkdir(parents=True, exist_ok=True)
    entry = {"run_id": run_id, "run_dir": str(run_dir), "started_at": time.time(), "pid": 1}
    with open(index, "a") as out:
        out.write(json.dumps(entry) + "\n")
