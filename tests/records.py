"""Builders of schema-v1 lines for tests (the same shape the telemetry writes)."""

from __future__ import annotations

import json
from typing import Any


class Lines:
    """Makes envelope-complete JSON lines with increasing seq and ts."""

    def __init__(self, writer: str = "w1", t0: float = 1_000_000.0, dt: float = 1.0) -> None:
        self.writer = writer
        self.seq = 0
        self.ts = t0
        self.dt = dt

    def make(self, kind: str, **payload: Any) -> bytes:
        rec = {
            "v": 1,
            "seq": self.seq,
            "w": self.writer,
            "ts": self.ts,
            "kind": kind,
            "rank": 0,
            **payload,
        }
        self.seq += 1
        self.ts += self.dt
        return (json.dumps(rec) + "\n").encode()

    def train(
        self,
        step: int,
        loss: float,
        acc: tuple[float, ...] = (0.5, 0.3, 0.2),
        epoch: int = 0,
        **extra: Any,
    ) -> bytes:
        metrics: dict[str, Any] = {"loss": loss}
        full = 1.0
        for k, a in enumerate(acc):
            metrics[f"loss_{k}"] = loss / len(acc)
            metrics[f"cond_acc_{k}"] = a
            full *= a
            metrics[f"full_acc_{k}"] = full
        return self.make(
            "train",
            step=step,
            global_step=step,
            epoch=epoch,
            train=metrics,
            profile={"step_ms": 100.0, "fetch_ms": 5.0, "fetch_frac": 0.05, "tokens_per_s": 1000.0},
            **({"lr": 0.001} | extra),
        )

    def val(self, step: int, epoch: int, loss: float) -> bytes:
        return self.make(
            "val", step=step, epoch=epoch, val={"loss_epoch": loss, "full_acc_0_epoch": 0.4}
        )

    def event(self, event: str, **fields: Any) -> bytes:
        return self.make("lifecycle", event=event, **fields)

    def log(self, msg: str, level: str = "INFO", logger: str = "speculators") -> bytes:
        return self.make("log", level=level, logger=logger, msg=msg)

    def gpu(self, util: float, devices: int = 2, mem_used: float = 7e10) -> bytes:
        devs = [
            {
                "index": i,
                "name": "NVIDIA H100",
                "util": util,
                "mem_used": mem_used,
                "mem_total": 8.5e10,
                "power_w": 600.0,
                "temp_c": 60.0,
                "pids": [100 + i],
            }
            for i in range(devices)
        ]
        return self.make("gpu", status="ok", devices=devs)

    def no_driver(self) -> bytes:
        return self.make("gpu", status="no_driver", error="NVML Shared Library Not Found")

    def io(self, read_bytes: float, files: tuple[str, ...] = ("hs_1.safetensors",)) -> bytes:
        workers = [{"pid": 200, "role": "worker", "read_bytes": read_bytes, "files": list(files)}]
        return self.make(
            "io",
            interval_s=1.0,
            workers=workers,
            bytes=read_bytes,
            files_read=len(files) if read_bytes else 0,
        )

    def ckpt(self, event: str, path: str, **fields: Any) -> bytes:
        return self.make("ckpt", event=event, path=path, **fields)

    def heartbeat(self, written: int = 0, dropped: int = 0) -> bytes:
        return self.make("heartbeat", written=written, dropped=dropped, bytes=0)

    def proc(
        self,
        alive: bool = True,
        cpu_pct: float | None = 100.0,
        log_grew: float = 0.0,
        started: float = 1_000_000.0,
        pid: int = 4242,
        **info: Any,
    ) -> bytes:
        """What the agent writes about a training observed without telemetry."""
        process = {
            "pid": pid,
            "started": started,
            "telemetry": False,
            "command": ["python", "train.py"],
            "cwd": "/work/exp7",
            "user": "alice",
            "log_file": "/work/exp7/train.log",
            "log_bytes": 1000.0,
            "log_grew": log_grew,
            "checkpoint_dir": "/work/exp7/checkpoints",
            "cpu_pct": cpu_pct,
            **info,
        }
        members = [
            {"pid": pid, "role": "trainer", "comm": "python", "state": "R", "cpu_pct": cpu_pct},
            {"pid": pid + 1, "role": "worker", "comm": "pt_data_worker", "state": "S"},
        ]
        return self.make("proc", alive=alive, process=process, processes=members)

    def bar(self, epoch: int, n: int, total: int, elapsed_s: float, phase: str = "train") -> bytes:
        """An epoch progress bar of the trainer's output."""
        bar = {"epoch": epoch, "phase": phase, "n": n, "total": total, "done": n >= total}
        bar |= {"elapsed_s": elapsed_s, "remaining_s": 0.0, "rate": n / elapsed_s}
        return self.make("progress", bar=bar)

    def at(self, ts: float) -> Lines:
        """Set the timestamp of the next line."""
        self.ts = ts
        return self
