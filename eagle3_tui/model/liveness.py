"""What the client knows of a run from outside its file: the host's clock, the link,
and a probe of the trainer's process.

Records carry the host's time (``ts``); the client turns its own clock into the
host's with the offset measured when it asked the host (:meth:`Liveness.host_time`).
While the link is down no data can arrive, so silence then says nothing of the
trainer (model/health.py judges on what arrived before). A probe of the process
(the agent's ``status``, or a ``proc`` record of a run observed without telemetry)
says whether the trainer is alive, and what of the run outlived it.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Leftover:
    """A process of the run still alive after its trainer is gone (a probe's finding)."""

    pid: int
    comm: str
    rss_bytes: int | None
    gpu_bytes: int | None
    """GPU memory it holds, summed over devices (None: NVML cannot say)."""
    gpus: tuple[int, ...] = ()
    gone: bool = False
    """Found gone by a later look (kept: what was alive when the trainer ended)."""


@dataclass
class Liveness:
    """The host's clock, the link and the probe, of one run (``RunState.liveness``)."""

    clock_offset: float = 0.0
    """The host's clock minus the client's (records carry the host's ``ts``)."""
    link_down_since: float | None = None
    """Client time since which no data can arrive (None: the link is up, data current)."""
    link_detail: str = ""
    process_alive: bool | None = None
    process_checked_at: float | None = None
    process_state: str | None = None
    """The live trainer's state as the probe found it (``T``: held stopped)."""
    leftovers: tuple[Leftover, ...] = ()
    """Processes of the run alive after its trainer (dataloader workers...): from a probe."""
    copy_of: str | None = None
    """The run directory this one is a copy of (its host's word): the run is written
    there; this one's records end where it was copied."""
    original_alive: bool | None = None
    """That run's trainer alive (its host's word)."""

    def set_copy(self, original: str, alive: bool) -> None:
        self.copy_of, self.original_alive = original, alive

    def set_host_clock(self, host_now: float, client_now: float) -> None:
        """The host's clock read at ``client_now``: records' ``ts`` are in its time."""
        self.clock_offset = host_now - client_now

    def host_time(self, client_now: float) -> float:
        return client_now + self.clock_offset

    def set_link(self, up: bool, at: float, detail: str = "") -> None:
        """Whether data can reach the client (client clock ``at``). Up means current:
        everything the host wrote until the reconnection has been read."""
        if up:
            self.link_down_since = None
            self.link_detail = ""
        else:
            if self.link_down_since is None:
                self.link_down_since = at
            self.link_detail = detail

    def set_process(
        self,
        alive: bool | None,
        checked_at: float,
        leftovers: Iterable[Leftover] = (),
        state: str | None = None,
    ) -> None:
        """A probe's finding at ``checked_at`` (the host's time)."""
        self.process_alive = alive
        self.process_checked_at = checked_at
        self.leftovers = tuple(leftovers)
        self.process_state = state if alive else None

    def take_link(self, other: Liveness) -> None:
        """The clock and the link as ``other`` knows them (the probe stays this one's)."""
        self.clock_offset = other.clock_offset
        self.link_down_since, self.link_detail = other.link_down_since, other.link_detail
