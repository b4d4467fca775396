"""``eagle3-tui watch``: runs followed without a screen, an alert on each change of
verdict that needs a human (and the good news), so that nobody has to be looking.

Each run is followed as the monitor follows it — its stream into a :class:`Pipeline`,
the host's status probes, one verdict code (``model/health.py``) on a snapshot — so
the watcher says what the monitor would. A host target is the user's live trainings
there, found again every :data:`DISCOVER_S` (so those that start later too), with or
without telemetry. One connection per host carries every run's stream, probe and
discovery.

A verdict is sent once per transition, after it has held for ``hold_s`` and two looks
(no flapping), at most one alert per run every ``gap_s`` (a change within the gap waits
for its end, and is sent then if it still holds). Which verdict was last sent for
each run, and the deliveries not yet done, are kept in a state file: after a restart
the watcher neither repeats an alert nor loses one (a change it missed while down is
sent on its first looks).

Over 600 lines: the rules (pure, tested alone), the saved state and the following loop
are kept together because the loop's every step moves the state by the rules; the
delivery of alerts is ``notify.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shlex
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3_tui.app.pipeline import Pipeline
from eagle3_tui.app.run_control import RunControl
from eagle3_tui.model.snapshot import Snapshot, ViewParams
from eagle3_tui.notify import ALARMS, Alert, Delivery, Notifier, Outbox
from eagle3_tui.transport import calls
from eagle3_tui.transport.base import TargetError
from eagle3_tui.transport.channel import AgentAnswerError, Host
from eagle3_tui.transport.replies import Choice, ErrorKind, ProcessRow
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
OBSERVE_S = 2.0
"""A training without telemetry is sampled this often (the monitor: each second)."""
BATCH_S = 2.0
"""A followed run's appends within this long reach the watcher as one frame (it looks
every few seconds: a frame per write would only cost both ends)."""

REMEMBERED = 2000
"""Runs the state file keeps (those seen last): enough that no run still listed or named
is forgotten, and an alert about it repeated."""
ENDED = ("finished", "stopped", "dead")
QUIET = ("running", "waiting")
SEVERITY = ("dead", "stalled", "diverged", "silent", "disk_full", "unreadable", "stopped")
"""Worst first: ``watch --once`` exits with the status of the worst it found."""


@dataclass(frozen=True)
class WatchTarget:
    """A target as given (``text``) and what it is: ``discover`` for a host alone
    (every live training of the user there, those that start later included)."""

    text: str
    target: Target
    discover: bool


@dataclass
class Verdict:
    """What one look says of a run."""

    health: str
    reason: str
    step: int | None = None
    """1-based, as shown (steps done)."""
    total_steps: int | None = None
    epoch: int | None = None
    epochs: int | None = None
    pid: int | None = None
    observed: bool = False
    """No telemetry: watched from outside."""
    handler: str | None = None
    """An observed run's own handler or backend, when it has one."""
    link_down_since: float | None = None
    leftovers: bool = False


def verdict_of(snap: Snapshot, manifest: dict[str, Any] | None) -> Verdict:
    """The verdict as the monitor's header and ``summary`` say it."""
    p = snap.progress
    observed = snap.observed
    pid = observed.pid if observed is not None else None
    if pid is None and manifest is not None and isinstance(manifest.get("pid"), int):
        pid = int(manifest["pid"])
    return Verdict(
        health=snap.health.value,
        reason=snap.diagnosis.reason,
        step=p.step,
        total_steps=p.total_steps,
        epoch=p.epoch,
        epochs=p.epochs_total,
        pid=pid,
        observed=observed is not None,
        handler=observed.handler if observed is not None else None,
        link_down_since=snap.diagnosis.link_down_since,
        leftovers=bool(snap.leftovers),
    )


@dataclass
class RunMemory:
    """What the watcher keeps of one run (saved in its state file)."""

    label: str
    alerted: str | None = None
    """The verdict last sent, or taken as the baseline (a run first seen running)."""
    alerted_at: float | None = None
    link_alerted: bool = False
    last_sent: float | None = None
    pending: str | None = None
    """A new verdict not sent yet (not saved: after a restart it is looked at again)."""
    pending_since: float = 0.0
    pending_looks: int = 0
    seen_at: float = 0.0
    """When the watcher last looked at the run (the state file keeps the
    :data:`REMEMBERED` runs seen last)."""

    def saved(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "alerted": self.alerted,
            "alerted_at": self.alerted_at,
            "link_alerted": self.link_alerted,
            "last_sent": self.last_sent,
            "seen_at": self.seen_at,
        }


@dataclass
class Rules:
    hold_s: float = 15.0
    """A new verdict is sent once it has held this long (and for two looks)."""
    gap_s: float = 30.0
    """At most one alert per run in this long."""
    link_down_s: float = 60.0
    """A link down this long is an alert (and its return one more)."""


def transition(
    memory: RunMemory, v: Verdict, now: float, rules: Rules, looks: int = 2
) -> str | None:
    """The alert kind this look calls for (and the memory moved on), or None."""
    kind = _transition(memory, v, now, rules, looks)
    if kind is not None:
        memory.last_sent = now
    return kind


def _transition(memory: RunMemory, v: Verdict, now: float, rules: Rules, looks: int) -> str | None:
    link = _link_transition(memory, v, now, rules)
    if link is not None:
        return link
    if v.link_down_since is not None:
        return None  # nothing new can arrive: the last verdict stands
    health = v.health
    if health == memory.alerted or (
        memory.alerted is None and health in QUIET
    ):  # no change, or a run first seen healthy: its baseline
        memory.alerted = memory.alerted or health
        memory.pending, memory.pending_looks = None, 0
        return None
    if memory.pending != health:
        memory.pending, memory.pending_since, memory.pending_looks = health, now, 0
    memory.pending_looks += 1
    held = now - memory.pending_since >= rules.hold_s and memory.pending_looks >= looks
    in_gap = memory.last_sent is not None and now - memory.last_sent < rules.gap_s
    if not held or in_gap:
        return None
    previous = memory.alerted
    memory.alerted, memory.alerted_at = health, now
    memory.pending, memory.pending_looks = None, 0
    if health in QUIET:
        if previous in ALARMS:
            return "recovered"
        return None  # waiting <-> running: nothing to say
    return health


def _link_transition(memory: RunMemory, v: Verdict, now: float, rules: Rules) -> str | None:
    down = v.link_down_since
    if down is not None and not memory.link_alerted and now - down >= rules.link_down_s:
        memory.link_alerted = True
        return "link_down"
    if down is None and memory.link_alerted:
        memory.link_alerted = False
        return "recovered"
    return None


def action(kind: str, run: str, v: Verdict, ssh_args: Sequence[str]) -> str | None:
    """The command that acts on a verdict (as the monitor's keys would)."""
    opts = "".join(f" {shlex.quote(a)}" for a in ssh_args)
    host_run = shlex.quote(run)
    if v.observed and v.pid is not None:
        host, _, _ = run.partition(" pid ")
        by_pid = (
            f"{shlex.quote(host)} --pid {v.pid}" if host != "this machine" else f"--pid {v.pid}"
        )
    else:
        by_pid = host_run
    if kind == "silent":
        if v.observed and v.handler is None:  # no handler: telemetry is the fix
            return f"eagle3-tui attach {by_pid}{opts}"
        return f"eagle3-tui {by_pid}{opts}"
    if kind in ("stalled", "diverged") or (kind == "dead" and v.leftovers):
        return f"eagle3-tui kill {by_pid}{opts}"
    if kind in ("dead", "stopped"):
        return f"eagle3-tui resume {by_pid}{opts}"
    if kind == "finished":
        return f"eagle3-tui summary {by_pid}{opts}"
    if kind in ("recovered", "link_down", "disk_full", "unreadable"):
        return f"eagle3-tui {by_pid}{opts}"
    return None


def make_alert(
    kind: str,
    memory: RunMemory,
    host: str,
    v: Verdict,
    previous: str | None,
    ssh_args: Sequence[str],
    now: float,
) -> Alert:
    """The alert for a change of one run's verdict, as it is sent."""
    reason = v.reason
    if kind == "link_down":
        since = time.strftime("%H:%M:%S", time.localtime(v.link_down_since or now))
        reason = f"No data from {host} since {since}: the link is down. {reason}"
    return Alert(
        kind=kind,
        run=memory.label,
        host=host,
        pid=v.pid,
        health=v.health,
        previous=previous,
        reason=reason,
        step=v.step,
        total_steps=v.total_steps,
        epoch=v.epoch,
        epochs=v.epochs,
        command=action(kind, memory.label, v, ssh_args),
        at=now,
        id=uuid.uuid4().hex,
    )


# ---- the state file ---------------------------------------------------------------


def state_path(targets: Sequence[str], explicit: str | None = None) -> Path:
    """Where the watcher keeps what it sent: ``--state``, else one file per set of
    targets under the user's state directory."""
    if explicit:
        return Path(explicit)
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    digest = hashlib.sha1("\0".join(sorted(targets)).encode()).hexdigest()[:12]
    return base / "eagle3-tui" / "watch" / f"{digest}.json"


@dataclass
class WatchState:
    path: Path
    runs: dict[str, RunMemory] = field(default_factory=dict)
    outbox: list[Delivery] = field(default_factory=list)
    problem: str | None = None
    """Why the saved state could not be read (then the watcher starts afresh, said)."""

    @classmethod
    def load(cls, path: Path) -> WatchState:
        state = cls(path)
        try:
            data = json.loads(path.read_text())
            for key, saved in data.get("runs", {}).items():
                state.runs[str(key)] = RunMemory(
                    label=str(saved.get("label") or key),
                    alerted=saved.get("alerted"),
                    alerted_at=saved.get("alerted_at"),
                    link_alerted=bool(saved.get("link_alerted")),
                    last_sent=_float_or_none(saved.get("last_sent")),
                    seen_at=_float_or_none(saved.get("seen_at")) or 0.0,
                )
            state.outbox = [Delivery.of_json(d) for d in data.get("outbox", [])]
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
            state.problem = f"{path}: not read ({type(e).__name__}: {e}); starting afresh"
            state.runs, state.outbox = {}, []
        return state

    def save(self, outbox: list[Delivery]) -> None:
        """Written whole (a temporary file, then renamed). Of the runs, the
        :data:`REMEMBERED` seen last are kept: a watcher of a busy fleet over months would
        otherwise grow its file by every run it ever saw."""
        runs = dict(self.runs)  # a copy: two threads
        if len(runs) > REMEMBERED:
            kept = sorted(runs, key=lambda k: runs[k].seen_at)[-REMEMBERED:]
            runs = {k: runs[k] for k in kept}
        data = {
            "version": 1,
            "runs": {k: m.saved() for k, m in runs.items()},
            "outbox": [d.to_json() for d in outbox],
        }
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # a stale one of this PID's; another user's: refused, said
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, self.path)


def _float_or_none(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


# ---- following --------------------------------------------------------------------


@dataclass
class Followed:
    """One run as the watcher follows it: its pipeline fed by its stream, its probes."""

    key: str
    label: str
    host_label: str
    pipeline: Pipeline
    control: RunControl | None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    probed_at: float = 0.0
    probing: bool = True
    records_seen: int = -1
    found: bool = False
    """Found on a host (not named by a target): let go once its end is sent."""

    async def look(self, now: float) -> Verdict:
        probes = self.control is not None and not self.control.observed and self.probing
        records = self.pipeline.run.unsettled.records
        flowing, self.records_seen = records != self.records_seen, records
        every = PROBE_FLOWING_S if flowing else PROBE_S
        if probes and now - self.probed_at >= every:
            self.probed_at = now
            await self._probe(now)
        await self.pipeline.ingest_pending()  # the interval's chunks, in one feed
        snap, _ = await self.pipeline.snapshot(now, VIEW, lines=False)
        return verdict_of(snap, self.pipeline.run.unsettled.manifest)

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

    def stop(self) -> None:
        for task in self.tasks:
            task.cancel()


class Watcher:
    """Follows the runs its targets name and turns their verdicts into alerts."""

    def __init__(
        self,
        targets: Sequence[WatchTarget],
        notifiers: Sequence[Notifier],
        state: WatchState,
        *,
        rules: Rules | None = None,
        interval_s: float = 5.0,
        ssh_args: Sequence[str] = (),
        say: Callable[[str], None] = print,
        report: Callable[[str], None] = print,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.targets = list(targets)
        self.state = state
        self.rules = rules or Rules()
        self.interval_s = interval_s
        self.ssh_args = list(ssh_args)
        self.say, self.clock = say, clock
        self.outbox = Outbox(list(notifiers), report, self.save, clock)
        self.outbox.queue = list(state.outbox)
        self.followed: dict[str, Followed] = {}
        self.hosts: dict[str, Host] = {}
        self.alerts: list[Alert] = []
        self._discovered_at: dict[str, float] = {}
        self._unlisted: dict[str, str] = {}
        self._ended: set[str] = set()
        self._save_problem: str | None = None
        self._save_lock = threading.Lock()
        """Runs found on a host and let go after their end was sent."""

    def save(self) -> None:
        """The state to its file (the watching loop and the outbox's thread both call)."""
        try:
            with self._save_lock:
                self.state.save(list(self.outbox.queue))
        except OSError as e:
            problem = f"{self.state.path}: not saved ({e.strerror or e}): a restart may repeat"
            if problem != self._save_problem:
                self.say(f"eagle3-tui watch: {problem}")
            self._save_problem = problem
        else:
            self._save_problem = None

    def host_of(self, target: Target) -> Host:
        name = host_name(target)
        if name not in self.hosts:
            self.hosts[name] = calls.open_host(target)
        return self.hosts[name]

    async def run(self, stop: asyncio.Event | None = None) -> None:
        self.outbox.start()
        stop = stop or asyncio.Event()
        try:
            while not stop.is_set():
                await self.turn()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.interval_s)
        finally:
            await self.close()

    async def close(self) -> None:
        for f in self.followed.values():
            f.stop()
        for f in self.followed.values():
            for task in f.tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        for host in self.hosts.values():
            with contextlib.suppress(Exception):
                await host.close()
        self.outbox.stop(drain_s=2.0)
        self.save()

    async def turn(self) -> None:
        """One round: find runs (hosts), look at each, send what changed."""
        now = self.clock()
        for wt in self.targets:
            await self._find(wt, now)
        for key, f in list(self.followed.items()):
            try:
                v = await f.look(self.clock())
            except Exception as e:  # one run's trouble never stops the others
                self.say(f"eagle3-tui watch: {f.label}: not judged ({type(e).__name__}: {e})")
                continue
            self._judge(key, f, v)
            if f.found and v.health in ENDED and self.state.runs[key].alerted == v.health:
                self._let_go(key, f)  # said: a host's ended run is followed no longer

    def _judge(self, key: str, f: Followed, v: Verdict) -> None:
        self.judge(key, f.label, f.host_label, v)

    def _let_go(self, key: str, f: Followed) -> None:
        """Stop following a run found on a host once its end was sent (its agent on the
        host ends too); found live again (resumed), it is followed again."""
        f.stop()
        del self.followed[key]
        self._ended.add(key)

    def judge(self, key: str, label: str, host: str, v: Verdict, looks: int = 2) -> None:
        """One look's verdict on a run: an alert posted when it calls for one."""
        now = self.clock()
        memory = self.state.runs.setdefault(key, RunMemory(label))
        memory.seen_at = now
        previous = memory.alerted
        kind = transition(memory, v, now, self.rules, looks)
        if kind is None:
            return
        alert = make_alert(kind, memory, host, v, previous, self.ssh_args, now)
        self.alerts.append(alert)
        self.say(alert.text().replace("\n", " — "))
        self.outbox.post(alert)
        self.save()

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
        host = self.host_of(wt.target)
        try:
            chosen = await calls.choose(host, calls.run_dir_of(wt.target), None)
        except TargetError as e:
            if self._unlisted.get(wt.text) != str(e):  # said once per failure, then retried
                self.say(f"eagle3-tui watch: {wt.text}: not followed yet ({e})")
            self._unlisted[wt.text] = str(e)
            return
        if self._unlisted.pop(wt.text, None) is not None:
            self.say(f"eagle3-tui watch: {wt.text}: followed now")
        self._discovered_at[wt.text] = now
        if chosen.choice is Choice.RUN:
            run_dir = chosen.chosen_run_dir()
            key = f"{host_name(wt.target)}:{run_dir}"
            if key not in self.followed:
                self._follow_dir(key, wt.text, pinned(wt.target, run_dir))
        elif chosen.choice is Choice.PROCESS:
            row = chosen.chosen_row()
            key = f"{host_name(wt.target)}:pid:{row.pid}:{row.start_ticks}"
            if key not in self.followed:
                self._follow_process(key, wt.target, row)
        else:
            for row in chosen.runs:
                await self._follow_row(wt.text, wt.target, row)

    async def _discover(self, text: str, target: Target) -> None:
        host = self.host_of(target)
        try:
            report = await calls.discover(host)
        except TargetError as e:
            if self._unlisted.get(text) != str(e):  # said once per failure, not each look
                self.say(f"eagle3-tui watch: {text}: trainings not listed ({e})")
            self._unlisted[text] = str(e)
            return
        if self._unlisted.pop(text, None) is not None:
            self.say(f"eagle3-tui watch: {text}: trainings listed again")
        for row in report.live:
            if row.mine:
                await self._follow_row(text, target, row)

    async def _follow_row(self, text: str, target: Target, row: ProcessRow) -> None:
        """A live training found on a host: its run directory when it writes telemetry,
        else the process watched from outside (live again after its end: followed again)."""
        if row.run_dir and row.telemetry:
            key = f"{host_name(target)}:{row.run_dir}"
            if key not in self.followed:
                self._ended.discard(key)
                at = pinned(target, row.run_dir)
                self._follow_dir(key, label_of(text, target, row.run_dir), at)
                self.followed[key].found = True
            return
        key = f"{host_name(target)}:pid:{row.pid}:{row.start_ticks}"
        if key not in self.followed and key not in self._ended:
            self._follow_process(key, target, row)
            self.followed[key].found = True

    def _follow_dir(self, key: str, label: str, target: Target) -> None:
        from eagle3_tui.transport.local import LocalTransport

        host = self.host_of(target)
        if isinstance(target, LocalTarget):
            source: Any = LocalTransport(target.run_dir)
        else:
            from eagle3_tui.transport.ssh import SshTransport

            source = SshTransport(host, target.run_dir, batch_s=BATCH_S)  # type: ignore[arg-type]
        control = RunControl.for_target(target, host)
        self._start(Followed(key, label, host_name(target), Pipeline(self.clock), control), source)

    def _follow_process(self, key: str, target: Target, row: ProcessRow) -> None:
        from eagle3_tui.transport.observed import ObservedTransport

        host = self.host_of(target)
        source = ObservedTransport(host, row, interval_s=OBSERVE_S)
        control = RunControl.for_process(target, host, row)
        label = f"{host_name(target)} pid {row.pid}"
        self._start(Followed(key, label, host_name(target), Pipeline(self.clock), control), source)

    def _start(self, f: Followed, source: Any) -> None:
        f.tasks = [asyncio.ensure_future(f.pipeline.pump(source, lambda _event: None))]
        self.followed[f.key] = f
        self.state.runs.setdefault(f.key, RunMemory(f.label)).label = f.label


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


def worst_status(healths: Sequence[str]) -> int:
    """``watch --once``'s exit status: that of the worst health found (0: all well)."""
    from eagle3_tui import exits

    for health in SEVERITY:
        if health in healths:
            return exits.BY_HEALTH.get(health, exits.OK)
    return exits.OK


def once(w: Watcher) -> int:
    """``watch --once``: every run the targets name read once, as ``summary`` reads it;
    an alert for each verdict that differs from the last one sent (the state file), no
    hold; the deliveries tried once each (what fails waits in the state for the next
    time); the exit status of the worst health found."""
    from eagle3_tui import api
    from eagle3_tui.api.reading import run_sync

    w.rules = Rules(hold_s=0.0, gap_s=0.0, link_down_s=w.rules.link_down_s)
    healths: list[str] = []
    errors = 0

    def judge(key: str, label: str, host: str, opened: api.OpenedRun) -> None:
        v = verdict_of(opened.snapshot(), opened.state.manifest)
        healths.append(v.health)
        w.judge(key, label, host, v, looks=1)

    for wt in w.targets:
        host = host_name(wt.target)
        try:
            if not wt.discover:
                judge(f"{host}:{wt.text}", wt.text, host, api.open_run(wt.target, label=wt.text))
                continue
            report = run_sync(calls.on_host(wt.target, lambda h: calls.discover(h)))
            for row in report.live:
                if not row.mine:
                    continue
                if row.run_dir and row.telemetry:
                    label = label_of(wt.text, wt.target, row.run_dir)
                    opened = api.open_run(pinned(wt.target, row.run_dir), label=label)
                    judge(f"{host}:{row.run_dir}", label, host, opened)
                else:
                    key = f"{host}:pid:{row.pid}:{row.start_ticks}"
                    opened = api.open_run(wt.target, pid=row.pid, label=f"{host} pid {row.pid}")
                    judge(key, f"{host} pid {row.pid}", host, opened)
        except TargetError as e:
            said = str(e) if str(e).startswith(wt.text) else f"{wt.text}: {e}"
            w.say(f"eagle3-tui watch: {said}")
            errors += 1
    for delivery in list(w.outbox.queue):  # cron's next look is minutes away: all now
        w.outbox.attempt(delivery)
    w.save()
    from eagle3_tui import exits

    return worst_status(healths) or (exits.ERROR if errors else exits.OK)
