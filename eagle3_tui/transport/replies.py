"""The agent's replies as typed values: decoded once, where they arrive.

The agent (standard library only) writes its results as JSON objects and names its
events and error kinds in :mod:`eagle3_tui.agent.names`; here each operation's
``result`` becomes a msgspec Struct (:class:`Status`, :class:`KillReport`,
:class:`ResumeReport`, :class:`RunsReport`), and an error event's kind an
:class:`ErrorKind`. A reply that does not have the shape its operation promises is
an :class:`AgentProtocolError` (one line, naming the field), never a ``KeyError``
further up. The run state takes a status in one place: :func:`apply_status`.

No textual, no asyncssh here.
"""

from __future__ import annotations

import enum
from typing import Any, Literal, TypeVar

import msgspec

from eagle3_tui.agent import names
from eagle3_tui.model.state import Leftover, RunState
from eagle3_tui.transport.base import TargetError


class ErrorKind(enum.StrEnum):
    """An error event's ``kind`` (the agent's ``names.ERROR_KINDS``, and ``UNKNOWN`` for
    a kind this client does not know: a newer agent's)."""

    INVALID = names.ERR_INVALID
    MISSING = names.ERR_MISSING
    REFUSED = names.ERR_REFUSED
    NOT_TRAINING = names.ERR_NOT_TRAINING
    PERMISSION = names.ERR_PERMISSION
    GONE = names.ERR_GONE
    NO_MANIFEST = names.ERR_NO_MANIFEST
    UNKNOWN = "unknown"

    @classmethod
    def of(cls, value: object) -> ErrorKind:
        try:
            return cls(str(value))
        except ValueError:
            return cls.UNKNOWN


class AgentProtocolError(TargetError):
    """The agent answered, but not with the shape its operation promises (an agent of
    another version, a damaged reply)."""


class Reply(msgspec.Struct, kw_only=True, omit_defaults=False):
    """What every result carries: the operation it answers (unknown fields are ignored:
    an agent may say more than this client reads)."""

    op: str = ""


class Resolved(Reply, kw_only=True):
    """``resolve``: the run directory a target means, checked to exist."""

    run_dir: str
    has_file: bool = False
    has_manifest: bool = False
    host: str | None = None


# ---- status ---------------------------------------------------------------------------


class LeftoverProcess(msgspec.Struct, kw_only=True):
    """A process of the run alive though its trainer is not."""

    pid: int
    comm: str = "?"
    role: str | None = None
    rss_bytes: int | None = None
    gpu_bytes: int | None = None
    """GPU memory it holds, summed over devices (None: NVML cannot say)."""
    gpus: list[int] = msgspec.field(default_factory=list)


class Status(Reply, kw_only=True):
    """``status`` of a registered run (and ``describe`` of a training without telemetry):
    whether the manifest's trainer lives (PID, start time and boot id checked), why not,
    the manifest, what of the run outlived the trainer, the host and its clock."""

    alive: bool
    problem: str | None = None
    manifest: dict[str, Any] = msgspec.field(default_factory=dict)
    leftovers: list[LeftoverProcess] = msgspec.field(default_factory=list)
    host: str | None = None
    now: float | None = None
    """The host's clock when it answered."""
    run_dir: str | None = None
    row: dict[str, Any] | None = None
    """``describe`` only: the discovered training's row."""


def apply_status(state: RunState, status: Status, now: float) -> None:
    """The host's evidence into the run state (asked at ``now``, the client's clock): the
    manifest, the host's clock, whether the trainer lives and what outlived it. The one
    place a status moves the model (the app's probe, the headless commands)."""
    if status.manifest:
        state.set_manifest(status.manifest)
    if status.now is not None:
        state.set_host_clock(status.now, now)
    left = () if status.alive else tuple(leftover_of(x) for x in status.leftovers)
    state.set_process(status.alive, now, left)


def leftover_of(x: LeftoverProcess) -> Leftover:
    return Leftover(x.pid, x.comm[:32], x.rss_bytes, x.gpu_bytes, tuple(x.gpus))


# ---- kill and resume ----------------------------------------------------------------


class ProcessReport(msgspec.Struct, kw_only=True):
    """One process a kill found: what it is, the signals sent, how it ended."""

    pid: int
    role: str = ""
    label: str | None = None
    comm: str | None = None
    signals: list[str] = msgspec.field(default_factory=list)
    outcome: str = ""
    exit_status: int | None = None
    ended: str | None = None


class CheckpointInfo(msgspec.Struct, kw_only=True):
    path: str
    problems: list[str] = msgspec.field(default_factory=list)
    global_step: int | None = None
    epoch: int | None = None
    local_step: int | None = None
    new: bool = True
    """``interrupted/`` only: whether this kill wrote it."""
    written_at: float | None = None


class Checkpoints(msgspec.Struct, kw_only=True):
    """What a stop leaves: ``interrupted/`` and the numbered one a resume takes."""

    dir: str | None = None
    latest: CheckpointInfo | None = None
    interrupted: CheckpointInfo | None = None


KillStatus = Literal["stopped", "not_running", "refused", "remaining", "error"]
ResumeStatus = Literal["started", "failed", "refused", "error"]


class KillReport(Reply, kw_only=True):
    status: KillStatus
    message: str = ""
    processes: list[ProcessReport] = msgspec.field(default_factory=list)
    checkpoints: Checkpoints = msgspec.field(default_factory=Checkpoints)
    signalled_trainer: bool = False
    host: str | None = None
    node_rank: int | None = None
    pid: int | None = None
    run_dir: str | None = None
    run_id: str | None = None
    where: str | None = None
    """A node's report in a multi-node one: which node."""
    nodes: list[KillReport] | None = None
    """Several nodes: each one's report (this one's fields are the first node's)."""


class ResumeReport(Reply, kw_only=True):
    status: ResumeStatus
    message: str = ""
    pid: int | None = None
    confirmed: bool = False
    log: str | None = None
    log_tail: str = ""
    command: list[str] = msgspec.field(default_factory=list)
    checkpoint: CheckpointInfo | None = None
    run_dir: str | None = None
    where: str | None = None
    nodes: list[ResumeReport] | None = None


# ---- runs -----------------------------------------------------------------------------

RunStateName = Literal["gone", "running", "dead"]


class RunEntry(msgspec.Struct, kw_only=True):
    """A run registered on the host, with its manifest's state."""

    run_dir: str
    run_id: str | None = None
    started_at: float | None = None
    exists: bool = True
    status: str | None = None
    """The manifest's: running, finished, interrupted, crashed."""
    pid: int | None = None
    alive: bool = False
    live_pid: int | None = None
    """``discover``: the live training this run is (shown once, as that)."""

    @property
    def state(self) -> str:
        """The one rule: ``gone`` (its directory is), ``running`` (its trainer lives),
        ``dead`` (its manifest says running, its trainer does not), else the manifest's
        status (``unknown`` when it has none)."""
        if not self.exists:
            return "gone"
        if self.alive:
            return "running"
        if self.status == "running":
            return "dead"
        return self.status or "unknown"


class RunsReport(Reply, kw_only=True):
    runs: list[RunEntry] = msgspec.field(default_factory=list)
    others: int = 0
    """Other users' runs left out."""
    index: str | None = None
    host: str | None = None


# ---- decoding -------------------------------------------------------------------------

R = TypeVar("R", bound=msgspec.Struct)


def decode(kind: type[R], fields: dict[str, Any], where: str = "the host") -> R:
    """``fields`` (a result event's) as ``kind``; a missing or mistyped field is an
    :class:`AgentProtocolError` naming it."""
    try:
        return msgspec.convert(fields, kind, str_keys=True)
    except msgspec.ValidationError as e:
        op = fields.get("op") or kind.__name__
        raise AgentProtocolError(
            f"{where}: the agent's {op} reply is not understood ({e}); is the agent of "
            "another eagle3-tui version?"
        ) from None


def to_json(reply: msgspec.Struct) -> str:
    """A reply as one JSON object (``--json``)."""
    return msgspec.json.encode(reply).decode()


def to_builtins(reply: msgspec.Struct) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(reply)
    return out
