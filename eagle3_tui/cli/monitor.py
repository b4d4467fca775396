"""``eagle3-tui TARGET``: the live monitor (the Textual app) of a run, a training
without telemetry, or the nodes of a multi-node run."""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_tui import exits
from eagle3_tui.cli.common import (
    Parser,
    add_pid_option,
    add_ssh_options,
    cli_target,
    say,
    ssh_options,
    version,
)
from eagle3_tui.transport.base import TargetError

if TYPE_CHECKING:
    from eagle3_tui.transport.target import SshTarget, Target


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="eagle3-tui",
        description="Live terminal monitor for EAGLE-3 draft-model training with speculators.",
        epilog=(
            "commands:\n"
            "  eagle3-tui RUN_DIR                  monitor a run directory on this machine\n"
            "  eagle3-tui [USER@]HOST[:DIR]        monitor over SSH (HOST alone: your live\n"
            "                                      training there, else its latest run)\n"
            "  eagle3-tui [TARGET] --pid PID       monitor a training process (no telemetry\n"
            "                                      needed: watched from outside)\n"
            "  eagle3-tui runs [HOST]              live trainings and registered runs\n"
            "  eagle3-tui fleet [HOST...]          every live and recent run of several hosts,\n"
            "                                      one row each, live (Enter opens one)\n"
            "  eagle3-tui HOST0 HOST1 ...          one run whose nodes are these hosts (torchrun)\n"
            "  eagle3-tui kill TARGET              stop a run: checkpoint saved, no process left\n"
            "  eagle3-tui resume TARGET            relaunch a stopped run from its checkpoint\n"
            "  eagle3-tui attach [TARGET] --pid N  add telemetry to a live training, no restart\n"
            "  eagle3-tui demo [--headless]        train a tiny model on the CPU and monitor it\n"
            "  eagle3-tui summary RUN_DIR [--json] print the run's state (exit status = health)\n"
            "  eagle3-tui compare A B [--json]     this run against a previous one, same step\n"
            "  eagle3-tui watch TARGET... --notify URL  alert when a run needs you, headless\n"
            "\nexit status:\n"
            "  0 after q; 1 the monitor stopped on an error; 2 a missing run or a bad flag;\n"
            "  20-23 a process target (see summary); 21 no permission (a run directory, its\n"
            "  metrics.jsonl or run.json this user may not read); 25 not what it should be\n"
            "  (a file for a run directory; a directory, FIFO, device or dangling link for\n"
            "  metrics.jsonl or run.json)\n"
            "\nRun 'eagle3-tui COMMAND --help' (or 'eagle3-tui help COMMAND') for a command's "
            "options."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=version())
    p.add_argument(
        "target",
        metavar="TARGET",
        nargs="*",
        help="a local run or work directory, or [USER@]HOST[:DIR] (HOST alone: your live "
        "training there, else its latest run); several hosts: the nodes of one multi-node run "
        "(one host is enough once its manifest names the others)",
    )
    add_pid_option(p)
    p.add_argument(
        "--compare",
        metavar="RUN",
        help="a previous run to compare with (key c): a run directory on the same host, "
        "or a TARGET",
    )
    add_ssh_options(p)
    p.add_argument(
        "--ssh-client",
        choices=("auto", "openssh", "asyncssh"),
        default="auto",
        help="what carries the live stream: the ssh binary when installed (auto; the lowest "
        "latency), or asyncssh in-process",
    )
    return p


def run(ns: argparse.Namespace) -> int:
    import asyncio

    from eagle3_tui.transport.target import SshTarget, parse_target

    if not ns.target:
        ns.target = None  # --pid alone: this machine
        target = cli_target(ns)
        return then_fleet(asyncio.run(monitor(target, ns)), target, ns)
    targets = [parse_target(t, ssh_options(ns)) for t in ns.target]
    if len(targets) > 1:
        remote = [t for t in targets if isinstance(t, SshTarget)]
        if len(remote) != len(targets):
            raise TargetError("several targets are the nodes of one run: give them as hosts")
        return then_fleet(asyncio.run(monitor(remote[0], ns, remote[1:])), remote[0], ns)
    return then_fleet(asyncio.run(monitor(targets[0], ns)), targets[0], ns)


def then_fleet(status: int, target: Target, ns: argparse.Namespace) -> int:
    """After ``F`` in the monitor: the fleet of the run's host (this machine's for a local
    run), with the same SSH options. Opened from the fleet, the monitor just returns."""
    from eagle3_tui.cli import fleet
    from eagle3_tui.transport.target import LocalTarget

    if not getattr(ns, "fleet_requested", False) or status != exits.OK or fleet.opening:
        return status
    from eagle3_tui.cli import main
    from eagle3_tui.cli.watch import ssh_argv

    host = "localhost" if isinstance(target, LocalTarget) else target.destination
    pid = getattr(ns, "pid", None)
    fleet.back_to = [*(ns.target or []), *(["--pid", str(pid)] if pid is not None else [])]
    return main(["fleet", host, *ssh_argv(ns)])


async def monitor(target: Target, ns: argparse.Namespace, nodes: Sequence[SshTarget] = ()) -> int:
    """Find what the target means first (errors as one line, before any UI; a picker when
    the host has several live trainings), then monitor it: a run's metrics.jsonl, or a
    training without telemetry watched from outside. Over SSH the live stream goes through
    the ``ssh`` binary where there is one (``--ssh-client``), control over asyncssh.

    A multi-node run: ``nodes`` are its other hosts (given on the command line), or, when
    none are given, the nodes its manifest names; every node's file is streamed into one
    view, and kill/resume act on every node."""
    from eagle3_tui.api.reading import needs_choice
    from eagle3_tui.transport import calls
    from eagle3_tui.transport.local import LocalTransport, check_run_dir
    from eagle3_tui.transport.replies import Choice
    from eagle3_tui.transport.target import LocalTarget, SshTarget

    pid = getattr(ns, "pid", None)
    place = await job_place(target) if target.job is not None else None
    if place is not None:
        assert place.where is not None
        target, pid = place.where, None if place.telemetry else place.pid
    host = calls.open_host(target)
    hosts: list[Any] = [host]

    def slurmed(control: Any) -> Any:
        if place is not None:  # k ends the job through Slurm too, r requeues it
            control.job, control.login = place.job, place.login
        return control

    try:
        from eagle3_tui.app.app import make_app
        from eagle3_tui.app.run_control import RunControl

        if isinstance(target, LocalTarget) and not needs_choice(target, pid):
            check_run_dir(target.run_dir, wait_for_file=True)
            app = make_app(
                LocalTransport(target.run_dir),
                control=slurmed(RunControl.for_target(target)),
                note=place.note if place is not None else "",
                compare=compare_source(ns, target),
                open_run=open_run_for(target),
                export_dir=local_export_dir(target.run_dir),
            )
            app.owns_process = True
            await app.run_async()
            ns.fleet_requested = app.fleet_requested
            return app_exit_status(app)
        host_alone = isinstance(target, SshTarget) and target.run_dir is None and pid is None
        try:
            chosen = await calls.choose(host, calls.run_dir_of(target), pid)
        except TargetError:
            if not host_alone or place is not None:
                raise
            chosen = None  # nothing of the user's on the host itself: its Slurm jobs?
        idle = chosen is None or (chosen.choice is Choice.RUN and chosen.row is None)
        if host_alone and place is None and idle:
            # no live training on the host itself (a login node): its Slurm jobs, if any
            job = await slurm_jobs_shown(host)
            if job == "":
                return exits.SEVERAL
            if job is not None:
                return await monitor(replace(target, job=job), ns)
        if chosen is None:  # no Slurm job either: the host's own answer
            chosen = await calls.choose(host, calls.run_dir_of(target), pid)
        note, short = chosen.note, chosen.short
        row = chosen.row
        if chosen.choice is Choice.SEVERAL:
            from eagle3_tui.app.chooser import choose_live

            row = await choose_live(chosen)
            if row is None:
                return exits.OK
            note = f"picked among {note}"
        export_dir: Path | None = None
        if row is not None and not row.run_dir:  # a training without telemetry
            from eagle3_tui.transport.observed import ObservedTransport

            source: Any = ObservedTransport(stream_host(target, host, ns), row)
            app_control = RunControl.for_process(target, host, row)
            compare, open_run = compare_source(ns, target, host), open_run_for(target, host)
        else:
            run_dir = row.run_dir if row is not None and row.run_dir else chosen.chosen_run_dir()
            if isinstance(target, LocalTarget):
                export_dir = local_export_dir(Path(run_dir))
                pinned_local = LocalTarget(Path(run_dir))
                check_run_dir(pinned_local.run_dir, wait_for_file=True)
                source = LocalTransport(pinned_local.run_dir)
                app_control = RunControl.for_target(pinned_local)
                compare, open_run = compare_source(ns, pinned_local), open_run_for(pinned_local)
            else:
                from eagle3_tui.transport.ssh import SshTransport

                pinned = target.with_run_dir(run_dir)  # a newer run does not take over
                source = SshTransport(stream_host(pinned, host, ns), run_dir)
                app_control = RunControl.for_target(pinned, host)
                source = await with_nodes(source, app_control, pinned, nodes, hosts, ns)
                compare = compare_source(ns, pinned, host)
                open_run = open_run_for(pinned, host)
        if place is not None:
            note = f"{place.note}; {note}" if note else place.note
        app = make_app(
            source,
            control=slurmed(app_control),
            compare=compare,
            open_run=open_run,
            note=note,
            chosen=short,
            export_dir=export_dir,
        )
        app.owns_process = True
        await app.run_async()
    finally:
        for h in hosts:
            await h.close()
    ns.fleet_requested = getattr(app, "fleet_requested", False)
    return app_exit_status(app)


async def slurm_jobs_shown(host: Any) -> str | None:
    """On a host without a live training of the user's (a login node): the user's Slurm
    jobs that are speculators trainings and have not ended. One running: its id (the
    monitor opens it); several, or pending ones: listed, with their state and reason,
    and "" (the user picks one); none, or no Slurm: None."""
    from eagle3_tui.slurm_text import slurm_lines
    from eagle3_tui.transport.replies import DiscoverReport
    from eagle3_tui.transport.slurm import slurm_jobs

    try:
        report = await slurm_jobs(host)
    except TargetError:
        return None
    jobs = [j for j in report.jobs if j.training and j.active]
    if not report.slurm or not jobs:
        return None
    if len(jobs) == 1 and jobs[0].running:
        return jobs[0].array or jobs[0].id
    listing = DiscoverReport(jobs=jobs, user=report.user, host=report.host)
    lines = slurm_lines(listing)[1:]
    lines[-1] = f"(open one: eagle3-tui {host.label}:job/ID)"
    say("\n".join(lines))
    return ""


async def job_place(target: Target) -> Any:
    """A Slurm job's place (``api/slurm.py``): where its training runs; a pending job, or
    a running one whose training is still starting, is waited for (what it waits for
    said once, and again when it changes); an ended one without a registered run is an
    error."""
    from eagle3_tui.api import slurm

    said = None
    while True:
        try:
            place = await slurm.locate(target)
        except slurm.NoTrainingYetError as e:
            if str(e) != said:
                say(f"eagle3-tui: {e}; waiting for it (Ctrl+C to leave)", err=True)
                said = str(e)
            await asyncio.sleep(2.0)
            continue
        if place.where is not None:
            return place
        if not place.job.active:
            raise slurm.no_run_error(place, target.label)
        if place.note != said:
            say(f"eagle3-tui: {place.note}; waiting for it to run (Ctrl+C to leave)", err=True)
            said = place.note
        await asyncio.sleep(5.0)


async def with_nodes(
    source: Any,
    app_control: Any,
    pinned: SshTarget,
    nodes: Sequence[SshTarget],
    hosts: list[Any],
    ns: argparse.Namespace,
) -> Any:
    """A multi-node run's view: every node's stream merged (``transport.merge``), its
    control on each node (``RunControl.nodes``); the source unchanged for one node."""
    from eagle3_tui.app.run_control import RunControl
    from eagle3_tui.transport import calls
    from eagle3_tui.transport.merge import MergedSource
    from eagle3_tui.transport.ssh import SshTransport

    others = list(nodes) or await calls.node_targets(pinned)
    if not others:
        return source
    sources = [source]
    for node in others:
        host = calls.open_host(node)
        hosts.append(host)
        run_dir = (await calls.resolve(host, node.run_dir)).run_dir
        node_pinned = node.with_run_dir(run_dir)
        sources.append(SshTransport(stream_host(node_pinned, host, ns), run_dir))
        app_control.nodes.append(RunControl.for_target(node_pinned, host))
    return MergedSource(sources, [t.destination for t in (pinned, *others)])


def stream_host(target: Target, host: Any, ns: argparse.Namespace) -> Any:
    """What carries a live stream: the ``ssh`` binary where installed (``--ssh-client``),
    else the asyncssh connection; this machine's agent for a local target."""
    from eagle3_tui.transport.target import LocalTarget

    if isinstance(target, LocalTarget):
        return host
    from eagle3_tui.transport.openssh import OpenSshHost, find_ssh

    client = getattr(ns, "ssh_client", "auto")
    ssh = find_ssh() if client != "asyncssh" else None
    if client == "openssh" and ssh is None:
        raise TargetError("--ssh-client openssh: no ssh on PATH")
    # the stream's ssh reads the configuration and known_hosts the connection did
    return OpenSshHost(target, ssh, getattr(host, "known_hosts", None)) if ssh else host


def compare_source(ns: argparse.Namespace, target: Target, host: Any = None) -> Any:
    """The source of ``--compare RUN``: a directory on the monitored run's host, or a TARGET."""
    if not getattr(ns, "compare", None):
        return None
    from eagle3_tui.transport.local import LocalTransport, check_run_dir
    from eagle3_tui.transport.target import LocalTarget, parse_target

    other = parse_target(ns.compare, ssh_options(ns))
    if isinstance(other, LocalTarget):
        if isinstance(target, LocalTarget) or os.path.isdir(other.run_dir):
            check_run_dir(other.run_dir)
            return LocalTransport(other.run_dir)
        other = target.with_run_dir(str(other.run_dir))  # a path on the SSH host
    from eagle3_tui.transport.ssh import SshHost, SshTransport

    same = host is not None and not isinstance(target, LocalTarget)
    same = same and other.destination == target.destination  # type: ignore[union-attr]
    return SshTransport(host if same else SshHost(other), other.run_dir)


def open_run_for(target: Target, host: Any = None) -> Any:
    """How the app opens another run of the same host (the compare picker)."""
    from eagle3_tui.transport.local import LocalTransport
    from eagle3_tui.transport.target import LocalTarget

    if isinstance(target, LocalTarget):
        return lambda run_dir: LocalTransport(Path(run_dir))
    from eagle3_tui.transport.ssh import SshTransport

    return lambda run_dir: SshTransport(host, run_dir)


def local_export_dir(run_dir: Path) -> Path:
    """``e`` writes a local run's CSV next to its records, where its user looks."""
    return run_dir / "exports"


def app_exit_status(app: Any) -> int:
    """0 after a quit; exits.CRASHED when the monitor stopped on an error (Textual has
    printed the traceback), with one line saying so: a crash never exits 0."""
    if app.return_code:
        say("eagle3-tui: the monitor stopped on an error (traceback above)", err=True)
        return exits.CRASHED
    return exits.OK
