"""speculators' checkpoint directories: which one a resume would take, and whether it
is whole."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

from eagle3_tui.telemetry.safefs import open_file, read_bounded

MAX_HEADER = 100 << 20
"""A safetensors header larger than this is not one (the real ones are kilobytes)."""
STATE_LIMIT = 1 << 20
"""``training_state.json`` is a few hundred bytes."""


def checkpoint_dir(m: dict[str, Any], run_dir: Path) -> Path | None:
    raw = m.get("checkpoint_dir")
    if not raw:
        return None
    path = Path(raw)
    if not path.is_absolute():
        path = Path(m.get("cwd") or run_dir) / path
    return path


def latest_numbered(ckpt: Path) -> Path | None:
    """The directory speculators resumes from: the highest integer name (symlinks skipped)."""
    best: tuple[int, Path] | None = None
    try:
        entries = list(ckpt.iterdir())
    except OSError:
        return None
    for d in entries:
        if d.is_symlink() or not d.is_dir():
            continue
        try:
            n = int(d.name)
        except ValueError:
            continue
        if best is None or n > best[0]:
            best = (n, d)
    return None if best is None else best[1]


def _safetensors_problem(path: Path) -> str | None:
    try:
        with open_file(path) as f:  # a regular file: a FIFO there never hangs the agent
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                return "truncated header"
            n = int.from_bytes(head, "little")
            if n > size - 8:
                return "truncated header"
            if n > MAX_HEADER:
                return f"not a checkpoint (a {n}-byte header)"
            header = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        return f"unreadable ({e})"
    end = 0
    for name, info in header.items():
        if name != "__metadata__" and isinstance(info, dict):
            end = max(end, int(info.get("data_offsets", [0, 0])[1]))
    if size != 8 + n + end:
        return f"truncated ({size} bytes, expected {8 + n + end})"
    return None


def _zip_problem(path: Path) -> str | None:
    try:
        with open_file(path) as f, zipfile.ZipFile(f) as z:
            z.infolist()
    except (OSError, zipfile.BadZipFile) as e:
        return f"truncated or corrupt ({e})"
    return None


def checkpoint_problems(d: Path) -> list[str]:
    """Why ``d`` cannot be resumed from (empty when complete).

    speculators writes, in order: ``model.safetensors`` and ``config.json``,
    ``optimizer_state_dict.pt``, ``scheduler_state_dict.pt`` (optional), then
    ``training_state.json``; saves are not atomic and mid-epoch saves rewrite
    the directory in place. So: each file present and whole (safetensors length
    from its header, torch files' zip directory), and ``training_state.json``
    (when present) not older than the files written before it.
    """
    problems = []
    for name, check in (
        ("model.safetensors", _safetensors_problem),
        ("optimizer_state_dict.pt", _zip_problem),
    ):
        path = d / name
        if not path.exists():
            problems.append(f"{name} is missing")
        else:
            why = check(path)
            if why:
                problems.append(f"{name} is {why}")
    sched = d / "scheduler_state_dict.pt"
    if sched.exists():
        why = _zip_problem(sched)
        if why:
            problems.append(f"scheduler_state_dict.pt is {why}")
    state = d / "training_state.json"
    if state.exists():
        try:
            json.loads(read_bounded(state, STATE_LIMIT))
        except (OSError, ValueError):
            problems.append("training_state.json is unreadable")
        else:
            newest = max(
                (
                    p.stat().st_mtime_ns
                    for p in (d / "model.safetensors", d / "optimizer_state_dict.pt")
                    if p.exists()
                ),
                default=0,
            )
            if state.stat().st_mtime_ns < newest:
                problems.append("training_state.json is older than the weights (save interrupted)")
    return problems


def checkpoint_info(d: Path) -> dict[str, Any]:
    info: dict[str, Any] = {"path": str(d), "problems": checkpoint_problems(d)}
    try:
        state = json.loads(read_bounded(d / "training_state.json", STATE_LIMIT))
        if isinstance(state, dict):
            for key in ("global_step", "epoch", "local_step"):  # ints, or not said
                value = state.get(key)
                ok = isinstance(value, int) and not isinstance(value, bool)
                info[key] = value if ok else None
    except (OSError, ValueError):
        pass
    return info


def files_state(d: Path | None) -> dict[str, tuple[int, int]] | None:
    """Each file of ``d``: (size, mtime in ns); None when ``d`` is no directory. What a
    kill compares before and after, to report only what it produced."""
    if d is None:
        return None
    try:
        return {
            f.name: (f.stat().st_size, f.stat().st_mtime_ns) for f in d.iterdir() if f.is_file()
        }
    except OSError:
        return None


def interrupted_dir(m: dict[str, Any], run_dir: Path) -> Path | None:
    ckpt = checkpoint_dir(m, run_dir)
    return None if ckpt is None else ckpt / "interrupted"


def checkpoint_report(
    m: dict[str, Any], run_dir: Path, before: dict[str, tuple[int, int]] | None = None
) -> dict[str, Any]:
    """The checkpoints a stop leaves: ``interrupted/`` and the numbered one a resume
    takes. ``before``: ``interrupted/``'s files when the stop began; the report then
    says whether this stop wrote it (``new``) — an ``interrupted/`` left by an earlier
    stop is not this one's result (``earlier``, with its time)."""
    ckpt = checkpoint_dir(m, run_dir)
    if ckpt is None:
        return {}
    latest = latest_numbered(ckpt)
    interrupted = ckpt / "interrupted"
    info = checkpoint_info(interrupted) if interrupted.is_dir() else None
    if info is not None:
        now = files_state(interrupted) or {}
        info["new"] = bool(now) and now != (before or {})
        newest = max((mtime for _, mtime in now.values()), default=None)
        info["written_at"] = newest / 1e9 if newest is not None else None
    return {
        "dir": str(ckpt),
        "latest": checkpoint_info(latest) if latest is not None else None,
        "interrupted": info,
    }
