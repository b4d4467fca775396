"""The run manifest ``RUN_DIR/run.json`` and the per-user index of runs.

The manifest says what a client needs to find, trust and control a run: where it
is, which process it is (PID *and* start time *and* boot id, so a reused PID is
never signalled), how it was started, and the exact command that resumes it.
It is replaced atomically (write a temp file, fsync, rename), so a reader sees
the old or the new one, never half of one.

Each run is also appended to a per-user index,
``${XDG_STATE_HOME:-~/.local/state}/eagle3-tui/runs.jsonl``, so that a client
can find "the latest run on this host" without being told its path.

Standard library only: imported inside the trainer.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Final

MANIFEST_SCHEMA: Final = 1
RUN_ID_ENV: Final = "EAGLE3_TUI_RUN_ID"
"""Environment marker inherited by every process of a run (dataloader workers too)."""

ENV_KEYS: Final = (
    "CUDA_VISIBLE_DEVICES",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    RUN_ID_ENV,
)


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


def boot_id() -> str | None:
    """This boot's id (Linux); None elsewhere."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def proc_start_ticks(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat``: the process start time in clock ticks since boot."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may contain spaces and parentheses: split after the last ")"
    fields = raw[raw.rfind(")") + 2 :].split()
    try:
        return int(fields[19])  # field 22 overall = index 19 after "pid (comm)"
    except (IndexError, ValueError):
        return None


def build_manifest(
    run_dir: Path,
    *,
    run_id: str,
    resume_command: list[str] | None = None,
    checkpoint_dir: str | None = None,
    epochs: int | None = None,
    steps_per_epoch: int | None = None,
    log_file: str | None = None,
    pid: int | None = None,
) -> dict[str, Any]:
    """The manifest of the calling process's run."""
    pid = os.getpid() if pid is None else pid
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    now = time.time()
    total = epochs * steps_per_epoch if epochs is not None and steps_per_epoch is not None else None
    return {
        "schema": MANIFEST_SCHEMA,
        "run_id": run_id,
        "run_dir": str(run_dir.resolve()),
        "host": socket.gethostname(),
        "pid": pid,
        "pgid": os.getpgid(pid),
        "sid": os.getsid(pid),
        "start_ticks": proc_start_ticks(pid),
        "boot_id": boot_id(),
        "launcher_pid": os.getppid() if os.environ.get("TORCHELASTIC_RUN_ID") else None,
        "argv": argv,
        "cwd": os.getcwd(),
        "python": sys.executable,
        "env": {k: os.environ[k] for k in ENV_KEYS if k in os.environ},
        "checkpoint_dir": checkpoint_dir,
        "epochs": epochs,
        "steps_per_epoch": steps_per_epoch,
        "total_steps": total,
        "resume_command": resume_command if resume_command is not None else argv,
        "metrics_file": "metrics.jsonl",
        "log_file": log_file,
        "started_at": now,
        "updated_at": now,
        "status": "running",
    }


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    """Replace ``path`` atomically with ``manifest`` (may raise OSError)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest at ``path`` (may raise OSError or ValueError)."""
    obj = json.loads(path.read_text())
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: not a JSON object")
    return obj


def index_path() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "eagle3-tui" / "runs.jsonl"


def register_run(manifest: dict[str, Any], path: Path | None = None) -> None:
    """Append the run to the per-user index (one whole line, O_APPEND)."""
    path = index_path() if path is None else path
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {
        "run_id": manifest["run_id"],
        "run_dir": manifest["run_dir"],
        "host": manifest["host"],
        "pid": manifest["pid"],
        "started_at": manifest["started_at"],
    }
    line = (json.dumps(entry, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
