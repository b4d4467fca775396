"""Remote control of a run: kill, resume, list runs, read a run file; with their reports.

Each operation is one agent call on the host where the run lives (this machine or
an SSH host), so what decides (PID checks, checkpoint checks) runs next to the
processes and files it judges. The functions here open hosts, call the agent and
turn its answer into text for a person and an exit status.

No textual here; asyncssh only when a host target is opened.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
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

KILL_EXIT = {"stopped": EXIT_OK, "not_running": EXIT_OK, "refused": EXIT_REFUSED}


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


# ---- reports ------------------------------------------------------------------------


def kill_exit_status(result: dict[str, Any]) -> int:
    return KILL_EXIT.get(str(result.get("status")), EXIT_INCOMPLETE)


def resume_exit_status(result: dict[str, Any]) -> int:
    return EXIT_OK if result.get("status") == "started" else EXIT_INCOMPLETE


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
    node = f" [{printable(str(result['host']))}]" if result.get("nodes_total", 1) > 1 else ""
    lines = [f"{result.get('status')}{node}: {printable(str(result.get('message')))}"]
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
