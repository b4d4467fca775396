"""The fleet: every live and recent run on several hosts, one row each, kept current.

Built on :mod:`eagle3_tui.following` (one connection per host, however many runs): a
host's live trainings (with or without telemetry, those that start later too) and its
user's registered runs started in the last :data:`RECENT_S` are each followed as the
monitor follows a run, and each look makes the run's :class:`FleetRow` from the same
snapshot the monitor draws: its verdict with its cause, step/total, loss, τ and its
trend, pace, ETA, GPUs busy, last checkpoint. A run that ended is let go once its
records stopped coming (its row stays, as it ended); found live again (resumed), it is
followed again. A host that cannot be reached marks its rows and is tried again; the
other hosts go on.

What shows the rows: ``eagle3-tui fleet`` (a live table, ``app/fleet.py``) and
``eagle3-tui fleet --once`` (a table printed once every run was read).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from eagle3_tui.app.run_control import RunControl
from eagle3_tui.following import (
    Followed,
    Follower,
    WatchTarget,
    host_name,
    label_of,
    pinned,
)
from eagle3_tui.model.inert import printable
from eagle3_tui.model.snapshot import Snapshot, ViewParams
from eagle3_tui.model.verdict import ENDED, GPU_BUSY_UTIL, WORST_FIRST, ago
from eagle3_tui.transport.replies import DiscoverReport
from eagle3_tui.transport.target import Target

LOOK_S = 10.0
"""Between looks at every run, once each was read (until then, every second: the screen
fills as fast as the hosts answer). A look feeds what arrived, settles the samples and
builds the run's snapshot, and the screen redraws the rows it changed: 10 live runs on
3 hosts cost 1.1 % of a core looked at every 5 s, 0.5 % every 30 s (the screen's floor),
0.68 % every 10 s (``benchmarks/bench_fleet.py``)."""
FILLING_S = 1.0
RECENT_S = 24 * 3600.0
"""Registered runs started this recently are rows too (the live ones always are)."""
VIEW = ViewParams()
"""The τ line as the monitor draws it by default (its columns, its smoothing), for its
trend: the two say the same (unsmoothed, over 32 columns, a tiny run's noisy τ read
↓0.14 in the fleet beside the monitor's ↑ +0.077)."""
STILL_LOOKS = 3
"""An ended run whose records did not grow for this many looks has been read: let go."""


@dataclass(frozen=True)
class FleetRow:
    """One run as the fleet shows it (from one snapshot: every figure of the same look)."""

    key: str
    host: str
    run: str
    """Its directory on the host, or ``pid N`` for a training without telemetry."""
    opens: tuple[str, ...]
    """The arguments that open it in the monitor (``HOST:DIR``, or ``HOST --pid N``)."""
    health: str
    reason: str
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    tau: float | None = None
    tau_trend: float | None = None
    """τ now minus τ a quarter of its plotted line back (None: too few points)."""
    steps_per_s: float | None = None
    eta_s: float | None = None
    gpus: int = 0
    gpus_busy: int = 0
    checkpoint: str | None = None
    """The last complete save's directory (its last two path parts: ``checkpoints/3``)."""
    checkpoint_at: float | None = None
    started_at: float | None = None
    looked_at: float = 0.0
    link_down: bool = False
    """Nothing can arrive from its host now: its figures are those of the last look."""
    observed: bool = False
    """No telemetry: read from outside (its process, log, checkpoints)."""

    def to_json(self) -> dict[str, object]:
        return {
            "host": self.host,
            "run": self.run,
            "opens": list(self.opens),
            "health": self.health,
            "reason": self.reason,
            "step": self.step,
            "total_steps": self.total_steps,
            "loss": _num(self.loss),
            "tau": _num(self.tau),
            "tau_trend": _num(self.tau_trend),
            "steps_per_s": _num(self.steps_per_s),
            "eta_s": _num(self.eta_s),
            "gpus": self.gpus,
            "gpus_busy": self.gpus_busy,
            "checkpoint": self.checkpoint,
            "checkpoint_at": self.checkpoint_at,
            "started_at": self.started_at,
            "link_down": self.link_down,
            "observed": self.observed,
        }


def row_of(key: str, f: Followed, snap: Snapshot, now: float) -> FleetRow:
    """The row of a followed run, from one look's snapshot."""
    p = snap.progress
    trend = snap.tau_line.trend() if snap.tau_line is not None else None
    saved = next((c for c in reversed(snap.checkpoints) if c.event == "save_finished"), None)
    utils = [g.util for g in snap.gpus]
    observed = snap.observed is not None
    if f.pid is not None:
        run = f"pid {f.pid}"
        opens: tuple[str, ...] = ("--pid", str(f.pid))
        if f.host_label != "this machine":
            opens = (f.host_label, *opens)
    else:
        run = str(getattr(f.target, "run_dir", f.label))
        opens = (f.label,)
    manifest = f.pipeline.run.unsettled.manifest
    started = manifest.get("started_at") if manifest else None
    return FleetRow(
        key=key,
        host=f.host_label,
        run=run,
        opens=opens,
        health=snap.health.value,
        reason=snap.diagnosis.reason,
        step=p.step,
        total_steps=p.total_steps,
        loss=snap.latest.get("train/loss"),
        tau=snap.tau,
        tau_trend=trend[0] if trend is not None else None,
        steps_per_s=p.steps_per_s,
        eta_s=p.eta_run_s,
        gpus=len(utils),
        gpus_busy=sum(1 for u in utils if u is not None and u >= GPU_BUSY_UTIL),
        checkpoint="/".join(saved.path.rstrip("/").split("/")[-2:]) if saved is not None else None,
        checkpoint_at=saved.when if saved is not None else None,
        started_at=float(started) if isinstance(started, int | float) else None,
        looked_at=now,
        link_down=snap.diagnosis.link_down_since is not None,
        observed=observed,
    )


@dataclass
class HostState:
    """A host target's listing: when it last worked, and why it does not now."""

    text: str
    problem: str | None = None
    since: float | None = None

    def said(self) -> str:
        """``TARGET: why`` (the target named once: a connection's error often names it)."""
        problem = self.problem or ""
        return problem if problem.startswith(f"{self.text}:") else f"{self.text}: {problem}"


@dataclass
class _Seen:
    records: int = -1
    still: int = 0


class Fleet(Follower):
    """Every live and recent run of the hosts its targets name, as rows."""

    name = "fleet"

    def __init__(
        self,
        targets: Sequence[WatchTarget],
        *,
        recent_s: float = RECENT_S,
        interval_s: float = LOOK_S,
        say: Callable[[str], None] = lambda _text: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(targets, interval_s=interval_s, say=say, clock=clock, view=VIEW)
        self.recent_s = recent_s
        self.rows: dict[str, FleetRow] = {}
        self.hosts_state: dict[str, HostState] = {t.text: HostState(t.text) for t in targets}
        self.generation = 0
        """Bumped whenever a row or a host's state changed."""
        self._seen: dict[str, _Seen] = {}
        self._read_keys: set[str] = set()
        """Runs looked at once their first read was done (``--once`` waits for all)."""
        self._controls: dict[str, RunControl] = {}

    def fresh(self) -> Fleet:
        """A new fleet of the same targets and settings (this one was closed)."""
        return Fleet(
            self.targets,
            recent_s=self.recent_s,
            interval_s=self.interval_s,
            say=self.say,
            clock=self.clock,
        )

    def control_of(self, key: str) -> RunControl | None:
        """What kills or resumes a row's run (kept after its following ended)."""
        return self._controls.get(key)

    # ---- what the follower is told ------------------------------------------------------
    def started(self, f: Followed) -> None:
        if f.control is not None:
            self._controls[f.key] = f.control

    async def discovered(self, text: str, target: Target, report: DiscoverReport) -> None:
        await super().discovered(text, target, report)
        now = report.now if report.now is not None else self.clock()
        for entry in report.runs:
            if entry.live_pid or not entry.exists or entry.run_dir in ("", None):
                continue  # a live one is followed as the training it is
            if entry.started_at is not None and now - entry.started_at > self.recent_s:
                continue
            key = f"{host_name(target)}:{entry.run_dir}"
            if key in self.followed or key in self.rows:
                continue  # followed, or read to its end already
            self.follow_dir(
                key, label_of(text, target, entry.run_dir), pinned(target, entry.run_dir)
            )
            self.followed[key].found = True

    def unlisted(self, text: str, problem: str | None) -> None:
        hs = self.hosts_state.setdefault(text, HostState(text))
        hs.problem, hs.since = problem, (self.clock() if problem else None)
        self.generation += 1

    def looked(self, key: str, f: Followed, snap: Snapshot) -> None:
        now = self.clock()
        row = row_of(key, f, snap, now)
        last = self.rows.get(key)
        self.rows[key] = row
        if last is None or dataclasses.replace(last, looked_at=now) != row:
            self.generation += 1  # what is shown changed (not only when it was looked at)
        seen = self._seen.setdefault(key, _Seen())
        records = f.pipeline.run.unsettled.records
        seen.still = seen.still + 1 if records == seen.records else 0
        seen.records = records
        if (
            f.pipeline.caught_up
            and not row.link_down
            and (f.pid is None or records)
            and f.process_known
        ):
            self._read_keys.add(key)  # what the file held then has been read, its process asked
        if f.found and row.health in ENDED and seen.still >= STILL_LOOKS and f.pipeline.caught_up:
            self.let_go(key)  # read to its end: its row stays as it ended

    def next_wait(self) -> float:
        return self.interval_s if self.all_read() else min(FILLING_S, self.interval_s)

    # ---- what the views ask --------------------------------------------------------------
    def host_problem(self, host_label: str) -> str | None:
        """Why the host a row is on cannot be listed now (None: it can)."""
        for wt in self.targets:
            if host_name(wt.target) == host_label:
                hs = self.hosts_state.get(wt.text)
                if hs is not None and hs.problem:
                    return hs.problem
        return None

    def all_read(self) -> bool:
        """Every target listed (or failed) and every followed run read once to its
        current end (its records stopped growing for a look)."""
        listed = all(wt.text in self.listed for wt in self.targets)
        return listed and all(k in self._read_keys for k in self.followed)

    def sorted_rows(self, key: str = "health", reverse: bool = False) -> list[FleetRow]:
        rows = list(self.rows.values())
        return sort_rows(rows, key, reverse)


SORT_KEYS = ("health", "host", "run", "step", "loss", "tau", "pace", "eta", "started")


def sort_rows(rows: list[FleetRow], key: str = "health", reverse: bool = False) -> list[FleetRow]:
    """Rows by ``key`` (one of :data:`SORT_KEYS`; health: the worst first), then by host
    and run; rows without the figure last whichever the direction."""

    def health_rank(r: FleetRow) -> int:
        return WORST_FIRST.index(r.health) if r.health in WORST_FIRST else len(WORST_FIRST)

    figure: dict[str, Callable[[FleetRow], object]] = {
        "health": health_rank,
        "host": lambda r: r.host,
        "run": lambda r: r.run,
        "step": lambda r: r.step,
        "loss": lambda r: _finite(r.loss),
        "tau": lambda r: _finite(r.tau),
        "pace": lambda r: _finite(r.steps_per_s),
        "eta": lambda r: _finite(r.eta_s),
        "started": lambda r: r.started_at,
    }
    get = figure[key]
    base = sorted(rows, key=lambda r: (r.host, r.run))
    have = [r for r in base if get(r) is not None]
    missing = [r for r in base if get(r) is None]
    have.sort(key=lambda r: get(r), reverse=reverse)  # type: ignore[arg-type,return-value]
    return have + missing


def matches(row: FleetRow, text: str) -> bool:
    """The filter: every word of ``text`` in the row's host, run, health or cause."""
    hay = f"{row.host} {row.run} {row.health} {row.reason}".lower()
    return all(word in hay for word in text.lower().split())


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def _num(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


# ---- in words ----------------------------------------------------------------------------

NO_RUNS = "(no live or recent runs found)"
COLUMNS = ("HOST", "RUN", "HEALTH", "STEP", "LOSS", "τ", "PACE", "ETA", "GPU", "CHECKPOINT")


def cells(row: FleetRow, now: float) -> tuple[str, ...]:
    """A row's figures as the table shows them (the cause is said apart: it is long)."""
    step = "-" if row.step is None else f"{row.step:,}"
    if row.step is not None and row.total_steps:
        step += f"/{row.total_steps:,}"
    tau = "-" if row.tau is None else f"{row.tau:.2f}"
    if row.tau is not None and row.tau_trend is not None and abs(row.tau_trend) >= 0.005:
        tau += f" {'↑' if row.tau_trend > 0 else '↓'}{abs(row.tau_trend):.2f}"
    pace = "-" if row.steps_per_s is None else f"{row.steps_per_s:.2f}/s"
    gpus = "-" if not row.gpus else f"{row.gpus_busy}/{row.gpus} busy"
    ckpt = "-"
    if row.checkpoint is not None:
        ckpt = row.checkpoint
        if row.checkpoint_at is not None:
            ckpt += f" ({ago(now - row.checkpoint_at)} ago)"
    health = row.health.upper() + (" (link down)" if row.link_down else "")
    return (
        printable(row.host),
        printable(row.run),
        health,
        step,
        "-" if row.loss is None else f"{row.loss:.4g}",
        tau,
        pace,
        "-" if row.eta_s is None or row.health != "running" else duration(row.eta_s),
        gpus,
        ckpt,
    )


def duration(seconds: float) -> str:
    s = int(max(0.0, seconds))
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def format_fleet(rows: Sequence[FleetRow], problems: Sequence[str], now: float) -> str:
    """The rows as a table, each followed by its cause, then the hosts not reached."""
    if not rows:
        return "\n".join([*(f"(not reached: {printable(p)})" for p in problems), NO_RUNS])
    table = [COLUMNS, *(cells(r, now) for r in rows)]
    widths = [max(len(t[i]) for t in table) for i in range(len(COLUMNS))]
    lines: list[str] = []
    for i, t in enumerate(table):
        lines.append("  ".join(c.ljust(w) for c, w in zip(t, widths, strict=True)).rstrip())
        if i and rows[i - 1].reason:
            lines.append(f"    {printable(rows[i - 1].reason)}")
    lines.extend(f"(not reached: {printable(p)})" for p in problems)
    return "\n".join(lines)
