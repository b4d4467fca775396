"""Where a process sits in a torchrun job: its ranks, its node, the agent, the other nodes.

torchrun starts one agent per node; the agent starts the node's ranks with their
place in the environment (``RANK``, ``LOCAL_RANK``, ``GROUP_RANK`` = the node,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_WORLD_SIZE`` = the nodes). What a
rank cannot read from its environment is where the *other* ranks live: once the
process group exists, every rank puts one small entry (host, pid, run dir, run id)
into the job's key-value store (the one ``init_process_group`` connected to, a
plain client of the agent's TCPStore: no collective, nothing the training loop
waits on), and the node's manifest writer reads them all back. That is how a
node's ``run.json`` comes to name every node of the run, so that a monitor
pointed at one node finds the others.

Standard library only: ``torch.distributed`` is used through ``sys.modules`` when
the trainer has imported it, never imported here.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import dataclass
from typing import Any

from eagle3_tui.telemetry.parsing import parse_json
from eagle3_tui.telemetry.procs import cmdline

STORE_PREFIX = "eagle3_tui/rank/"
TORCHRUN_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
)
"""What the agent sets for each rank: not part of the environment a relaunch of the
agent itself should get (it sets them again)."""


def _int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def host_name() -> str:
    return socket.gethostname()


@dataclass(frozen=True)
class Place:
    """This process's place in a torchrun job (all zeros and ones outside torchrun)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    nnodes: int = 1
    launcher_pid: int | None = None
    """The torchrun agent (this process's parent) when under torchrun."""

    @property
    def distributed(self) -> bool:
        return self.launcher_pid is not None or self.world_size > 1

    @property
    def node_leader(self) -> bool:
        """Local rank 0: writes the node's manifest and samples the node's GPUs."""
        return self.local_rank == 0


def place_from_env(rank: int | None = None) -> Place:
    """Read the torchrun variables (``rank`` overrides ``RANK``)."""
    elastic = bool(os.environ.get("TORCHELASTIC_RUN_ID"))
    r = rank if rank is not None else (_int("RANK") or 0)
    world = _int("WORLD_SIZE") or 1
    local = _int("LOCAL_RANK")
    return Place(
        rank=r,
        local_rank=local if local is not None else r,
        world_size=world,
        local_world_size=_int("LOCAL_WORLD_SIZE") or world,
        node_rank=_int("GROUP_RANK") or 0,
        nnodes=_int("GROUP_WORLD_SIZE") or 1,
        launcher_pid=os.getppid() if elastic else None,
    )


LAUNCHER_ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_", "CUDA_", "EAGLE3_TUI_")
LAUNCHER_ENV_KEYS = ("OMP_NUM_THREADS", "PYTHONPATH", "PATH", "VIRTUAL_ENV")
"""What of the agent's environment a relaunch needs again (a resume over SSH starts from
the login's environment): the communication and device settings, the interpreter's
path. Never the whole environment: it may hold tokens, and run.json is readable."""


def launcher_env(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.decode("utf-8", "replace").partition("=")
        if sep and (key in LAUNCHER_ENV_KEYS or key.startswith(LAUNCHER_ENV_PREFIXES)):
            out[key] = value
    return out


def launcher_info(pid: int) -> dict[str, Any]:
    """The torchrun agent as the manifest records it: pid, start time, command line, cwd,
    the part of its environment a relaunch needs (:data:`LAUNCHER_ENV_PREFIXES`)."""
    from eagle3_tui.telemetry.procs import start_ticks

    try:
        cwd: str | None = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = None
    return {
        "pid": pid,
        "start_ticks": start_ticks(pid),
        "argv": cmdline(pid),
        "cwd": cwd,
        "env": launcher_env(pid),
    }


def rank_entry(place: Place, run_dir: str, run_id: str) -> dict[str, Any]:
    """What one rank publishes about itself."""
    from eagle3_tui.telemetry.procs import start_ticks

    pid = os.getpid()
    return {
        "rank": place.rank,
        "local_rank": place.local_rank,
        "node_rank": place.node_rank,
        "host": host_name(),
        "pid": pid,
        "start_ticks": start_ticks(pid),
        "run_dir": run_dir,
        "run_id": run_id,
        "launcher_pid": place.launcher_pid,
    }


def manifest_fields(
    place: Place, launcher: dict[str, Any] | None, entry: dict[str, Any]
) -> dict[str, Any]:
    """What a node's manifest says about the job (``ranks`` and ``nodes`` are completed
    once every rank's entry is in the store)."""
    fields: dict[str, Any] = {
        "world_size": place.world_size,
        "rank": place.rank,
        "local_rank": place.local_rank,
        "local_world_size": place.local_world_size,
        "node_rank": place.node_rank,
        "nnodes": place.nnodes,
        "launcher": launcher,
        "ranks": [entry],
    }
    if place.nnodes == 1:
        fields["nodes"] = nodes_of([entry])
    return fields


def nodes_of(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every rank's entry grouped by node: ``[{node_rank, host, run_dir, run_id,
    launcher_pid, ranks: [...]}]``, by node rank."""
    nodes: dict[int, dict[str, Any]] = {}
    for e in sorted(entries, key=lambda e: int(e.get("rank", 0))):
        n = int(e.get("node_rank", 0))
        node = nodes.setdefault(
            n,
            {
                "node_rank": n,
                "host": e.get("host"),
                "run_dir": e.get("run_dir"),
                "run_id": e.get("run_id"),
                "launcher_pid": e.get("launcher_pid"),
                "ranks": [],
            },
        )
        node["ranks"].append(e.get("rank"))
    return [nodes[k] for k in sorted(nodes)]


class TopologyExchange:
    """Publishes this rank's entry in the job's store and, on a node's manifest writer,
    collects everybody's. Driven from the telemetry writer thread every interval; each
    step is a few store round trips at most and never raises."""

    def __init__(self, place: Place, entry: dict[str, Any], *, collect: bool) -> None:
        self.place = place
        self.entry = entry
        self.collect = collect
        self.published = False
        self.entries: list[dict[str, Any]] | None = None
        self.error = ""

    @property
    def done(self) -> bool:
        return self.published and (not self.collect or self.entries is not None)

    def step(self) -> list[dict[str, Any]] | None:
        """One attempt; returns every rank's entry the first time they are all there."""
        if self.done:
            return None
        store = _default_store()
        if store is None:
            return None
        try:
            if not self.published:
                store.set(STORE_PREFIX + str(self.place.rank), json.dumps(self.entry))
                self.published = True
            if not self.collect:
                return None
            keys = [STORE_PREFIX + str(r) for r in range(self.place.world_size)]
            if not store.check(keys):
                return None
            entries = [parse_json(store.get(k)) for k in keys]
        except Exception as e:  # a store that went away (the job is ending)
            self.error = f"{type(e).__name__}: {e}"[:300]
            return None
        self.entries = [e for e in entries if isinstance(e, dict)]
        return self.entries


def _default_store() -> Any:
    """The store of torch.distributed's default group, once it is initialized."""
    dist: Any = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        if not (dist.is_available() and dist.is_initialized()):
            return None
        c10d: Any = sys.modules.get("torch.distributed.distributed_c10d")
        return c10d._get_default_store() if c10d is not None else None
    except Exception:
        return None
