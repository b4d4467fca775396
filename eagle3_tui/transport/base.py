"""What every transport yields: file chunks with offsets, and link state changes.

A transport (a local directory, an SSH host) streams one file of a run as
:class:`Chunk` values that carry their byte offset, interleaved with
:class:`LinkChanged` values saying whether data can flow, :class:`FileChanged` when
the file was deleted, replaced or truncated under it (why and when; the stream then
starts the new file at 0), and :class:`DiskSpace`, the room on the run's filesystem.
The model's ``LineReader`` turns chunks into records; offsets make resumption exact.

No textual here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# the file changed under the stream, the room on its filesystem: said to the model as is
from eagle3_tui.model.files import DiskSpace as DiskSpace
from eagle3_tui.model.files import FileChanged as FileChanged

# what the transport's messages and reports quote of a run is shown through it
from eagle3_tui.model.inert import printable as printable


class Link(enum.Enum):
    """The state of the connection to where the run lives."""

    LOCAL = "local"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    RECONNECTING = "reconnecting"
    REFUSED = "refused"
    WAITING = "waiting"  # connected, the file does not exist yet
    UNREADABLE = "unreadable"  # a local file this user may not read (or of the wrong kind) now


@dataclass(frozen=True, slots=True)
class LinkChanged:
    link: Link
    detail: str = ""
    retry_in: float | None = None
    size: int | None = None
    """CONNECTED, LOCAL: the file's size when the host opened it (what was written while
    the link was down is read once the stream has delivered up to here; what a fleet
    waits for before a run counts as read)."""
    host_time: float | None = None
    """CONNECTED: the host's clock then (the records' ``ts`` are in its time)."""
    silent_s: float | None = None
    """RECONNECTING after a stream's agent said nothing for this long: the link went
    down that long ago (no data since then), not when that was noticed."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """Bytes of the file starting at ``offset``."""

    offset: int
    data: bytes
    stream: int = 0
    """Which file, when one run is read from several (the nodes of a multi-node run)."""
    span: int = -1
    """-1: ``data`` is bytes of the file; else a columns payload standing for ``span``
    bytes at ``offset`` (see ``channel.DataFrame``)."""

    @property
    def end(self) -> int:
        """The file offset just past what this chunk stands for."""
        return self.offset + (len(self.data) if self.span < 0 else self.span)


StreamEvent = Chunk | LinkChanged | FileChanged | DiskSpace


class TargetError(Exception):
    """The target cannot be used: a missing run, a refused host key... (one line)."""


class NoPermissionError(TargetError):
    """This user may not read the target: a run directory, its ``metrics.jsonl`` or
    ``run.json`` whose mode refuses it (``chmod 000``), or a directory above it that it
    may not enter. Its own exit status (see ``reports.exit_status_of``)."""


class UnreadableRunError(TargetError):
    """The run's file holds no valid record, only malformed lines: nothing of it can be
    compared. Its own exit status, ``summary``'s for such a run (``exits.UNREADABLE``)."""


class WrongKindError(TargetError):
    """The target is not what it must be: a file where a run directory should be, a
    directory, FIFO, device or dangling link where ``metrics.jsonl`` or ``run.json``
    should be a regular file. Its own exit status (see ``reports.exit_status_of``)."""


class SeveralRunsError(TargetError):
    """A headless command met several live trainings and was not told which (--pid).
    Its own exit status (see ``reports.exit_status_of``)."""
