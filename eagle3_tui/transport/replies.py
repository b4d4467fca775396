"""The agent's replies as typed values: decoded once, where they arrive.

The agent (standard library only) writes its results as JSON objects and names its
events and error kinds in :mod:`eagle3_tui.agent.names`; here each operation's
``result`` becomes a msgspec Struct (:class:`Status`, :class:`KillReport`,
:class:`ResumeReport`, :class:`RunsReport`, :class:`DiscoverReport`,
:class:`ChooseReply` with its :class:`ProcessRow`, :class:`AttachPlan`,
:class:`AttachResult`), and an error event's kind an
:class:`ErrorKind`. A reply that does not have the shape its operation promises is
an :class:`AgentProtocolError` (one line, naming the field), never a ``KeyError``
further up.
Nothing here changes the model: the API's ``apply_status`` (``api/reading.py``) is
where a status moves a run's state.

No textual, no asyncssh here.

Over 600 lines: one typed Struct per reply of each agent operation, decoded in one place
so that every key the agent sends has exactly one field
(``tests/transport/test_replies.py`` checks it).
"""

from __future__ import annotations

import enum
from typing import Any, Literal, TypeVar

import msgspec

from eagle3_tui.agent import names
from eagle3_tui.model.liveness import Leftover
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
    NOT_NAMED = names.ERR_NOT_NAMED
    WRONG_KIND = names.ERR_WRONG_KIND
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
    label: str = ""
    """What it is, where known (``worker, rank 0``, ``sidecar``)."""
    rss_bytes: int | None = None
    gpu_bytes: int | None = None
    """GPU memory it holds, summed over devices (None: NVML cannot say)."""
    gpus: list[int] = msgspec.field(default_factory=list)


class PlannedProcess(msgspec.Struct, kw_only=True):
    """A process a kill would act on now (``status`` with ``plan``, ``describe``): what it
    is (``label``: ``rank 1``, ``worker, rank 0``, ``sidecar``, ``torchrun agent``; else
    its ``role``), and whether the first SIGTERM goes to it."""

    pid: int
    role: str = ""
    label: str = ""
    comm: str = ""
    first: bool = False


class Status(Reply, kw_only=True):
    """``status`` of a registered run (and ``describe`` of a training without telemetry):
    whether the manifest's trainer lives (PID, start time and boot id checked), why not,
    the manifest, what of the run outlived the trainer, the host and its clock."""

    alive: bool
    problem: str | None = None
    manifest: dict[str, Any] = msgspec.field(default_factory=dict)
    leftovers: list[LeftoverProcess] = msgspec.field(default_factory=list)
    processes: list[PlannedProcess] = msgspec.field(default_factory=list)
    """What a kill would act on now (asked with ``plan``; always for ``describe``)."""
    host: str | None = None
    now: float | None = None
    """The host's clock when it answered."""
    run_dir: str | None = None
    row: ProcessRow | None = None
    """``describe`` only: the discovered training's row."""
    copy_of: str | None = None
    """The run directory this one was copied from (``runs.copy_of``): ``alive`` and the
    manifest's processes are that run's, none of them this copy's."""
    state: str | None = None
    """The live trainer's process state (``/proc``: R, S, D, T held stopped...)."""
    checkpoints_present: bool | None = None
    """Whether its checkpoint directory holds a numbered checkpoint (what a resume
    continues from); None: no checkpoint directory known."""


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


class SaveWait(msgspec.Struct, kw_only=True):
    """A checkpoint save a kill found in progress and waited for before its first signal."""

    path: str
    waited_s: float = 0.0
    finished: bool = False
    """Whether the save finished within the wait (else the kill went on regardless)."""


class SaveWaitReport(Reply, kw_only=True):
    """``save_wait``: a multi-node kill's first step, on each node."""

    save_wait: SaveWait | None = None
    run_dir: str | None = None


class RestartRecord(msgspec.Struct, kw_only=True):
    """What a kill of a training without telemetry recorded for ``resume`` to restart it
    with telemetry (agent/restart.py), or why it could not (``problem``)."""

    run_dir: str | None = None
    """The record's run directory (``…/eagle3-runs/restart-PID``)."""
    resume_command: list[str] = msgspec.field(default_factory=list)
    telemetry: bool = False
    """Whether the command starts the program under the telemetry bootstrap."""
    note: str | None = None
    """Why not, when it does not."""
    log_file: str | None = None
    """The user's own log, which the restart's output is appended to."""
    env_file: str | None = None
    env_vars: int = 0
    """How many variables the saved environment holds (all of the process's)."""
    lib: str | None = None
    """The telemetry package written for it (the user's cache)."""
    checkpoint_dir: str | None = None
    """Where its checkpoints were found (None: nowhere, and ``resume`` refuses: it would
    start over)."""
    problem: str | None = None


class Redo(msgspec.Struct, kw_only=True):
    """The steps a resume will do again: the checkpoint's step against the last step the
    run reached, as its records tell (``exact``), or its pace tells (about)."""

    checkpoint_step: int
    steps: int
    exact: bool = False
    source: str = ""
    """What tells: ``metrics`` (metrics.jsonl's last training step), ``log`` (its log's
    last metric line), ``bar`` (its epoch's progress bar in its log), ``pace`` (its
    checkpoints' pace: an estimate)."""
    last_step: int | None = None
    """The 0-based global step of its last step, when known."""
    pace: float | None = None
    """Steps per second (its checkpoints'), when the count is an estimate."""
    since_s: float | None = None
    """From the checkpoint's save to the stop, when the count is an estimate."""


class StopCheckpoint(msgspec.Struct, kw_only=True):
    """The numbered checkpoint a stop's ``interrupted/`` became (agent/checkpoints.py
    ``resume_at_stop``)."""

    path: str
    moved_aside: str | None = None
    """Where a numbered checkpoint of the same epoch that was there went (never removed)."""
    link: str | None = None


StopHow = Literal["step_boundary", "sigterm", "exited", "finished", "node0"]


class StopReport(msgspec.Struct, kw_only=True):
    """How a kill of a run with telemetry stopped it (agent/stopping.py): at a step
    boundary through speculators' interrupt path (``step_boundary``: ``global_step`` steps
    done, the ``local_step``-th of ``epoch``), by SIGTERM (``reason``: not asked, or no
    step boundary within ``wait_s``), ended by itself first (``exited``; ``finished``: its
    training done, nothing to resume), or with node 0's ranks (``node0``); the checkpoint
    a restart continues from and what it redoes."""

    how: StopHow
    reason: str | None = None
    request: str | None = None
    waited_s: float = 0.0
    wait_s: float | None = None
    phase: str | None = None
    epoch: int | None = None
    local_step: int | None = None
    global_step: int | None = None
    checkpoint: StopCheckpoint | None = None
    not_converted: list[str] = msgspec.field(default_factory=list)
    """Why the stop's save did not become the numbered checkpoint (a restart redoes)."""
    redo: Redo | None = None


class AttachedFirst(msgspec.Struct, kw_only=True):
    """A kill of a training without telemetry attached it first, so that it too stops at a
    step boundary and a restart redoes nothing (``attached``: ``run_dir`` is where its
    telemetry writes, the run the kill then stopped); or why not (``refused``: a check of
    attach's; ``skipped``: not tried; ``queued``/``failed``: tried, no telemetry came):
    then it was SIGTERM'd as before."""

    status: Literal["attached", "refused", "skipped", "queued", "failed"]
    message: str = ""
    run_dir: str | None = None
    mechanism: str | None = None
    stopped_ms: float | None = None
    """How long the injection held the trainer's main thread."""
    took_s: float = 0.0
    """From the plan to attached telemetry (its first step's metrics, when one came)."""


KillStatus = Literal["stopped", "not_running", "refused", "remaining", "error"]
ResumeStatus = Literal["started", "failed", "refused", "error", "plan"]


class SchedulerStep(msgspec.Struct, kw_only=True):
    """A Slurm job's part in a kill or a resume: what the scheduler was asked (``cancel``,
    ``requeue``, or nothing: ``None``) and the job's state after it."""

    job: str
    name: str | None = None
    action: str | None = None
    state: str | None = None
    reason: str | None = None
    exit_code: list[int] | None = None
    said: str | None = None
    """What the scheduler's command printed."""
    note: str | None = None


class KillReport(Reply, kw_only=True):
    status: KillStatus
    message: str = ""
    processes: list[ProcessReport] = msgspec.field(default_factory=list)
    checkpoints: Checkpoints = msgspec.field(default_factory=Checkpoints)
    signalled_trainer: bool = False
    save_wait: SaveWait | None = None
    """A checkpoint save in progress that the kill waited for before it signalled."""
    joined: bool = False
    """Another kill of the run was running: this one waited for it and sent no signal
    (its processes are the ones it found before it waited, and how each ended)."""
    host: str | None = None
    node_rank: int | None = None
    pid: int | None = None
    run_dir: str | None = None
    run_id: str | None = None
    where: str | None = None
    """A node's report in a multi-node one: which node."""
    nodes: list[KillReport] | None = None
    """Several nodes: each one's report (this one's fields are the first node's)."""
    restart: RestartRecord | None = None
    """A training without telemetry: what its restart will run (recorded before the
    first signal)."""
    stop: StopReport | None = None
    """A run with telemetry: how it was stopped and where a restart continues."""
    attached_first: AttachedFirst | None = None
    """A training without telemetry: whether the kill attached telemetry to it first (the
    client's step, before the agent's kill)."""
    slurm: SchedulerStep | None = None
    """A Slurm job: the scheduler's part (the client's step, after the stop)."""


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
    cwd: str | None = None
    """``plan``: the working directory it runs in."""
    env_vars: int | None = None
    """``plan``: how many variables its environment holds."""
    slurm: SchedulerStep | None = None
    """A Slurm job: requeued through the scheduler (its new trainer in ``pid``, once seen)."""
    redo: Redo | None = None
    restart: bool = False
    """The restart of a training that had no telemetry (its kill's record): it comes
    back with telemetry, its metrics in ``run_dir``."""


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
    user: str | None = None
    """The owner of its directory."""

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


class DiscoverReport(Reply, kw_only=True):
    """``discover``: the host's live trainings (with or without telemetry) and its
    registered runs (the login user's; ``others`` counts the ones left out)."""

    live: list[ProcessRow] = msgspec.field(default_factory=list)
    ended: list[ProcessRow] = msgspec.field(default_factory=list)
    """Trainings without telemetry eagle3-tui observed that have ended (their records)."""
    runs: list[RunEntry] = msgspec.field(default_factory=list)
    others: int = 0
    pruned: list[str] | None = None
    """``prune``: the run directories (gone) that the index forgot."""
    index: str | None = None
    host: str | None = None
    user: str | None = None
    uid: int | None = None
    now: float | None = None
    jobs: list[SlurmJob] | None = None
    """The user's Slurm jobs (the client's second call; None: no Slurm on the host)."""
    jobs_error: str | None = None
    """Why Slurm could not list them (its controller does not answer...)."""


# ---- live trainings ---------------------------------------------------------------------


class Member(msgspec.Struct, kw_only=True):
    """A process of a training's tree (``role``: launcher, trainer, rank, worker, helper,
    spawned, child)."""

    pid: int
    role: str = ""
    comm: str = ""


class RankRow(msgspec.Struct, kw_only=True):
    """A rank under a torchrun agent (``RANK`` and ``LOCAL_RANK`` as its environment
    says them: strings)."""

    pid: int
    rank: str | None = None
    local_rank: str | None = None


class GpuUse(msgspec.Struct, kw_only=True):
    """A GPU the training uses, and which of its processes hold it."""

    index: int
    pids: list[int] = msgspec.field(default_factory=list)


class NamedPid(msgspec.Struct, kw_only=True):
    """``describe`` of a worker or rank: the PID asked about, and its role."""

    pid: int
    role: str = ""


class ProcessRow(msgspec.Struct, kw_only=True):
    """A training found on the host by its processes (``discover``, ``choose``,
    ``describe``): the trainer's identity (PID, start time, boot id), where it works,
    whether telemetry is attached, its tree and why it is taken for a training."""

    pid: int
    start_ticks: int | None = None
    boot_id: str | None = None
    pgid: int | None = None
    sid: int | None = None
    """Its session (what a SIGKILLed trainer's workers still share: leftovers)."""
    launcher_pid: int | None = None
    """The torchrun agent (None: no torchrun)."""
    uid: int | None = None
    user: str = "?"
    mine: bool = False
    """Owned by the user the agent runs as."""
    readable: bool = False
    started: float | None = None
    """When the trainer started (the host's clock)."""
    command: list[str] = msgspec.field(default_factory=list)
    """The launcher's command line (torchrun's), else the trainer's."""
    cwd: str | None = None
    log: str | None = None
    """Where its output goes, when that is a file."""
    telemetry: bool = False
    handler: str | None = None
    """``json`` or ``printed``: no telemetry, but a handler of the user's own writes its
    metric dicts (to ``metrics_file``; read there); ``tensorboard``: speculators' own
    backend writes them as events (``metrics_file``: the event file); ``mlflow``,
    ``trackio``: its backend's store (``metrics_file``, the run ``metrics_run`` in it)."""
    metrics_file: str | None = None
    metrics_run: str | None = None
    metrics_note: str | None = None
    """Why its backend's store cannot be read (ambiguous, not trusted, on a server)."""
    backends: list[str] = msgspec.field(default_factory=list)
    """speculators' metric backends it is seen to use (its ``--logger``, its script)."""
    log_dir: str | None = None
    """Its ``--log-dir`` (the library's CLI: where its metric backends write), absolute."""
    run_dir: str | None = None
    run_id: str | None = None
    checkpoint_dir: str | None = None
    epochs: int | None = None
    ranks: list[RankRow] = msgspec.field(default_factory=list)
    workers: list[int] = msgspec.field(default_factory=list)
    members: list[Member] = msgspec.field(default_factory=list)
    evidence: list[str] = msgspec.field(default_factory=list)
    health: str | None = None
    """``discover``'s first verdict: running, waiting, silent, stalled."""
    health_reason: str | None = None
    cpu_pct: float | None = None
    gpus: list[GpuUse] = msgspec.field(default_factory=list)
    named_pid: NamedPid | None = None
    alive: bool = True
    """False: it has ended; this is the record eagle3-tui kept of it (``record``)."""
    ended_at: float | None = None
    """When a look found it gone (the host's clock)."""
    last_alive: float | None = None
    """Found gone later: the last look that found it alive (it ended in between)."""
    exit_status: int | None = None
    """How it ended where the kernel said (-N: signal N); None: not known."""
    record: str | None = None
    """Where its record is on the host (agent/timeline.py)."""


class Choice(enum.StrEnum):
    """What ``choose`` found a target to mean."""

    RUN = names.CHOICE_RUN
    PROCESS = names.CHOICE_PROCESS
    SEVERAL = names.CHOICE_SEVERAL


class ChooseReply(Reply, kw_only=True):
    """``choose``: a ``run`` (``run_dir``; ``row`` when it is the live training), a
    ``process`` (``row``: a training without telemetry) or ``several`` (``runs``: the
    live trainings), with a ``note`` saying why and a ``short`` form of it."""

    choice: Choice
    run_dir: str | None = None
    row: ProcessRow | None = None
    runs: list[ProcessRow] = msgspec.field(default_factory=list)
    note: str = ""
    short: str = ""
    host: str | None = None
    user: str | None = None

    def __post_init__(self) -> None:
        # what each choice needs (a ValueError here is a ValidationError to decode)
        if self.choice is Choice.RUN and not self.run_dir:
            raise ValueError("a `run` choice without its `run_dir`")
        if self.choice is Choice.PROCESS and self.row is None:
            raise ValueError("a `process` choice without its `row`")

    def chosen_run_dir(self) -> str:
        """The run directory a ``run`` choice names."""
        if not self.run_dir:
            raise AgentProtocolError(f"the agent's {self.choice} choice names no run directory")
        return self.run_dir

    def chosen_row(self) -> ProcessRow:
        """The training a ``process`` choice names."""
        if self.row is None:
            raise AgentProtocolError(f"the agent's {self.choice} choice names no process")
        return self.row


# ---- attach -----------------------------------------------------------------------------


class PythonInfo(msgspec.Struct, kw_only=True):
    """The interpreter a process runs, as ``/proc`` tells."""

    exe: str = "?"
    version: list[int] | None = None
    implementation: str = ""
    libpython: str | None = None
    abiflags: str = ""
    label: str = "?"


class AttachPlan(Reply, kw_only=True):
    """``attach`` ``plan``: every check passed; the process (PID, start time, boot id),
    its Python, how the code gets in, where the metrics go."""

    status: Literal["plan"] = "plan"
    pid: int
    start_ticks: int | None = None
    boot_id: str | None = None
    comm: str = ""
    uid: int | None = None
    gid: int | None = None
    user: str = "?"
    python: PythonInfo = msgspec.field(default_factory=PythonInfo)
    mechanism: str = ""
    """``ptrace`` (eagle3-tui's injector, CPython 3.8-3.13), ``gdb`` (where the injector
    cannot go) or ``remote_exec`` (3.14+)."""
    gdb: str | None = None
    injector_problem: str | None = None
    """Why not the injector, when gdb is the way in."""
    argv: list[str] = msgspec.field(default_factory=list)
    cwd: str | None = None
    run_dir: str | None = None
    log_file: str | None = None
    evidence: str = ""
    speculators_seen: bool = False
    files: str | None = None
    """The private directory of the trainer's user the telemetry package goes to."""
    key: str | None = None
    torchrun: bool = False
    host: str | None = None


class AttachCandidate(msgspec.Struct, kw_only=True):
    """A training ``attach`` could mean (several, and no PID given)."""

    pid: int
    argv: list[str] = msgspec.field(default_factory=list)
    user: str = "?"


class AttachResult(Reply, kw_only=True):
    """``attach``'s outcome: ``attached``, ``already``, ``queued``, or refused or failed
    (``reason`` names why: the exit status follows it). What the trainer wrote back
    (its step, the pause it caused) when the injection ran; the plan it carried out."""

    status: str
    reason: str | None = None
    message: str = ""
    pid: int | None = None
    run_dir: str | None = None
    run_id: str | None = None
    global_step: int | None = None
    epochs: int | None = None
    steps_per_epoch: int | None = None
    total_steps: int | None = None
    checkpoint_dir: str | None = None
    first_step: int | None = None
    first_metric_s: float | None = None
    """Seconds from the injection to the first step's metrics."""
    stopped_ms: float | None = None
    """How long the injection held the trainer stopped (its main thread for the
    injector, the whole process for gdb)."""
    registers: str | None = None
    """The injector's check of the registers it gave back: ``verified`` or ``differs``."""
    pause_ms: float | None = None
    """How long the trainer's main thread ran the attach."""
    tool_s: float | None = None
    traceback: str | None = None
    output: str | None = None
    """The tool's (gdb's) output, when it failed."""
    result_file: str | None = None
    lib: str | None = None
    candidates: list[AttachCandidate] = msgspec.field(default_factory=list)
    """``reason`` ``choose``: the trainings to choose among."""
    sampler_pid: int | None = None
    found_by: str | None = None
    trainers: int | None = None
    thread: str | None = None
    python: str | None = None
    """The trainer's Python version (as it reported it)."""
    telemetry_from: str | None = None
    finished_at: float | None = None
    plan: AttachPlan | None = None


# ---- the nodes of a multi-node run ------------------------------------------------------


class NodePlace(msgspec.Struct, kw_only=True):
    """A node of a torchrun job, as its manifest's ``nodes`` name it."""

    host: str
    run_dir: str | None = None
    node_rank: int | None = None
    run_id: str | None = None
    launcher_pid: int | None = None
    ranks: list[int | None] = msgspec.field(default_factory=list)


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


def decode_plan(fields: dict[str, Any], where: str = "the host") -> AttachPlan | AttachResult:
    """An ``attach`` ``plan`` reply: the plan (``status`` ``plan``), or the refusal."""
    if fields.get("status") == "plan":
        return decode(AttachPlan, fields, where)
    return decode(AttachResult, fields, where)


def to_json(reply: msgspec.Struct) -> str:
    """A reply as one JSON object (``--json``), its epochs and last steps counted from 1
    as every view says them (``SHOWN_FROM_1``); the agent's replies count from 0, as
    speculators does."""
    return msgspec.json.encode(_shown(msgspec.to_builtins(reply))).decode()


SHOWN_FROM_1 = frozenset({"epoch", "last_step"})
"""The reply fields (a checkpoint's and a stop's ``epoch``, a redo's ``last_step``) that
the agent counts from 0 and a person reads from 1 (the README: steps and epochs)."""


def _shown(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: v + 1 if k in SHOWN_FROM_1 and type(v) is int else _shown(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_shown(v) for v in value]
    return value


def to_builtins(reply: msgspec.Struct) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(reply)
    return out


# ---- Slurm -----------------------------------------------------------------------------

JOB_ACTIVE = (
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "REQUEUED",
    "RESIZING",
)
"""States in which a job holds, or waits for, its allocation (agent/slurm.py's)."""


class JobTraining(msgspec.Struct, kw_only=True):
    """The job's training on the host that answered (discover's row, in brief)."""

    pid: int
    start_ticks: int | None = None
    launcher_pid: int | None = None
    command: list[str] | None = None
    cwd: str | None = None
    log: str | None = None
    telemetry: bool = False
    run_dir: str | None = None
    run_id: str | None = None
    checkpoint_dir: str | None = None


class SlurmJob(msgspec.Struct, kw_only=True):
    """One job as ``scontrol show job`` (or ``sacct``, once the controller forgot it)
    says it."""

    id: str
    array: str | None = None
    name: str | None = None
    user: str | None = None
    state: str = "UNKNOWN"
    reason: str | None = None
    exit_code: list[int] | None = None
    """[status, signal]: ``143:0`` is [143, 0]."""
    nodes: list[str] = msgspec.field(default_factory=list)
    batch_host: str | None = None
    partition: str | None = None
    command: str | None = None
    workdir: str | None = None
    stdout: str | None = None
    stderr: str | None = None
    submitted: float | None = None
    started: float | None = None
    ended: float | None = None
    eligible: float | None = None
    restarts: int | None = None
    requeue: bool = False
    batch: bool = True
    source: str = "scontrol"
    here: bool = False
    """Its processes run on the host that answered (``scontrol listpids``)."""
    training_row: JobTraining | None = None
    training: bool = False
    """A speculators training: its script or command names one, or it runs one."""
    script_read: bool = False
    run_dir: str | None = None
    """Its run with telemetry: the one it runs, or the newest registered as this job."""

    @property
    def label(self) -> str:
        return f"job {self.array or self.id}" + (f" ({self.name})" if self.name else "")

    @property
    def active(self) -> bool:
        return self.state in JOB_ACTIVE

    @property
    def pending(self) -> bool:
        return self.state in ("PENDING", "REQUEUED")

    @property
    def running(self) -> bool:
        return self.state in ("RUNNING", "COMPLETING", "CONFIGURING")

    @property
    def node(self) -> str | None:
        """Where its batch script (and rank 0) runs."""
        return self.batch_host or (self.nodes[0] if self.nodes else None)

    def exit_text(self) -> str | None:
        if self.exit_code is None or self.active:
            return None
        code, sig = [*self.exit_code, 0, 0][:2]
        return f"signal {sig}" if sig else f"exit {code}"

    def state_text(self) -> str:
        """``PENDING (Dependency)``, ``RUNNING on gpu01``, ``FAILED (exit 143)``."""
        if self.pending:
            return f"{self.state} ({self.reason})" if self.reason else self.state
        if self.running and self.nodes:
            more = f" +{len(self.nodes) - 1}" if len(self.nodes) > 1 else ""
            return f"{self.state} on {self.node}{more}"
        ended = self.exit_text()
        return f"{self.state} ({ended})" if ended else self.state

    def summary(self) -> dict[str, object]:
        """``summary --json``'s ``slurm`` object."""
        return {
            "job": self.array or self.id,
            "name": self.name,
            "state": self.state,
            "reason": self.reason if self.pending else None,
            "exit_code": self.exit_code if not self.active else None,
            "nodes": list(self.nodes),
            "stdout": self.stdout,
            "restarts": self.restarts,
        }


class JobsReport(Reply, kw_only=True):
    """``jobs``: the user's jobs the scheduler knows (one, when asked by id)."""

    slurm: bool = False
    """Whether the host is part of a Slurm cluster (its commands answer)."""
    note: str | None = None
    """Why not."""
    jobs: list[SlurmJob] = msgspec.field(default_factory=list)
    host: str | None = None
    user: str | None = None
    now: float | None = None


class JobControlReport(Reply, kw_only=True):
    """``job_control``: what the scheduler said, and the job's state after it."""

    action: str = ""
    job: SlurmJob | None = None
    said: str | None = None
    note: str | None = None
