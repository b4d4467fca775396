"""eagle3-tui from Python: open a run, read its state and verdict, follow it, compare two
runs, stop and resume one. The CLI is a thin layer over these functions.

    from eagle3_tui import api

    run = api.open_run("runs/exp7")  # or "gpu-box:runs/exp7", or pid=12345
    print(run.health, run.reason)  # "running", "No metric for 4 min ..."
    print(run.summary()["loss"], run.summary()["tau"])  # summary --json's object
    print(api.compare("runs/exp7", "runs/exp6").verdict)

A target is what the command line takes: a local run or work directory, or
``[USER@]HOST[:DIR]`` reached with ssh's own configuration (``ssh=SshOptions(...)`` for
``-p``, ``-i``, ``-J``...); ``pid=`` names a training process, with or without
telemetry. Every failure a user can cause raises :class:`TargetError` with one line
that says what is wrong (:func:`exit_status` is the status the CLI exits with).

The functions are synchronous; called where an event loop already runs (a Jupyter
notebook), they do their I/O in a thread of their own, so they work there as well.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

from eagle3_tui import exits
from eagle3_tui.agent.names import KILL_GRACE_S, PURPOSE_RESUME, SAVE_WAIT_S
from eagle3_tui.model.compare import Comparison
from eagle3_tui.model.compare import compare as compare_states
from eagle3_tui.model.files import DiskSpace
from eagle3_tui.model.run import Run
from eagle3_tui.model.snapshot import Snapshot, ViewParams, build_snapshot
from eagle3_tui.model.state import RunState
from eagle3_tui.model.summary import summarize
from eagle3_tui.transport import control
from eagle3_tui.transport.base import TargetError
from eagle3_tui.transport.channel import AgentAnswerError, DataFrame, Event, Host
from eagle3_tui.transport.control import Report
from eagle3_tui.transport.local import check_local_input, check_run_dir, iter_chunks
from eagle3_tui.transport.replies import (
    AttachPlan,
    AttachResult,
    Choice,
    DiscoverReport,
    KillReport,
    ResumeReport,
    SaveWait,
    SaveWaitReport,
    Status,
    apply_status,
)
from eagle3_tui.transport.target import (
    LocalTarget,
    SshOptions,
    SshTarget,
    Target,
    parse_host,
    parse_target,
)

__all__ = [
    "OpenedRun",
    "SshOptions",
    "TargetError",
    "attach",
    "compare",
    "exit_status",
    "follow",
    "kill",
    "open_run",
    "resume",
    "runs",
    "target",
]

T = TypeVar("T")
Note = Callable[[str], object]
"""Told what a target turned out to mean (a process, a work directory's run)."""

OBSERVE_S = 2.5
"""How long a training without telemetry is watched when opened (CPU and reads need two
samples; the log and checkpoints are read back at once)."""


def target(where: str | Path | Target, ssh: SshOptions | None = None) -> Target:
    """A target as the command line reads it (``Path``: always this machine)."""
    if isinstance(where, LocalTarget | SshTarget):
        return where
    if isinstance(where, Path):
        return LocalTarget(where)
    return parse_target(where, ssh)


@dataclass(frozen=True)
class OpenedRun:
    """A run as read at one moment: its records and its host's word on its processes."""

    label: str
    where: Target
    run: Run
    now: float
    """The host's clock when it was read (health is judged against it)."""
    note: str | None = None
    """What the target turned out to mean, when the host had to say (a process...)."""

    @property
    def state(self) -> RunState:
        return self.run.state

    def snapshot(self, columns: int = 1) -> Snapshot:
        """What the monitor draws (series reduced to ``columns`` points)."""
        return build_snapshot(self.run.state, self.now, ViewParams(columns=columns))

    def summary(self) -> dict[str, Any]:
        """``eagle3-tui summary --json``'s object (documented field by field in the README)."""
        return dict(self._summary)

    @cached_property
    def _summary(self) -> dict[str, Any]:
        return summarize(self.run.state, self.now)

    @property
    def health(self) -> str:
        """``running``, ``finished``, ``silent``, ``stalled``, ``dead``, ``diverged``..."""
        return str(self._summary["health"])

    @property
    def reason(self) -> str:
        """The diagnosis: why the run has this health, every clause from its evidence."""
        return str(self._summary["reason"])

    @property
    def exit_status(self) -> int:
        """``summary``'s exit status for this health (``eagle3_tui.exits``)."""
        return exits.BY_HEALTH.get(self.health, exits.OK)


def open_run(
    where: str | Path | Target | None = None,
    *,
    pid: int | None = None,
    ssh: SshOptions | None = None,
    label: str | None = None,
    on_note: Note | None = None,
) -> OpenedRun:
    """Any run a target names, read once: a run directory's records (and manifest), or
    what the host says the target means (a process, a work directory, the host's live
    training: with telemetry or without, its metrics from its log, its own handler's
    file or its metric backend's files, watched for :data:`OBSERVE_S`). No target and
    a ``pid``: that process on this machine. ``on_note`` is told what the host chose
    as soon as it has (also kept as ``note``)."""
    t = _target_or_here(where, pid, ssh)
    label = label or _label(where, pid)
    notes: list[str] = []

    def noted(note: str) -> None:
        notes.append(note)
        if on_note is not None:
            on_note(note)

    if not needs_choice(t, pid):
        run, now = load_target(t, label)
    else:
        run, now = run_sync(load_chosen(t, pid, label, noted))
        state = run.state
        if state.records == 0 and state.malformed_count == 0 and state.observed is None:
            raise TargetError(f"{label}: metrics.jsonl is empty (no record written yet)")
    return OpenedRun(label, t, run, now, notes[-1] if notes else None)


def follow(
    where: str | Path | Target | None = None,
    *,
    every: float = 5.0,
    pid: int | None = None,
    ssh: SshOptions | None = None,
) -> Iterator[OpenedRun]:
    """The run read again every ``every`` seconds, for as long as the caller iterates.
    A local run directory is read on from where the last look ended (only new bytes):
    each look's ``summary()`` is as of its own time, while its ``run`` is the one being
    followed and grows. Anything else is opened afresh each time (for a live screen,
    the monitor streams)."""
    first = open_run(where, pid=pid, ssh=ssh)
    yield _taken(first)
    t, label = first.where, first.label
    local_run = isinstance(t, LocalTarget) and not needs_choice(t, pid)
    run, offset = first.run, first.run.reader.next_offset
    seen = _file_id(t) if local_run else None
    while True:
        time.sleep(every)
        if not local_run:
            yield open_run(t, pid=pid, label=label)
            continue
        assert isinstance(t, LocalTarget)
        path = check_run_dir(t.run_dir)
        now_id = _file_id(t)
        if now_id != seen or path.stat().st_size < offset:  # replaced or truncated
            run, offset, seen = Run(), 0, now_id  # read it whole again
        for chunk in iter_chunks(path, offset):
            run.feed(chunk.offset, chunk.data)
            offset = chunk.end
        now = time.time()
        _local_status(run, t.run_dir, now)
        yield _taken(OpenedRun(label, t, run, now))


def _taken(opened: OpenedRun) -> OpenedRun:
    """The look with its summary taken now (its run may be fed on afterwards)."""
    opened.summary()
    return opened


def _file_id(where: Target) -> tuple[int, int]:
    """Which file a local run's metrics.jsonl is (a new one under the name starts over)."""
    assert isinstance(where, LocalTarget)
    st = check_run_dir(where.run_dir).stat()
    return st.st_dev, st.st_ino


def compare(
    a: str | Path | Target,
    b: str | Path | Target,
    *,
    axis: str = "step",
    ssh: SshOptions | None = None,
    on_note: Note | None = None,
) -> Comparison:
    """Run A (this one) against run B (a previous one) at the furthest point both reached
    (``axis``: ``step``, ``tokens`` or ``time``); ``comparison_json(result)`` is
    ``compare --json``'s object, ``result.verdict`` its sentence."""
    ta, tb = target(a, ssh), target(b, ssh)
    same = same_place(ta, tb)
    if same is not None:
        raise TargetError(f"{a} and {b} are the same run ({same}): compare it with another run")
    run_a = open_run(ta, label=str(a), on_note=on_note)
    run_b = open_run(tb, label=str(b), on_note=on_note)
    return compare_states(run_a.state, run_b.state, axis=axis, labels=(str(a), str(b)))


def kill(
    where: str | Path | Target | None = None,
    *,
    pid: int | None = None,
    grace: float = KILL_GRACE_S,
    save_wait: float = SAVE_WAIT_S,
    stop_wait: float | None = None,
    attach_first: bool = True,
    ssh: SshOptions | None = None,
    on_progress: Callable[[Event], None] | None = None,
    on_note: Note | None = None,
) -> KillReport:
    """Stop a run as ``eagle3-tui kill`` does (at a step boundary where it can, its
    checkpoint saved, then every process of it verified gone; on every node of a
    multi-node run) and return the report. ``on_progress`` gets each step as it happens."""
    t = _target_or_here(where, pid, ssh)
    save_wait = max(0.0, save_wait)

    async def one(host: Host, at: Target) -> KillReport:
        return await control.kill_run(
            host,
            control.run_dir_of(at),
            grace,
            on_progress=on_progress,
            save_wait_s=save_wait,
            stop_wait_s=stop_wait,
        )

    async def saves_done(targets: list[Target]) -> SaveWait | None:
        def call(at: Target) -> Callable[[], Awaitable[SaveWaitReport]]:
            return lambda: control.on_host(
                at,
                lambda h: control.wait_for_save(h, control.run_dir_of(at), save_wait, on_progress),
            )

        return await control.saves_done([call(at) for at in targets])

    async def go() -> KillReport:
        if not needs_choice(t, pid):
            return await on_every_node(t, "kill", one, KillReport, first=saves_done)
        chosen = await control.on_host(t, lambda h: control.choose(h, control.run_dir_of(t), pid))
        if chosen.choice is Choice.SEVERAL:
            raise control.several_error(chosen, _label(where, pid))
        _tell(on_note, chosen.note)
        if chosen.choice is Choice.PROCESS:
            row = chosen.chosen_row()
            return await control.on_host(
                t,
                lambda h: control.kill_run(
                    h,
                    None,
                    grace,
                    on_progress=on_progress,
                    process=row,
                    save_wait_s=save_wait,
                    stop_wait_s=stop_wait,
                    attach_first=attach_first,
                ),
            )
        pinned = pinned_to(t, chosen.chosen_run_dir())
        return await on_every_node(pinned, "kill", one, KillReport, first=saves_done)

    return run_sync(go())


def resume(
    where: str | Path | Target | None = None,
    *,
    pid: int | None = None,
    wait: float = 30.0,
    ssh: SshOptions | None = None,
    on_note: Note | None = None,
) -> ResumeReport:
    """Relaunch a stopped run from its last complete checkpoint, as ``eagle3-tui
    resume`` does (``pid``: a training without telemetry that eagle3-tui's kill
    stopped, restarted with telemetry); returns the report (the new PID in it)."""
    t = _target_or_here(where, pid, ssh)

    async def one(host: Host, at: Target) -> ResumeReport:
        return await control.resume_run(host, control.run_dir_of(at), wait)

    async def go() -> ResumeReport:
        if pid is not None:  # a training without telemetry: the restart its kill recorded
            return await control.on_host(t, lambda h: control.resume_run(h, None, wait, pid=pid))
        if not needs_choice(t, None):
            return await on_every_node(t, "resume", one, ResumeReport)
        # a work directory or a host alone: the run it means (a live one is refused
        # by the agent, as for a run directory: kill it first)
        chosen = await control.on_host(
            t, lambda h: control.choose(h, control.run_dir_of(t), purpose=PURPOSE_RESUME)
        )
        if chosen.choice is Choice.SEVERAL:
            raise control.several_error(chosen, str(where) if where else "this machine")
        _tell(on_note, chosen.note)
        if chosen.choice is Choice.PROCESS:
            raise TargetError(
                f"{chosen.short} is running without telemetry: nothing to resume (kill it "
                "first: the kill records what resume reruns; or attach: eagle3-tui attach)"
            )
        pinned = pinned_to(t, chosen.chosen_run_dir())
        return await on_every_node(pinned, "resume", one, ResumeReport)

    return run_sync(go())


def runs(
    host: str | None = None,
    *,
    all_users: bool = False,
    prune: bool = False,
    ssh: SshOptions | None = None,
) -> DiscoverReport:
    """The live trainings on a host (this machine without one), with or without
    telemetry, and the registered runs (``all_users``: every user's), newest first;
    ``prune`` first forgets registered runs whose directory is gone."""
    t: Target = LocalTarget(Path("."))
    if host is not None:  # always a host here, even where a local path has its name
        t = parse_target(host, ssh)
        if isinstance(t, LocalTarget):
            t = parse_host(host, ssh)
    result = run_sync(control.on_host(t, lambda h: control.discover(h, all_users, prune)))
    if not result.runs and not result.live and not result.ended and not result.pruned:
        raise control.no_runs_error(result, host or "this machine")
    return result


def attach(
    where: str | Path | Target | None = None,
    *,
    pid: int | None = None,
    confirm: Callable[[AttachPlan], bool] = lambda plan: True,
    wait: float = 10.0,
    ssh: SshOptions | None = None,
) -> AttachResult | None:
    """Add telemetry to a live training without restarting it: the host's plan is given
    to ``confirm`` first (False: nothing done, None returned). Returns the result; a
    plan the host refused comes back as its refusal (``status``, ``reason``)."""
    t = target(where, ssh) if where is not None else LocalTarget(Path("."))
    run_dir = control.run_dir_of(t) if where is not None else None

    async def go(host: Host) -> AttachResult | None:
        plan = await control.attach_plan(host, run_dir, pid)
        if not isinstance(plan, AttachPlan):
            return plan  # refused: which check, and why
        if not await asyncio.to_thread(confirm, plan):
            return None
        return await control.attach_run(host, plan, wait_s=wait)

    return run_sync(control.on_host(t, go))


def exit_status(error: TargetError) -> int:
    """The exit status the CLI gives an error (``eagle3_tui/exits.py``: 21 no
    permission, 22 no such process, 25 not a regular file, 2 otherwise...)."""
    return control.exit_status_of(error)


# ---- how a run is read --------------------------------------------------------------


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to its end: in this thread, or, where an event loop runs here
    already (a notebook), in a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1, thread_name_prefix="eagle3-tui-api") as pool:
        return pool.submit(asyncio.run, coro).result()


def _target_or_here(
    where: str | Path | Target | None, pid: int | None, ssh: SshOptions | None
) -> Target:
    """The target; with a pid and no target, this machine."""
    if where is None:
        if pid is None:
            raise TargetError(
                "a TARGET is needed (a run directory, or [USER@]HOST[:DIR]), or --pid PID"
            )
        return LocalTarget(Path("."))  # the pid decides: see choose()
    return target(where, ssh)


def _label(where: object, pid: int | None) -> str:
    return str(where) if where is not None else f"pid {pid}"


def _tell(on_note: Note | None, note: object) -> None:
    if note and on_note is not None:
        on_note(str(note))


def load_local(run_dir: Path) -> Run:
    path = check_run_dir(run_dir)
    run = Run()
    for chunk in iter_chunks(path):
        run.feed(chunk.offset, chunk.data)
    return run


async def load_remote(where: SshTarget) -> tuple[Run, float]:
    """The run's metrics.jsonl read over SSH with its manifest and whether its trainer
    lives (one connection), and the host's clock. A multi-node run's other nodes (its
    manifest names them) are read too, each over its own connection."""
    run = Run()

    async def read(host: Host) -> tuple[float, Status | None]:
        with Feeder(run) as feed:
            eof = await control.read_file(host, where.run_dir, feed)
        note_disk(run, eof.get("disk"))
        return float(eof.get("now") or time.time()), await host_status(host, where.run_dir)

    now, status = await control.on_host(where, read)
    if status is not None:
        nodes = control.other_nodes(status.manifest, str(status.host), str(status.run_dir))
        for i, node in enumerate(nodes, start=1):
            other = control.node_target(where, node)

            async def read_node(host: Host, i: int = i, other: SshTarget = other) -> None:
                with Feeder(run, i) as feed:
                    await control.read_file(host, other.run_dir, feed)

            await control.on_host(other, read_node)
        apply_status(run.state, status, now)
    return run, now


def note_disk(run: Run, report: object) -> None:
    """The room on the run's filesystem (the agent's report), for the verdict."""
    disk = DiskSpace.of(report if isinstance(report, dict) else None)
    if disk is not None:
        run.set_disk(disk)


class Feeder:
    """Frames fed to a run in a thread of their own as they arrive, so that the ingest
    overlaps the transfer (fed in the event loop, it would hold the next frames up);
    leaving the ``with`` waits until all are in (and raises what feeding raised)."""

    def __init__(self, run: Run, stream: int = 0) -> None:
        self.run, self.stream = run, stream
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="eagle3-tui-feed")
        self._error: BaseException | None = None

    def _feed(self, frame: DataFrame) -> None:
        if self._error is None:  # after a failure, nothing more: it is raised
            try:
                self.run.feed_frame(frame, self.stream)
            except BaseException as e:
                self._error = e

    def __call__(self, frame: DataFrame) -> None:
        if self._error is not None:
            raise self._error
        self._pool.submit(self._feed, frame)

    def __enter__(self) -> Feeder:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=True)
        if self._error is not None and exc[0] is None:
            raise self._error


async def host_status(host: Host, run_dir: str | None) -> Status | None:
    """The run's status on its host (through its agent, as the app probes it), or None
    when there is none to have: no manifest (a user's own writer), an unreadable one."""
    try:
        return await control.run_status(host, run_dir)
    except TargetError:
        return None  # judged from the records alone


def _local_status(run: Run, run_dir: Path, now: float) -> None:
    """A run on this machine: the room on its filesystem and the agent's own ``status``
    code, run in this process (no agent process to start); nothing without a manifest."""
    from eagle3_tui.agent.diskspace import disk_space

    note_disk(run, disk_space(str(run_dir), str(run_dir / "metrics.jsonl")))
    try:
        status = control.local_status(str(run_dir))
    except AgentAnswerError:
        return  # no manifest (a user's own writer), an unreadable one: the records
    apply_status(run.state, status, now)


def load_target(where: Target, label: str) -> tuple[Run, float]:
    """A run's records, manifest and whether its trainer lives (the agent's ``status``
    on the run's host; in this process for a local run)."""
    if isinstance(where, LocalTarget):
        run = load_local(where.run_dir)
        now = time.time()
        _local_status(run, where.run_dir, now)
    else:
        run, now = run_sync(load_remote(where))
    if run.state.records == 0 and run.state.malformed_count == 0:
        raise TargetError(f"{label}: metrics.jsonl is empty (no record written yet)")
    return run, now


def needs_choice(where: Target, pid: int | None) -> bool:
    """Whether the host's agent must say what the target means (a process, a work
    directory, a host's live training) before it is read: all but a local run directory
    (its run.json, or eagle3-tui's metrics.jsonl: a user's own handler's file is a work
    directory's, whose training says how it is doing)."""
    from eagle3_tui.agent.discover import eagle3_metrics

    if pid is not None:
        return True
    if isinstance(where, LocalTarget):
        d = where.run_dir
        check_local_input(d)  # unreadable or of the wrong kind: one line, its own status
        metrics = d / "metrics.jsonl"
        ours = (d / "run.json").exists() or (metrics.exists() and eagle3_metrics(str(metrics)))
        return d.is_dir() and not ours
    return True


async def load_chosen(
    where: Target, pid: int | None, label: str, on_note: Note | None = None
) -> tuple[Run, float]:
    """What the target means, read on its host over one connection: a run's
    metrics.jsonl (and manifest), or a few seconds' observation of a training without
    telemetry."""

    async def go(host: Host) -> tuple[Run, float]:
        chosen = await control.choose(host, control.run_dir_of(where), pid)
        if chosen.choice is Choice.SEVERAL:
            raise control.several_error(chosen, label)
        _tell(on_note, chosen.note)
        run = Run()
        if chosen.choice is Choice.RUN:
            run_dir = chosen.chosen_run_dir()
            with Feeder(run) as feed:
                eof = await control.read_file(host, run_dir, feed)
            note_disk(run, eof.get("disk"))
            now = float(eof.get("now") or time.time())
            status = await host_status(host, run_dir)
            if status is not None:
                apply_status(run.state, status, now)
            return run, now
        end = await control.observe_once(
            host, chosen.chosen_row(), lambda f: run.feed_frame(f), OBSERVE_S
        )
        return run, float(end.get("now") or time.time())

    return await control.on_host(where, go)


def same_place(a: Target, b: Target) -> str | None:
    """Where both targets point, when they are one place however they are spelt
    (``RUN``, ``RUN/``, ``./RUN``, a link to it; the same host and directory); else
    None (two copies of a run are two runs)."""
    if isinstance(a, LocalTarget) and isinstance(b, LocalTarget):
        try:
            same = os.path.samefile(a.run_dir, b.run_dir)
        except OSError:  # one is missing: said when it is read
            return None
        return str(a.run_dir.resolve()) if same else None
    if isinstance(a, LocalTarget) or isinstance(b, LocalTarget):
        return None
    dirs = [posixpath.normpath(t.run_dir) if t.run_dir else None for t in (a, b)]
    if a.destination == b.destination and dirs[0] == dirs[1]:  # one set of ssh options
        return f"{a.destination}:{dirs[0] or '(its live or latest run)'}"
    return None


def pinned_to(where: Target, run_dir: str) -> Target:
    """The target with the run directory a choice gave (a newer run does not take over)."""
    if isinstance(where, LocalTarget):
        return LocalTarget(Path(run_dir))
    return where.with_run_dir(run_dir)


async def on_every_node(
    where: Target,
    op: str,
    call: Callable[[Host, Target], Awaitable[Report]],
    kind: type[Report],
    first: Callable[[list[Target]], Awaitable[SaveWait | None]] | None = None,
) -> Report:
    """``call(host, target)`` on the target's host, or, for a multi-node run whose manifest
    names its nodes, on every node at once; one (merged) report. ``first``: a step on
    every node before the calls on any (a kill's wait for a checkpoint save), what it
    waited for kept in the report."""
    others: list[Target] = list(await control.node_targets(where))
    if not others:
        return await control.on_host(where, lambda h: call(h, where))
    waited = await first([where, *others]) if first is not None else None
    report = control.merge_results(op, await control.on_nodes([where, *others], call, kind))
    if isinstance(report, KillReport):
        report = control.with_save_wait(report, waited)
    return report
