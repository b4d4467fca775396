"""Room on the run's filesystem, reported while a run is followed: a full disk is not
a hang.

When the disk fills, every write of the telemetry fails (``ENOSPC``), the heartbeats
too, and the file simply stops growing: from the records alone that is a run that
stopped. ``os.statvfs`` of the run directory (microseconds) says why. ``follow``
sends a ``disk`` event when the room changed materially and at least every
:data:`EVERY_S` seconds; the client's ``LocalTransport`` uses the same watch.

Standard library only, Python 3.8+ (runs on the training host).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

CHECK_S = 2.0
"""How often the filesystem is looked at (one ``statvfs``, a few microseconds)."""
EVERY_S = 10.0
"""A report at least this often, changed or not: the client knows it is current."""
LOW_ROOM = 64 << 20
"""Below this much room every change is reported (the disk is filling up)."""
STEP = 1 << 20
"""Above it, a change of at least this much (or a thousandth of the filesystem)."""


def disk_space(run_dir: str, metrics: str | None = None) -> dict[str, Any] | None:
    """The room on ``run_dir``'s filesystem now (None when it cannot be read): ``avail``
    (``f_bavail``: what a user other than root may write), ``free`` (``f_bfree``, with
    the blocks reserved for root), ``total``, ``room`` (what the writer's own user may
    write: the owner of ``metrics`` (else of ``run_dir``), root using the reserve; 0 on
    a read-only filesystem), ``writer_uid``, ``read_only`` and ``at`` (this clock)."""
    try:
        st = os.statvfs(run_dir)
    except OSError:
        return None
    uid: int | None = None
    for path in (metrics, run_dir):
        if path is None:
            continue
        try:
            uid = os.stat(path).st_uid
        except OSError:
            continue
        break
    avail, free = st.f_bavail * st.f_frsize, st.f_bfree * st.f_frsize
    read_only = bool(st.f_flag & getattr(os, "ST_RDONLY", 1))
    room = 0 if read_only else (free if uid == 0 else avail)
    return {
        "avail": avail,
        "free": free,
        "total": st.f_blocks * st.f_frsize,
        "room": room,
        "writer_uid": uid,
        "read_only": read_only,
        "at": time.time(),
    }


class DiskWatch:
    """Decides when a report is due: :meth:`poll` returns one when the room changed
    materially since the last one sent, or :data:`EVERY_S` passed; it looks at most
    every :data:`CHECK_S` seconds."""

    def __init__(
        self,
        run_dir: str,
        metrics: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.run_dir = run_dir
        self.metrics = metrics
        self._clock = clock
        self._looked = -CHECK_S
        self._sent_at = -EVERY_S
        self._sent: dict[str, Any] | None = None

    def poll(self) -> dict[str, Any] | None:
        now = self._clock()
        if now - self._looked < CHECK_S:
            return None
        self._looked = now
        report = disk_space(self.run_dir, self.metrics)
        if report is None:
            return None
        if now - self._sent_at < EVERY_S and not self._material(report):
            return None
        self._sent, self._sent_at = report, now
        return report

    def _material(self, report: dict[str, Any]) -> bool:
        last = self._sent
        if last is None or report["read_only"] != last["read_only"]:
            return True
        was: int = last["room"]
        room: int = report["room"]
        if room == was:
            return False
        if min(room, was) < LOW_ROOM:
            return True
        total: int = report["total"]
        return abs(room - was) >= max(STEP, total // 1000)
