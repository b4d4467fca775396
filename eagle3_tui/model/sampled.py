"""What the sidecar's samplers said of a run: GPUs, reads, heartbeats, the stack.

Of a long run's samples the bounded histories keep only the newest few hundred
(model/samples.py). A catch-up meets tens of thousands of them: they wait in
:attr:`Samplers.pending`, undecoded, and only those a history keeps are decoded and
applied when the state settles (:meth:`~eagle3_tui.model.state.RunState.settle`).
A ``stack`` record (where the trainer's main thread was when its steps stopped) is
rare and applied as it comes.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from eagle3_tui.model.records import (
    DECODE_ERRORS,
    Deferred,
    GpuDevice,
    IoWorker,
    Malformed,
    Record,
    gpu_devices,
    io_workers,
)
from eagle3_tui.model.samples import GPU_HISTORY, IO_HISTORY, SAMPLES_KEPT
from eagle3_tui.model.stack import StackSample

RECENT_FILES = 50
CPU_PIDS = 8
"""Trainers (by pid) whose CPU time is kept: the current one and a few before it."""
CPU_POINTS = 900
"""Heartbeats a trainer's CPU time is kept for (15 min at one a second)."""


@dataclass(frozen=True, slots=True)
class IoPoint:
    ts: float
    bytes: float
    files_read: int
    workers: int
    worker_bytes: float = 0.0
    """Of ``bytes``, what the dataloader workers read (not the trainer itself)."""
    rank: int = 0
    host: str = ""


@dataclass
class Samplers:
    """The samplers' histories of one run (``RunState.samplers``)."""

    gpu_status: str | None = None
    gpu_error: str | None = None
    gpu_devices: dict[tuple[str, int], GpuDevice] = field(default_factory=dict)
    """By (host, NVML index): several nodes of a run each have their device 0."""
    gpu_samples: deque[tuple[float, list[GpuDevice]]] = field(
        default_factory=lambda: deque(maxlen=GPU_HISTORY)
    )
    """Per device index: (ts, reading), oldest first."""
    _utils: dict[tuple[str, int], tuple[deque[int], deque[float]]] = field(
        default_factory=dict, repr=False
    )
    """Each device's utilization readings and the serial number of their sample: what
    :meth:`gpu_utils` hands out, less those older than the kept samples."""
    _gpu_count: int = 0
    """GPU samples applied so far (the next one's serial number)."""
    last_gpu_ts: float | None = None
    io_history: deque[IoPoint] = field(default_factory=lambda: deque(maxlen=IO_HISTORY))
    io_workers: dict[tuple[str, int], IoWorker] = field(default_factory=dict)
    """By (host, pid): the processes of each sampler's latest io sample (every rank's
    sampler reports its own; those alive then)."""
    recent_files: deque[tuple[float, int, str]] = field(
        default_factory=lambda: deque(maxlen=RECENT_FILES)
    )
    last_io_ts: float | None = None
    heartbeat: Record | None = None
    last_heartbeat_ts: float | None = None
    rank_heartbeats: dict[int, Record] = field(default_factory=dict)
    """The newest heartbeat of each rank (under torchrun every rank writes its own)."""
    held_since: dict[int, float] = field(default_factory=dict)
    """By trainer pid: the first heartbeat's time while a sidecar's every heartbeat since
    finds that trainer held in a stop (process state ``T``, ``t``: SIGSTOP, Ctrl-Z, a
    debugger); gone once one finds it otherwise. Of applied heartbeats: after a catch-up
    that kept only the newest, no earlier than that one (never longer than seen)."""
    cpu_seen: dict[int, deque[tuple[float, float]]] = field(default_factory=dict)
    """By trainer pid: (time, CPU seconds) of the trainer as its sidecar's heartbeats
    said, the newest :data:`CPU_POINTS`: whether it has run at all over a while."""
    stack: StackSample | None = None
    """The trainer's main thread when its steps last stopped (a ``stack`` record)."""
    pending: dict[str, deque[Record | Deferred]] = field(
        default_factory=lambda: {k: deque(maxlen=n) for k, n in SAMPLES_KEPT.items()}, repr=False
    )
    """Records of each sampler kind waiting to be applied, as many as its history keeps."""
    unsettled: bool = False
    """Whether any wait in :attr:`pending`."""

    def queue(self, kind: str, item: Record | Deferred) -> None:
        self.pending[kind].append(item)
        self.unsettled = True

    def take_pending(self) -> Iterator[tuple[str, Record | Malformed]]:
        """The waiting records, each kind's oldest first, decoded (an envelope only,
        an old sample of a catch-up, is skipped: it was counted); the queues empty."""
        if not self.unsettled:
            return
        self.unsettled = False
        for kind, queue in self.pending.items():
            while queue:
                item = queue.popleft()
                if isinstance(item, Deferred) and item.stub:
                    continue
                rec = item.resolve() if isinstance(item, Deferred) else item
                if isinstance(rec, Malformed | Record):
                    yield kind, rec

    def apply(self, kind: str, rec: Record) -> str | None:
        """A valid record of a sampler kind; what is wrong with its payload, if anything."""
        if kind == "gpu":
            return self._apply_gpu(rec)
        if kind == "io":
            return self._apply_io(rec)
        self.heartbeat = rec
        self.last_heartbeat_ts = rec.ts
        self.rank_heartbeats[rec.rank] = rec
        self._note_held(rec)
        return None

    def _note_held(self, rec: Record) -> None:
        trainer = rec.trainer if isinstance(rec.trainer, dict) else {}
        pid = trainer.get("pid")
        if type(pid) is not int:
            return
        if trainer.get("state") in ("T", "t") and trainer.get("alive") is not False:
            self.held_since.setdefault(pid, rec.ts)
        else:
            self.held_since.pop(pid, None)
        cpu = trainer.get("cpu_s")
        if not isinstance(cpu, int | float) or isinstance(cpu, bool) or rec.ts is None:
            return
        if math.isfinite(cpu) and cpu >= 0:
            seen = self.cpu_seen.get(pid)
            if seen is None:
                if len(self.cpu_seen) >= CPU_PIDS:  # a run of many resumes: the oldest go
                    del self.cpu_seen[next(iter(self.cpu_seen))]
                seen = self.cpu_seen[pid] = deque(maxlen=CPU_POINTS)
            if not seen or rec.ts > seen[-1][0]:
                seen.append((rec.ts, float(cpu)))

    def cpu_used(self, pid: int, since: float) -> tuple[float, float] | None:
        """The CPU seconds trainer ``pid`` used from its last heartbeat at or before
        ``since`` to its newest, and that span's start; None where its heartbeats do not
        reach back to ``since``."""
        seen = self.cpu_seen.get(pid)
        if not seen or seen[0][0] > since:
            return None
        ts, cpu = next(point for point in reversed(seen) if point[0] <= since)
        return seen[-1][1] - cpu, ts

    def _apply_gpu(self, rec: Record) -> str | None:
        try:
            devices = gpu_devices(rec)
        except DECODE_ERRORS as e:
            return f"gpu devices: {e}"
        self.last_gpu_ts = rec.ts
        self.gpu_status = rec.status or "ok"
        self.gpu_error = rec.error
        host = rec.host or ""
        serial = self._gpu_count
        for dev in devices:
            dev.host = host
            self.gpu_devices[(host, dev.index)] = dev
            if dev.util is not None:
                kept = self._utils.setdefault((host, dev.index), (deque(), deque()))
                kept[0].append(serial)
                kept[1].append(dev.util)
        self.gpu_samples.append((rec.ts, devices))
        self._gpu_count += 1
        return None

    def gpu_utils(self, key: tuple[str, int]) -> list[float]:
        """One device's (host, NVML index) utilization readings in the kept samples,
        oldest first (kept as they come: a snapshot a second need not walk 600 samples
        of 8 devices for each device)."""
        kept = self._utils.get(key)
        if kept is None:
            return []
        serials, utils = kept
        first = self._gpu_count - len(self.gpu_samples)  # the oldest kept sample's
        while serials and serials[0] < first:
            serials.popleft()
            utils.popleft()
        return list(utils)

    def _apply_io(self, rec: Record) -> str | None:
        try:
            workers = io_workers(rec)
        except DECODE_ERRORS as e:
            return f"io workers: {e}"  # (nothing moved: a malformed line)
        self.last_io_ts = rec.ts
        total = rec.bytes
        if total is None:
            total = sum(w.read_bytes or 0.0 for w in workers)
        files_read = (
            rec.files_read if rec.files_read is not None else sum(len(w.files) for w in workers)
        )
        host = rec.host or ""
        worker_bytes = sum(w.read_bytes or 0.0 for w in workers if w.role == "worker")
        self.io_history.append(
            IoPoint(
                rec.ts, float(total), files_read, len(workers), float(worker_bytes), rec.rank, host
            )
        )
        # each sampler's latest processes only: a worker of an earlier epoch, or the
        # trainer before a resume, is gone (each sample lists the trainer's children now)
        self.io_workers = {
            key: w for key, w in self.io_workers.items() if (w.host, w.rank) != (host, rec.rank)
        }
        for w in workers:
            w.rank = rec.rank
            w.host = host
            self.io_workers[(host, w.pid)] = w
            for f in w.files:
                self.recent_files.append((rec.ts, w.pid, f))
        return None
