"""Remote control of a run: kill, resume, list runs, read a run file; with their reports.

Each operation is one agent call on the host where the run lives (this machine or
an SSH host), so what decides (PID checks, checkpoint checks) runs next to the
processes and files it judges. The functions here open hosts, call the agent and
turn its answer into text for a person and an exit status.

Over 600 lines: one short function per agent operation (its request and its reply's
decoding), sharing the opening of hosts and the nodes of a multi-node run; split by
operation, each part would import those back.

No textual here; asyncssh only when a host target is opened.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import msgspec

from eagle3_tui.agent.names import (
    COLUMNS_WANTED,
    COMPRESS_ZLIB,
    EV_CHOSEN,
    OP_ATTACH,
    OP_CHOOSE,
    OP_DESCRIBE,
    OP_DISCOVER,
    OP_KILL,
    OP_LOOK,
    OP_OBSERVE,
    OP_RESOLVE,
    OP_RESUME,
    OP_RUNS,
    OP_SAVE_WAIT,
    OP_STATUS,
)
from eagle3_tui.model.samples import SAMPLES_KEPT
from eagle3_tui.transport.base import SeveralRunsError, TargetError, printable
from eagle3_tui.transport.channel import (
    AgentAnswerError,
    DataFrame,
    Event,
    Host,
    LocalHost,
    ProgressCallback,
    call_agent,
)
from eagle3_tui.transport.replies import (
    AgentProtocolError,
    AttachedFirst,
    AttachPlan,
    AttachResult,
    ChooseReply,
    DiscoverReport,
    ErrorKind,
    KillReport,
    NodePlace,
    ProcessRow,
    Resolved,
    ResumeReport,
    RunsReport,
    SaveWait,
    SaveWaitReport,
    Status,
    decode,
    decode_plan,
)
from eagle3_tui.transport.target import LocalTarget, SshTarget, Target

T = TypeVar("T")


def open_host(target: Target) -> Host:
    """The host where ``target`` lives (nothing is connected yet)."""
    if isinstance(target, LocalTarget):
        return LocalHost()
    from eagle3_tui.transport.ssh import SshHost

    return SshHost(target)


async def on_host(target: Target, call: Callable[[Host], Awaitable[T]]) -> T:
    """Open the host where ``target`` lives, make ``call`` with it, close it."""
    host = open_host(target)
    try:
        return await call(host)
    finally:
        await host.close()


def run_dir_of(target: Target) -> str | None:
    if isinstance(target, LocalTarget):
        return str(target.run_dir)
    return target.run_dir


def where(target: Target, run_dir: str | None) -> str:
    """``host:run_dir`` (or the local path) for messages, on one line."""
    shown = printable(run_dir or "(latest run)")
    if isinstance(target, SshTarget):
        return f"{target.destination}:{shown}"
    return shown


def python_of(host: Host) -> str:
    """The Python that runs the agent on ``host``."""
    return str(getattr(host, "python", "python3"))


async def resolve(host: Host, run_dir: str | None) -> Resolved:
    """The run directory a target means, checked to exist (the latest run when None)."""
    ev = await call_agent(host, {"op": OP_RESOLVE, "run_dir": run_dir}, python=python_of(host))
    return decode(Resolved, ev.fields, host.label)


async def kill_run(
    host: Host,
    run_dir: str | None,
    grace_s: float,
    on_progress: ProgressCallback | None = None,
    process: ProcessRow | None = None,
    save_wait_s: float | None = None,
    stop_wait_s: float | None = None,
    attach_first: bool = True,
) -> KillReport:
    """Kill the run in ``run_dir``, or (``process``: a discovered training's row) that
    process tree, identified by PID, start time and boot id. A checkpoint save in
    progress is waited for first, up to ``save_wait_s`` (None: the agent's default); a
    run with telemetry is asked to stop at a step boundary, waited for up to
    ``stop_wait_s`` (None: by the run's pace, agent/stopping.py) before SIGTERM.

    A training without telemetry is attached first where it can be (``attach_first``,
    :func:`attach_for_stop`): then it is that run which is stopped, at a step boundary,
    and resumed at the next step. Where it cannot, its kill records its restart and
    SIGTERMs it, as the report says."""
    first: AttachedFirst | None = None
    if process is not None and attach_first:
        first = await attach_for_stop(host, process, on_progress)
        if first.status == "attached" and first.run_dir is not None:
            report = await kill_run(
                host, first.run_dir, grace_s, on_progress, None, save_wait_s, stop_wait_s
            )
            return msgspec.structs.replace(report, attached_first=first, pid=process.pid)
    request: dict[str, Any] = {"op": OP_KILL, "run_dir": run_dir, "grace_s": grace_s}
    if save_wait_s is not None:
        request["save_wait_s"] = save_wait_s
    if stop_wait_s is not None:
        request["stop_wait_s"] = stop_wait_s
    if process is not None:  # no telemetry: the agent records its restart, with this package
        from eagle3_tui.transport.bundle import telemetry_library

        request.update(pid=process.pid, start_ticks=process.start_ticks, boot_id=process.boot_id)
        request["lib"] = telemetry_library()
    ev = await call_agent(host, request, on_progress=on_progress, python=python_of(host))
    report = decode(KillReport, ev.fields, host.label)
    return report if first is None else msgspec.structs.replace(report, attached_first=first)


async def attach_for_stop(
    host: Host, process: ProcessRow, on_progress: ProgressCallback | None = None
) -> AttachedFirst:
    """Attach telemetry to a training without it, before its kill, so that the kill can
    stop it at a step boundary (attach's own checks decide; the process must still be
    the one shown: same PID, start time and boot id). A torchrun job is not attached
    (every rank would have to be, before any can stop); its kill SIGTERMs it."""
    t0 = time.monotonic()

    def said(status: Any, message: str, **more: Any) -> AttachedFirst:
        first = AttachedFirst(
            status=status, message=message, took_s=round(time.monotonic() - t0, 3), **more
        )
        if on_progress is not None:
            on_progress(Event("progress", {"step": "attach_first", "first": first}))
        return first

    if process.launcher_pid is not None or len(process.ranks) > 1:
        return said("skipped", "a torchrun job: each rank would have to be attached first")
    plan = await attach_plan(host, None, process.pid)
    if not isinstance(plan, AttachPlan):
        return said("refused", plan.message or str(plan.reason))
    if (plan.start_ticks, plan.boot_id) != (process.start_ticks, process.boot_id):
        return said("refused", f"pid {process.pid} is another process now")
    if on_progress is not None:
        on_progress(Event("progress", {"step": "attach_first", "plan": plan.mechanism}))
    result = await attach_run(host, plan)
    if result.status == "attached" and result.run_dir:
        return said(
            "attached",
            result.message,
            run_dir=result.run_dir,
            mechanism=plan.mechanism,
            stopped_ms=result.stopped_ms,
        )
    status = "queued" if result.status == "queued" else "failed"
    return said(status, result.message or str(result.reason), mechanism=plan.mechanism)


async def wait_for_save(
    host: Host,
    run_dir: str | None,
    save_wait_s: float | None = None,
    on_progress: ProgressCallback | None = None,
) -> SaveWaitReport:
    """A kill's first step alone: wait for a checkpoint save in progress (agent/saving.py)."""
    request: dict[str, Any] = {"op": OP_SAVE_WAIT, "run_dir": run_dir}
    if save_wait_s is not None:
        request["save_wait_s"] = save_wait_s
    ev = await call_agent(host, request, on_progress=on_progress, python=python_of(host))
    return decode(SaveWaitReport, ev.fields, host.label)


async def saves_done(
    calls: Sequence[Callable[[], Awaitable[SaveWaitReport]]],
) -> SaveWait | None:
    """Every node's :func:`wait_for_save` at once, before a multi-node kill signals any
    node: the ranks of every node take part in a save, so none is signalled while one
    node's records show a save in progress. What was waited for (the longest wait), if
    anything; a node that cannot answer is left to its kill's own report."""

    async def one(call: Callable[[], Awaitable[SaveWaitReport]]) -> SaveWait | None:
        try:
            return (await call()).save_wait
        except TargetError:
            return None

    waits = [w for w in await asyncio.gather(*(one(c) for c in calls)) if w is not None]
    return max(waits, key=lambda w: w.waited_s) if waits else None


async def resume_run(
    host: Host,
    run_dir: str | None,
    wait_s: float,
    process: ProcessRow | None = None,
    pid: int | None = None,
    plan: bool = False,
) -> ResumeReport:
    """Relaunch the run in ``run_dir``; or the training without telemetry that ``process``
    (its discovery row) or ``pid`` names, from the restart its kill recorded, with
    telemetry. ``plan``: every check on the host, nothing started (status ``plan``)."""
    request: dict[str, Any] = {"op": OP_RESUME, "run_dir": run_dir, "wait_s": wait_s}
    if process is not None:  # where its kill wrote the record: its working directory
        request.update(pid=process.pid, start_ticks=process.start_ticks, cwd=process.cwd)
    elif pid is not None:
        request["pid"] = pid
    if plan:
        request["plan"] = True
    ev = await call_agent(host, request, python=python_of(host))
    return decode(ResumeReport, ev.fields, host.label)


async def run_status(host: Host, run_dir: str | None, plan: bool = False) -> Status:
    """Whether the manifest's PID is still the trainer (start time and boot id match),
    why not, the manifest, what outlived it, the host and the host's clock. On this
    machine the agent's own ``status`` code runs in a thread of this process: the
    monitor's probe of a local run then starts no Python process every minute (it cost
    ~0.1 % of a core on its own: benchmarks/bench_follow.py's "children"). ``plan``:
    with what a kill would act on now (the ``k`` dialog's rows)."""
    if isinstance(host, LocalHost):
        return await asyncio.to_thread(local_status, run_dir, plan)
    request = {"op": OP_STATUS, "run_dir": run_dir, "plan": plan}
    ev = await call_agent(host, request, python=python_of(host))
    return decode(Status, ev.fields, host.label)


def local_status(run_dir: str | None, plan: bool = False) -> Status:
    """``status`` of a run on this machine: the agent's own code, run in this process,
    decoded as its reply is; its errors as the agent's would read."""
    from eagle3_tui.agent.frames import AgentError
    from eagle3_tui.agent.runs import status_of

    try:
        fields = status_of(run_dir, plan)
    except AgentError as e:  # as the agent's error frame reads: its kind, its line
        raise AgentAnswerError(str(e), ErrorKind.of(e.kind)) from None
    except Exception as e:  # as an agent that failed: a TargetError, never into the app
        raise TargetError(f"local: status failed: {type(e).__name__}: {e}") from e
    return decode(Status, {"op": OP_STATUS, **fields}, LocalHost.label)


def with_save_wait(report: KillReport, waited: SaveWait | None) -> KillReport:
    """A multi-node kill's merged report with what its first step (:func:`saves_done`)
    waited for, unless a node's own kill says it already."""
    if waited is None or report.save_wait is not None:
        return report
    return msgspec.structs.replace(report, save_wait=waited)


async def discover(host: Host, all_users: bool = False, prune: bool = False) -> DiscoverReport:
    """The host's live trainings (``live``, with or without telemetry) and its registered
    runs (``runs``: the login user's, or whoever owns them with ``all_users``; ``others``
    counts the ones left out). ``prune``: the index forgets the runs whose directory is
    gone first (``pruned``)."""
    request: dict[str, Any] = {"op": OP_DISCOVER, "all": all_users}
    if prune:
        request["prune"] = True
    ev = await call_agent(host, request, python=python_of(host))
    return decode(DiscoverReport, ev.fields, host.label)


async def choose(
    host: Host, run_dir: str | None, pid: int | None = None, purpose: str | None = None
) -> ChooseReply:
    """What a target means: ``choice`` ``run`` (``run_dir``), ``process`` (``row``, a
    training without telemetry) or ``several`` (``runs``), and a ``note`` saying so.
    ``purpose`` ``resume``: a host alone means its latest stopped run."""
    request: dict[str, Any] = {"op": OP_CHOOSE, "run_dir": run_dir}
    if pid is not None:
        request["pid"] = pid
    if purpose is not None:
        request["purpose"] = purpose
    ev = await call_agent(host, request, python=python_of(host))
    return decode(ChooseReply, ev.fields, host.label)


async def describe(host: Host, process: ProcessRow) -> Status:
    """A discovered training now: alive or not, why, its ``row``, a manifest-like
    identity, the host and its clock (as ``run_status`` for a registered run)."""
    request = {"op": OP_DESCRIBE, "pid": process.pid, "start_ticks": process.start_ticks}
    ev = await call_agent(host, request, python=python_of(host))
    return decode(Status, ev.fields, host.label)


async def observe_once(
    host: Host,
    process: ProcessRow,
    on_data: Callable[[DataFrame], object],
    seconds: float = 2.5,
) -> Event:
    """A short observation of a training without telemetry (records through ``on_data``,
    the log read back from near its end); returns the ``eof`` event (``now``: the host's
    clock). A trainer that exits meanwhile ends it early (``ended``)."""
    request = {
        "op": OP_OBSERVE,
        "pid": process.pid,
        "start_ticks": process.start_ticks,
        "until_s": seconds,
    }
    return await call_agent(host, request, on_data=on_data, python=python_of(host))


def several_error(result: ChooseReply, label: str) -> SeveralRunsError:
    rows = result.runs
    listed = "; ".join(describe_process(r) for r in rows[:6])
    return SeveralRunsError(
        f"{label}: {len(rows)} live trainings ({printable(listed)}): choose one with --pid PID"
    )


def describe_process(row: ProcessRow) -> str:
    from eagle3_tui.transport.observed import describe_row

    return describe_row(row)


async def list_runs(host: Host, all_users: bool = False) -> RunsReport:
    """The host's runs of the user we log in as (``all_users``: whoever owns them)."""
    ev = await call_agent(host, {"op": OP_RUNS, "all": all_users}, python=python_of(host))
    return decode(RunsReport, ev.fields, host.label)


_READ_REQUEST = {"compress": COMPRESS_ZLIB, "columns": COLUMNS_WANTED, "samples": SAMPLES_KEPT}
"""What every read of a run's file asks for: zlib frames, the columns the monitor and
commands read, the GPU samples kept."""


async def look(
    host: Host,
    run_dir: str | None,
    pid: int | None,
    on_data: Callable[[DataFrame], object],
    on_event: ProgressCallback,
    history: dict[str, Any] | None = None,
    since: tuple[str, int, str] | None = None,
) -> tuple[ChooseReply, Event | None]:
    """What a target means and, where that is a run with telemetry, its file and status,
    in one agent process (:func:`choose`, :func:`read_file` and :func:`run_status` one
    after the other would start three): the choice, and the read's ``eof`` with the
    run's ``status`` in it (None: the choice is not a run's file to read). The choice
    comes to ``on_event`` as a ``chosen`` event before the run's first frame. ``since``:
    an earlier look's run directory, the size it read and the file's identity then;
    where the host chooses that run directory again, it is read on from there (as
    :func:`read_file` reads from an ``offset``)."""
    request: dict[str, Any] = {"op": OP_LOOK, "run_dir": run_dir, **_READ_REQUEST}
    if pid is not None:
        request["pid"] = pid
    if history is not None:
        request["history"] = history
    if since is not None:
        request["since"] = {"run_dir": since[0], "offset": since[1], "identity": since[2]}
    chosen: list[Event] = []

    def progress(ev: Event) -> None:
        if ev.event == EV_CHOSEN:
            chosen.append(ev)
        on_event(ev)

    final = await call_agent(
        host, request, on_progress=progress, on_data=on_data, python=python_of(host)
    )
    if final.event != "eof":
        return decode(ChooseReply, final.fields, host.label), None
    if not chosen:
        raise AgentProtocolError(
            f"{host.label}: the agent's look read a file it had not said it chose; is the "
            "agent of another eagle3-tui version?"
        )
    return decode(ChooseReply, chosen[0].fields, host.label), final


def look_status(eof: Event, where: str) -> Status | None:
    """The run's ``status`` a look's ``eof`` carries (None: it has none to have, as
    :func:`run_status` then refuses: no manifest, an unreadable one; or one not
    understood: the run is judged from its records, as when a status call fails)."""
    status = eof.get("status")
    if not isinstance(status, dict):
        return None
    try:
        return decode(Status, status, where)
    except AgentProtocolError:
        return None


async def read_file(
    host: Host,
    run_dir: str | None,
    on_data: Callable[[DataFrame], object],
    file: str | None = None,
    history: dict[str, Any] | None = None,
    offset: int = 0,
    identity: str | None = None,
    on_event: ProgressCallback | None = None,
) -> Event:
    """Every byte of the run's file (metrics.jsonl) now; returns the ``eof`` event
    (``size``, ``identity``, and ``now``: the host's clock, for health judged against
    it). Frames may carry columns (``span``): feed them with ``Run.feed_frame``.
    ``history``: of the older steps, only these columns (agent/names.py's
    ``SUMMARY_HISTORY``). From ``offset`` of the file an earlier read's ``eof`` named
    (``identity``): where that file is replaced or shorter, ``on_event`` is told
    (``restarted``) before it is sent from 0."""
    request: dict[str, Any] = {"op": "read", "run_dir": run_dir, **_READ_REQUEST}
    if history is not None:
        request["history"] = history
    if file:
        request["file"] = file
    if offset:
        request["offset"] = offset
    if identity is not None:
        request["identity"] = identity
    return await call_agent(
        host, request, on_progress=on_event, on_data=on_data, python=python_of(host)
    )


# ---- the nodes of a multi-node run ----------------------------------------------------


def other_nodes(manifest: dict[str, Any], host: str, run_dir: str) -> list[NodePlace]:
    """The nodes a run's manifest names besides the one read (``host``, ``run_dir``)
    (``nodes`` is filled in once every rank of a torchrun job has put its place in the
    job's store; an entry without a host name is skipped)."""
    nodes = manifest.get("nodes")
    if not isinstance(nodes, list):
        return []
    mine = manifest.get("node_rank")
    out = []
    for entry in nodes:
        try:
            node = msgspec.convert(entry, NodePlace, str_keys=True)
        except msgspec.ValidationError:
            continue
        if node.node_rank == mine or (node.host == host and node.run_dir == run_dir):
            continue
        out.append(node)
    return out


def node_target(target: SshTarget, node: NodePlace) -> SshTarget:
    """Another node of the run, reached as ``target`` is (same user and ssh options): by
    the host name its telemetry recorded, which ssh resolves (a ~/.ssh/config alias,
    the cluster's DNS)."""
    return replace(target, host=node.host, run_dir=node.run_dir)


async def node_targets(target: Target) -> list[SshTarget]:
    """The other nodes of the run at ``target`` (SSH targets only; none otherwise)."""
    if not isinstance(target, SshTarget):
        return []

    async def find(host: Host) -> list[NodePlace]:
        info = await resolve(host, target.run_dir)
        try:
            status = await run_status(host, info.run_dir)
        except TargetError:
            return []  # no manifest: a single node's run as far as anyone can tell
        return other_nodes(status.manifest, str(info.host), info.run_dir)

    return [node_target(target, node) for node in await on_host(target, find)]


Report = TypeVar("Report", KillReport, ResumeReport)


async def on_nodes(
    targets: Sequence[Target],
    call: Callable[[Host, Target], Awaitable[Report]],
    kind: type[Report],
) -> list[tuple[str, Report]]:
    """``call`` on every node at once (a kill must reach every rank of a job together:
    a rank that is still training waits in its next collective for one that is
    saving). Each answer with where it came from; a node's error is its answer."""

    async def one(t: Target) -> tuple[str, Report]:
        try:
            return where(t, run_dir_of(t)), await on_host(t, lambda h: call(h, t))
        except TargetError as e:
            return where(t, run_dir_of(t)), failure(e, kind)

    return list(await asyncio.gather(*(one(t) for t in targets)))


def failure(e: TargetError, kind: type[Report]) -> Report:
    """A node's error as its report: ``refused`` (nothing done) or ``error``."""
    refused = isinstance(e, AgentAnswerError) and e.kind is ErrorKind.REFUSED
    return kind(status="refused" if refused else "error", message=str(e))


def merge_results(op: str, results: list[tuple[str, Report]]) -> Report:
    """One report from every node's (the first node's fields, ``nodes`` = all of them, a
    status that is the worst of theirs)."""
    if len(results) == 1:
        return results[0][1]
    order = ("error", "refused", "remaining", "failed", "stopped", "started", "not_running")
    statuses = [r.status for _, r in results]
    worst = min(statuses, key=lambda st: order.index(st) if st in order else 0)
    return msgspec.structs.replace(
        results[0][1],
        op=op,
        status=worst,
        message="; ".join(f"{w}: {r.message}" for w, r in results),
        nodes=[msgspec.structs.replace(r, where=w) for w, r in results],
    )


# ---- reports ------------------------------------------------------------------------


def no_runs_error(result: DiscoverReport, label: str) -> TargetError:
    if result.others:
        return TargetError(
            f"{label}: no run of yours registered, {result.others} of other users (--all)"
        )
    return TargetError(
        f"{label}: no live training and no run registered (index {printable(str(result.index))})"
    )


# ---- attach -----------------------------------------------------------------------


def attach_request(
    step: str,
    run_dir: str | None,
    pid: int | None,
    confirmed: AttachPlan | None = None,
    mechanism: str | None = None,
) -> dict[str, Any]:
    """The agent request of an attach step; ``inject`` names the process confirmed
    (PID, start time, boot id), the way in it was shown (``mechanism``) and carries
    the telemetry package. ``mechanism`` = ``gdb`` asks the plan for gdb where the
    injector could go too (the benchmark compares them)."""
    request: dict[str, Any] = {
        "op": OP_ATTACH,
        "step": step,
        "run_dir": run_dir,
        "pid": pid,
        "mechanism": mechanism,
    }
    if confirmed is not None:
        request.update(
            pid=confirmed.pid,
            start_ticks=confirmed.start_ticks,
            boot_id=confirmed.boot_id,
            run_dir=confirmed.run_dir,
            mechanism=confirmed.mechanism or None,
        )
    if step == "inject":
        from eagle3_tui.transport.bundle import telemetry_library

        request["lib"] = telemetry_library()
    return request


async def attach_plan(
    host: Host, run_dir: str | None, pid: int | None, mechanism: str | None = None
) -> AttachPlan | AttachResult:
    """What attaching would do (every check done, nothing touched): the plan, or the
    refusal (``reason``: which check; ``choose``: the ``candidates``)."""
    request = attach_request("plan", run_dir, pid, mechanism=mechanism)
    ev = await call_agent(host, request, python=python_of(host))
    return decode_plan(ev.fields, host.label)


async def attach_run(
    host: Host, plan: AttachPlan, wait_s: float = 10.0, metric_wait_s: float = 15.0
) -> AttachResult:
    """Attach to the process ``plan`` showed (refused if the PID is another one now)."""
    request = attach_request("inject", None, None, plan)
    request.update(wait_s=wait_s, metric_wait_s=metric_wait_s)
    ev = await call_agent(host, request, python=python_of(host))
    return decode(AttachResult, ev.fields, host.label)
