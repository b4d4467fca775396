"""speculators' checkpoint directories: which one a resume would take, and whether it
is whole."""

from __future__ import annotations

import json
import os
import stat
import time
import zipfile
from pathlib import Path
from typing import Any

from eagle3_tui.telemetry.parsing import parse_json
from eagle3_tui.telemetry.safefs import open_file, read_bounded, write_atomic

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
            header = parse_json(f.read(n))
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
            parse_json(read_bounded(state, STATE_LIMIT))
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
        state = parse_json(read_bounded(d / "training_state.json", STATE_LIMIT))
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


# ---- after a stop at a step boundary: the save speculators resumes from mid-epoch --------

MOVED_ASIDE = "before-stop"
"""``<epoch>.before-stop-<time>-<hex>``: where a numbered checkpoint the stop's save takes
the place of is moved (a name speculators ignores: not an integer)."""
STATE_FILES = ("model.safetensors", "optimizer_state_dict.pt")


def stop_save_problems(
    ckpt: Path, state: dict[str, Any], before: dict[str, tuple[int, int]] | None
) -> list[str]:
    """Why ``ckpt/interrupted/`` is not the complete save of the stop ``state`` describes
    (the telemetry's ``stop-state.json``): speculators did not say it saved it, its files
    are an earlier stop's (unchanged since the kill began, or older than the stop),
    incomplete, or a later numbered checkpoint would be resumed from anyway. Empty when
    it can become the checkpoint the run resumes from."""
    problems = []
    if state.get("phase") != "saved":
        problems.append(f"speculators did not report the interrupt save ({state.get('phase')})")
    for key, least in (("epoch", 0), ("local_step", 1), ("global_step", 1)):
        value = state.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            problems.append(f"the stop's {key} is {value!r}")
    saved = ckpt / "interrupted"
    if saved.is_symlink() or not saved.is_dir():
        return [*problems, f"{saved} is not a directory"]
    now = files_state(saved) or {}
    if not now or now == (before or {}):
        problems.append(f"{saved} was not written by this stop")
    stopped_at = state.get("stopped_at")
    if isinstance(stopped_at, (int, float)):
        for name in STATE_FILES:
            mtime = now.get(name, (0, 0))[1] / 1e9
            if name in now and mtime < float(stopped_at) - 1.0:
                problems.append(f"{name} is older than the stop")
    problems += checkpoint_problems(saved)
    latest = latest_numbered(ckpt)
    epoch = state.get("epoch")
    if latest is not None and isinstance(epoch, int) and int(latest.name) > epoch:
        problems.append(f"{latest} is a later checkpoint: speculators would resume from it")
    return problems


def resume_at_stop(ckpt: str, epoch: int, local_step: int, global_step: int) -> dict[str, Any]:
    """Make ``ckpt/interrupted/`` the numbered checkpoint speculators resumes from in the
    middle of epoch ``epoch``, after its ``local_step``-th step: its
    ``training_state.json`` (the library's own format), the directory renamed to
    ``<epoch>/``, and the ``epoch<e>_step<k>`` link as the library makes one (an older link
    of that epoch removed, as the library does). Nothing the run saved is destroyed: a
    ``<epoch>/`` already there (a mid-epoch save of this epoch) is moved aside first
    (:data:`MOVED_ASIDE`), and ``checkpoint_best`` follows it if it named it.

    Runs as the checkpoint's owner (``userfiles.as_user``); renames never follow a link.
    Returns ``{"path", "moved_aside", "link"}``."""
    root = Path(ckpt)
    saved = root / "interrupted"
    if not stat.S_ISDIR(os.lstat(saved).st_mode):
        raise OSError(f"{saved} is not a directory")
    state = {"epoch": epoch, "local_step": local_step, "global_step": global_step}
    write_atomic(saved / "training_state.json", json.dumps(state).encode(), 0o644)
    target = root / str(epoch)
    moved: Path | None = None
    if os.path.lexists(target):
        stamp = time.strftime("%Y%m%d-%H%M%S")
        moved = root / f"{epoch}.{MOVED_ASIDE}-{stamp}-{os.urandom(3).hex()}"
        os.rename(target, moved)
    os.rename(saved, target)
    best = root / "checkpoint_best"
    if moved is not None and best.is_symlink() and os.readlink(best).rstrip("/") == str(epoch):
        os.unlink(best)
        os.symlink(moved.name, best)
    for old in root.glob(f"epoch{epoch}_*"):
        if old.is_symlink():
            old.unlink()
    link = root / f"epoch{epoch}_step{local_step}"
    os.symlink(str(epoch), link)
    return {"path": str(target), "moved_aside": str(moved) if moved else None, "link": str(link)}
