"""How the API reads a run: a local file fed to the model, a remote one over SSH (each
node of a multi-node run), what a host says a target means, and the call that runs it
all from synchronous code (:func:`run_sync`). The CLI's monitor uses the same pieces.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import math
import os
import posixpath
import sys
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from eagle3_tui.agent.names import EV_CHOSEN
from eagle3_tui.transport import calls
from eagle3_tui.transport.base import FileChanged, TargetError
from eagle3_tui.transport.calls import Report
from eagle3_tui.transport.channel import AgentAnswerError, DataFrame, Event, Host
from eagle3_tui.transport.forked import read_inflated
from eagle3_tui.transport.local import check_local_input, check_run_dir
from eagle3_tui.transport.replies import Choice, KillReport, SaveWait, Status, leftover_of
from eagle3_tui.transport.target import LocalTarget, SshOptions, SshTarget, Target, parse_target

if TYPE_CHECKING:  # the model (numpy) is imported where a run is read: `runs`, `kill`... never
    from eagle3_tui.model.run import Run
    from eagle3_tui.model.state import RunState

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
    if not isinstance(where, str):  # 123, a list...: never a traceback from deep inside
        raise TargetError(
            f"target={where!r}: a run or work directory, [USER@]HOST[:DIR], a Path or a "
            "Target (a process goes as pid=PID)"
        )
    return parse_target(where, ssh)


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to its end: in this thread, or, where an event loop runs here
    already (a notebook), in a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1, thread_name_prefix="eagle3-tui-api") as pool:
        return pool.submit(asyncio.run, coro).result()


class Session:
    """An event loop of its own, in a thread, and one host opened on it, kept from one
    call to the next (``follow``'s looks: one connection for all of them, not one a
    look). :meth:`close` closes the host and ends the loop; a session still open when
    the interpreter exits is closed first (a ``follow`` a script left unfinished: its
    generator is finalized only once the loop's thread can no longer run)."""

    CLOSE_S = 10.0
    """How long :meth:`close` waits for the host to close (a dead link's connection)."""

    def __init__(self, where: Target) -> None:
        self.where = where
        self.closed = False
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="eagle3-tui-session", daemon=True
        )
        self._thread.start()
        self.host: Host = calls.open_host(where)
        _open_sessions.add(self)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """``coro`` run to its end on the session's loop."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def reopen(self) -> None:
        """The host closed and opened again (a connection that may have died meanwhile)."""
        self._close_host()
        self.host = calls.open_host(self.where)

    def _close_host(self) -> None:
        with contextlib.suppress(Exception):
            self.run(self.host.close(), self.CLOSE_S)

    def close(self) -> None:
        """Once; nothing where the interpreter is finalizing (the loop's thread cannot
        run then: waiting for it would never end)."""
        if self.closed:
            return
        self.closed = True
        _open_sessions.discard(self)
        if sys.is_finalizing():
            return
        try:
            self._close_host()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(self.CLOSE_S)
            if not self._thread.is_alive():
                self.loop.close()


_open_sessions: weakref.WeakSet[Session] = weakref.WeakSet()


def _close_sessions() -> None:
    for session in list(_open_sessions):
        session.close()


atexit.register(_close_sessions)  # (before the interpreter finalizes: threads still run)


def target_or_here(
    where: str | Path | Target | None, pid: int | None, ssh: SshOptions | None
) -> Target:
    """The target; with a pid and no target, this machine. TargetError: a ``pid`` that
    is not a process ID (``"abc"``, ``3.7``, ``True``, ``0``: never another run)."""
    check_pid(pid)
    if where is None:
        if pid is None:
            raise TargetError(
                "a TARGET is needed (a run directory, or [USER@]HOST[:DIR]), or --pid PID"
            )
        return LocalTarget(Path("."))  # the pid decides: see choose()
    return target(where, ssh)


def check_pid(pid: object) -> None:
    """TargetError unless ``pid`` is None or a process ID (an int from 1; not a bool)."""
    if pid is not None and (type(pid) is not int or pid < 1):
        raise TargetError(f"pid={pid!r}: a process ID is a whole number from 1")


def check_seconds(**durations: float | None) -> None:
    """TargetError unless each duration (keyword: its parameter's name) is None or a
    finite number of seconds, 0 or more (a ``grace=-1`` would SIGKILL at once)."""
    for name, value in durations.items():
        ok = value is None or (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and value >= 0
        )
        if not ok:
            raise TargetError(f"{name}={value!r}: a number of seconds, 0 or more")


def label_of(where: object, pid: int | None) -> str:
    return str(where) if where is not None else f"pid {pid}"


def tell(on_note: Note | None, note: object) -> None:
    if note and on_note is not None:
        on_note(str(note))


def apply_status(state: RunState, status: Status, now: float) -> None:
    """The host's evidence into the run state (asked at ``now``, the client's clock): the
    manifest, the host's clock, whether the trainer lives and what outlived it. The one
    place a status moves the model (the app's probe, the API and the commands)."""
    if status.manifest:
        state.set_manifest(status.manifest)
    state.liveness.set_checkpoints(status.checkpoints_present)
    if status.now is not None:
        state.liveness.set_host_clock(status.now, now)
    if status.copy_of is not None:  # its trainer is the first run's: nothing of the copy
        state.liveness.set_copy(status.copy_of, status.alive)
        state.liveness.set_process(None, now)
        return
    left = () if status.alive else tuple(leftover_of(x) for x in status.leftovers)
    state.liveness.set_process(status.alive, now, left, status.state)


History = dict[str, Any] | None
"""Of a run's older steps, only these columns (agent/names.py's ``SUMMARY_HISTORY``);
None: every one."""


def new_run() -> Run:
    """An empty run (the model, and numpy with it, imported here: the commands that read
    no run's records never pay for it)."""
    from eagle3_tui.model.run import Run

    return Run()


def load_local(run_dir: Path, history: History = None) -> Run:
    path = check_run_dir(run_dir)
    run = new_run()
    for frame, ahead in read_inflated(path, history):
        run.feed(frame.offset, frame.data, 0, frame.span, ahead)
    return run


class LocalFile:
    """A local run's ``metrics.jsonl`` read on into one run across ``follow``'s looks, as
    the monitor's stream (``transport/local.py``'s :class:`LocalTransport`) reads it: the
    file is held open between looks, so one deleted or replaced meanwhile is read to its
    end first (what was appended before the swap is not lost), then the file at the path
    from 0; each change is said to the run (:meth:`Run.file_changed
    <eagle3_tui.model.run.Run.file_changed>`, with what the transport says), whose model
    decides whose history the new file continues, as the monitor's does: the same run's
    file goes on as the same history (nothing dropped), another file is shown as what the
    path holds now. A path with no file is said once (``deleted``), and waited on."""

    def __init__(self, run_dir: Path, run: Run, offset: int) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.run = run
        self.offset = offset
        """How far the file held has been fed to the run."""
        self.fd: int | None = None
        self.identity: tuple[int, int] | None = None
        self.gone = False
        """The path had no file at the last look (the change was said)."""
        self._open()

    def _open(self) -> os.stat_result | None:
        """The file at the path now, held (None: none there)."""
        from eagle3_tui.telemetry.safefs import open_regular
        from eagle3_tui.transport.local import check_local_input, input_error

        try:
            if self.identity is not None:  # a file made there since: checked as the first
                os.lstat(self.path)  # was (another user's link: not followed), once the
                check_local_input(self.path.parent)  # open could see it (else its words)
            fd, st = open_regular(self.path)  # never a FIFO: no hang
        except FileNotFoundError:
            return None
        except OSError as e:
            raise input_error(self.path, e) from None
        self.fd, self.identity = fd, (st.st_dev, st.st_ino)
        return st

    def read_on(self) -> None:
        """What was written since the last look, into the run (a change under the file
        said first, in its place)."""
        if self.fd is not None:
            self._read_held()
            if _identity(self.path) == self.identity:
                return
            self._read_held()  # once more: what was appended before the swap
            os.close(self.fd)  # read to its end: the path's file from now on
            self.fd = None
        had = self.identity
        st = self._open()
        if st is None:
            if had is not None and not self.gone:
                self.gone = True
                self.run.file_changed(FileChanged("deleted", time.time(), self.offset))
            return
        if had is not None:
            change = "deleted" if self.gone else "replaced"
            self.run.file_changed(FileChanged(change, time.time(), self.offset, st.st_size))
            self.offset = 0
        self.gone = False
        self._read_held()

    def _read_held(self) -> None:
        from eagle3_tui.transport.parts import READ_SIZE

        assert self.fd is not None
        size = os.fstat(self.fd).st_size
        if size < self.offset:  # cut short: its history read before is kept
            self.run.file_changed(FileChanged("truncated", time.time(), self.offset, size))
            self.offset = 0
        while self.offset < size:
            data = os.pread(self.fd, min(READ_SIZE, size - self.offset), self.offset)
            if not data:
                break
            self.run.feed(self.offset, data)
            self.offset += len(data)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _identity(path: Path) -> tuple[int, int] | None:
    """The file at ``path`` now (device, inode); None when there is none to see."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


async def load_remote(where: SshTarget, history: History = None) -> tuple[Run, float]:
    """The run's metrics.jsonl read over SSH with its manifest and whether its trainer
    lives (one connection), and the host's clock. A multi-node run's other nodes (its
    manifest names them) are read too, each over its own connection."""
    run = new_run()

    async def read(host: Host) -> tuple[float, Status | None]:
        with Feeder(run) as feed:
            eof = await calls.read_file(host, where.run_dir, feed, history=history)
        note_disk(run, eof.get("disk"))
        return float(eof.get("now") or time.time()), await host_status(host, where.run_dir)

    now, status = await calls.on_host(where, read)
    if status is not None:
        nodes = calls.other_nodes(status.manifest, str(status.host), str(status.run_dir))
        for i, node in enumerate(nodes, start=1):
            other = calls.node_target(where, node)

            async def read_node(host: Host, i: int = i, other: SshTarget = other) -> None:
                with Feeder(run, i) as feed:
                    await calls.read_file(host, other.run_dir, feed, history=history)

            await calls.on_host(other, read_node)
        apply_status(run.state, status, now)
    return run, now


def note_disk(run: Run, report: object) -> None:
    """The room on the run's filesystem (the agent's report), for the verdict."""
    from eagle3_tui.model.files import DiskSpace

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
        self.gone = False
        """The last look found no file at the path (a new one there is said ``deleted``)."""

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

    def event(self, event: Event) -> None:
        """The agent's word that the file is another one, or shorter, than the one read
        up to the request's offset (``restarted``: it sends it from 0): said to the run,
        in its place among the frames, as the monitor's stream says it (``FileChanged``):
        its model decides whose history the frames after it continue (the run's own file
        goes on as the same history, another is shown as what the path holds now)."""
        if event.event == "restarted":
            expected, size, now = event.get("expected"), event.get("size"), event.get("now")
            change = FileChanged(
                "deleted" if self.gone else str(event.get("reason") or "replaced"),
                float(now) if type(now) in (int, float) else time.time(),
                expected if type(expected) is int else None,
                size if type(size) is int else None,
                self.stream,
            )
            self._pool.submit(self._restart, change)

    def _restart(self, change: FileChanged) -> None:
        if self._error is None:
            try:
                self.run.file_changed(change)
            except BaseException as e:
                self._error = e

    def begin(self, run: Run) -> None:
        """The frames after this go to ``run`` (an earlier look's, read on)."""
        self._pool.submit(setattr, self, "run", run)

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
        return await calls.run_status(host, run_dir)
    except TargetError:
        return None  # judged from the records alone


def local_status(run: Run, run_dir: Path, now: float) -> None:
    """A run on this machine: the room on its filesystem and the agent's own ``status``
    code, run in this process (no agent process to start); nothing without a manifest."""
    from eagle3_tui.agent.diskspace import disk_space

    note_disk(run, disk_space(str(run_dir), str(run_dir / "metrics.jsonl")))
    try:
        status = calls.local_status(str(run_dir))
    except AgentAnswerError:
        return  # no manifest (a user's own writer), an unreadable one: the records
    apply_status(run.state, status, now)


def load_target(where: Target, label: str, history: History = None) -> tuple[Run, float]:
    """A run's records, manifest and whether its trainer lives (the agent's ``status``
    on the run's host; in this process for a local run)."""
    if isinstance(where, LocalTarget):
        run = load_local(where.run_dir, history)
        now = time.time()
        local_status(run, where.run_dir, now)
    else:
        run, now = run_sync(load_remote(where, history))
    if run.state.records == 0 and run.state.malformed_count == 0:
        raise TargetError(f"{label}: metrics.jsonl is empty (no record written yet)")
    return run, now


def needs_choice(where: Target, pid: int | None) -> bool:
    """Whether the host's agent must say what the target means (a process, a work
    directory, a host's live training) before it is read: all but a local run directory
    (its run.json, or eagle3-tui's metrics.jsonl: a user's own handler's file is a work
    directory's, whose training says how it is doing)."""
    from eagle3_tui.agent.process_facts import eagle3_metrics

    if pid is not None:
        return True
    if isinstance(where, LocalTarget):
        d = where.run_dir
        check_local_input(d)  # unreadable or of the wrong kind: one line, its own status
        metrics = d / "metrics.jsonl"
        ours = (d / "run.json").exists() or (metrics.exists() and eagle3_metrics(str(metrics)))
        return d.is_dir() and not ours
    return True


@dataclass(frozen=True)
class ReadTo:
    """Where a read of a run's file on its host ended: its run (fed up to there), the
    run directory the host chose, and the file's size and identity then. A later look
    at the same run reads on from it (:func:`load_chosen`'s ``since``)."""

    run: Run
    run_dir: str
    offset: int
    identity: str
    gone: bool = False
    """A later look found no file at the path (said to the run as ``deleted``)."""


@dataclass(frozen=True)
class Look:
    """A target read once on its host (:func:`load_chosen`): its run, the host's clock,
    and where the read of the run's file ended (None: not a run's file, a training
    without telemetry observed)."""

    run: Run
    now: float
    read_to: ReadTo | None


async def load_chosen(
    where: Target,
    pid: int | None,
    label: str,
    on_note: Note | None = None,
    history: History = None,
    since: ReadTo | None = None,
    host: Host | None = None,
) -> Look:
    """What the target means, read on its host over one connection: a run's
    metrics.jsonl (and manifest), or a few seconds' observation of a training without
    telemetry. ``since``: an earlier look's end; where the host chooses the same run,
    its run is read on from there (only the bytes written since: a file that is
    another one now, or shorter, is read whole again into a new run, as a local
    ``follow`` reads it). ``host``: the target's host, open already (kept open)."""

    async def go(host: Host) -> Look:
        at = None if since is None else (since.run_dir, since.offset, since.identity)
        read_dir = ""
        with Feeder(new_run()) as feed:
            feed.gone = since is not None and since.gone

            def on_event(ev: Event) -> None:
                nonlocal read_dir
                if ev.event == EV_CHOSEN:  # before the run's first frame
                    read_dir = str(ev.get("read_dir") or "")
                    if since is not None and read_dir == since.run_dir:
                        feed.begin(since.run)  # read on from where it ended
                    tell(on_note, ev.get("note"))
                feed.event(ev)

            chosen, eof = await calls.look(
                host, calls.run_dir_of(where), pid, feed, on_event, history, at
            )
        if chosen.choice is Choice.SEVERAL:
            raise calls.several_error(chosen, label)
        if eof is not None:
            run = feed.run
            note_disk(run, eof.get("disk"))
            now = float(eof.get("now") or time.time())
            status = calls.look_status(eof, host.label)
            if status is not None:
                apply_status(run.state, status, now)
            size, identity = eof.get("size"), eof.get("identity")
            ok = type(size) is int and size >= 0 and isinstance(identity, str)
            ok = ok and bool(read_dir)
            return Look(run, now, ReadTo(run, read_dir, size, identity) if ok else None)
        tell(on_note, chosen.note)
        run = new_run()
        end = await calls.observe_once(
            host, chosen.chosen_row(), lambda f: run.feed_frame(f), OBSERVE_S
        )
        return Look(run, float(end.get("now") or time.time()), None)

    if host is not None:
        return await go(host)
    return await calls.on_host(where, go)


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
    others: list[Target] = list(await calls.node_targets(where))
    if not others:
        return await calls.on_host(where, lambda h: call(h, where))
    waited = await first([where, *others]) if first is not None else None
    report = calls.merge_results(op, await calls.on_nodes([where, *others], call, kind))
    if isinstance(report, KillReport):
        report = calls.with_save_wait(report, waited)
    return report
