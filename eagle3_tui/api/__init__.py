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
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_tui import exits
from eagle3_tui.agent.names import KILL_GRACE_S, PURPOSE_RESUME, SAVE_WAIT_S, SUMMARY_HISTORY
from eagle3_tui.api import slurm
from eagle3_tui.api.reading import (
    OBSERVE_S,
    LocalFile,
    Note,
    ReadTo,
    Session,
    apply_status,
    check_pid,
    check_seconds,
    host_status,
    label_of,
    load_chosen,
    load_target,
    local_status,
    needs_choice,
    new_run,
    on_every_node,
    pinned_to,
    run_sync,
    same_place,
    target,
    target_or_here,
    tell,
)
from eagle3_tui.transport import calls
from eagle3_tui.transport.base import TargetError, UnreadableRunError
from eagle3_tui.transport.channel import AgentAnswerError, Event, Host
from eagle3_tui.transport.replies import (
    AttachPlan,
    AttachResult,
    Choice,
    DiscoverReport,
    ErrorKind,
    KillReport,
    ResumeReport,
    SaveWait,
    SaveWaitReport,
    SlurmJob,
)
from eagle3_tui.transport.slurm import slurm_jobs
from eagle3_tui.transport.target import (
    LocalTarget,
    SshOptions,
    Target,
    parse_host,
    parse_target,
)

if TYPE_CHECKING:  # the model (numpy) is imported where a run is read (reading.new_run)
    from eagle3_tui.model.compare import Comparison
    from eagle3_tui.model.run import Run
    from eagle3_tui.model.snapshot import Snapshot
    from eagle3_tui.model.state import RunState

__all__ = [
    "OBSERVE_S",
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
    job: SlurmJob | None = None
    """A Slurm job's target: the job, as the scheduler said it when the run was read."""
    _read_to: ReadTo | None = field(default=None, repr=False, compare=False)
    """Where the read of a run's file on its host ended (``follow`` reads on from it)."""

    @property
    def state(self) -> RunState:
        return self.run.state

    def snapshot(self, columns: int = 1) -> Snapshot:
        """What the monitor draws (series reduced to ``columns`` points)."""
        from eagle3_tui.model.snapshot import ViewParams, build_snapshot

        return build_snapshot(self.run.state, self.now, ViewParams(columns=columns))

    def summary(self) -> dict[str, Any]:
        """``eagle3-tui summary --json``'s object (documented field by field in the README)."""
        return dict(self._summary)

    @cached_property
    def _summary(self) -> dict[str, Any]:
        from eagle3_tui.model.summary import summarize

        out = summarize(self.run.state, self.now)
        if self.job is not None:
            if self.job.active and not self.job.running and self.run.state.records == 0:
                out["reason"] = (
                    f"Slurm {self.job.label} is {self.job.state_text()}: no training runs yet."
                )
            out["slurm"] = self.job.summary()
        return out

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
    whole_history: bool = True,
) -> OpenedRun:
    """Any run a target names, read once: a run directory's records (and manifest), or
    what the host says the target means (a process, a work directory, the host's live
    training: with telemetry or without, its metrics from its log, its own handler's
    file or its metric backend's files, watched for ``OBSERVE_S`` seconds). No target and
    a ``pid``: that process on this machine. ``on_note`` is told what the host chose
    as soon as it has (also kept as ``note``). ``whole_history`` False: of the older
    steps, only what ``summary()`` reads (the loss, the steps and times, the pace's
    timings: agent/names.py's ``SUMMARY_HISTORY``; an old block's timings as their sum
    on its last row), so a long run's other metrics are not read (nor sent) for it; the
    newest steps whole either way."""
    t = target_or_here(where, pid, ssh)
    label = label or label_of(where, pid)
    history = None if whole_history else SUMMARY_HISTORY
    if t.job is not None:
        return _open_job(t, label, on_note, whole_history)
    notes: list[str] = []

    def noted(note: str) -> None:
        notes.append(note)
        if on_note is not None:
            on_note(note)

    if not needs_choice(t, pid):
        run, now = load_target(t, label, history)
        return OpenedRun(label, t, run, now, notes[-1] if notes else None)
    return _chosen(t, pid, label, noted, history, None, notes)


def _chosen(
    t: Target,
    pid: int | None,
    label: str,
    on_note: Note | None,
    history: dict[str, Any] | None,
    since: ReadTo | None,
    notes: list[str],
    session: Session | None = None,
) -> OpenedRun:
    """A target its host must say the meaning of, read (on from ``since``, where the host
    chooses the same run; through ``session``'s host, where one is kept open)."""
    if session is None:
        look = run_sync(load_chosen(t, pid, label, on_note, history, since))
    else:
        try:
            look = session.run(load_chosen(t, pid, label, on_note, history, since, session.host))
        except AgentAnswerError:
            raise  # the host's answer
        except TargetError:
            # the connection kept from the last look may have died meanwhile: a new one,
            # and the read on from as far as the run got (a read cut short fed it part)
            session.reopen()
            if since is not None:
                since = replace(since, offset=since.run.reader.next_offset)
            look = session.run(load_chosen(t, pid, label, on_note, history, since, session.host))
    state = look.run.state
    if state.records == 0 and state.malformed_count == 0 and state.observed is None:
        raise TargetError(f"{label}: metrics.jsonl is empty (no record written yet)")
    note = notes[-1] if notes else None
    return OpenedRun(label, t, look.run, look.now, note, _read_to=look.read_to)


def _open_job(t: Target, label: str, on_note: Note | None, whole_history: bool) -> OpenedRun:
    """A Slurm job's run: its training's (running), the one registered as it (ended), or
    none yet (pending: waiting, with the scheduler's reason)."""
    place = run_sync(slurm.locate(t, label))
    tell(on_note, place.note)
    if place.where is None:
        if place.job.active:
            return OpenedRun(label, t, new_run(), time.time(), place.note, place.job)
        raise slurm.no_run_error(place, label)
    pid = None if place.telemetry else place.pid
    opened = open_run(place.where, pid=pid, label=label, whole_history=whole_history)
    return replace(opened, note=place.note, job=place.job)


def follow(
    where: str | Path | Target | None = None,
    *,
    every: float = 5.0,
    pid: int | None = None,
    ssh: SshOptions | None = None,
    whole_history: bool = True,
) -> Generator[OpenedRun, None, None]:
    """The run read again every ``every`` seconds, for as long as the caller iterates
    (``close()`` ends it: a connection kept for the looks is closed then).
    A run's file is read on from where the last look ended (only new bytes): a local run
    directory's, and over SSH the run the host chooses for the target, each look, where it
    is the one the last look read. A file deleted, replaced or truncated meanwhile is said
    to the run as the monitor's stream says it (its model keeps what was read, and takes
    the run's own new file as the same history; a local one is held open between looks, so
    what was appended before the change is read first); a look that finds no file there
    yields the run as read so far (``summary()["file_changes"]`` says so) and the follow
    goes on (only its first look raises where there is none, as :func:`open_run`). Each
    look's ``summary()`` is as of its own time, while its ``run`` is
    the one being followed and grows. Anything else (a training without telemetry, a
    Slurm job, another run chosen) is opened afresh (for a live screen, the monitor
    streams). ``whole_history`` False: as :func:`open_run`'s (a long run's first look
    reads of its older steps only what ``summary()`` needs)."""
    history = None if whole_history else SUMMARY_HISTORY
    check_seconds(every=every)
    t = target_or_here(where, pid, ssh)
    if t.job is None and needs_choice(t, pid):
        yield from _follow_chosen(t, pid, label_of(where, pid), every, history)
        return
    first = open_run(where, pid=pid, ssh=ssh, whole_history=whole_history)
    t, label = first.where, first.label
    if not isinstance(t, LocalTarget) or t.job is not None:
        yield _taken(first)
        while True:  # a Slurm job's: where its training runs may change
            time.sleep(every)
            yield _taken(open_run(t, pid=pid, label=label, whole_history=whole_history))
    run_dir = t.run_dir
    # held from now: a file deleted or replaced before the next look is read to its end
    file = LocalFile(run_dir, first.run, first.run.reader.next_offset)
    try:
        yield _taken(first)
        while True:
            time.sleep(every)
            file.read_on()
            now = time.time()
            local_status(file.run, run_dir, now)
            yield _taken(OpenedRun(label, t, file.run, now))
    finally:
        file.close()


def _follow_chosen(
    t: Target, pid: int | None, label: str, every: float, history: dict[str, Any] | None
) -> Generator[OpenedRun, None, None]:
    """:func:`follow`'s looks at a target whose host says what it means (over SSH, a
    process): one connection for them all, each look reading on from the last."""
    session = Session(t)
    try:
        read_to: ReadTo | None = None
        skew = 0.0  # the host's clock less this one's, as of the last look
        while True:
            notes: list[str] = []  # what the host chose, each look (its note)
            try:
                look = _chosen(t, pid, label, notes.append, history, read_to, notes, session)
            except AgentAnswerError as e:
                if read_to is None or e.kind is not ErrorKind.MISSING:
                    raise
                # the run's file is gone from the path (deleted, not made again yet): the
                # run read so far, the change said to it once, as the monitor says it
                read_to = _file_gone(read_to, session)
                now = time.time() + skew
                yield _taken(OpenedRun(label, t, read_to.run, now, _read_to=read_to))
            else:
                read_to = look._read_to
                skew = look.now - time.time()
                yield _taken(look)
            time.sleep(every)
    finally:
        session.close()


def _file_gone(read_to: ReadTo, session: Session) -> ReadTo:
    """``read_to``'s run told that its file is gone (once) and what its host says of its
    trainer now; the next look reads the file made there as the run's (``deleted``)."""
    from eagle3_tui.transport.base import FileChanged

    run = read_to.run
    if not read_to.gone:
        run.file_changed(FileChanged("deleted", time.time(), read_to.offset))
    now = time.time()
    status = session.run(host_status(session.host, read_to.run_dir))
    if status is not None:
        apply_status(run.state, status, status.now or now)
    return replace(read_to, gone=True)


def _taken(opened: OpenedRun) -> OpenedRun:
    """The look with its summary taken now (its run may be fed on afterwards)."""
    opened.summary()
    return opened


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
    for label, opened in ((a, run_a), (b, run_b)):
        if opened.health == "unreadable":  # no record: a table of differences says nothing
            raise UnreadableRunError(f"{label}: {opened.reason} Nothing to compare.")
    from eagle3_tui.model.compare import compare as compare_states  # (not a summary's)

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
    multi-node run) and return the report. ``on_progress`` gets each step as it happens.
    A Slurm job (``HOST:job/ID``): its training stopped so, then the job ended through
    the scheduler (a pending one cancelled); ``slurm`` in the report says the job's state."""
    check_seconds(grace=grace, save_wait=save_wait, stop_wait=stop_wait)
    t = target_or_here(where, pid, ssh)
    save_wait = max(0.0, save_wait)
    if t.job is not None:
        place = run_sync(slurm.locate(t, label_of(where, pid)))
        tell(on_note, place.note)
        job = place.job
        if place.pid is None and not job.active:
            raise TargetError(
                f"{t.label}: {job.label} has ended ({job.state_text()}): nothing to stop"
            )
        report = KillReport(status="stopped", message=f"{job.label} had no training yet")
        if place.pid is not None and place.where is not None:
            report = kill(
                place.where,
                pid=None if place.telemetry else place.pid,
                grace=grace,
                save_wait=save_wait,
                stop_wait=stop_wait,
                attach_first=attach_first,
                on_progress=on_progress,
            )
        if report.status in ("stopped", "not_running"):
            report.slurm = run_sync(slurm.cancel(place))
        return report

    async def one(host: Host, at: Target) -> KillReport:
        return await calls.kill_run(
            host,
            calls.run_dir_of(at),
            grace,
            on_progress=on_progress,
            save_wait_s=save_wait,
            stop_wait_s=stop_wait,
        )

    async def saves_done(targets: list[Target]) -> SaveWait | None:
        def call(at: Target) -> Callable[[], Awaitable[SaveWaitReport]]:
            return lambda: calls.on_host(
                at,
                lambda h: calls.wait_for_save(h, calls.run_dir_of(at), save_wait, on_progress),
            )

        return await calls.saves_done([call(at) for at in targets])

    async def go() -> KillReport:
        if not needs_choice(t, pid):
            return await on_every_node(t, "kill", one, KillReport, first=saves_done)
        chosen = await calls.on_host(t, lambda h: calls.choose(h, calls.run_dir_of(t), pid))
        if chosen.choice is Choice.SEVERAL:
            raise calls.several_error(chosen, label_of(where, pid))
        tell(on_note, chosen.note)
        if chosen.choice is Choice.PROCESS:
            row = chosen.chosen_row()
            return await calls.on_host(
                t,
                lambda h: calls.kill_run(
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
    check_seconds(wait=wait)
    t = target_or_here(where, pid, ssh)
    if t.job is not None:  # a Slurm job: requeued, its script runs again
        label = label_of(where, pid)
        report, place = run_sync(slurm.requeue_report(t, wait, label))
        tell(on_note, place.note if place is not None else None)
        return report

    async def one(host: Host, at: Target) -> ResumeReport:
        return await calls.resume_run(host, calls.run_dir_of(at), wait)

    async def go() -> ResumeReport:
        if pid is not None:  # a training without telemetry: the restart its kill recorded
            return await calls.on_host(t, lambda h: calls.resume_run(h, None, wait, pid=pid))
        if not needs_choice(t, None):
            return await on_every_node(t, "resume", one, ResumeReport)
        # a work directory or a host alone: the run it means (a live one is refused
        # by the agent, as for a run directory: kill it first)
        chosen = await calls.on_host(
            t, lambda h: calls.choose(h, calls.run_dir_of(t), purpose=PURPOSE_RESUME)
        )
        if chosen.choice is Choice.SEVERAL:
            raise calls.several_error(chosen, str(where) if where else "this machine")
        tell(on_note, chosen.note)
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
    plain = ssh is None or ssh == SshOptions()
    if host == "localhost" and plain:  # this machine, as watch and fleet take it (no SSH)
        host = None
    if host is not None:  # always a host here, even where a local path has its name
        t = parse_target(host, ssh)
        if isinstance(t, LocalTarget):
            t = parse_host(host, ssh)

    async def both(h: Host) -> DiscoverReport:
        found = await calls.discover(h, all_users, prune)
        try:
            jobs = await slurm_jobs(h, everyone=all_users)
        except TargetError as e:  # Slurm is there and does not answer: said, not fatal
            found.jobs_error = str(e)
        else:
            found.jobs = jobs.jobs if jobs.slurm else None
        return found

    result = run_sync(calls.on_host(t, both))
    empty = not result.runs and not result.live and not result.ended and not result.pruned
    if empty and not result.jobs and not result.jobs_error:
        raise calls.no_runs_error(result, host or "this machine")
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
    check_pid(pid)
    check_seconds(wait=wait)
    t = target(where, ssh) if where is not None else LocalTarget(Path("."))
    run_dir = calls.run_dir_of(t) if where is not None else None

    async def go(host: Host) -> AttachResult | None:
        plan = await calls.attach_plan(host, run_dir, pid)
        if not isinstance(plan, AttachPlan):
            return plan  # refused: which check, and why
        if not await asyncio.to_thread(confirm, plan):
            return None
        return await calls.attach_run(host, plan, wait_s=wait)

    return run_sync(calls.on_host(t, go))


def exit_status(error: TargetError) -> int:
    """The exit status the CLI gives an error (``eagle3_tui/exits.py``: 21 no
    permission, 22 no such process, 25 not a regular file, 2 otherwise...)."""
    from eagle3_tui import reports  # (its report texts: not a summary's to import)

    return reports.exit_status_of(error)
