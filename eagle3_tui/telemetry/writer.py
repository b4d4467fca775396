"""Append JSON lines to one file, whole lines only, never raising into the caller.

Each record is encoded into one ``bytes`` ending in ``\\n`` and handed to a single
``os.write`` on a file descriptor opened with ``O_APPEND``: the kernel appends it
at the current end of file in one piece, so a tail sees it at once (no user-space
buffer to flush) and never sees half a line or two writers' lines interleaved.

Standard library only (orjson is used when installed).
"""

from __future__ import annotations

import errno
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from eagle3_tui.telemetry.schema import SCHEMA_VERSION, to_jsonable

try:  # optional fast path
    import orjson

    def _dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)

except ImportError:  # pragma: no cover - exercised where orjson is absent
    import json

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()


@dataclass
class WriterStats:
    """What the writer has done so far; reported in heartbeats."""

    written: int = 0
    dropped: int = 0
    bytes: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    last_error: str = ""


class JsonlWriter:
    """Writes records to ``path`` as JSON lines with a per-writer sequence number.

    ``write`` never raises: a record that cannot be encoded or written is counted
    in :attr:`stats` (``dropped``) with the reason, and the caller carries on.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        rank: int = 0,
        writer_id: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = os.fspath(path)
        self.rank = rank
        self.writer_id = writer_id or f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._clock = clock
        self._lock = threading.Lock()
        self._seq = 0
        self.stats = WriterStats()
        self._fd: int | None = None
        self._open()

    def _open(self) -> None:
        try:
            self._fd = os.open(
                self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644
            )
        except OSError as e:
            self._fd = None
            self._count_error(e)

    def _count_error(self, e: BaseException) -> None:
        name = (
            errno.errorcode.get(e.errno, type(e).__name__)
            if isinstance(e, OSError) and e.errno
            else type(e).__name__
        )
        self.stats.errors[name] = self.stats.errors.get(name, 0) + 1
        self.stats.last_error = f"{name}: {e}"[:300]

    def write(self, kind: str, payload: Mapping[str, Any] | None = None) -> bool:
        """Append one record; returns False (and counts a drop) on any failure."""
        try:
            with self._lock:
                record: dict[str, Any] = {
                    "v": SCHEMA_VERSION,
                    "seq": self._seq,
                    "w": self.writer_id,
                    "ts": self._clock(),
                    "kind": kind,
                    "rank": self.rank,
                }
                if payload:
                    for k, v in payload.items():
                        if k not in record:
                            record[k] = to_jsonable(v)
                try:
                    line = _dumps(record) + b"\n"
                except Exception as e:  # unserializable even after to_jsonable
                    self._count_error(e)
                    self.stats.dropped += 1
                    self._seq += 1  # the gap tells readers a record was lost here
                    return False
                self._seq += 1
                if self._fd is None:
                    self._open()
                    if self._fd is None:
                        self.stats.dropped += 1
                        return False
                n = os.write(self._fd, line)
                if n != len(line):  # a short write on a full disk: the line is torn
                    self.stats.dropped += 1
                    self._count_error(OSError(errno.ENOSPC, "short write"))
                    return False
                self.stats.written += 1
                self.stats.bytes += n
                return True
        except Exception as e:
            self.stats.dropped += 1
            self._count_error(e)
            return False

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                try:
                    os.close(self._fd)
                except OSError as e:
                    self._count_error(e)
                self._fd = None
