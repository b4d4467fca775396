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

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from eagle3_tui.telemetry import procs
from eagle3_tui.telemetry.parsing import parse_json
from eagle3_tui.telemetry.safefs import open_append, read_bounded, write_atomic

MANIFEST_SCHEMA: Final = 1
MANIFEST_LIMIT: Final = 4 << 20
"""A manifest is a few KiB (its environment, its command line); more is not one."""
RUN_ID_ENV: Final = "EAGLE3_TUI_RUN_ID"
"""Environment marker inherited by every process of a run (dataloader workers too)."""
RUN_DIR_ENV: Final = "EAGLE3_TUI_RUN_DIR"
"""The run directory the marker belongs to (a launcher sets both before exec)."""
RESUME_ENV_FILE: Final = "resume-env.json"
"""In the run directory: the whole environment the run's command was started with, which
``resume`` runs it in again (its manifest's ``resume_env_file``; mode 0600: it may hold
tokens)."""

STOP_SAVES: Final = "stop_saves"
"""Each stop at a step boundary whose save a kill made a numbered checkpoint:
``[{"from": ".../interrupted", "path": ".../checkpoints/N", "at": TIME}, ...]``, the
newest :data:`STOP_SAVES_KEPT` (the save's records name ``interrupted/``, renamed since)."""
STOP_SAVES_KEPT: Final = 20

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
    RUN_DIR_ENV,
    "EAGLE3_TUI_NVML_FIXTURE",
    "SLURM_JOB_ID",  # a Slurm job's: which job this run is (``HOST:job/ID`` finds it by it)
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_JOB_NODELIST",
    "SLURM_RESTART_COUNT",
)


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


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
        "start_ticks": procs.start_ticks(pid),
        "boot_id": procs.boot_id(),
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


def write_manifest(path: Path, manifest: dict[str, Any], mode: int = 0o644) -> None:
    """Replace ``path`` atomically with ``manifest`` (may raise OSError): through a
    temporary file of an unpredictable name, created exclusively (a link planted at
    ``path`` or at a guessable temporary name is never written through)."""
    data = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    write_atomic(path, data, mode)


def update_manifest(path: Path, **fields: Any) -> dict[str, Any]:
    """Read the manifest at ``path``, set ``fields`` and ``updated_at``, replace it atomically.

    May raise OSError or ValueError (a missing or unreadable manifest).
    """
    manifest = read_manifest(path)
    manifest.update(fields)
    manifest["updated_at"] = time.time()
    write_manifest(path, manifest)
    return manifest


def note_stop_save(path: str, saved: str, moved_to: str) -> None:
    """Add to the manifest at ``path`` (a regular file, replaced atomically with its mode
    kept) that the save ``saved`` is now ``moved_to`` (:data:`STOP_SAVES`). May raise
    OSError or ValueError."""
    p = Path(path)
    mode = os.lstat(p).st_mode & 0o777
    manifest = read_manifest(p)
    notes = manifest.get(STOP_SAVES)
    kept = [n for n in notes if isinstance(n, dict)] if isinstance(notes, list) else []
    kept = kept[-(STOP_SAVES_KEPT - 1) :]
    kept.append({"from": saved, "path": moved_to, "at": time.time()})
    manifest[STOP_SAVES] = kept
    write_manifest(p, manifest, mode)


def launch_env(run_dir: Path) -> dict[str, str]:
    """What a launcher puts in a trainer's environment before exec, so that the
    trainer's own ``/proc/PID/environ`` carries the run marker."""
    return {RUN_ID_ENV: resolve_run_id(run_dir), RUN_DIR_ENV: str(run_dir.resolve())}


def resolve_run_id(run_dir: Path) -> str:
    """The id of the run in ``run_dir``: the one a launcher gave this process for
    this directory (``EAGLE3_TUI_RUN_ID`` with a matching ``EAGLE3_TUI_RUN_DIR``),
    else the existing manifest's (a resume), else a new one. Under torchrun
    without either, every rank derives the same id from the agent's PID and
    ``TORCHELASTIC_RUN_ID``.
    """
    env = os.environ.get(RUN_ID_ENV)
    env_dir = os.environ.get(RUN_DIR_ENV)
    if env and env_dir and os.path.realpath(env_dir) == os.path.realpath(run_dir):
        return env
    try:
        existing = read_manifest(run_dir / "run.json").get("run_id")
    except (OSError, ValueError):
        existing = None
    if isinstance(existing, str) and existing:
        return existing
    elastic = os.environ.get("TORCHELASTIC_RUN_ID")
    if elastic:
        return f"te-{os.getppid()}-{uuid.uuid5(uuid.NAMESPACE_OID, elastic).hex[:8]}"
    return new_run_id()


def resume_point(checkpoint_dir: str | os.PathLike[str] | None) -> tuple[str | None, int]:
    """Where speculators will resume from: (the highest numbered checkpoint dir or
    None, the global step saved in its ``training_state.json`` or 0).

    Mirrors ``BaseCheckpointer._get_previous_epoch``; never raises.
    """
    if checkpoint_dir is None:
        return None, 0
    root = Path(checkpoint_dir)
    best = -1
    try:
        for entry in os.scandir(root):
            if entry.is_symlink() or not entry.is_dir() or not entry.name.isdigit():
                continue
            best = max(best, int(entry.name))
    except OSError:
        return None, 0
    if best < 0:
        return None, 0
    path = root / str(best)
    try:
        state = parse_json((path / "training_state.json").read_text())
        step = int(state.get("global_step", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        step = 0
    return str(path), step


def save_environment(path: Path, env: dict[str, str]) -> None:
    """``env`` as ``path`` (a JSON object), replaced atomically, mode 0600: an environment
    may hold tokens, readable by its user only (may raise OSError)."""
    write_atomic(path, json.dumps(env, sort_keys=True).encode(), 0o600, fsync=False)


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest at ``path`` (may raise OSError or ValueError): a regular file, read
    bounded (a FIFO or a device planted there never hangs the trainer)."""
    obj = parse_json(read_bounded(path, MANIFEST_LIMIT))
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: not a JSON object")
    return obj


def index_path() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
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
    with index_lock(path):
        fd, _ = open_append(path)  # never through a link, never another user's file
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


@contextlib.contextmanager
def index_lock(path: Path) -> Iterator[None]:
    """The index's lock: an exclusive ``flock`` of ``runs.jsonl.lock`` beside it (a file
    never replaced), held by an append and by ``runs --prune``'s rewrite, so that an
    append is never made to a file the rewrite is about to replace. Where the
    filesystem has no locks, nothing is held."""
    try:
        fd, _ = open_append(path.with_name(path.name + ".lock"))  # flock needs no read
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
