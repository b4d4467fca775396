"""Samplers: GPU (NVML), dataloader reads (/proc + transfer reports), checkpoints, heartbeat.

Each sampler has ``sample(now)``, which writes at most a few records and never
raises (the :class:`SamplerSet` counts a sampler's exceptions and reports them
in the heartbeat). :class:`SamplerSet` calls them on their intervals; it runs
either in the sidecar process (``eagle3_tui.telemetry.sidecar``, the default) or
in a thread of the trainer. Both read the trainer from outside (``/proc``, NVML,
the checkpoint directory), so they keep reporting while the training loop hangs.

Standard library only.

Over 600 lines: every sampler is small and shares :class:`SamplerSet`'s scheduling
and error counting, which the sidecar and the in-trainer thread both run.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from eagle3_tui.telemetry import procs
from eagle3_tui.telemetry.nvml import DeviceReading, Nvml, NvmlUnavailable
from eagle3_tui.telemetry.parsing import parse_json
from eagle3_tui.telemetry.reads import ReadsReceiver
from eagle3_tui.telemetry.safefs import read_bounded
from eagle3_tui.telemetry.schema import SAVED_RE, SAVING_RE, Kind

if TYPE_CHECKING:  # (the agent imports the samplers: standard library only at run time)
    from eagle3_tui.telemetry.writer import JsonlWriter

SAMPLERS = ("gpu", "io", "ckpt", "heartbeat")
MAX_FILES_PER_WORKER = 20


class RecordSink(Protocol):
    """Where a sampler's records go: a :class:`JsonlWriter` inside a run, the agent's
    frames when it observes a run without telemetry (``agent/observe.py``)."""

    def write(
        self, kind: str, payload: Mapping[str, Any] | None = None, step: int | None = None
    ) -> bool: ...


@dataclass
class SamplerConfig:
    """Everything a sampler host needs; JSON-ready, so it can be passed to the sidecar."""

    run_dir: str
    trainer_pid: int
    rank: int = 0
    run_id: str = ""
    interval: float = 1.0
    intervals: dict[str, float] = field(default_factory=dict)
    """Per-sampler interval overrides; 0 or less switches a sampler off."""
    enabled: list[str] = field(default_factory=lambda: list(SAMPLERS))
    checkpoint_dir: str | None = None
    cuda_visible_devices: str | None = None
    local_rank: int | None = None
    world_size: int = 1
    local_world_size: int = 1
    launcher_pid: int | None = None
    """The torchrun agent: its descendants are the node's ranks."""
    gpu_scope: str = "own"
    """``own``: this process's devices; ``node``: every device of the node's ranks (local
    rank 0 under torchrun, so a node's GPUs are read once, not once per rank);
    ``none``: another rank of the node reads them."""
    writes_manifest: bool = True
    nvml_fixture: str | None = None
    """A recorded-readings file (RecordedNvml) instead of the real NVML."""
    reads_socket: str | None = None
    exclude_pids: list[int] = field(default_factory=list)
    """Children of the trainer that are not dataloader workers (the sidecar, a tee)."""
    trainer_start_ticks: int | None = None

    def interval_of(self, name: str) -> float:
        if name not in self.enabled:
            return 0.0
        return float(self.intervals.get(name, self.interval))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SamplerConfig:
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in known})


# ---- GPU ------------------------------------------------------------------------------


def visible_devices(spec: str | None) -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` as a list of entries (indices or UUIDs); None = all."""
    if spec is None:
        return None
    return [e.strip() for e in spec.split(",") if e.strip()]


def node_device_entries(spec: str | None, local_world_size: int) -> list[str]:
    """The entries of ``CUDA_VISIBLE_DEVICES`` that a node's ranks use: torchrun gives
    local rank i the i-th visible device."""
    visible = visible_devices(spec)
    if visible is None:
        return [str(i) for i in range(max(1, local_world_size))]
    return visible[: max(1, local_world_size)]


def own_device_entries(
    spec: str | None, local_rank: int | None, world_size: int
) -> list[str] | None:
    """The entries of ``CUDA_VISIBLE_DEVICES`` this process uses: its ``LOCAL_RANK``'s
    one under torchrun, all visible ones otherwise (None = every device)."""
    visible = visible_devices(spec)
    if world_size > 1 and local_rank is not None:
        if visible is None:
            return [str(local_rank)]
        if 0 <= local_rank < len(visible):
            return [visible[local_rank]]
    return visible


class GpuSampler:
    """One ``gpu`` record per interval: this process's devices via the NVML seam.

    Without a driver it writes one record with ``status: "no_driver"`` and stops.
    Integer entries of ``CUDA_VISIBLE_DEVICES`` are taken as NVML (PCI order)
    indices, UUID entries are matched by UUID. With ``local_ranks`` (a node's
    sampler under torchrun) each device says which local rank uses it.
    """

    name = "gpu"

    def __init__(
        self,
        writer: RecordSink,
        nvml: Nvml,
        *,
        entries: list[str] | None,
        run_pids: Callable[[], set[int]],
        local_ranks: bool = False,
    ) -> None:
        self.writer = writer
        self.nvml = nvml
        self.entries = entries
        self.local_ranks = local_ranks
        self.run_pids = run_pids
        self.enabled = True
        self.host = socket.gethostname()
        self._started = False
        self._indices: list[int] | None = None
        self._positions: list[int] = []
        """For each device read, its position in ``entries`` (= the local rank using it)."""
        self._last_error = ""

    def _start(self) -> bool:
        self._started = True
        try:
            self.nvml.init()
        except NvmlUnavailable as e:
            self.writer.write(
                Kind.GPU, {"status": e.kind, "error": e.message, "host": self.host, "devices": []}
            )
            self.enabled = False
            return False
        return True

    def _resolve(self) -> list[int]:
        count = self.nvml.device_count()
        if self.entries is None:
            self._positions = list(range(count))
            return list(range(count))
        indices: list[int] = []
        positions: list[int] = []
        uuids: dict[str, int] | None = None
        for pos, entry in enumerate(self.entries):
            if entry.isdigit():
                if int(entry) < count:
                    indices.append(int(entry))
                    positions.append(pos)
                continue
            if uuids is None:
                uuids = {self.nvml.read(i).uuid: i for i in range(count)}
            for uuid, i in uuids.items():
                if uuid and (uuid == entry or uuid.startswith(entry)):
                    indices.append(i)
                    positions.append(pos)
        self._positions = positions
        return indices

    def sample(self, now: float) -> None:
        if not self.enabled:
            return
        if not self._started and not self._start():
            return
        if self._indices is None:
            self._indices = self._resolve()
        pids = self.run_pids()
        devices: list[dict[str, Any]] = []
        errors = 0
        for n, i in enumerate(self._indices):
            try:
                record = device_record(self.nvml.read(i), pids)
            except Exception as e:
                errors += 1
                record = {"index": i, "error": f"{type(e).__name__}: {e}"[:300]}
            if self.local_ranks and n < len(self._positions):
                record["local_rank"] = self._positions[n]
            devices.append(record)
        status = "ok" if errors == 0 else "error"
        payload: dict[str, Any] = {"status": status, "host": self.host, "devices": devices}
        if errors:
            payload["error"] = f"{errors} of {len(self._indices)} devices could not be read"
        self.writer.write(Kind.GPU, payload)

    def close(self) -> None:
        if self._started and self.enabled:
            self.nvml.shutdown()


def device_record(r: DeviceReading, run_pids: set[int]) -> dict[str, Any]:
    return {
        "index": r.index,
        "uuid": r.uuid,
        "name": r.name,
        "util": r.util,
        "mem_util": r.mem_util,
        "mem_used": r.mem_used,
        "mem_total": r.mem_total,
        "power_w": r.power_w,
        "temp_c": r.temp_c,
        "pids": sorted(p.pid for p in r.processes if p.pid in run_pids),
        "procs": len(r.processes),
    }


# ---- dataloader reads -----------------------------------------------------------------

_NOT_WORKERS = (
    "resource_tracker",
    "semaphore_tracker",
    "compile_worker",
    "eagle3_tui.telemetry.sidecar",
    "eagle3_tui.train.tee",
)


class IoSampler:
    """One ``io`` record per interval: per process of the run, bytes and files read.

    The trainer's children are its dataloader workers (less the sidecar and the
    multiprocessing helpers). From ``/proc``: ``rchar`` and ``read_bytes`` deltas
    and the data files open or mapped at the moment; from the transfer reports
    (when the dataset reads through an observed transfer): every file loaded and
    its bytes, which ``/proc`` cannot see (safetensors maps files, it does not
    ``read`` them). A process's ``read_bytes`` is the transfer figure once it has
    reported, its ``rchar`` delta before.
    """

    name = "io"

    def __init__(
        self,
        writer: RecordSink,
        *,
        trainer_pid: int,
        receiver: ReadsReceiver | None,
        exclude: Callable[[], set[int]],
    ) -> None:
        self.writer = writer
        self.trainer_pid = trainer_pid
        self.receiver = receiver
        self.exclude = exclude
        self.host = socket.gethostname()
        self._prev: dict[int, dict[str, int]] = {}
        self._totals: dict[int, int] = {}
        self._reporting: set[int] = set()
        self._roles: dict[int, str] = {}
        self._last = time.monotonic()
        self._uptime: float | None = None
        self.last_bytes = 0
        """Bytes the run's processes read in the latest interval (what it wrote)."""

    def _started_since_last(self, pid: int) -> bool:
        st = procs.stat(pid)
        if st is None or self._uptime is None:
            return False
        return st.start_ticks / procs.CLK_TCK >= self._uptime

    def _role(self, pid: int) -> str | None:
        role = self._roles.get(pid)
        if role is None:
            if pid == self.trainer_pid:
                role = "main"
            else:
                cmd = " ".join(procs.cmdline(pid))
                role = "other" if any(s in cmd for s in _NOT_WORKERS) else "worker"
            self._roles[pid] = role
        return None if role == "other" else role

    def sample(self, now: float) -> None:
        mono = time.monotonic()
        interval = mono - self._last
        self._last = mono
        reported_bytes, reported_files = (
            self.receiver.take() if self.receiver is not None else ({}, {})
        )
        excluded = self.exclude()
        pids = [self.trainer_pid] + [
            p for p in procs.children(self.trainer_pid) if p not in excluded
        ]
        entries: list[dict[str, Any]] = []
        total = 0
        all_files: set[str] = set()
        seen: set[int] = set()
        for pid in pids + [p for p in reported_bytes if p not in pids]:
            if pid in seen:
                continue
            seen.add(pid)
            role = self._role(pid) if pid in pids else "worker"
            if role is None:
                continue
            counters = procs.io_counters(pid)
            prev = self._prev.get(pid)
            if prev is None and counters is not None and self._started_since_last(pid):
                prev = {}  # born in this interval: everything it read, it read now
            rchar = read_bytes = None
            if counters is not None:
                if prev is not None:
                    rchar = max(0, counters.get("rchar", 0) - prev.get("rchar", 0))
                    read_bytes = max(0, counters.get("read_bytes", 0) - prev.get("read_bytes", 0))
                self._prev[pid] = counters
            if pid in reported_bytes and pid not in self._reporting:
                self._reporting.add(pid)
                self._totals[pid] = 0  # from now on the total counts data files only
            if pid in self._reporting:
                nbytes = reported_bytes.get(pid, 0)
                source = "transfer"
            else:
                nbytes = rchar or 0
                source = "proc"
            files = set(reported_files.get(pid, ()))
            if role == "worker":
                files |= procs.data_files(pid)
            self._totals[pid] = self._totals.get(pid, 0) + nbytes
            total += nbytes
            all_files |= files
            shown = sorted(files)
            entry: dict[str, Any] = {
                "pid": pid,
                "role": role,
                "read_bytes": nbytes,
                "read_total": self._totals[pid],
                "rchar": rchar,
                "disk_read_bytes": read_bytes,
                "source": source,
                "files": shown[:MAX_FILES_PER_WORKER],
            }
            if len(shown) > MAX_FILES_PER_WORKER:
                entry["files_more"] = len(shown) - MAX_FILES_PER_WORKER
            entries.append(entry)
        for gone in [p for p in self._prev if p not in seen]:
            del self._prev[gone]
        self._uptime = procs.uptime()
        self.last_bytes = total
        self.writer.write(
            Kind.IO,
            {
                "interval_s": round(interval, 3),
                "workers": entries,
                "bytes": total,
                "files_read": len(all_files),
                "host": self.host,
            },
        )

    def close(self) -> None:
        if self.receiver is not None:
            self.receiver.close()


# ---- checkpoints ----------------------------------------------------------------------

_LINK = re.compile(r"^epoch(\d+)_(end|step(\d+))$")
REQUIRED_FILES = ("model.safetensors", "config.json", "optimizer_state_dict.pt")


def dir_contents(path: Path) -> tuple[int, list[str]]:
    """Total bytes and file names directly in ``path`` (checkpoint dirs are flat)."""
    total = 0
    names: list[str] = []
    try:
        for entry in os.scandir(path):
            try:
                if entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
                    names.append(entry.name)
            except OSError:
                continue
    except OSError:
        pass
    return total, sorted(names)


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def is_complete(name: str, files: list[str]) -> bool:
    need = [*REQUIRED_FILES, "training_state.json"] if name.isdigit() else list(REQUIRED_FILES)
    return all(f in files for f in need)


def training_state(path: Path) -> dict[str, int] | None:
    """``epoch``, ``local_step`` and ``global_step`` (the steps done) of a numbered
    checkpoint's ``training_state.json``, read bounded, never through a link nor from a
    FIFO (another user may have made the directory); None when not there or not that."""
    try:
        raw = read_bounded(path / "training_state.json", 4096, follow=False)
        state = parse_json(raw)
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict):
        return None
    out = {k: state.get(k) for k in ("epoch", "local_step", "global_step")}
    if not all(type(v) is int and 0 <= v < 1 << 40 for v in out.values()):
        return None
    return out  # type: ignore[return-value]


def epoch_of(name: str) -> int | None:
    return int(name) if name.isdigit() else None


@dataclass
class _Save:
    path: Path
    started: float
    inferred: bool
    last_bytes: int = -1
    stable: int = 0


class CheckpointWatcher:
    """``ckpt`` records from the checkpoint directory and the trainer's messages.

    The speculators messages "Saving checkpoint to X" / "Checkpoint saved to X"
    (passed in with :meth:`on_message`) give a save's exact start and end; the
    directory, polled every interval, gives its growing size, the completed
    epoch links (``epoch{e}_end``, ``epoch{e}_step{n}``), ``checkpoint_best`` and
    ``interrupted/``, and saves made without those messages (inferred).
    """

    name = "ckpt"

    def __init__(self, writer: RecordSink, checkpoint_dir: str | None) -> None:
        self.writer = writer
        self.root = Path(checkpoint_dir) if checkpoint_dir else None
        self._scanned = False
        self._sizes: dict[str, int] = {}
        self._links: dict[str, str] = {}
        self._saves: dict[str, _Save] = {}
        self._weights: dict[str, float | None] = {}
        self._messages = False

    def set_dir(self, checkpoint_dir: str | None) -> None:
        root = Path(checkpoint_dir) if checkpoint_dir else None
        if root != self.root:
            self.root = root
            self._scanned = False

    def on_message(self, text: str, ts: float) -> None:
        m = SAVING_RE.match(text)
        if m:
            self._messages = True
            path = Path(m.group(1).strip().strip("'"))
            self._saves[path.name] = _Save(path, ts, inferred=False)
            self._write("save_started", path, started=ts)
            return
        m = SAVED_RE.match(text)
        if m:
            path = Path(m.group(1).strip().strip("'"))
            save = self._saves.pop(path.name, None)
            self._finish(path, save.started if save else None, ts, inferred=False)

    def _write(self, event: str, path: Path, **fields: Any) -> None:
        name = path.name
        payload: dict[str, Any] = {"event": event, "path": str(path), "epoch": epoch_of(name)}
        if name == "interrupted":
            payload["label"] = "interrupted"
        payload.update(fields)
        self.writer.write(Kind.CKPT, payload)

    def _finish(self, path: Path, started: float | None, ts: float, *, inferred: bool) -> None:
        nbytes, files = dir_contents(path)
        self._sizes[path.name] = nbytes
        fields: dict[str, Any] = {
            "bytes": nbytes,
            "duration_s": round(ts - started, 3) if started is not None else None,
            "complete": is_complete(path.name, files),
            "files": files,
        }
        state = training_state(path) if path.name.isdigit() else None
        if state is not None:
            fields["training_state"] = state
        if inferred:
            # seen by polling: its start and end are the looks', not the save's (a 15 ms
            # save read "in 2.0 s"); its files' newest time is when it was written
            fields["inferred"] = True
            fields["duration_s"] = None
            times = [t for t in (_mtime(path / f) for f in files) if t is not None]
            if times:
                fields["written_at"] = round(max(times), 3)
        self._write("save_finished", path, **fields)
        if path.name == "interrupted":
            self._write("interrupted", path, bytes=nbytes, complete=fields["complete"], files=files)

    def sample(self, now: float) -> None:
        root = self.root
        if root is None:
            return
        try:
            entries = list(os.scandir(root))
        except OSError:  # not there yet: everything that appears later is new
            self._scanned = True
            return
        dirs: dict[str, Path] = {}
        links: dict[str, str] = {}
        for e in entries:
            try:
                if e.is_symlink():
                    links[e.name] = os.readlink(e.path)
                elif e.is_dir() and (e.name.isdigit() or e.name == "interrupted"):
                    dirs[e.name] = Path(e.path)
            except OSError:
                continue
        if not self._scanned:
            self._scanned = True
            self._inventory(root, dirs, links)
            return
        for name, path in dirs.items():
            save = self._saves.get(name)
            nbytes, _ = dir_contents(path)
            if save is None:
                known = name in self._sizes
                self._sizes[name] = nbytes
                weights = _mtime(path / "model.safetensors")
                changed = weights != self._weights.get(name)
                self._weights[name] = weights
                # Without the trainer's messages, a new directory or new weights is a save.
                if self._messages or (known and not changed):
                    continue
                save = self._saves[name] = _Save(path, now, inferred=True)
                self._write("save_started", path, started=now, inferred=True)
            if nbytes != save.last_bytes:
                save.last_bytes = nbytes
                save.stable = 0
                self._write(
                    "save_progress", path, bytes=nbytes, elapsed_s=round(now - save.started, 3)
                )
            else:
                save.stable += 1
                if save.inferred and save.stable >= 2:
                    del self._saves[name]
                    self._finish(path, save.started, now, inferred=True)
        for name, target in links.items():
            if self._links.get(name) == target:
                continue
            target_path = (root / target).resolve() if not os.path.isabs(target) else Path(target)
            if name == "checkpoint_best":
                self._write("best", target_path, link=name)
            else:
                m = _LINK.match(name)
                if m:
                    nbytes, files = dir_contents(target_path)
                    extra: dict[str, Any] = {}
                    state = training_state(target_path) if target_path.name.isdigit() else None
                    if state is not None:
                        extra["training_state"] = state
                    self._write(
                        "completed",
                        target_path,
                        link=name,
                        epoch=int(m.group(1)),
                        local_step=int(m.group(3)) if m.group(3) else None,
                        bytes=nbytes,
                        complete=is_complete(target_path.name, files),
                        **extra,
                    )
        self._links = links

    def _inventory(self, root: Path, dirs: dict[str, Path], links: dict[str, str]) -> None:
        found = []
        for name in sorted(dirs, key=lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0)):
            nbytes, files = dir_contents(dirs[name])
            self._sizes[name] = nbytes
            self._weights[name] = _mtime(dirs[name] / "model.safetensors")
            times = [t for t in (_mtime(dirs[name] / f) for f in files) if t is not None]
            found.append(
                {
                    "name": name,
                    "epoch": epoch_of(name),
                    "bytes": nbytes,
                    "complete": is_complete(name, files),
                    # when it was saved (its files' newest time): what the views list
                    "written_at": round(max(times), 3) if times else None,
                }
            )
        self._links = links
        if not found and not links:
            return
        best = links.get("checkpoint_best")
        self.writer.write(
            Kind.CKPT,
            {
                "event": "inventory",
                "path": str(root),
                "checkpoints": found,
                "best": Path(best).name if best else None,
            },
        )

    def close(self) -> None:
        pass


# ---- heartbeat ------------------------------------------------------------------------


class Heartbeat:
    """One ``heartbeat`` record per interval, even while the training loop hangs.

    ``trainer_stats()`` returns the trainer's writer figures and when they were
    published (the sidecar gets them through its pipe; a thread reads them
    directly). ``stats_age_s`` growing while heartbeats keep coming means the
    trainer's Python is stuck (a GIL-holding hang) or its writer is blocked.
    """

    name = "heartbeat"

    def __init__(
        self,
        writer: JsonlWriter,
        *,
        source: str,
        trainer_pid: int,
        trainer_stats: Callable[[], tuple[dict[str, Any], float | None]],
        sampler_cpu: Callable[[], float],
        sampler_errors: Callable[[], dict[str, int]],
    ) -> None:
        self.writer = writer
        self.source = source
        self.trainer_pid = trainer_pid
        self.trainer_stats = trainer_stats
        self.sampler_cpu = sampler_cpu
        self.sampler_errors = sampler_errors
        self.host = socket.gethostname()
        self._last = time.monotonic()
        self._last_cpu = sampler_cpu()

    def sample(self, now: float) -> None:
        mono = time.monotonic()
        cpu = self.sampler_cpu()
        interval = mono - self._last
        cpu_pct = 100.0 * (cpu - self._last_cpu) / interval if interval > 0 else 0.0
        self._last, self._last_cpu = mono, cpu
        stats, published = self.trainer_stats()
        payload: dict[str, Any] = dict(stats)
        payload.update(
            source=self.source,
            interval_s=round(interval, 3),
            stats_age_s=round(now - published, 3) if published is not None else None,
            sampler_cpu_s=round(cpu, 4),
            sampler_cpu_pct=round(cpu_pct, 3),
            sampler_errors=self.sampler_errors(),
            host=self.host,
        )
        st = procs.stat(self.trainer_pid)
        payload["trainer"] = {
            "pid": self.trainer_pid,
            "alive": st is not None and st.state not in ("Z", "X"),
            "state": st.state if st else None,
            "cpu_s": round(st.cpu_s, 2) if st else None,
        }
        if self.source == "sidecar":
            own = self.writer.figures()
            payload["sidecar"] = {
                k: own[k] for k in ("written", "dropped", "bytes", "errors", "queued")
            }
        self.writer.write(Kind.HEARTBEAT, payload)

    def close(self) -> None:
        pass


# ---- the set --------------------------------------------------------------------------


class SamplerSet:
    """The enabled samplers and when each is due; one host (sidecar or thread) drives it."""

    def __init__(self, samplers: list[Any], intervals: dict[str, float]) -> None:
        self.samplers = samplers
        self.intervals = intervals
        now = time.monotonic()
        self._due = {s.name: now for s in samplers}
        self.errors: dict[str, int] = {}
        self.last_error = ""

    def get(self, name: str) -> Any:
        for s in self.samplers:
            if s.name == name:
                return s
        return None

    def next_due(self) -> float:
        return min(self._due.values(), default=time.monotonic() + 3600.0)

    def run_due(self) -> None:
        mono = time.monotonic()
        now = time.time()
        for s in self.samplers:
            if self._due[s.name] > mono:
                continue
            self._due[s.name] = mono + self.intervals[s.name]
            self.run_one(s, now)

    def run_one(self, s: Any, now: float) -> None:
        try:
            s.sample(now)
        except Exception as e:  # a sampler's bug must not stop the others
            self.errors[s.name] = self.errors.get(s.name, 0) + 1
            self.last_error = f"{s.name}: {type(e).__name__}: {e}"[:300]

    def close(self) -> None:
        for s in self.samplers:
            try:
                s.close()
            except Exception as e:
                self.errors[s.name] = self.errors.get(s.name, 0) + 1
                self.last_error = f"{s.name}: {type(e).__name__}: {e}"[:300]
