"""``eagle3-tui watch``: runs followed without a screen, an alert on each change of
verdict that needs a human (and the good news), so that nobody has to be looking.

Each run is followed as the monitor follows it (``following.py``: its stream into a
pipeline, the host's status probes, a snapshot per look; a host target is its user's
live trainings, those that start later too; one connection per host), and judged by the
one verdict code (``model/health.py``): the watcher says what the monitor would.

A verdict is sent once per transition, after it has held for ``hold_s`` and two looks
(no flapping), at most one alert per run every ``gap_s`` (a change within the gap waits
for its end, and is sent then if it still holds). Which verdict was last sent for
each run, and the deliveries not yet done, are kept in a state file: after a restart
the watcher neither repeats an alert nor loses one (a change it missed while down is
sent on its first looks). An alarm that outlives its run (a diverged run that then
finished or was stopped) is said once more when the run ends: ``ended``.

Over 600 lines: a verdict's way to an alert (the transition rules, the alert, its
command), the state file that remembers what was sent, and the watcher that joins them
to the following (``following.py``) belong together.
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

from eagle3_tui.following import (
    PROBE_FLOWING_S,
    Followed,
    Follower,
    WatchTarget,
    host_name,
    label_of,
    pinned,
)
from eagle3_tui.model.health import current_process, numbered_checkpoint, stop_requested
from eagle3_tui.model.snapshot import Snapshot
from eagle3_tui.model.state import RunState
from eagle3_tui.model.verdict import ENDED, WORST_FIRST
from eagle3_tui.notify import ALARMS, Alert, Delivery, Notifier, Outbox
from eagle3_tui.telemetry.parsing import parse_json
from eagle3_tui.transport import calls
from eagle3_tui.transport.base import TargetError
from eagle3_tui.transport.target import LocalTarget

REMEMBERED = 2000
"""Runs the state file keeps (those seen last): enough that no run still listed or named
is forgotten, and an alert about it repeated."""
QUIET = ("running", "waiting")
BOUNDS_PROBE_S = 2.0
"""While a run's totals are not known yet, its manifest is asked again each look (at
most this often), not every ``PROBE_FLOWING_S`` while its records flow: its trainer
writes them to ``run.json`` once its Trainer is made, after a watcher started with it
first looked."""


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
    ended: bool = False
    """The run ended (finished, stopped, dead): nothing of it runs to be killed."""
    resumable: bool = True
    """Whether a resume has a checkpoint to continue from, as the records tell: a
    complete numbered save, or a stop at a step boundary's (a kill numbers it). Not a
    signal's ``interrupted/`` alone, which speculators does not resume from."""


def verdict_of(snap: Snapshot, state: RunState) -> Verdict:
    """The verdict as the monitor's header and ``summary`` say it. Its pid: the current
    trainer's, as its own ``start`` or ``resume`` record says it (the manifest a probe
    last read may name the process before a resume), else the manifest's."""
    p = snap.progress
    observed = snap.observed
    pid = observed.pid if observed is not None else None
    current = current_process(state)
    if pid is None and current is not None:
        pid = current.pid
    manifest = state.manifest
    if pid is None and isinstance(manifest.get("pid"), int):
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
        leftovers=any(not x.gone for x in snap.leftovers),
        ended=p.ended_at is not None,
        resumable=observed is not None or _resumable(snap, state),
    )


def _resumable(snap: Snapshot, state: RunState) -> bool:
    if numbered_checkpoint(state):
        return True
    saved_at_stop = any(c.event == "interrupted" for c in snap.checkpoints)
    return saved_at_stop and stop_requested(state)


@dataclass
class RunMemory:
    """What the watcher keeps of one run (saved in its state file)."""

    label: str
    alerted: str | None = None
    """The verdict last sent, or taken as the baseline (a run first seen running)."""
    alerted_at: float | None = None
    link_alerted: bool = False
    last_sent: float | None = None
    end_alerted: bool = False
    """The run's end was said: by the alert of an ended verdict (finished, dead, a
    diverged run that had finished), or by ``ended`` (an alarm that outlived its run)."""
    ended_since: float | None = None
    """When the looks first found the run ended, its alarm unchanged (not saved)."""
    ended_looks: int = 0
    pending: str | None = None
    """A new verdict not sent yet (not saved: after a restart it is looked at again)."""
    pending_since: float = 0.0
    pending_looks: int = 0
    seen_at: float = 0.0
    """When the watcher last looked at the run (the state file keeps the
    :data:`REMEMBERED` runs seen last)."""
    seen: str | None = None
    """The health the last look found (not saved)."""
    pending_from: str | None = None
    """The health looks found just before the pending one (not saved)."""
    previous: str | None = None
    """What the last alert's run was before its change: the health the looks found
    before it (a run that went from waiting to running and stopped within a hold was
    running, though only waiting was ever sent)."""

    def saved(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "alerted": self.alerted,
            "alerted_at": self.alerted_at,
            "link_alerted": self.link_alerted,
            "last_sent": self.last_sent,
            "end_alerted": self.end_alerted,
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
    memory.previous = memory.alerted
    kind = _transition(memory, v, now, rules, looks)
    if v.link_down_since is None:
        memory.seen = v.health
    if kind is not None:
        memory.last_sent = now
        if kind != "link_down":
            memory.end_alerted = v.ended  # its alert said the run ended, or not yet
    return kind


def _transition(memory: RunMemory, v: Verdict, now: float, rules: Rules, looks: int) -> str | None:
    link = _link_transition(memory, v, now, rules)
    if link is not None:
        return link
    if v.link_down_since is not None:
        return None  # nothing new can arrive: the last verdict stands
    health = v.health
    if health == memory.alerted and health in ALARMS:
        ended = _end_transition(memory, v, now, rules, looks)
        if ended is not None:
            return ended
    if health == memory.alerted or (
        memory.alerted is None and health in QUIET
    ):  # no change, or a run first seen healthy: its baseline
        memory.alerted = memory.alerted or health
        memory.pending, memory.pending_looks = None, 0
        return None
    if memory.pending != health:
        memory.pending, memory.pending_since, memory.pending_looks = health, now, 0
        memory.pending_from = memory.seen if memory.seen != health else None
    memory.pending_looks += 1
    held = now - memory.pending_since >= rules.hold_s and memory.pending_looks >= looks
    in_gap = memory.last_sent is not None and now - memory.last_sent < rules.gap_s
    if not held or in_gap:
        return None
    previous = memory.alerted
    if memory.pending_from is not None:
        memory.previous = memory.pending_from
    memory.alerted, memory.alerted_at = health, now
    memory.pending, memory.pending_looks = None, 0
    if health in QUIET:
        if previous in ALARMS:
            return "recovered"
        return None  # waiting <-> running: nothing to say
    return health


def _end_transition(
    memory: RunMemory, v: Verdict, now: float, rules: Rules, looks: int
) -> str | None:
    """``ended``: a run whose alarm was sent (diverged) ended still in it (finished or
    stopped after it diverged): its health does not change, but nobody would learn it
    ended. Sent once, after the end held as a change does, within the gap's rule."""
    if not v.ended or v.health in ENDED:
        memory.ended_since, memory.ended_looks = None, 0
        if not v.ended:
            memory.end_alerted = False  # live again (resumed): its next end is news
        return None
    if memory.end_alerted:
        return None
    if memory.ended_since is None:
        memory.ended_since = now
    memory.ended_looks += 1
    held = now - memory.ended_since >= rules.hold_s and memory.ended_looks >= looks
    in_gap = memory.last_sent is not None and now - memory.last_sent < rules.gap_s
    if not held or in_gap:
        return None
    memory.ended_since, memory.ended_looks = None, 0
    memory.alerted_at = now
    memory.pending, memory.pending_looks = None, 0
    return "ended"


def _link_transition(memory: RunMemory, v: Verdict, now: float, rules: Rules) -> str | None:
    down = v.link_down_since
    if down is not None and not memory.link_alerted and now - down >= rules.link_down_s:
        memory.link_alerted = True
        return "link_down"
    if down is None and memory.link_alerted:
        memory.link_alerted = False
        return "recovered"
    return None


def action(
    kind: str, run: str, v: Verdict, ssh_args: Sequence[str], host: str | None = None
) -> str | None:
    """The command that acts on a verdict (as the monitor's keys would). A run watched
    from outside is acted on by its PID on its ``host`` (by default the one its name
    says: ``HOST pid N``; a directory's training without telemetry is named by the
    directory)."""
    opts = "".join(f" {shlex.quote(a)}" for a in ssh_args)
    host_run = shlex.quote(run)
    if v.observed and v.pid is not None:
        if host is None:
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
    if kind in ("diverged", "ended") and v.ended and not v.leftovers:  # it finished or stopped so
        return f"eagle3-tui summary {by_pid}{opts}"
    if kind in ("stalled", "diverged", "ended") or (kind == "dead" and v.leftovers):
        return f"eagle3-tui kill {by_pid}{opts}"
    if kind in ("dead", "stopped"):
        if not v.resumable:  # nothing to continue from: resume would be refused
            return f"eagle3-tui summary {by_pid}{opts}"
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
        command=action(kind, memory.label, v, ssh_args, host),
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
    make_dirs: bool = True
    """Whether a save makes the file's missing directories (the default path's; one
    named with ``--state`` is in a directory that exists, and none is made)."""

    @classmethod
    def load(cls, path: Path) -> WatchState:
        state = cls(path)
        try:
            data = parse_json(path.read_text())
            for key, saved in data.get("runs", {}).items():
                state.runs[str(key)] = RunMemory(
                    label=str(saved.get("label") or key),
                    alerted=saved.get("alerted"),
                    alerted_at=saved.get("alerted_at"),
                    link_alerted=bool(saved.get("link_alerted")),
                    end_alerted=bool(saved.get("end_alerted")),
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

    def memory(self, key: str, label: str) -> RunMemory:
        """What is kept of a run, under its key; one kept under the key an older watcher
        gave it (a local directory as typed: ``this machine:r2``, now its resolved
        path) is found there and kept under the new one (its alert is not sent again)."""
        memory = self.runs.get(key)
        if memory is None:
            old = _old_key(key, self.runs)
            memory = self.runs.pop(old) if old is not None else RunMemory(label)
            self.runs[key] = memory
        return memory

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
        if self.make_dirs:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # a stale one of this PID's; another user's: refused, said
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, self.path)


def _old_key(key: str, runs: dict[str, RunMemory]) -> str | None:
    """The key of ``runs`` that names the same local directory as ``key`` (a resolved
    path) as it was typed then, relative to this directory; None if none does."""
    local = f"{host_name(LocalTarget(Path('.')))}:"
    path = key[len(local) :]
    if not key.startswith(local) or not os.path.isabs(path):
        return None
    for old in runs:
        typed = old[len(local) :]
        if old.startswith(local) and typed and not typed.startswith("pid:"):
            with contextlib.suppress(OSError, ValueError):
                if str(Path(typed).resolve()) == path:
                    return old
    return None


def _float_or_none(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


# ---- following --------------------------------------------------------------------


class Watcher(Follower):
    """Follows the runs its targets name and turns their verdicts into alerts."""

    name = "watch"

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
        super().__init__(targets, interval_s=interval_s, say=say, clock=clock)
        self.state = state
        self.rules = rules or Rules()
        self.ssh_args = list(ssh_args)
        self.outbox = Outbox(list(notifiers), report, self.save, clock)
        self.outbox.queue = list(state.outbox)
        self.alerts: list[Alert] = []
        self._first_step_at: dict[str, float] = {}
        """When each run's first step was seen while its totals were unknown."""
        self._keys: dict[str, str] = {}
        """A followed run's key -> its key in the state file, where they differ (a
        directory's training without telemetry is kept by its directory, not its PID)."""
        self._save_problem: str | None = None
        self._save_lock = threading.Lock()

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

    async def run(self, stop: asyncio.Event | None = None) -> None:
        self.outbox.start()
        await super().run(stop)

    async def close(self) -> None:
        await super().close()
        self.outbox.stop(drain_s=2.0)
        self.save()

    def started(self, f: Followed) -> None:
        """A run followed: kept under its key. A directory named by a target whose
        training writes no telemetry is followed by its trainer's PID, but kept and named
        as the directory (a local one by its resolved path, a ``HOST:DIR`` as typed), as
        its run would be: the README's promise, and ``--once``'s key."""
        named = next((t for t in self.targets if not t.discover and t.target is f.target), None)
        run_dir = named.target.run_dir if named is not None else None
        if f.pid is not None and named is not None and run_dir is not None:
            f.label = named.text
            self._keys[f.key] = f"{f.host_label}:{run_dir}"
        self.state.memory(self._keys.get(f.key, f.key), f.label).label = f.label

    def looked(self, key: str, f: Followed, snap: Snapshot) -> None:
        v = verdict_of(snap, f.pipeline.run.unsettled)
        self._ask_for_totals(key, f, v)
        kept = self._keys.get(key, key)
        self.judge(kept, f.label, f.host_label, v)
        memory = self.state.runs[kept]
        ended = v.health in ENDED or (v.ended and memory.end_alerted)
        if f.found and memory.alerted == v.health and ended:
            self.let_go(key)  # said: a host's ended run is followed no longer

    def _ask_for_totals(self, key: str, f: Followed, v: Verdict) -> None:
        """A run whose total steps are not known: its host asked again at the next look
        (see :data:`BOUNDS_PROBE_S`), until one answer came after its first step (a
        Trainer writes its totals before it: a run without any is asked no more)."""
        now = self.clock()
        if v.total_steps is not None or v.ended or v.observed or not f.probing:
            self._first_step_at.pop(key, None)
            return
        busy = f.probe_task is not None and not f.probe_task.done()
        if v.step is not None:
            first = self._first_step_at.setdefault(key, now)
            if f.probed and f.probed_at > first and not busy:
                return  # asked after its first step: it has no totals to give
        if not busy and now - f.probed_at >= BOUNDS_PROBE_S:
            f.probed_at = now - PROBE_FLOWING_S  # the next look asks

    def judge(self, key: str, label: str, host: str, v: Verdict, looks: int = 2) -> None:
        """One look's verdict on a run: an alert posted when it calls for one."""
        now = self.clock()
        memory = self.state.memory(key, label)
        memory.label, memory.seen_at = label, now
        kind = transition(memory, v, now, self.rules, looks)
        if kind is None:
            return
        alert = make_alert(kind, memory, host, v, memory.previous, self.ssh_args, now)
        self.alerts.append(alert)
        self.say(alert.text().replace("\n", " — "))
        self.outbox.post(alert)
        self.save()


def worst_status(healths: Sequence[str]) -> int:
    """``watch --once``'s exit status: that of the worst health found (0: all well)."""
    from eagle3_tui import exits

    for health in WORST_FIRST:
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
    errors: list[int] = []  # each failed target's exit status, as summary's for it

    def judge(key: str, label: str, host: str, opened: api.OpenedRun) -> None:
        v = verdict_of(opened.snapshot(), opened.state)
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
            errors.append(api.exit_status(e))
    w.outbox.try_all()  # cron's next look is minutes away: all now, in order
    w.save()
    from eagle3_tui import exits

    return worst_status(healths) or (errors[0] if errors else exits.OK)
