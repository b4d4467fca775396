"""Helpers for the torchrun tests: launch the real tiny training under torchrun, wait for
what its telemetry says, find what is left of it.

The machine is shared (other trainings, other helpers' processes): every check is
filtered by the run directory the test created, and every wait is generous.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from eagle3_tui.agent import processes
from eagle3_tui.api.reading import load_local
from eagle3_tui.model.state import RunState
from eagle3_tui.model.verdict import HEARTBEAT_DEAD_S, quiet_limit
from tests import conftest

FIXTURE = str(Path(__file__).parent / "telemetry" / "fixtures" / "nvml_8x_h200.json")
TORCHRUN = (sys.executable, "-m", "torch.distributed.run")
STEPS = ("--epochs", "40", "--step-delay", "0.2", "--workers", "1", "--checkpoint-freq", "0.5")
"""Never finishes on its own (the tests stop it); a numbered checkpoint every 6 steps."""

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def tiny_args(run_dir: Path, control: Path) -> list[str]:
    return [
        "-m",
        "eagle3_tui.train.tiny",
        "--run-dir",
        str(run_dir),
        *STEPS,
        "--debug-control",
        str(control),
    ]


def records(path: Path) -> list[dict[str, Any]]:
    """The whole lines of a metrics file (a torn last line is skipped)."""
    try:
        raw = path.read_bytes()
    except OSError:
        return []
    out = []
    for line in raw.split(b"\n")[:-1]:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def manifest(run_dir: Path) -> dict[str, Any]:
    try:
        m: dict[str, Any] = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return {}
    return m


def state_of(run_dir: Path) -> RunState:
    run = load_local(run_dir)
    m = manifest(run_dir)
    if m:
        run.state.set_manifest(m)
    return run.state


def wait_until(predicate: Callable[[], T | None], timeout: float, what: str, log: Path) -> T:
    """``predicate()``'s first true value; fails with the log's tail after ``timeout``."""

    def said() -> str:
        try:
            return f"{what}\n{log.read_text(errors='replace')[-4000:]}"
        except OSError:
            return f"{what}\n(no log)"

    return conftest.wait_until(predicate, timeout, said, interval=0.5)


def leftovers(run_dir: Path) -> list[str]:
    """Live processes of this run (its directory on their command line): agents, ranks,
    sidecars; dataloader workers carry it as ``EAGLE3_TUI_RUN_DIR`` in their environment."""
    needle = str(run_dir)
    marker = f"EAGLE3_TUI_RUN_DIR={run_dir}".encode()
    marker1 = f"EAGLE3_TUI_RUN_DIR={run_dir}/node".encode()
    out = []
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        p = processes.proc_stat(pid)
        if p is None or p.zombie or pid == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if "eagle3_tui" not in cmd and b"EAGLE3_TUI" not in env:
            continue
        if needle in cmd or any(v == marker or v.startswith(marker1) for v in env.split(b"\0")):
            out.append(f"{pid} {cmd[:160]}")
    return out


def kill_leftovers(run_dir: Path) -> None:
    """SIGKILL whatever of this run remains (a failed test's cleanup)."""
    import signal

    for line in leftovers(run_dir):
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(line.split()[0]), signal.SIGKILL)


def rank_pids(m: dict[str, Any]) -> dict[int, int]:
    return {int(r["rank"]): int(r["pid"]) for r in m.get("ranks") or []}


def train_steps(recs: list[dict[str, Any]]) -> list[int]:
    return [int(r["step"]) for r in recs if r.get("kind") == "train" and "step" in r]


def checkpointed(run_dir: Path) -> bool:
    """A numbered checkpoint is whole (what a resume needs)."""
    return (run_dir / "checkpoints" / "0" / "training_state.json").exists()


def hung(run_dir: Path, rank: int = 1) -> RunState | None:
    """The run's state once ``rank`` is blocked outside any collective, every other rank
    waits in one, and their heartbeats have gone on long enough after the last metric
    that :func:`quiet_later` still finds them fresh."""
    st = state_of(run_dir)
    hb = st.samplers.rank_heartbeats
    if len(hb) < 2 or rank not in hb or st.last_train_ts is None:
        return None
    if (hb[rank].where or {}).get("collective") or not (hb[rank].where or {}).get("frame"):
        return None
    if not all((h.where or {}).get("collective") for r, h in hb.items() if r != rank):
        return None
    if min(h.ts for h in hb.values()) < quiet_later(st) - HEARTBEAT_DEAD_S + 1:
        return None
    return st


def quiet_later(st: RunState) -> float:
    """The moment the run has been quiet past its limit: what the monitor will say then,
    if nothing moves (the health of a state is a pure function of it and the time)."""
    assert st.last_train_ts is not None
    return st.last_train_ts + quiet_limit(st) + 1.0
