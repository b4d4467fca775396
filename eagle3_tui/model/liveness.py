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

DATALOADER_WORKER = "pt_data_worker"
"""The name torch gives its dataloader workers (``/proc/PID/comm``) once their loop runs."""

_UNNAMED = (None, "", "child", "spawned", "marked")
"""Roles a process of the run gets from where it was found, before its name said more:
a child of the trainer, a multiprocessing child still importing, an escaped process
carrying the run's marker."""


def process_role(role: str | None, comm: str) -> str | None:
    """A process's role as the monitor names it: ``worker`` for a dataloader worker,
    known by its name (what the banner shows: ``pid N pt_data_worker``) where the look
    that first recorded it knew it only as a child (torch names a worker when its loop
    starts, after that look; a SIGKILLed trainer's workers are found by its marker);
    else the role as found."""
    if comm == DATALOADER_WORKER and role in _UNNAMED:
        return "worker"
    return role


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
    role: str | None = None
    """What it is, as the host found it (``worker``, ``helper``, ``child``...; None: not
    said); :attr:`kind` is what the monitor calls it."""

    @property
    def kind(self) -> str | None:
        """Its role as the monitor names it (:func:`process_role`): a dataloader worker
        by its name whatever the host's row said."""
        return process_role(self.role, self.comm)


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
    checkpoints_present: bool | None = None
    """Whether the host found a numbered checkpoint (``checkpoints/N``, what a resume
    continues from: ``agent/checkpoints.latest_numbered``) in the run's checkpoint
    directory at its last look; None: not looked (an older agent, nothing asked)."""

    def set_checkpoints(self, present: bool | None) -> None:
        """The host's word on the run's numbered checkpoints (see ``checkpoints_present``)."""
        self.checkpoints_present = present

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
