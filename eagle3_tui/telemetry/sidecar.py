"""Where the samplers run: a sidecar process (default) or a thread of the trainer.

The sidecar is ``python -m eagle3_tui.telemetry.sidecar CONFIG_JSON``, started by
``attach()`` in a session of its own. Its stdin is a pipe from the trainer,
which sends JSON lines: its writer's figures every interval (``stats``), the
speculators messages about checkpoints (``message``), a new checkpoint dir
(``ckpt_dir``), ``finish`` and ``stop``. It writes its own records (its own
writer id and sequence) to the same ``metrics.jsonl``.

Why a process: the samplers matter most when the training loop hangs, and a
hang can hold the GIL (a C extension stuck without releasing it), which stops
every thread of the trainer, samplers included. The sidecar keeps sampling
and its heartbeat keeps coming, with ``stats_age_s`` growing, which is how a
reader tells "Python is stuck" from "the process is gone". When the pipe
closes without ``finish`` or ``stop``, the trainer died (a SIGKILL, the OOM
killer, ``os._exit``): the sidecar writes a ``crash`` lifecycle event and exits.

The thread host (``samplers="thread"``, or when the sidecar cannot start) runs
the same samplers in a daemon thread of the trainer: enough for hangs that
release the GIL (a deadlock on a lock, a stuck collective, a blocked read),
not for those that hold it.

Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_tui.telemetry import procs
from eagle3_tui.telemetry.isolation import module_argv
from eagle3_tui.telemetry.manifest import read_manifest, update_manifest
from eagle3_tui.telemetry.nvml import Nvml, PynvmlApi, RecordedNvml
from eagle3_tui.telemetry.parsing import parse_json
from eagle3_tui.telemetry.reads import ReadsReceiver
from eagle3_tui.telemetry.samplers import (
    CheckpointWatcher,
    GpuSampler,
    Heartbeat,
    IoSampler,
    SamplerConfig,
    SamplerSet,
    node_device_entries,
    own_device_entries,
)
from eagle3_tui.telemetry.schema import MANIFEST_FILE, METRICS_FILE, Kind
from eagle3_tui.telemetry.writer import JsonlWriter

if TYPE_CHECKING:  # an alias for annotations only: the trainer's Python may be 3.8
    Op = dict[str, Any]


def procs_host() -> str:
    import socket

    return socket.gethostname()


def make_nvml(cfg: SamplerConfig) -> Nvml:
    if cfg.nvml_fixture:
        return RecordedNvml(cfg.nvml_fixture)
    return PynvmlApi()


class SamplerHost:
    """Drives a :class:`SamplerSet` and applies the trainer's ops; one loop, one thread.

    ``get_ops(timeout)`` returns the ops that arrived (waiting at most
    ``timeout`` s), or None when the trainer is gone (the pipe closed).
    """

    def __init__(
        self,
        cfg: SamplerConfig,
        writer: JsonlWriter,
        *,
        source: str,
        get_ops: Callable[[float], list[Op] | None],
        sampler_cpu: Callable[[], float],
        local_stats: Callable[[], dict[str, Any]] | None = None,
        exclude: Callable[[], set[int]] | None = None,
    ) -> None:
        self.cfg = cfg
        self.writer = writer
        self.source = source
        self.get_ops = get_ops
        self.local_stats = local_stats
        self._stats: dict[str, Any] = {}
        self._stats_ts: float | None = None
        self.finished = False
        self.stopped = False
        self.last_step: int | None = None
        # the trainer's children that are not dataloader workers: a tee, the sidecar itself
        self._exclude = exclude or (lambda: {*cfg.exclude_pids, os.getpid()})
        self.receiver: ReadsReceiver | None = None
        # held from the start, so that how the trainer ended can be read after it is reaped
        self.pidfd = procs.open_pidfd(cfg.trainer_pid)
        self.sset = self._build(sampler_cpu)

    def _run_pids(self) -> set[int]:
        pid = self.cfg.trainer_pid
        return {pid, *procs.descendants(pid)}

    def _node_pids(self) -> set[int]:
        """Every process of the node's ranks: the torchrun agent's descendants."""
        agent = self.cfg.launcher_pid
        if agent is None:
            return self._run_pids()
        return {agent, *procs.descendants(agent)}

    def _build(self, sampler_cpu: Callable[[], float]) -> SamplerSet:
        cfg = self.cfg
        samplers: list[Any] = []
        if cfg.interval_of("gpu") > 0 and cfg.gpu_scope == "node":
            samplers.append(
                GpuSampler(
                    self.writer,
                    make_nvml(cfg),
                    entries=node_device_entries(cfg.cuda_visible_devices, cfg.local_world_size),
                    run_pids=self._node_pids,
                    local_ranks=True,
                )
            )
        elif cfg.interval_of("gpu") > 0 and cfg.gpu_scope == "own":
            entries = own_device_entries(cfg.cuda_visible_devices, cfg.local_rank, cfg.world_size)
            samplers.append(
                GpuSampler(self.writer, make_nvml(cfg), entries=entries, run_pids=self._run_pids)
            )
        if cfg.interval_of("io") > 0:
            if cfg.reads_socket:
                try:
                    self.receiver = ReadsReceiver(cfg.reads_socket)
                except OSError as e:
                    self.writer.write(
                        Kind.LOG,
                        {
                            "level": "WARNING",
                            "logger": "eagle3_tui.telemetry",
                            "msg": f"no per-file read reports ({cfg.reads_socket}): {e}",
                        },
                    )
            samplers.append(
                IoSampler(
                    self.writer,
                    trainer_pid=cfg.trainer_pid,
                    receiver=self.receiver,
                    exclude=self._exclude,
                )
            )
        if cfg.interval_of("ckpt") > 0 and cfg.rank == 0:
            samplers.append(CheckpointWatcher(self.writer, cfg.checkpoint_dir))
        sset = SamplerSet(samplers, {s.name: cfg.interval_of(s.name) for s in samplers})
        if cfg.interval_of("heartbeat") > 0:
            hb = Heartbeat(
                self.writer,
                source=self.source,
                trainer_pid=cfg.trainer_pid,
                trainer_stats=self._trainer_stats,
                sampler_cpu=sampler_cpu,
                sampler_errors=lambda: dict(sset.errors),
            )
            sset.samplers.append(hb)
            sset.intervals[hb.name] = cfg.interval_of("heartbeat")
            sset._due[hb.name] = time.monotonic() + cfg.interval_of("heartbeat")
        return sset

    def _trainer_stats(self) -> tuple[dict[str, Any], float | None]:
        if self.local_stats is not None:
            return self.local_stats(), time.time()
        return self._stats, self._stats_ts

    def apply(self, op: Op) -> None:
        kind = op.get("op")
        if kind == "stats":
            stats = op.get("stats")
            if isinstance(stats, dict):
                self._stats = stats
                self._stats_ts = float(op.get("ts") or time.time())
                step = stats.get("last_step")
                self.last_step = step if isinstance(step, int) else self.last_step
        elif kind == "message":
            ckpt = self.sset.get("ckpt")
            if ckpt is not None:
                ckpt.on_message(str(op.get("text", "")), float(op.get("ts") or time.time()))
                self.sset.run_one(ckpt, time.time())
        elif kind == "ckpt_dir":
            ckpt = self.sset.get("ckpt")
            if ckpt is not None:
                ckpt.set_dir(op.get("path"))
        elif kind == "finish":
            self.finished = True
        elif kind == "stop":
            self.stopped = True

    def run(self) -> None:
        """Sample until ``stop`` (or the trainer is gone), then write the last figures."""
        while not self.stopped:
            timeout = max(0.0, self.sset.next_due() - time.monotonic())
            ops = self.get_ops(min(timeout, 1.0))
            if ops is None:
                self._trainer_gone()
                break
            for op in ops:
                self.apply(op)
            if self.stopped:
                break
            self.sset.run_due()
            if not procs.alive(self.cfg.trainer_pid, self.cfg.trainer_start_ticks):
                self._trainer_gone()
                break
        self._final()

    def _exit_status(self, wait_s: float = 1.0) -> int | None:
        """How the trainer ended; its parent (a shell, the torchrun agent) reaps it within
        moments, after which only the pidfd tells (Linux 6.15+)."""
        deadline = time.monotonic() + wait_s
        while True:
            status = procs.exit_status(self.cfg.trainer_pid, self.pidfd)
            if status is not None or time.monotonic() >= deadline:
                return status
            time.sleep(0.05)

    def _trainer_gone(self) -> None:
        if self.finished or self.stopped:
            return
        noticed = time.time()  # under torchrun, which rank went first matters
        status = self._exit_status()
        how = procs.describe_exit(status)
        self.writer.write(
            Kind.LIFECYCLE,
            {
                "event": "crash",
                "error": f"the trainer process {self.cfg.trainer_pid} exited without a "
                f"finish event ({how}{_exit_guess(status)})",
                "step": self.last_step,
                "pid": self.cfg.trainer_pid,
                "exit_status": status,
                "host": procs_host(),
                "detected_by": self.source,
            },
            ts=noticed,
        )
        if self.cfg.writes_manifest:  # the trainer cannot update its manifest any more: we do
            path = Path(self.cfg.run_dir) / MANIFEST_FILE
            try:
                manifest = read_manifest(path)
                if manifest.get("pid") == self.cfg.trainer_pid and manifest.get("status") in (
                    "running",
                    None,
                ):
                    update_manifest(path, status="crashed", finished_at=time.time())
            except (OSError, ValueError):
                pass

    def _close_pidfd(self) -> None:
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = None

    def _final(self) -> None:
        """The last look: what the checkpoint directory became, the last figures."""
        for name in ("ckpt", "heartbeat"):
            sampler = self.sset.get(name)
            if sampler is not None:
                self.sset.run_one(sampler, time.time())
        self.sset.close()
        self._close_pidfd()


# ---- the thread host (in the trainer) ---------------------------------------------------


class ThreadSamplers:
    """The samplers in a daemon thread of the trainer."""

    source = "thread"

    def __init__(
        self,
        cfg: SamplerConfig,
        writer: JsonlWriter,
        local_stats: Callable[[], dict[str, Any]],
    ) -> None:
        self._ops: queue.SimpleQueue[Op] = queue.SimpleQueue()
        self.pid: int | None = None
        self.host: SamplerHost | None = None
        self._thread = threading.Thread(
            target=self._run,
            args=(cfg, writer, local_stats),
            name="eagle3-tui-samplers",
            daemon=True,
        )
        self._thread.start()

    def _run(
        self, cfg: SamplerConfig, writer: JsonlWriter, local_stats: Callable[[], dict[str, Any]]
    ) -> None:
        # Built in this thread: the heartbeat's CPU figure is this thread's time.
        self.host = SamplerHost(
            cfg,
            writer,
            source=self.source,
            get_ops=self._get_ops,
            sampler_cpu=time.thread_time,
            local_stats=local_stats,
        )
        self.host.run()

    def _get_ops(self, timeout: float) -> list[Op] | None:
        ops: list[Op] = []
        try:
            ops.append(self._ops.get(timeout=timeout))
            while True:
                ops.append(self._ops.get_nowait())
        except queue.Empty:
            pass
        return ops

    def send(self, op: Op) -> bool:
        self._ops.put(op)
        return True

    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self, timeout: float = 3.0) -> None:
        self.send({"op": "stop"})
        self._thread.join(timeout)


# ---- the sidecar process -----------------------------------------------------------------


class SidecarClient:
    """The trainer's end of the sidecar: starts it, sends it ops (never blocking)."""

    source = "sidecar"

    def __init__(self, cfg: SamplerConfig) -> None:
        # isolated (python -I): nothing of the trainer's working directory is imported,
        # the package comes from where the trainer's came from (a live attach's private
        # directory too), the rest of the trainer's sys.path follows (isolation.py)
        self.proc = subprocess.Popen(
            module_argv("eagle3_tui.telemetry.sidecar", json.dumps(cfg.to_dict())),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=None,  # its tracebacks, if any, go where the trainer's go
            close_fds=True,
            start_new_session=True,  # a Ctrl+C or a group kill must not end it first
        )
        assert self.proc.stdin is not None
        self._fd = self.proc.stdin.fileno()
        os.set_blocking(self._fd, False)
        self.pid: int | None = self.proc.pid
        self.unsent = 0
        self._dead = False

    def send(self, op: Op) -> bool:
        if self._dead:
            return False
        data = json.dumps(op, separators=(",", ":"), default=str).encode() + b"\n"
        try:
            n = os.write(self._fd, data)
        except BlockingIOError:  # the sidecar is not reading: drop, never wait
            self.unsent += 1
            return False
        except OSError as e:
            if e.errno in (errno.EPIPE, errno.EBADF):
                self._dead = True
            self.unsent += 1
            return False
        if n != len(data):  # a partial line in the pipe: end it so the next one parses
            with contextlib.suppress(OSError):
                os.write(self._fd, b"\n")
            self.unsent += 1
            return False
        return True

    def alive(self) -> bool:
        return not self._dead and self.proc.poll() is None

    def close(self, timeout: float = 3.0) -> None:
        self.send({"op": "stop"})
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(1.0)


def _read_ops(fd: int, wake: list[int]) -> Callable[[float], list[Op] | None]:
    """Ops from ``fd``; a descriptor in ``wake`` that becomes readable (the trainer's
    pidfd) ends the wait early."""
    buf = bytearray()

    def get_ops(timeout: float) -> list[Op] | None:
        try:
            ready, _, _ = select.select([fd, *wake], [], [], timeout)
        except (InterruptedError, OSError):
            return []
        if fd not in ready:
            return []
        try:
            chunk = os.read(fd, 1 << 16)
        except OSError:
            return None
        if not chunk:
            return None
        buf.extend(chunk)
        ops: list[Op] = []
        while True:
            i = buf.find(b"\n")
            if i < 0:
                break
            line = bytes(buf[:i])
            del buf[: i + 1]
            try:
                op = parse_json(line)
            except ValueError:
                continue
            if isinstance(op, dict):
                ops.append(op)
        return ops

    return get_ops


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m eagle3_tui.telemetry.sidecar CONFIG_JSON", file=sys.stderr)
        return 2
    try:
        cfg = SamplerConfig.from_dict(parse_json(args[0]))
    except (ValueError, TypeError) as e:
        print(f"eagle3-tui sidecar: bad configuration: {e}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with contextlib.suppress(OSError):
        os.nice(5)
    writer = JsonlWriter(
        Path(cfg.run_dir) / METRICS_FILE,
        rank=cfg.rank,
        writer_id=f"{os.getpid()}-sidecar",
        run_id=cfg.run_id or None,
        columns=False,  # its events marked, no rows (the trainer's writer keeps them)
    )
    wake: list[int] = []
    read_ops = _read_ops(0, wake)

    def get_ops(timeout: float) -> list[Op] | None:
        if stop.is_set():
            return [{"op": "stop"}]
        return read_ops(timeout)

    host = SamplerHost(
        cfg,
        writer,
        source="sidecar",
        get_ops=get_ops,
        sampler_cpu=time.process_time,
    )
    if host.pidfd is not None:
        wake.append(host.pidfd)  # readable the moment the trainer exits
    host.run()
    writer.close(5.0)
    return 0


def _exit_guess(status: int | None) -> str:
    """What an exit without a finish event may have been, as far as its status tells."""
    if status is None:
        return ": killed by a signal, os._exit, or out of memory?"
    if status == -9:
        return ": a kill -9, or the kernel's out-of-memory killer (dmesg says which)"
    if status < 0:
        return ""
    return ": os._exit, or an error that ended it without Python's cleanup"


if __name__ == "__main__":
    sys.exit(main())
