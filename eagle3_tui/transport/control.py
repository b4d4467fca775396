"""Remote control of a run: kill, resume, list runs, read a run file; with their reports.

Each operation is one agent call on the host where the run lives (this machine or
an SSH host), so what decides (PID checks, checkpoint checks) runs next to the
processes and files it judges. The functions here open hosts, call the agent and
turn its answer into text for a person and an exit status.

No textual here; asyncssh only when a host target is opened.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from eagle3_tui.transport.base import TargetError, printable
from eagle3_tui.transport.channel import (
    DataFrame,
    Event,
    Host,
    LocalHost,
    ProgressCallback,
    call_agent,
)
from eagle3_tui.transport.target import LocalTarget, SshTarget, Target

T = TypeVar("T")

# Exit statuses of kill and resume (documented in the README).
EXIT_OK = 0
EXIT_ERROR = 2
EXIT_INCOMPLETE = 8  # done, but processes of the run remain / the resumed run died at once
EXIT_REFUSED = 9  # nothing done: the PID is another process now, no complete checkpoint...

KILL_EXIT = {
    "stopped": EXIT_OK,
    "not_running": EXIT_OK,
    "refused": EXIT_REFUSED,
    "error": EXIT_ERROR,
}


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


def _python(host: Host) -> str:
    return str(getattr(host, "python", "python3"))


async def resolve(host: Host, run_dir: str | None) -> dict[str, Any]:
    """The run directory a target means, checked to exist (the latest run when None)."""
    ev = await call_agent(host, {"op": "resolve", "run_dir": run_dir}, python=_python(host))
    return ev.fields


async def kill_run(
    host: Host, run_dir: str | None, grace_s: float, on_progress: ProgressCallback | None = None
) -> dict[str, Any]:
    request = {"op": "kill", "run_dir": run_dir, "grace_s": grace_s}
    ev = await call_agent(host, request, on_progress=on_progress, python=_python(host))
    return ev.fields


async def resume_run(host: Host, run_dir: str | None, wait_s: float) -> dict[str, Any]:
    request = {"op": "resume", "run_dir": run_dir, "wait_s": wait_s}
    ev = await call_agent(host, request, python=_python(host))
    return ev.fields


async def run_status(host: Host, run_dir: str | None) -> dict[str, Any]:
    """``alive`` (the manifest's PID is still the trainer: start time and boot id match),
    ``problem`` (why not, when known), ``manifest``, ``host`` and the host's clock ``now``."""
    ev = await call_agent(host, {"op": "status", "run_dir": run_dir}, python=_python(host))
    return ev.fields


async def list_runs(host: Host) -> dict[str, Any]:
    ev = await call_agent(host, {"op": "runs"}, python=_python(host))
    return ev.fields


async def read_file(
    host: Host,
    run_dir: str | None,
    on_data: Callable[[DataFrame], object],
    file: str | None = None,
) -> Event:
    """Every byte of the run's file (metrics.jsonl) now; returns the ``eof`` event
    (``size``, and ``now``: the host's clock, for health judged against it)."""
    request: dict[str, Any] = {"op": "read", "run_dir": run_dir}
    if file:
        request["file"] = file
    return await call_agent(host, request, on_data=on_data, python=_python(host))


# ---- the nodes of a multi-node run ----------------------------------------------------


def other_nodes(manifest: dict[str, Any], host: str, run_dir: str) -> list[dict[str, Any]]:
    """The nodes a run's manifest names besides the one read (``host``, ``run_dir``): each
    ``{node_rank, host, run_dir, ...}`` (``nodes`` is filled in once every rank of a
    torchrun job has put its place in the job's store)."""
    nodes = manifest.get("nodes")
    if not isinstance(nodes, list):
        return []
    mine = manifest.get("node_rank")
    out = []
    for node in nodes:
        if not isinstance(node, dict) or not isinstance(node.get("host"), str):
            continue
        if node.get("node_rank") == mine or (
            node.get("host") == host and node.get("run_dir") == run_dir
        ):
            continue
        out.append(node)
    return out


def node_target(target: SshTarget, node: dict[str, Any]) -> SshTarget:
    """Another node of the run, reached as ``target`` is (same user and ssh options): by
    the host name its telemetry recorded, which ssh resolves (a ~/.ssh/config alias,
    the cluster's DNS)."""
    return replace(target, host=str(node["host"]), run_dir=node.get("run_dir"))


async def node_targets(target: Target) -> list[SshTarget]:
    """The other nodes of the run at ``target`` (SSH targets only; none otherwise)."""
    if not isinstance(target, SshTarget):
        return []

    async def find(host: Host) -> list[dict[str, Any]]:
        info = await resolve(host, target.run_dir)
        try:
            status = await run_status(host, str(info["run_dir"]))
        except TargetError:
            return []  # no manifest: a single node's run as far as anyone can tell
        manifest = status.get("manifest") or {}
        return other_nodes(manifest, str(info.get("host")), str(info["run_dir"]))

    return [node_target(target, node) for node in await on_host(target, find)]


async def on_nodes(
    targets: Sequence[Target], call: Callable[[Host, Target], Awaitable[dict[str, Any]]]
) -> list[tuple[str, dict[str, Any]]]:
    """``call`` on every node at once (a kill must reach every rank of a job together:
    a rank that is still training waits in its next collective for one that is
    saving). Each answer with where it came from; a node's error is its answer."""

    async def one(t: Target) -> tuple[str, dict[str, Any]]:
        try:
            return where(t, run_dir_of(t)), await on_host(t, lambda h: call(h, t))
        except TargetError as e:
            return where(t, run_dir_of(t)), failure(e)

    return list(await asyncio.gather(*(one(t) for t in targets)))


def failure(e: TargetError) -> dict[str, Any]:
    """A node's error as its result: ``refused`` (nothing done) or ``error``."""
    refused = type(e).__name__ == "AgentRefusedError"
    return {"status": "refused" if refused else "error", "message": str(e)}


def merge_results(op: str, results: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One result from every node's (the first node's fields, ``nodes`` = all of them, a
    status that is the worst of theirs)."""
    if len(results) == 1:
        return results[0][1]
    order = ("error", "refused", "remaining", "failed", "stopped", "started", "not_running")
    statuses = [str(r.get("status")) for _, r in results]
    worst = min(statuses, key=lambda st: order.index(st) if st in order else 0)
    merged = dict(results[0][1])
    merged.update(
        op=op,
        status=worst,
        message="; ".join(f"{w}: {r.get('message')}" for w, r in results),
        nodes=[{"where": w, **r} for w, r in results],
    )
    return merged


# ---- reports ------------------------------------------------------------------------


def kill_exit_status(result: dict[str, Any]) -> int:
    return KILL_EXIT.get(str(result.get("status")), EXIT_INCOMPLETE)


def resume_exit_status(result: dict[str, Any]) -> int:
    status = result.get("status")
    if status == "started":
        return EXIT_OK
    return {"refused": EXIT_REFUSED, "error": EXIT_ERROR}.get(str(status), EXIT_INCOMPLETE)


def format_progress(ev: Event) -> str | None:
    step = ev.get("step")
    if step == "signal":
        result = ev.get("result")
        what = "sent" if result == "sent" else f"not sent: {result}"
        return f"{ev.get('signal')} -> pid {ev.get('pid')} ({ev.get('role')}): {what}"
    if step == "waiting":
        return (
            f"waiting for pid {ev.get('pid')} to save its checkpoint and exit "
            f"({float(ev.get('elapsed', 0)):.0f} s)"
        )
    if step == "timeout":
        return f"pid {ev.get('pid')} still alive after {ev.get('grace_s')} s: SIGKILL"
    return None


def _checkpoint_line(name: str, info: dict[str, Any] | None) -> str:
    if not info:
        return f"  {name}: none"
    state = "complete" if not info.get("problems") else "INCOMPLETE: " + "; ".join(info["problems"])
    step = info.get("global_step")
    at = f" (global step {step}, epoch {info.get('epoch')})" if step is not None else ""
    return f"  {name}: {printable(str(info.get('path')))}{at}, {state}"


def format_kill(result: dict[str, Any]) -> str:
    nodes = result.get("nodes")
    if isinstance(nodes, list):  # several nodes: each one's report under its name
        return "\n".join(f"== {printable(str(n.get('where')))}\n{format_kill(n)}" for n in nodes)
    lines = [f"{result.get('status')}: {printable(str(result.get('message')))}"]
    procs = result.get("processes") or []
    if procs:
        lines.append(f"  {'PID':>8}  {'ROLE':<18} {'COMMAND':<16} {'SIGNALS':<16} OUTCOME")
        for p in procs:
            signals = ",".join(p.get("signals") or []) or "-"
            role = printable(str(p.get("label") or p.get("role", "")))[:18]
            ended = f" ({p['ended']})" if p.get("ended") else ""
            lines.append(
                f"  {p['pid']:>8}  {role:<18} {printable(str(p.get('comm')))[:16]:<16} "
                f"{signals:<16} {p.get('outcome')}{ended}"
            )
    ckpt = result.get("checkpoints") or {}
    if ckpt:
        lines.append("checkpoints:")
        lines.append(_checkpoint_line("interrupted", ckpt.get("interrupted")))
        lines.append(_checkpoint_line("resume from", ckpt.get("latest")))
    return "\n".join(lines)


def format_resume(result: dict[str, Any]) -> str:
    nodes = result.get("nodes")
    if isinstance(nodes, list):
        return "\n".join(f"== {printable(str(n.get('where')))}\n{format_resume(n)}" for n in nodes)
    if result.get("status") in ("refused", "error"):  # one node's, in a multi-node report
        return f"{result.get('status')}: {printable(str(result.get('message')))}"
    if result.get("status") != "started":
        lines = [f"failed: {printable(str(result.get('message')))} (pid {result.get('pid')})"]
        tail = str(result.get("log_tail") or "")
        if tail:
            lines.append(f"last lines of {printable(str(result.get('log')))}:")
            lines.extend("  " + printable(line) for line in tail.splitlines())
        return "\n".join(lines)
    ck = result.get("checkpoint") or {}
    step = ck.get("global_step")
    confirmed = "" if result.get("confirmed") else " (its manifest has not been updated yet)"
    return "\n".join(
        [
            f"started: pid {result.get('pid')}{confirmed}",
            f"  from {printable(str(ck.get('path')))}"
            + (f" (global step {step}, epoch {ck.get('epoch')})" if step is not None else ""),
            f"  log  {printable(str(result.get('log')))}",
        ]
    )


def format_runs(result: dict[str, Any]) -> str:
    runs = result.get("runs") or []
    lines = [f"{'STARTED':<19}  {'STATUS':<11} {'PID':>8}  RUN_DIR"]
    for r in runs:
        started = r.get("started_at")
        when = (
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(started)))
            if isinstance(started, int | float)
            else "?"
        )
        if not r.get("exists"):
            status = "gone"
        elif r.get("alive"):
            status = "running"
        elif r.get("status") == "running":
            status = "dead"
        else:
            status = str(r.get("status") or "unknown")
        lines.append(
            f"{when:<19}  {status:<11} {r.get('pid') or '-':>8}  {printable(str(r.get('run_dir')))}"
        )
    return "\n".join(lines)


def no_runs_error(result: dict[str, Any], label: str) -> TargetError:
    return TargetError(
        f"{label}: no run registered (index {printable(str(result.get('index')))}); "
        "attach telemetry to a training first"
    )
