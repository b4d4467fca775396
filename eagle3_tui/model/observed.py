"""A run observed from outside (no telemetry): its records, its progress, its health.

The host's agent (``agent/observe.py``) writes ``proc`` records (the process tree, the
trainer alive or not, its log's growth) and ``progress`` records (speculators' epoch
progress bars in its output) besides the usual ``gpu``, ``io``, ``ckpt``, ``log`` and
``val``. :class:`~eagle3_tui.model.state.RunState` keeps them; this module decodes
and checks their payloads and derives progress (step, epoch, pace) from the bars.
``observed_health.py`` judges such a run.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

HISTORY = 600
"""``proc`` samples kept (10 min at 1 s)."""

HANDLER_WORDS = {
    "json": "its own JSON handler",
    "printed": "the handler that prints them to its log",
    "tensorboard": "speculators' TensorBoard backend (its event files)",
    "mlflow": "speculators' MLflow backend (its store)",
    "trackio": "speculators' trackio backend (its database)",
    "wandb": "speculators' W&B backend (its run file)",
}
"""What writes the metrics of a run without telemetry, by ``ProcessInfo.handler``."""


def metrics_source(handler: str | None) -> str | None:
    """Where a run without telemetry's metrics come from, in words; None: nowhere."""
    if handler is None:
        return None
    return HANDLER_WORDS.get(handler, f"its own handler ({handler})")


class ProcessInfo(msgspec.Struct, kw_only=True, gc=False):
    """``process`` of a ``proc`` record: the trainer and what was found about it."""

    pid: int
    started: float | None = None
    telemetry: bool = False
    command: list[str] = []
    cwd: str | None = None
    user: str | None = None
    log_file: str | None = None
    log_bytes: float | None = None
    log_grew: float | None = None
    log_mtime: float | None = None
    """When the log last changed (its mtime, the host's clock)."""
    checkpoint_dir: str | None = None
    epochs: int | None = None
    cpu_pct: float | None = None
    launcher_pid: int | None = None
    stack_unavailable: str | None = None
    """Why the agent cannot read where the trainer is stuck (py-spy missing, refused)."""
    slurm_job: str | None = None
    """The Slurm batch job it runs in (``SLURM_JOB_ID``, with sbatch's
    ``ENVIRONMENT=BATCH``): a restart is then the scheduler's (a requeue runs its
    script as it was, without telemetry); not in an interactive allocation."""
    handler: str | None = None
    """``json`` or ``printed``: a handler of the user's own writes its metric dicts (to
    :attr:`metrics_file`), read there; ``tensorboard``: speculators' own backend writes
    them as events (``metrics_file``: the event file); None: no metric is written
    anywhere."""
    metrics_file: str | None = None
    metrics_problem: str | None = None
    """What could not be read of :attr:`metrics_file` (bad records, broken framing)."""
    metrics_stuck: bool = False
    """Nothing more of :attr:`metrics_file` can be read (its framing is broken)."""
    exit_status: int | None = None
    """Once it ended: how, as ``subprocess`` says it (-N: killed by signal N); None when
    the kernel did not say (nobody held a pidfd on it when it ended)."""
    ended_at: float | None = None
    """Once it ended: when a look found it gone (within a look's interval of its end
    when one watched it: ``last_alive`` is None), the host's clock."""
    last_alive: float | None = None
    """Found gone later: the last look that found it alive (it ended in between)."""


class Member(msgspec.Struct, kw_only=True, gc=False):
    """One process of the observed run (``processes`` of a ``proc`` record)."""

    pid: int
    role: str = ""
    comm: str = ""
    state: str = ""
    cpu_pct: float | None = None
    rss: float | None = None
    held_since: float | None = None
    """In state T (held stopped: a SIGSTOP, Ctrl-Z): when the agent's look first found it
    so (it may have been stopped earlier: a lower bound of how long)."""


class Bar(msgspec.Struct, kw_only=True, gc=False):
    """``bar`` of a ``progress`` record: one ``Epoch N`` progress bar of the output."""

    epoch: int
    phase: str = "train"
    n: int
    total: int
    done: bool = False
    elapsed_s: float | None = None
    remaining_s: float | None = None
    rate: float | None = None


_members = msgspec.json.Decoder(list[Member], strict=False)


def decode_process(raw: object) -> ProcessInfo:
    """Raises msgspec.ValidationError for a payload that is not one."""
    return msgspec.convert(raw, ProcessInfo, strict=False)


def decode_members(raw: bytes) -> list[Member]:
    return _members.decode(raw) if raw else []


def decode_bar(raw: object) -> Bar:
    bar = msgspec.convert(raw, Bar, strict=False)
    if bar.n < 0 or bar.total < 0 or bar.epoch < 0:
        raise msgspec.ValidationError("negative count")
    return bar


@dataclass(frozen=True, slots=True)
class Observed:
    """The latest ``proc`` record: the process and its tree."""

    ts: float
    alive: bool
    info: ProcessInfo
    members: tuple[Member, ...]


@dataclass(frozen=True, slots=True)
class ProcSample:
    ts: float
    alive: bool
    cpu_pct: float | None
    log_grew: float | None


@dataclass(frozen=True, slots=True)
class BarSeen:
    ts: float
    bar: Bar


# ---- progress ---------------------------------------------------------------------------


def last_train_bar(bars: Sequence[BarSeen]) -> BarSeen | None:
    """The latest training epoch bar that counted a step (``RunState.bars``)."""
    for seen in reversed(bars):
        if seen.bar.phase == "train" and seen.bar.n > 0:
            return seen
    return None


def step_time(bars: Sequence[BarSeen]) -> float | None:
    """Seconds per training step from the latest epoch bar that says (elapsed / steps)."""
    seen = last_train_bar(bars)
    if seen is None:
        return None
    b = seen.bar
    if b.elapsed_s and b.n:
        return b.elapsed_s / b.n
    if b.rate:
        return 1.0 / b.rate
    return None


@dataclass(frozen=True, slots=True)
class BarProgress:
    step: int
    epoch: int
    steps_per_epoch: int
    steps_per_s: float | None
    at: float = 0.0
    """When the bar it is read from was seen (the host's clock)."""


def bar_progress(bars: Sequence[BarSeen], epochs_total: int | None) -> BarProgress | None:
    """Step (0-based, the last one done), epoch (the one under way), steps per epoch and
    pace from the bars (``RunState.bars``): a training without telemetry prints them as
    epochs end; never an epoch past ``epochs_total``."""
    seen = last_train_bar(bars)
    if seen is None:
        return None
    b = seen.bar
    st = step_time(bars)
    epoch = b.epoch + 1 if b.done else b.epoch
    if epochs_total:  # its last epoch done: that epoch, not one after the last
        epoch = min(epoch, epochs_total - 1)
    return BarProgress(
        b.epoch * b.total + b.n - 1, epoch, b.total, 1.0 / st if st else None, seen.ts
    )
