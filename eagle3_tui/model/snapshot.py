"""An immutable picture of a run for the UI, built off the UI thread.

The app never touches :class:`~eagle3_tui.model.state.RunState`: a worker builds a
:class:`Snapshot` (plain tuples and numbers, lines downsampled to the plot width)
and posts it; widgets only read it. Its cost does not grow with the run's length
beyond the O(n) copy-and-reduce of the plotted window (~1 ms per series at 1M).

Pure: no textual, no asyncssh.

Over 600 lines: one frozen dataclass per panel's view and the one function that builds
them all from a state in a single pass (so a frame costs one walk of the state).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from eagle3_tui.model.anomalies import Anomaly, LossScan, find_anomalies
from eagle3_tui.model.derived import (
    Pace,
    average_pace,
    ema,
    epoch_number,
    eta,
    io_rates,
    mean_tail,
    run_pace,
    smoothed,
    step_number,
    steps_done,
    steps_per_epoch,
    tau_from_cond,
    tau_of,
    tau_series,
)
from eagle3_tui.model.downsample import m4, m4_indices
from eagle3_tui.model.events import CkptEvent, Event, LogLine, Redo, renamed_saves
from eagle3_tui.model.files import DiskSpace, FileNotice, Outcome, WriteGap
from eagle3_tui.model.health import diagnose, ended_at
from eagle3_tui.model.liveness import Leftover
from eagle3_tui.model.observed import Member, bar_progress
from eagle3_tui.model.observed_health import ended_by
from eagle3_tui.model.sampled import IoPoint
from eagle3_tui.model.state import RunState
from eagle3_tui.model.verdict import Diagnosis, Health
from eagle3_tui.telemetry.manifest import STOP_SAVES

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class ViewParams:
    """What the UI wants drawn; the snapshot is built for it."""

    columns: int = 100
    """Plot width in terminal cells; M4 keeps ~4 points per cell."""
    window: int | None = None
    """Show only the last ``window`` steps (None: the whole run)."""
    smoothing: float = 0.6
    """EMA weight per step, as TensorBoard's slider (0: off)."""
    spark_points: int = 60
    """Points in each GPU/IO sparkline."""


@dataclass(frozen=True, slots=True)
class Line:
    """One drawable line: points already reduced to the plot's width."""

    label: str
    x: tuple[float, ...]
    y: tuple[float, ...]
    kind: str = "raw"
    """raw, smoothed, val or derived: lets a panel style lines."""

    def trend(self) -> tuple[float, int] | None:
        """The change of the last value against the point a quarter of the line's finite
        points back, and the steps between them; None with fewer than four points."""
        pts = [(x, y) for x, y in zip(self.x, self.y, strict=True) if math.isfinite(y)]
        if len(pts) < 4:
            return None
        x1, y1 = pts[-1]
        x0, y0 = pts[max(0, len(pts) - 1 - len(pts) // 4)]
        return y1 - y0, int(x1 - x0)


@dataclass(frozen=True, slots=True)
class ValRow:
    epoch: int
    step: int | None
    values: dict[str, float]


@dataclass(frozen=True, slots=True)
class GpuView:
    index: int
    name: str
    util: float | None
    mem_used: float | None
    mem_total: float | None
    power_w: float | None
    temp_c: float | None
    pids: tuple[int, ...]
    spark: tuple[float, ...]
    """Utilisation (%) over the last minutes, oldest first."""
    host: str = ""
    """The node, when the run's GPUs come from several (else empty)."""
    local_rank: int | None = None


@dataclass(frozen=True, slots=True)
class WorkerView:
    pid: int
    role: str
    bytes_per_s: float | None
    """None once the run ended (its reads are over, not current)."""
    read_total: float | None
    files: tuple[str, ...]
    rank: int = 0


@dataclass(frozen=True, slots=True)
class IoView:
    bytes_per_s: float | None
    files_per_s: float | None
    """The current read rates; None once the run ended (``Progress.ended_at``)."""
    workers: tuple[WorkerView, ...]
    recent_files: tuple[str, ...]
    spark: tuple[float, ...]
    """Bytes read per second over the last minutes, oldest first."""
    ranks: int = 1
    """How many ranks report reads (the rows say which rank when more than one)."""


@dataclass(frozen=True, slots=True)
class Progress:
    """Where the run is and how fast it goes: every view shows these figures as they are
    (numbering and pace are defined once, in :mod:`~eagle3_tui.model.derived`)."""

    step: int | None
    """The step shown as "step N": 1-based, = steps done (:func:`~derived.steps_done`)."""
    epoch: int | None
    """The epoch shown as "epoch E": 1-based (:func:`~derived.epoch_number`)."""
    epochs_total: int | None
    steps_per_epoch: int | None
    total_steps: int | None
    steps_per_s: float | None
    tokens_per_s: float | None
    eta_epoch_s: float | None
    eta_run_s: float | None
    fetch_frac: float | None
    """Mean share of step time spent waiting for data (data starvation)."""
    elapsed_s: float | None
    """How long the run has been up: from its start to now, or to its end once it ended."""
    global_step: int | None = None
    """speculators' 0-based step counter of the last logged step (the plots' x axis)."""
    ended_at: float | None = None
    """When the run ended (the host's clock, :func:`~health.ended_at`); None while it
    runs. Its figures stop there: the uptime, the pace, the read rates."""
    ended_by: float | None = None
    """A training without telemetry found gone by a later look: that look (it ended
    between ``ended_at``, the last moment it was known alive, and this; ``elapsed_s``
    runs to ``ended_at``: the least it ran)."""
    pace_over: str = "recent"
    """What ``steps_per_s``/``tokens_per_s`` measure: ``recent`` (the last minute of the
    running process), ``run`` (the average of the process that ended, over all its
    logged steps), ``epoch`` (a run without telemetry: its latest epoch bar's average)."""


@dataclass(frozen=True, slots=True)
class ObservedView:
    """A run without telemetry, watched from outside: what the panels say about it."""

    pid: int
    alive: bool
    command: tuple[str, ...]
    cwd: str | None
    user: str | None
    log_file: str | None
    checkpoint_dir: str | None
    cpu_pct: float | None
    members: tuple[Member, ...]
    """Its process tree; once it ended, what of it was still alive then."""
    handler: str | None = None
    """``json`` / ``printed``: its metrics come from a handler of the user's own."""
    metrics_file: str | None = None
    metrics_problem: str | None = None
    exit_status: int | None = None
    ended_at: float | None = None
    last_alive: float | None = None


@dataclass(frozen=True, slots=True)
class FileNote:
    """Something that happened to the run's file (``model/files.py``), said."""

    change: str
    outcome: str
    at: float | None
    """When, on the host's clock (None: not said)."""
    text: str
    moved_to: str | None = None
    lost: int | None = None
    """Records of the history continued missing across it (None: not known)."""
    sort_ts: float | None = None
    """Where it goes among the log's entries (``at``, else the newest record then)."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the panels show, frozen at ``now``."""

    now: float
    diagnosis: Diagnosis
    progress: Progress
    ttt_steps: int = 0
    latest: dict[str, float | None] = field(default_factory=dict)
    tau: float | None = None
    tau_cond: float | None = None
    """τ from the product of conditional accuracies, for comparison with τ."""
    loss_lines: tuple[Line, ...] = ()
    ttt_loss_lines: tuple[Line, ...] = ()
    """The loss of each TTT step (``loss_0``, ``loss_1``, …), smoothed as the loss."""
    acc_lines: tuple[Line, ...] = ()
    tau_line: Line | None = None
    val_rows: tuple[ValRow, ...] = ()
    gpu_status: str | None = None
    gpu_error: str | None = None
    gpus: tuple[GpuView, ...] = ()
    gpus_at: float | None = None
    """When the newest GPU sample was taken (the host's clock)."""
    io: IoView | None = None
    io_at: float | None = None
    """When the newest read sample was taken (the host's clock)."""
    host_now: float | None = None
    """``now`` on the host's clock (the samples' times are in it)."""
    sample_every_s: float | None = None
    """The samplers' interval, as their last two read samples were apart."""

    def samples_stale(self, at: float | None) -> bool:
        """A sample taken at ``at`` is no longer current: none came for 10 s and three
        of the samplers' intervals (the sidecar held, or gone)."""
        if at is None or self.host_now is None:
            return False
        return self.host_now - at > max(10.0, 3 * (self.sample_every_s or 0.0))

    checkpoints: tuple[CkptEvent, ...] = ()
    saving: str | None = None
    """The checkpoint being written now, if any."""
    logs: tuple[LogLine, ...] = ()
    events: tuple[Event, ...] = ()
    redos: tuple[Redo, ...] = ()
    warnings: int = 0
    records: int = 0
    malformed: int = 0
    malformed_last: str = ""
    lost: int = 0
    duplicates: int = 0
    restarts: int = 0
    files: tuple[FileNote, ...] = ()
    """What happened to metrics.jsonl, oldest first."""
    other_file: str | None = None
    """Set while another file's history is shown (what the path holds now): why."""
    file_news: str | None = None
    """The newest of ``files``, while it is recent (:data:`FILE_NEWS_S`)."""
    write_gaps: tuple[WriteGap, ...] = ()
    """Stretches of failed writes the writers reported (their records are among
    ``lost``: a gap of sequence numbers, counted once)."""
    disk: DiskSpace | None = None
    """The room on the run's filesystem (its newest report; the least room of several)."""
    leftovers: tuple[Leftover, ...] = ()
    """Processes of the run that outlived its trainer (from the host's probe)."""
    observed: ObservedView | None = None
    """Set for a run without telemetry: per-step metrics are not available."""
    anomalies: tuple[Anomaly, ...] = ()
    """What happened on the way (non-finite loss, spikes, resumes, steps not logged),
    in step order: kept visible after the end (``model/anomalies.py``)."""
    history: str | None = None
    """While a run opened at a glance is read whole (app/pipeline.py): how far."""

    @property
    def health(self) -> Health:
        return self.diagnosis.health

    @property
    def global_step(self) -> int | None:
        return self.progress.global_step

    @property
    def epoch(self) -> int | None:
        return self.progress.epoch


EMPTY_PROGRESS = Progress(None, None, None, None, None, None, None, None, None, None, None, None)
EMPTY = Snapshot(
    now=0.0,
    diagnosis=Diagnosis(Health.WAITING, "Waiting for the first record."),
    progress=EMPTY_PROGRESS,
)


class _Frame:
    """The plotted window of the step table: x converted once, y as float32 views.

    At a million steps each float64 copy costs milliseconds; a build converts the
    shared step column once and reads each metric without copying it.
    """

    def __init__(self, state: RunState, first_step: int, cache: SnapshotCache | None) -> None:
        table = state.table
        self.table = table
        self.i = bisect_left(table.steps, first_step)
        self.n = len(table.steps)
        self.first_step = first_step
        self.before = float(table.steps[0]) if self.n else math.inf
        """The table's first step: a glance's history stands for the steps before it."""
        hist = state.history
        self.history = hist if hist is not None and first_step < self.before else None
        """A glance's history in brief, where the window reaches before the table."""
        long = cache is not None and self.n - self.i >= INCREMENTAL_ROWS
        self.cache = cache if long and self.history is None else None
        """Set when the window is long enough to reduce incrementally."""
        self._x: F64 | None = None

    @property
    def x(self) -> F64:
        """The window's steps as float64 (converted on first use: 8 MB at 1M rows)."""
        if self._x is None:
            self._x = self.table.step_view()[self.i :].astype(np.float64)
        return self._x

    def y(self, key: str) -> npt.NDArray[np.float32] | None:
        values = self.table.view(key)
        return None if values is None or self.n <= self.i else values[self.i :]

    def rows(self, key: str) -> Rows | None:
        """Rows ``a..b`` of a column, for the incremental reduction."""
        values = self.table.view(key)
        if values is None or self.n <= self.i:
            return None
        return lambda a, b: values[a:b].astype(np.float64)

    def steps(self) -> npt.NDArray[np.int64]:
        return self.table.step_view()


def _line(frame: _Frame, key: str, label: str, view: ViewParams, kind: str) -> Line | None:
    if frame.cache is not None:
        rows = frame.rows(key)
        if rows is None:
            return None
        xs, ys = frame.cache.reduce(frame, key, rows, kind, view)
        return Line(label, tuple(xs.tolist()), tuple(ys.tolist()), kind)
    y: npt.NDArray[Any] | None = frame.y(key)
    x = frame.x
    hist = frame.history
    if hist is not None and kind == "smoothed":  # a glance's history: its blocks' means
        brief = hist.means(key, frame.first_step, frame.before)
        if brief is not None:
            if y is None or not len(y):
                return Line(label, tuple(brief[0].tolist()), tuple(brief[1].tolist()), kind)
            xs, ys = smoothed(x, y, view.smoothing, view.columns * 2)
            xs, ys = np.concatenate([brief[0], xs]), np.concatenate([brief[1], ys])
            return Line(label, tuple(xs.tolist()), tuple(ys.tolist()), kind)
    elif hist is not None:  # its blocks' first, min, max and last, then the table's rows
        brief = hist.points(key, frame.first_step, frame.before)
        if brief is not None:
            x = np.concatenate([brief[0], x]) if y is not None else brief[0]
            y = np.concatenate([brief[1], y]) if y is not None else brief[1]
    if y is None:
        return None
    if kind == "smoothed":
        xs, ys = smoothed(x, y, view.smoothing, view.columns * 2)
    else:
        nonfinite = frame.table.has_nonfinite(key)
        xs, ys = m4(x, y, view.columns, nonfinite)
    return Line(label, tuple(xs.tolist()), tuple(ys.tolist()), kind)


def _tau_series(frame: _Frame, ttt_steps: int) -> tuple[F64, F64] | None:
    full = [frame.y(f"train/full_acc_{k}") for k in range(ttt_steps)]
    cond = [frame.y(f"train/cond_acc_{k}") for k in range(ttt_steps)]
    tau = tau_series(full, cond)
    return None if tau is None else (frame.x, tau)


_Columns = list[npt.NDArray[np.float32] | None]


def _tau_brief(frame: _Frame, ttt_steps: int) -> tuple[F64, F64] | None:
    """τ of a glance's history: from each block's mean accuracies."""
    hist = frame.history
    if hist is None or ttt_steps == 0:
        return None
    lo, hi = frame.first_step, frame.before
    x: F64 | None = None

    def means(key: str) -> npt.NDArray[np.float64] | None:
        nonlocal x
        m = hist.means(key, lo, hi)
        if m is None:
            return None
        x = m[0]
        return m[1]

    full = [means(f"train/full_acc_{k}") for k in range(ttt_steps)]
    cond = [means(f"train/cond_acc_{k}") for k in range(ttt_steps)]
    tau = tau_series(full, cond)
    return None if tau is None or x is None else (x, tau)


def _tau_line(frame: _Frame, ttt_steps: int, view: ViewParams) -> Line | None:
    smooth = view.smoothing > 0
    if frame.cache is not None:
        full = [frame.table.view(f"train/full_acc_{k}") for k in range(ttt_steps)]
        cond = [frame.table.view(f"train/cond_acc_{k}") for k in range(ttt_steps)]

        def part(a: int, b: int, cols: _Columns) -> _Columns:
            return [None if c is None else c[a:b] for c in cols]

        def rows(a: int, b: int) -> F64:
            tau = tau_series(part(a, b, full), part(a, b, cond))
            return np.full(b - a, np.nan) if tau is None else tau

        if ttt_steps == 0 or tau_series(part(0, 1, full), part(0, 1, cond)) is None:
            return None
        key = f"τ/{ttt_steps}"
        xs, ys = frame.cache.reduce(frame, key, rows, "smoothed" if smooth else "raw", view)
        return Line("τ", tuple(xs.tolist()), tuple(ys.tolist()), "derived")
    tau_xy = _tau_series(frame, ttt_steps)
    brief = _tau_brief(frame, ttt_steps)
    if tau_xy is None and brief is None:
        return None
    xs, ys = brief if brief is not None else (np.zeros(0), np.zeros(0))
    if tau_xy is not None:
        x, y = tau_xy
        tx, ty = (
            smoothed(x, y, view.smoothing, view.columns * 2) if smooth else m4(x, y, view.columns)
        )
        xs, ys = np.concatenate([xs, tx]), np.concatenate([ys, ty])  # a glance's history first
    return Line("τ", tuple(xs.tolist()), tuple(ys.tolist()), "derived")


def _ttt_loss_lines(
    state: RunState, view: ViewParams, cache: SnapshotCache | None = None
) -> tuple[Line, ...]:
    last = state.global_step or 0
    frame = _Frame(state, max(0, last - view.window + 1) if view.window else 0, cache)
    kind = "smoothed" if view.smoothing > 0 else "raw"
    lines = (
        _line(frame, f"train/loss_{k}", f"loss_{k}", view, kind) for k in range(state.ttt_steps)
    )
    return tuple(line for line in lines if line is not None)


def _plot_lines(
    state: RunState, view: ViewParams, cache: SnapshotCache | None = None
) -> tuple[list[Line], list[Line], Line | None]:
    last = state.global_step or 0
    first_step = max(0, last - view.window + 1) if view.window else 0
    frame = _Frame(state, first_step, cache)
    smooth = view.smoothing > 0
    loss: list[Line] = []
    raw = _line(frame, "train/loss", "loss", view, "raw")
    if raw is not None:
        loss.append(raw)
        if smooth:
            sm = _line(frame, "train/loss", "loss (smoothed)", view, "smoothed")
            if sm is not None:
                loss.append(sm)
    if state.val_by_epoch:
        pts = sorted(
            (float(state.val_steps.get(e, 0)), v.get("loss_epoch", math.nan))
            for e, v in state.val_by_epoch.items()
            if state.val_steps.get(e, 0) >= first_step
        )
        if pts:
            loss.append(Line("val loss", tuple(p[0] for p in pts), tuple(p[1] for p in pts), "val"))
    acc: list[Line] = []
    for k in range(state.ttt_steps):
        for name in ("full", "cond"):
            kind = "smoothed" if smooth else "raw"
            line = _line(frame, f"train/{name}_acc_{k}", f"{name}_acc_{k}", view, kind)
            if line is not None:
                acc.append(line)
    return loss, acc, _tau_line(frame, state.ttt_steps, view)


def _progress(
    state: RunState, now: float, ended: float | None, cache: SnapshotCache | None = None
) -> Progress:
    """Where the run is and how fast it goes, at ``now`` (the host's clock); once it
    ended (``ended``), its span and its average pace, not a current one (``cache``:
    kept while no row changes)."""
    table = state.table
    steps = table.step_view()  # a view: read under the model's lock
    if ended is None:
        pace = run_pace(state)
    else:
        pace = cache.average_pace(state) if cache is not None else average_pace(state)
    pace_over = "recent" if ended is None else "run"
    manifest = state.manifest
    spe = manifest.get("steps_per_epoch")
    if not isinstance(spe, int) or spe <= 0:
        spe = steps_per_epoch(state.table.view("epoch"), steps)
    total = manifest.get("total_steps")
    if not isinstance(total, int) or total <= 0:
        total = spe * state.epochs_total if spe and state.epochs_total else None
    step = state.global_step
    epoch = state.epoch
    steps_per_s = pace.steps_per_s
    shown = steps_done(state)
    bars = (
        bar_progress(state.bars, state.epochs_total)
        if step is None and state.observed is not None
        else None
    )
    if bars is not None:  # no metric: the output's epoch bars say how far it is
        step, epoch, spe, steps_per_s = (
            bars.step,
            bars.epoch,
            bars.steps_per_epoch,
            bars.steps_per_s,
        )
        total = spe * state.epochs_total if state.epochs_total else None
        shown = step_number(step)
        pace_over = "epoch"
    evidence = bars.at if bars is not None else state.last_train_ts
    saved = state.saved_progress if state.global_step is None and state.observed else None
    if saved is not None and (step is None or saved.steps_done - 1 > step):
        # a checkpoint saved since the last epoch bar (a mid-epoch save) is further on
        step, epoch, evidence = saved.steps_done - 1, saved.epoch, saved.ts
        if total:
            step = min(step, total - 1)  # never beyond the run's own totals
        if state.epochs_total:
            epoch = min(epoch, state.epochs_total - 1)
        shown = step_number(step)
    eta_epoch, eta_run = eta(step, epoch, spe, total, steps_per_s)
    # counted down from the evidence it rests on (the last step's record, the last epoch
    # bar): it froze at its last value through a hang; past its end with no newer
    # evidence it is not known
    if ended is None and evidence is not None:
        late = max(0.0, now - evidence)
        eta_epoch, eta_run = _count_down(eta_epoch, late), _count_down(eta_run, late)
    # the run's first start (a resume rewrites started_at: its process's), as the
    # elapsed time says it: the whole run's, not its last process's
    started = manifest.get("first_started_at")
    if not isinstance(started, float | int):
        started = manifest.get("started_at")
    if not isinstance(started, float | int) and state.observed is not None:
        started = state.observed.info.started
    start = started if isinstance(started, float | int) else state.first_ts
    return Progress(
        step=shown,
        epoch=epoch_number(epoch),
        epochs_total=state.epochs_total,
        steps_per_epoch=spe,
        total_steps=total,
        steps_per_s=steps_per_s,
        tokens_per_s=pace.tokens_per_s,
        eta_epoch_s=eta_epoch,
        eta_run_s=eta_run,
        fetch_frac=mean_tail(state.table.floats("profile/fetch_frac", 50)),
        elapsed_s=(min(now, ended) if ended is not None else now) - start if start else None,
        global_step=step,
        ended_at=ended,
        ended_by=ended_by(state) if ended is not None else None,
        pace_over=pace_over,
    )


def _sample_every(state: RunState) -> float | None:
    """How far apart the last two read samples were (one rank's, the samplers' pace)."""
    points = state.samplers.io_history
    if len(points) < 2:
        return None
    gap = points[-1].ts - points[-2].ts
    return gap if gap > 0 else None


def _count_down(eta_s: float | None, late: float) -> float | None:
    """``eta_s`` as of ``late`` seconds after its evidence; None once that is past it."""
    if eta_s is None or (late > 0 and eta_s <= late):
        return None
    return eta_s - late


def _spark(values: list[float], n: int) -> tuple[float, ...]:
    if len(values) <= n:
        return tuple(values)
    arr = np.asarray(values[-(len(values) // n) * n :], dtype=np.float64)
    return tuple(arr.reshape(n, -1).max(axis=1).tolist())


def _gpus(state: RunState, view: ViewParams) -> tuple[GpuView, ...]:
    out = []
    several_hosts = len({host for host, _ in state.samplers.gpu_devices}) > 1
    for key in sorted(state.samplers.gpu_devices):
        d = state.samplers.gpu_devices[key]
        spark = _spark(state.samplers.gpu_utils(key), view.spark_points)
        out.append(
            GpuView(
                d.index,
                d.name,
                d.util,
                d.mem_used,
                d.mem_total,
                d.power_w,
                d.temp_c,
                tuple(d.pids),
                spark,
                host=key[0] if several_hosts else "",
                local_rank=d.local_rank,
            )
        )
    return tuple(out)


def _read_rate(points: list[IoPoint]) -> tuple[float | None, float | None]:
    """Bytes and files per second of one sampler's last points (``derived.io_rates``)."""
    recent = points[-5:]
    return io_rates(
        np.array([p.ts for p in recent]),
        np.array([p.bytes for p in recent]),
        np.array([p.files_read for p in recent], dtype=np.float64),
    )


def _io(state: RunState, view: ViewParams, ended: bool) -> IoView | None:
    """What the run reads; once it ended (``ended``), what it read, no rate."""
    if not state.samplers.io_history:
        return None
    hist = list(state.samplers.io_history)
    # one sampler per rank under torchrun: each rank's rate from its own points, summed
    by_source: dict[tuple[str, int], list[IoPoint]] = {}
    for p in hist:
        by_source.setdefault((p.host, p.rank), []).append(p)
    rates = [_read_rate(points) for points in by_source.values()]
    known = [r for r in rates if r[0] is not None and not ended]
    bps = sum(r[0] or 0.0 for r in known) if known else None
    fps = sum(r[1] or 0.0 for r in known) if known else None
    mine = next(iter(by_source.values()))
    recent = mine[-5:]
    span = (recent[-1].ts - recent[0].ts) if len(recent) > 1 else 0.0
    interval = span / (len(recent) - 1) if len(recent) > 1 else 1.0
    workers = tuple(
        WorkerView(
            w.pid,
            w.role,
            None if ended else (w.read_bytes or 0.0) / max(interval, 1e-9),
            w.read_total,
            tuple(w.files[-3:]),
            rank=w.rank,
        )
        for w in sorted(state.samplers.io_workers.values(), key=lambda w: (w.rank, w.pid))
    )[:16]
    if len(by_source) == 1:
        spark = _spark([p.bytes / max(interval, 1e-9) for p in mine], view.spark_points)
    else:  # several ranks: their bytes summed per second
        per_s: dict[int, float] = {}
        for p in hist:
            per_s[int(p.ts)] = per_s.get(int(p.ts), 0.0) + p.bytes
        spark = _spark([per_s[k] for k in sorted(per_s)], view.spark_points)
    files = tuple(f for _, _, f in list(state.samplers.recent_files)[-8:])
    return IoView(bps, fps, workers, files, spark, ranks=len({r for _, r in by_source}))


def build_snapshot(
    state: RunState,
    now: float,
    view: ViewParams | None = None,
    cache: SnapshotCache | None = None,
    lines_of: Snapshot | None = None,
) -> Snapshot:
    """Freeze ``state`` for drawing with ``view``. ``cache``: kept by the caller between
    builds of the same run (the app's pipeline), so that a long run's lines reduce only
    the rows that arrived since and unchanged GPU rows are reused. ``lines_of``: an
    earlier snapshot of the same run and view whose plotted lines this one shows as
    they were (no chart is due to draw: the lines are most of a build's cost); they are
    built anew all the same when the table was rewound or replaced since."""
    view = view or ViewParams()
    state.settle()
    fresh = cache.check(state) if cache is not None else True
    diagnosis = diagnose(state, now)
    ended = ended_at(state, diagnosis)
    progress = _progress(state, state.liveness.host_time(now), ended, cache)
    if diagnosis.health not in (Health.RUNNING, Health.WAITING, Health.SILENT):
        progress = replace(progress, eta_epoch_s=None, eta_run_s=None)
    if lines_of is not None and not fresh:
        loss, acc = lines_of.loss_lines, lines_of.acc_lines  # the same tuples
        tau_line, ttt_loss = lines_of.tau_line, lines_of.ttt_loss_lines
    else:
        loss_list, acc_list, tau_line = _plot_lines(state, view, cache)
        loss, acc = tuple(loss_list), tuple(acc_list)
        ttt_loss = _ttt_loss_lines(state, view, cache)
    latest = dict(state.table.latest)
    tau = tau_of(latest, state.ttt_steps)
    cond = [latest.get(f"train/cond_acc_{k}") for k in range(state.ttt_steps)]

    saving = state.activity.detail if state.activity and state.activity.what == "saving" else None
    if ended is not None:
        saving = None  # a save seen under way when the run ended is not going on now
    return Snapshot(
        now=now,
        diagnosis=diagnosis,
        progress=progress,
        ttt_steps=state.ttt_steps,
        latest=latest,
        tau=tau if tau is None or math.isfinite(tau) else None,
        tau_cond=tau_from_cond(cond),
        loss_lines=loss,
        ttt_loss_lines=ttt_loss,
        acc_lines=acc,
        tau_line=tau_line,
        val_rows=tuple(
            ValRow(e, state.val_steps.get(e), dict(v))
            for e, v in sorted(state.val_by_epoch.items())
        ),
        gpu_status=state.samplers.gpu_status,
        gpu_error=state.samplers.gpu_error,
        gpus=_gpus(state, view) if cache is None else cache.gpus(state, view),
        gpus_at=state.samplers.last_gpu_ts,
        io=_io(state, view, ended is not None),
        io_at=state.samplers.last_io_ts,
        host_now=state.liveness.host_time(now),
        sample_every_s=_sample_every(state),
        checkpoints=tuple(
            renamed_saves(list(state.ckpt_events)[-50:], state.manifest.get(STOP_SAVES))
        ),
        saving=saving,
        logs=tuple(list(state.logs)[-300:]),
        events=tuple(state.events[-50:]),
        redos=tuple(state.redos),
        warnings=state.warnings,
        records=state.records,
        malformed=state.malformed_count,
        malformed_last=_malformed_last(state),
        lost=state.lost_records,
        duplicates=state.duplicate_records,
        restarts=len(state.restarts),
        files=tuple(_file_note(state, n) for n in state.file_notices[-MAX_FILE_NOTES:]),
        other_file=_other_file(state),
        file_news=_file_news(state, state.liveness.host_time(now)),
        write_gaps=tuple(state.write_gaps[-MAX_FILE_NOTES:]),
        disk=min(state.disk.values(), key=lambda d: d.room, default=None),
        leftovers=state.liveness.leftovers,
        observed=_observed(state),
        anomalies=find_anomalies(state, cache.loss_scan if cache is not None else None),
    )


def _malformed_last(state: RunState) -> str:
    bad = state.malformed[-1] if state.malformed else None
    if bad is None:
        return ""
    if state.history is not None:  # opened at a glance: the lines before are not counted
        return f"at byte {bad.offset:,}: {bad.reason}"
    return f"line {bad.line_no}: {bad.reason}"


MAX_FILE_NOTES = 50
"""The newest file notices and write gaps a snapshot carries."""
FILE_NEWS_S = 600.0
"""How long the newest file notice is news (the banner says it while the run is well)."""


def _file_news(state: RunState, now: float) -> str | None:
    if not state.file_notices:
        return None
    notice = state.file_notices[-1]
    at = notice.at if notice.at is not None else notice.noted
    return state.file_sentence(notice) if at is not None and now - at <= FILE_NEWS_S else None


def _file_note(state: RunState, notice: FileNotice) -> FileNote:
    at = notice.at
    return FileNote(
        notice.change,
        notice.outcome.value,
        at,
        state.file_sentence(notice),
        notice.moved_to,
        notice.lost,
        at if at is not None else notice.noted,
    )


def _other_file(state: RunState) -> str | None:
    """Why another file's history is shown (its notice), while it is."""
    if not state.foreign:
        return None
    notice = next((n for n in reversed(state.file_notices) if n.outcome is Outcome.OTHER), None)
    return state.file_sentence(notice) if notice is not None else "another file's history"


def _observed(state: RunState) -> ObservedView | None:
    obs = state.observed
    if obs is None:
        return None
    info = obs.info
    return ObservedView(
        pid=info.pid,
        alive=obs.alive,
        command=tuple(info.command),
        cwd=info.cwd,
        user=info.user,
        log_file=info.log_file,
        checkpoint_dir=info.checkpoint_dir,
        cpu_pct=info.cpu_pct,
        members=tuple(m for m in obs.members if m.state != "gone"),
        handler=info.handler,
        metrics_file=info.metrics_file,
        metrics_problem=info.metrics_problem,
        exit_status=info.exit_status,
        ended_at=info.ended_at,
        last_alive=info.last_alive,
    )


INCREMENTAL_ROWS = 20_000
"""A plotted window of at least this many rows is reduced incrementally (with a cache):
below it a full reduction costs well under a millisecond per line."""

Rows = Callable[[int, int], F64]
"""Rows ``a..b`` (absolute) of one series, as float64."""


@dataclass(slots=True)
class _Buckets:
    """One series reduced over whole buckets of ``k`` rows aligned to multiples of ``k``:
    rows ``start..end`` done. M4: the kept rows and their values; means: one per bucket."""

    k: int
    start: int
    end: int
    idx: npt.NDArray[np.int64]
    val: F64


def _m4_piece(rows: Rows, a: int, b: int, k: int) -> tuple[npt.NDArray[np.int64], F64]:
    """M4 of rows ``a..b`` in buckets of ``k`` (the last may be shorter): kept rows, values."""
    if b <= a:
        return np.empty(0, dtype=np.int64), np.empty(0)
    y = rows(a, b)
    idx = m4_indices(y, max(1, (b - a) // k)) if b - a > 4 else np.arange(b - a)
    return idx + a, y[idx]


def _mean_piece(rows: Rows, a: int, b: int, k: int) -> tuple[npt.NDArray[np.int64], F64]:
    """NaN-ignoring means of rows ``a..b`` (whole buckets of ``k``): last rows, means."""
    if b <= a:
        return np.empty(0, dtype=np.int64), np.empty(0)
    block = rows(a, b).reshape(-1, k)
    finite = np.isfinite(block)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(finite, block, 0.0).sum(axis=1) / finite.sum(axis=1)
    return np.arange(a + k - 1, b, k, dtype=np.int64), means


class SnapshotCache:
    """What one run's snapshots keep between builds (the app's pipeline holds one).

    A long window's lines are M4 or bucket means over buckets aligned to multiples of
    their size: whole buckets are reduced once and kept, so a build reduces only the
    rows that arrived since and the window's two partial buckets (~0.1 ms per line at
    1M rows, against ~3 ms for a full pass). The bucket size is kept while the window
    holds one to two times the buckets wanted; a rewound table (a resume from an
    earlier step, :attr:`RunState.redos`) drops everything. The GPU rows are reused
    until a new GPU sample arrives.
    """

    def __init__(self) -> None:
        self._series: dict[tuple[str, str], _Buckets] = {}
        self._table: tuple[int, int, object] | None = None
        self._gpus: tuple[object, int, tuple[GpuView, ...]] | None = None
        self._pace: tuple[object, Pace] | None = None
        self.loss_scan = LossScan()
        """The loss scanned for anomalies so far (only new rows are scanned)."""
        self.reduced_rows = 0
        """Rows reduced so far (tests check a new build reduces only the new ones)."""

    def check(self, state: RunState) -> bool:
        """Forget what no longer holds: another table, or rows rewritten since (then
        True: lines drawn before show rows that are gone)."""
        key = (id(state.table), len(state.redos), state.redos[-1] if state.redos else None)
        if key != self._table:
            self._table = key
            self._series.clear()
            return True
        return False

    def average_pace(self, state: RunState) -> Pace:
        """:func:`average_pace` of ``state``, read anew only when its rows changed (an
        ended 1M-step run's reads every row: ~6 ms a picture, one every 2 s)."""
        start = state.process_start()
        key = (self._table, len(state.table), start.ts if start is not None else None)
        kept = self._pace
        if kept is not None and kept[0] == key:
            return kept[1]
        pace = average_pace(state)
        self._pace = (key, pace)
        return pace

    def gpus(self, state: RunState, view: ViewParams) -> tuple[GpuView, ...]:
        last = state.samplers.gpu_samples[-1] if state.samplers.gpu_samples else None
        cached = self._gpus
        if cached is not None and cached[0] is last and cached[1] == view.spark_points:
            return cached[2]
        rows = _gpus(state, view)
        self._gpus = (last, view.spark_points, rows)
        return rows

    def reduce(
        self, frame: _Frame, key: str, rows: Rows, kind: str, view: ViewParams
    ) -> tuple[F64, F64]:
        """The series ``rows`` over the frame's window: M4 to ``view.columns`` buckets,
        or (``smoothed``) the EMA of the means of ``2 × columns`` buckets."""
        i, n = frame.i, frame.n
        means = kind == "smoothed"
        want = view.columns * 2 if means else view.columns
        entry = self._series.get((key, kind))
        if entry is None or not (want <= (n - i) // entry.k < 2 * want) or entry.start > i:
            k = max(1, (n - i) // want)
            start = -(-i // k) * k
            entry = _Buckets(k, start, start, np.empty(0, dtype=np.int64), np.empty(0))
            self._series[(key, kind)] = entry
        k = entry.k
        a = -(-i // k) * k  # the window's first whole bucket
        b = n // k * k  # the end of its last whole bucket
        piece = _mean_piece if means else _m4_piece
        if b > entry.end:  # reduce the buckets completed since
            idx, val = piece(rows, entry.end, b, k)
            self.reduced_rows += b - entry.end
            entry.idx = np.concatenate((entry.idx, idx))
            entry.val = np.concatenate((entry.val, val))
            entry.end = b
        if a > entry.start + 4 * k * want:  # a sliding window left these far behind
            cut = int(np.searchsorted(entry.idx, a))
            entry.idx, entry.val, entry.start = entry.idx[cut:], entry.val[cut:], a
        cut = int(np.searchsorted(entry.idx, a))
        idx_parts = [entry.idx[cut:]]
        val_parts = [entry.val[cut:]]
        if means and b < n:  # the last point: the mean of the last k rows, as bucket_means'
            last = rows(n - k, n)
            fin = np.isfinite(last)
            if fin.any():
                idx_parts.append(np.array([n - 1], dtype=np.int64))
                val_parts.append(np.array([last[fin].mean()]))
        if not means:
            head = _m4_piece(rows, i, min(a, n), k)
            tail = _m4_piece(rows, max(b, a), n, k)
            idx_parts = [head[0], *idx_parts, tail[0]]
            val_parts = [head[1], *val_parts, tail[1]]
        self.reduced_rows += (a - i) + (n - b)
        idx = np.concatenate(idx_parts)
        ys = np.concatenate(val_parts)
        xs = frame.steps()[idx].astype(np.float64)
        if means and view.smoothing > 0:
            ys = ema(ys, view.smoothing**k)
        return xs, ys
