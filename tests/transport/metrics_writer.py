"""A small trainer's writer for the file-change tests: ``python metrics_writer.py RUN_DIR
RUN_ID`` appends a training step and a heartbeat to ``RUN_DIR/metrics.jsonl`` every
``INTERVAL`` seconds, in the telemetry's schema, until ``RUN_DIR/stop`` exists (and
waits between two ticks while ``RUN_DIR/pause`` exists, saying so with ``RUN_DIR/paused``).

What it does with its file is what the telemetry's writer does (the lines are written
by hand here, one ``os.write`` per tick on an ``O_APPEND`` descriptor): before each
write it looks whether the path still holds its file. Deleted: it creates it again;
replaced: it moves the other file aside (``metrics.jsonl.replaced-N``) and creates its
own; truncated: it goes on in it. The first line after such a change is a ``lifecycle``
``file`` event. A write that fails (a full disk) drops its records, whose sequence
numbers are spent; the first line once writes succeed again is a ``write_gap`` event
with their exact count. Standard library only.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from typing import Any

INTERVAL = 0.05
WRITER = "trainer-1"


class Writer:
    def __init__(self, run_dir: str, run_id: str) -> None:
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.run_id = run_id
        self.seq = 0
        self.step = 0
        self.fd = self._create()
        self.ident = self._ident(os.fstat(self.fd))
        self.end = 0  # the file's size after this writer's last write
        self.moved = 0
        self.dropped = 0
        self.errors: dict[str, int] = {}
        self.pending: list[tuple[str, dict[str, Any]]] = []  # events to write first
        self.gap: dict[str, Any] | None = None
        self.torn = False  # a short write left a line without its newline

    def _create(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    @staticmethod
    def _ident(st: os.stat_result) -> tuple[int, int]:
        return (st.st_dev, st.st_ino)

    def line(self, kind: str, **payload: Any) -> bytes:
        rec = {"v": 1, "seq": self.seq, "w": WRITER, "ts": time.time(), "kind": kind, "rank": 0}
        self.seq += 1
        return (json.dumps({**rec, **payload}) + "\n").encode()

    def check_file(self) -> None:
        """Is the path still this writer's file? If not, make it so, and say what was."""
        try:
            st: os.stat_result | None = os.stat(self.path)
        except FileNotFoundError:
            st = None
        extra: dict[str, Any] = {}
        if st is None:
            change = "deleted"
        elif self._ident(st) != self.ident:
            change = "replaced"
            self.moved += 1
            aside = f"{self.path}.replaced-{self.moved}"
            os.rename(self.path, aside)  # the other file kept, beside
            extra["moved_to"] = os.path.basename(aside)
        elif st.st_size < self.end:
            change = "truncated"
        else:
            return
        previous = {"identity": f"{self.ident[0]}:{self.ident[1]}", "size": self.end}
        if change != "truncated":
            os.close(self.fd)
            self.fd = self._create()
            self.ident = self._ident(os.fstat(self.fd))
        self.end = os.fstat(self.fd).st_size
        self.pending.append(
            (
                "file",
                {
                    "change": change,
                    "run_id": self.run_id,
                    "file": "metrics.jsonl",
                    "noticed": time.time(),
                    "previous": previous,
                    "written_before": self.seq,
                    **extra,
                },
            )
        )

    def tick(self) -> None:
        self.check_file()
        lines: list[bytes] = []
        if self.gap is not None:
            gap = self.gap
            lines.append(self.line("lifecycle", event="write_gap", until=time.time(), **gap))
        lines += [self.line("lifecycle", event=event, **fields) for event, fields in self.pending]
        lines.append(
            self.line(
                "train",
                step=self.step,
                global_step=self.step,
                epoch=self.step // 100,
                train={"loss": 2.0, "full_acc_0": 0.5, "cond_acc_0": 0.5},
                lr=0.001,
            )
        )
        lines.append(
            self.line(
                "heartbeat",
                written=self.seq,
                dropped=self.dropped,
                bytes=self.end,
                errors=dict(self.errors),
            )
        )
        self.step += 1
        data = b"".join(lines)
        if self.torn:
            data = b"\n" + data
        said = (1 if self.gap is not None else 0, len(self.pending))
        try:
            n = os.write(self.fd, data)
        except OSError as e:
            self.failed(lines, 0, e.errno or 0, said)
            return
        done = n - (1 if self.torn else 0)
        self.torn = False
        if n < len(data):
            self.failed(lines, done, errno.ENOSPC, said)
            return
        self.end = os.fstat(self.fd).st_size
        self.pending, self.gap = [], None

    def failed(self, lines: list[bytes], written: int, err: int, said: tuple[int, int]) -> None:
        """Records not written (whole lines past ``written`` bytes): their numbers are
        spent; once writes succeed, a ``write_gap`` says how many. ``said``: how many of
        ``lines`` were the gap's event and the file events (first, in that order)."""
        whole = 0
        for ln in lines:
            if written < len(ln):
                break
            written -= len(ln)
            whole += 1
        if written > 0:  # a torn line: ended before anything else is written
            self.torn = True
        self.end = os.fstat(self.fd).st_size
        gap_line, events = said
        if gap_line and whole >= 1:
            self.gap = None  # said: what fails now is a gap of its own
        if whole >= gap_line + events:
            self.pending = []
        lost = lines[whole:]
        if not lost:
            return
        first = json.loads(lost[0])["seq"]
        if self.gap is None:
            name = errno.errorcode.get(err, "EIO")
            self.gap = {"reason": name, "records": 0, "first_seq": first, "since": time.time()}
        self.gap["records"] += len(lost)
        self.gap["last_seq"] = first + len(lost) - 1
        self.dropped += len(lost)
        name = errno.errorcode.get(err, "EIO")
        self.errors[name] = self.errors.get(name, 0) + 1


def main() -> None:
    run_dir, run_id = sys.argv[1], sys.argv[2]
    writer = Writer(run_dir, run_id)
    stop, pause, paused = (os.path.join(run_dir, name) for name in ("stop", "pause", "paused"))
    while not os.path.exists(stop):
        if os.path.exists(pause):  # the test acts on the file between two ticks
            os.close(os.open(paused, os.O_WRONLY | os.O_CREAT, 0o644))
            while os.path.exists(pause):
                time.sleep(0.01)
            os.unlink(paused)
        writer.tick()
        time.sleep(INTERVAL)


if __name__ == "__main__":
    main()
