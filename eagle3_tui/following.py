"""Many runs followed at once without a screen of their own: what ``watch`` (alerts)
and the fleet view (``fleet.py``: one row per run) are both built on.

A target is a run (its directory, or a training's PID) or a host alone: then the
user's live trainings there, found again every :data:`DISCOVER_S` (so those that start
later too), with or without telemetry. Each run is followed as the monitor follows it —
its stream into a :class:`~eagle3_tui.app.pipeline.Pipeline`, the host's status probes,
one snapshot per look — so what is said of it is what the monitor would say. One
connection per host carries every run's stream, probe and discovery.

A subclass says what a look means (:meth:`Follower.looked`) and may follow more than
the live trainings of a host (:meth:`Follower.discovered`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3_tui.app.pipeline import Pipeline
from eagle3_tui.app.run_control import RunControl
from eagle3_tui.model.snapshot import Snapshot, ViewParams
from eagle3_tui.transport import calls
from eagle3_tui.transport.base import TargetError
from eagle3_tui.transport.channel import AgentAnswerError, Host
from eagle3_tui.transport.replies import Choice, DiscoverReport, ErrorKind, ProcessRow
from eagle3_tui.transport.target import LocalTarget, Target

DISCOVER_S = 20.0
"""How often a host target's live trainings are listed again (new ones are followed)."""
PROBE_S = 10.0
"""How often the host is asked whether a quiet run's trainer lives (as the monitor does)."""
PROBE_FLOWING_S = 300.0
"""How often while its records flow (they are evidence of life: its heartbeats each
second); each probe starts the agent on the host (~80 ms of CPU there), the bulk of what
watching costs a host. Once they stop, every :data:`PROBE_S`."""
VIEW = ViewParams(columns=1, smoothing=0.0)
"""What a look builds by default: the verdict and the latest figures, no chart."""
LINES_EVERY_S = 30.0
"""A view with lines (the fleet's τ trend) rebuilds them this often; the other looks keep
the last ones (a line reduced from thousands of steps moves little in seconds)."""
OBSERVE_S = 2.0
"""A training without telemetry is sampled this often (the monitor: each second)."""
BATCH_S = 2.0
"""A followed run's appends within this long reach the follower as one frame (it looks
every few seconds: a frame per write would only cost both ends)."""


@dataclass(frozen=True)
class WatchTarget:
    """A target as given (``text``) and what it is: ``discover`` for a host alone
    (every live training of the user there, those that start later included)."""

    text: str
    target: Target
    discover: bool


@dataclass
class Followed:
    """One run as it is followed: its pipeline fed by its stream, its probes."""

    key: str
    label: str
    host_label: str
    pipeline: Pipeline
    control: RunControl | None
    target: Target | None = None
    """What opens it in the monitor (its directory, pinned; None: a training's PID)."""
    pid: int | None = None
    """A training without telemetry: its PID (opened with ``--pid``)."""
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    probed_at: float = 0.0
    probing: bool = True
    records_seen: int = -1
    found: bool = False
    """Found on a host (not named by a target): let go once it ended."""
    view: ViewParams = VIEW
    probe_task: asyncio.Task[None] | None = None
    probed: bool = False
    """A probe was answered (or refused for good): the process's state is known."""
    lines_at: float = -1e9
    """When the view's lines were last built (they change slowly: see LINES_EVERY_S)."""

    async def look(self, now: float) -> Snapshot:
        """The run now: its pending records fed, a snapshot. The host is asked when due,
        in a task of its own: a host that stops answering holds up no look (its answer,
        or its stream's link going down, reaches a later one)."""
        probes = self.control is not None and not self.control.observed and self.probing
        records = self.pipeline.run.unsettled.records
        flowing, self.records_seen = records != self.records_seen, records
        every = PROBE_FLOWING_S if flowing else PROBE_S
        idle = self.probe_task is None or self.probe_task.done()
        if probes and idle and now - self.probed_at >= every:
            self.probed_at = now
            self.probe_task = asyncio.ensure_future(self._probe(now))
        await self.pipeline.ingest_pending()  # the interval's chunks, in one feed
        lines = self.view is not VIEW and now - self.lines_at >= LINES_EVERY_S
        if lines:
            self.lines_at = now
        snap, _ = await self.pipeline.snapshot(now, self.view, lines=lines)
        return snap

    @property
    def process_known(self) -> bool:
        """Whether what its process does is known: a probe answered, or none is asked."""
        asks = self.control is not None and not self.control.observed and self.probing
        return self.probed or not asks

    async def _probe(self, now: float) -> None:
        assert self.control is not None
        try:
            status = await self.control.status()
        except AgentAnswerError as e:
            if e.kind is ErrorKind.NO_MANIFEST:
                self.probing = False  # judged from its records, as the monitor does
            return
        except TargetError:
            return  # unreachable for now: the stream's link says so
        await self.pipeline.set_status(status, now)
        self.probed = True

    def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        if self.probe_task is not None:
            self.probe_task.cancel()


class Follower:
    """Follows the runs its targets name; a subclass says what each look means."""

    name = "follow"
    """How its messages begin: ``eagle3-tui NAME: …``."""

    def __init__(
        self,
        targets: Sequence[WatchTarget],
        *,
        interval_s: float = 5.0,
        say: Callable[[str], None] = print,
        clock: Callable[[], float] = time.time,
        view: ViewParams = VIEW,
    ) -> None:
        self.targets = list(targets)
        self.interval_s = interval_s
        self.say, self.clock = say, clock
        self.view = view
        self.followed: dict[str, Followed] = {}
        self.hosts: dict[str, Host] = {}
        self._discovered_at: dict[str, float] = {}
        self._unlisted: dict[str, str] = {}
        """Targets whose last listing failed, and how (said once per failure)."""
        self._ended: set[str] = set()
        """Runs found on a host and let go after their end."""
        self._with_telemetry: set[tuple[str, int, int | None]] = set()
        """(host, PID, start) of each training found writing telemetry: the same process
        found later without it (exiting, its telemetry closed) is that run, not another."""
        self._finding: dict[str, asyncio.Task[None]] = {}
        """Each target's listing in flight (a task: a host that hangs holds up no other)."""
        self.listed: set[str] = set()
        """Targets whose listing (or choice) came back at least once, answered or failed."""

    # ---- what a subclass says --------------------------------------------------------
    def looked(self, key: str, f: Followed, snap: Snapshot) -> None:
        """One look at a followed run."""

    def started(self, f: Followed) -> None:
        """A run is followed from now on."""

    def unlisted(self, text: str, problem: str | None) -> None:
        """A host target's listing failed (``problem``), or works again (None)."""

    async def discovered(self, text: str, target: Target, report: DiscoverReport) -> None:
        """A host's listing: its user's live trainings are followed."""
        for row in report.live:
            if row.mine:
                await self._follow_row(text, target, row)

    def next_wait(self) -> float:
        """Seconds to the next look (the interval; a subclass may look sooner)."""
        return self.interval_s

    # ---- the loop ----------------------------------------------------------------------
    def host_of(self, target: Target) -> Host:
        name = host_name(target)
        if name not in self.hosts:
            self.hosts[name] = calls.open_host(target)
        return self.hosts[name]

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        try:
            while not stop.is_set():
                await self.turn()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.next_wait())
        finally:
            await self.close()

    async def close(self) -> None:
        for task in self._finding.values():
            task.cancel()
        for task in self._finding.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for f in self.followed.values():
            f.stop()
        for f in self.followed.values():
            for task in f.tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        for host in self.hosts.values():
            with contextlib.suppress(Exception):
                await host.close()

    async def turn(self) -> None:
        """One round: find runs (hosts), look at each."""
        now = self.clock()
        for wt in self.targets:
            task = self._finding.get(wt.text)
            if task is None or task.done():
                self._finding[wt.text] = asyncio.ensure_future(self._find_once(wt, now))
        for key, f in list(self.followed.items()):
            try:
                snap = await f.look(self.clock())
            except Exception as e:  # one run's trouble never stops the others
                self.say(f"eagle3-tui {self.name}: {f.label}: not read ({type(e).__name__}: {e})")
                continue
            self.looked(key, f, snap)

    def let_go(self, key: str) -> None:
        """Stop following a run found on a host (its agent on the host ends too); found
        live again (resumed), it is followed again."""
        f = self.followed.pop(key, None)
        if f is not None:
            f.stop()
        self._ended.add(key)

    async def _find_once(self, wt: WatchTarget, now: float) -> None:
        try:
            await self._find(wt, now)
        except Exception as e:  # one target's trouble never stops the others
            self.say(f"eagle3-tui {self.name}: {wt.text}: not listed ({type(e).__name__}: {e})")
        finally:
            self.listed.add(wt.text)

    async def _find(self, wt: WatchTarget, now: float) -> None:
        """The runs a target names, each followed once: a host's live trainings (listed
        again every :data:`DISCOVER_S`), or what the host says a directory means (a run,
        or a training without telemetry working there)."""
        if wt.discover:
            if now - self._discovered_at.get(wt.text, -1e9) >= DISCOVER_S:
                self._discovered_at[wt.text] = now
                await self._discover(wt.text, wt.target)
            return
        if wt.text in self._discovered_at:
            return  # chosen once: its run, or its process, is followed
        target, pid = wt.target, None
        try:
            if target.job is not None:  # a Slurm job: where its training runs, once it does
                target, pid = await self._job_place(wt)
            host = self.host_of(target)
            chosen = await calls.choose(host, calls.run_dir_of(target), pid)
        except TargetError as e:
            if self._unlisted.get(wt.text) != str(e):  # said once per failure, then retried
                self.say(f"eagle3-tui {self.name}: {wt.text}: not followed yet ({e})")
                self.unlisted(wt.text, str(e))
            self._unlisted[wt.text] = str(e)
            return
        if self._unlisted.pop(wt.text, None) is not None:
            self.say(f"eagle3-tui {self.name}: {wt.text}: followed now")
            self.unlisted(wt.text, None)
        self._discovered_at[wt.text] = now
        if chosen.choice is Choice.RUN:
            run_dir = chosen.chosen_run_dir()
            key = f"{host_name(target)}:{run_dir}"
            if key not in self.followed:
                self.follow_dir(key, wt.text, pinned(target, run_dir))
        elif chosen.choice is Choice.PROCESS and chosen.row is not None and pid is not None:
            await self._follow_row(wt.text, target, chosen.row)  # a job's: its run if it has one
        elif chosen.choice is Choice.PROCESS:
            row = chosen.chosen_row()
            key = f"{host_name(target)}:pid:{row.pid}:{row.start_ticks}"
            if key not in self.followed:
                self._follow_process(key, target, row)
        else:
            for row in chosen.runs:
                await self._follow_row(wt.text, target, row)

    async def _job_place(self, wt: WatchTarget) -> tuple[Target, int | None]:
        """A Slurm job's training: its host (its run pinned) and trainer; a job that has
        no training yet (pending) is not followed yet, and asked again next look."""
        from eagle3_tui.api import slurm

        place = await slurm.locate(wt.target, wt.text)
        if place.where is None:
            if place.job.active:
                raise TargetError(place.note)
            raise slurm.no_run_error(place, wt.text)
        return place.where, None if place.telemetry else place.pid

    async def _discover(self, text: str, target: Target) -> None:
        host = self.host_of(target)
        try:
            report = await calls.discover(host)
        except TargetError as e:
            if self._unlisted.get(text) != str(e):  # said once per failure, not each look
                self.say(f"eagle3-tui {self.name}: {text}: trainings not listed ({e})")
                self.unlisted(text, str(e))
            self._unlisted[text] = str(e)
            return
        if self._unlisted.pop(text, None) is not None:
            self.say(f"eagle3-tui {self.name}: {text}: trainings listed again")
            self.unlisted(text, None)
        await self.discovered(text, target, report)

    async def _follow_row(self, text: str, target: Target, row: ProcessRow) -> None:
        """A live training found on a host: its run directory when it writes telemetry,
        else the process watched from outside (live again after its end: followed again)."""
        trainer = (host_name(target), row.pid, row.start_ticks)
        if row.run_dir and row.telemetry:
            self._with_telemetry.add(trainer)
            key = f"{host_name(target)}:{row.run_dir}"
            if key not in self.followed:
                self._ended.discard(key)
                at = pinned(target, row.run_dir)
                self.follow_dir(key, label_of(text, target, row.run_dir), at)
                self.followed[key].found = True
            return
        if trainer in self._with_telemetry:
            return  # its run directory's run (a second alert of its end, by PID)
        key = f"{host_name(target)}:pid:{row.pid}:{row.start_ticks}"
        if key not in self.followed and key not in self._ended:
            self._follow_process(key, target, row)
            self.followed[key].found = True

    def follow_dir(self, key: str, label: str, target: Target) -> None:
        """Follow the run in ``target``'s directory (pinned there) under ``key``."""
        from eagle3_tui.transport.local import LocalTransport

        host = self.host_of(target)
        if isinstance(target, LocalTarget):
            source: Any = LocalTransport(target.run_dir)
        else:
            from eagle3_tui.transport.ssh import SshTransport

            source = SshTransport(host, target.run_dir, batch_s=BATCH_S)  # type: ignore[arg-type]
        control = RunControl.for_target(target, host)
        pipeline = Pipeline(self.clock)
        f = Followed(key, label, host_name(target), pipeline, control, target=target)
        self._start(f, source)

    def _follow_process(self, key: str, target: Target, row: ProcessRow) -> None:
        from eagle3_tui.transport.observed import ObservedTransport

        host = self.host_of(target)
        source = ObservedTransport(host, row, interval_s=OBSERVE_S)
        control = RunControl.for_process(target, host, row)
        label = f"{host_name(target)} pid {row.pid}"
        pipeline = Pipeline(self.clock)
        f = Followed(key, label, host_name(target), pipeline, control, target=target, pid=row.pid)
        self._start(f, source)

    def _start(self, f: Followed, source: Any) -> None:
        f.view = self.view
        f.tasks = [asyncio.ensure_future(f.pipeline.pump(source, lambda _event: None))]
        self.followed[f.key] = f
        self.started(f)


def host_name(target: Target) -> str:
    return "this machine" if isinstance(target, LocalTarget) else target.destination


def pinned(target: Target, run_dir: str) -> Target:
    if isinstance(target, LocalTarget):
        return LocalTarget(Path(run_dir))
    return target.with_run_dir(run_dir)


def label_of(text: str, target: Target, run_dir: str) -> str:
    if isinstance(target, LocalTarget):
        return run_dir
    return f"{text.rstrip(':')}:{run_dir}"
