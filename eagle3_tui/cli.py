"""Command line: ``eagle3-tui TARGET``, ``demo``, ``summary``, ``compare``, ``kill``,
``resume``, ``runs``, ``attach``.

A TARGET is a local run directory or ``[USER@]HOST[:RUN_DIR]`` reached over SSH
with ssh's own options (``-p``, ``-i``, ``-J``, ``-F``, ``-o``) and files
(``~/.ssh/config``, ``known_hosts``, ssh-agent).

Every failure a user can cause (a missing run, a bad flag) ends with one line on
stderr and a non-zero exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from eagle3_tui import __version__, exits
from eagle3_tui.agent.names import KILL_GRACE_S, PURPOSE_RESUME, SAVE_WAIT_S
from eagle3_tui.model.inert import json_ascii, printable
from eagle3_tui.transport.base import TargetError

if TYPE_CHECKING:
    import subprocess

    from eagle3_tui.model.run import Run
    from eagle3_tui.transport.channel import DataFrame, Host
    from eagle3_tui.transport.control import Report
    from eagle3_tui.transport.replies import SaveWait, SaveWaitReport, Status
    from eagle3_tui.transport.target import LocalTarget, SshOptions, SshTarget, Target

# 21 and 25 (eagle3_tui/exits.py): a local input this user may not read, or of the wrong
# kind; every command that reads a run says them in its help, in these words:
INPUT_EXITS = (
    "21 no permission (a run directory, its metrics.jsonl or run.json this user may not "
    "read, or another user's process), 25 not what it should be (a file for a run "
    "directory; a directory, FIFO, device or dangling link for metrics.jsonl or run.json)"
)


def _version() -> str:
    return f"eagle3-tui {__version__}"


class Parser(argparse.ArgumentParser):
    """argparse's parser with its usage errors on one line: what is wrong and where the
    help is (argparse's own puts a usage synopsis of up to six lines first)."""

    def error(self, message: str) -> NoReturn:
        say(f"{self.prog}: {message} (see {self.prog} --help)", err=True)
        raise SystemExit(exits.ERROR)


def process_id(text: str) -> int:
    """A ``--pid``: a whole number from 1 (``-5``, ``0`` or ``abc`` are a usage error,
    not a process that 'has exited')."""
    try:
        pid = int(text)
    except ValueError:
        pid = 0
    if pid < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a process ID is a whole number from 1")
    return pid


def build_monitor_parser() -> argparse.ArgumentParser:
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
            "  eagle3-tui HOST0 HOST1 ...          one run whose nodes are these hosts (torchrun)\n"
            "  eagle3-tui kill TARGET              stop a run: checkpoint saved, no process left\n"
            "  eagle3-tui resume TARGET            relaunch a stopped run from its checkpoint\n"
            "  eagle3-tui attach [TARGET] --pid N  add telemetry to a live training, no restart\n"
            "  eagle3-tui demo [--headless]        train a tiny model on the CPU and monitor it\n"
            "  eagle3-tui summary RUN_DIR [--json] print the run's state (exit status = health)\n"
            "  eagle3-tui compare A B [--json]     this run against a previous one, same step\n"
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
    p.add_argument("--version", action="version", version=_version())
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


def command_parser(name: str, description: str) -> argparse.ArgumentParser:
    """The parser of ``eagle3-tui NAME``."""
    return Parser(prog=f"eagle3-tui {name}", description=description)


def add_json_and_ssh_options(p: argparse.ArgumentParser, json_help: str) -> argparse.ArgumentParser:
    """A command's last options: ``--json`` (what its JSON object is), then ssh's."""
    p.add_argument("--json", action="store_true", help=json_help)
    add_ssh_options(p)
    return p


def add_seconds_option(
    p: argparse.ArgumentParser, flag: str, default: float | None, help: str
) -> None:
    """An option that is a duration (``--grace``, ``--wait``)."""
    p.add_argument(flag, type=float, default=default, metavar="SECONDS", help=help)


def add_pid_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--pid",
        type=process_id,
        metavar="PID",
        help="the training process PID on the target's host (a trainer, its torchrun agent, "
        "a rank or a worker: its training); without TARGET, on this machine",
    )


def add_ssh_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("SSH options (for a HOST target; as in ssh)")
    g.add_argument("-p", dest="port", metavar="PORT", help="port on the host")
    g.add_argument(
        "-i", dest="identity", action="append", default=[], metavar="KEY", help="private key file"
    )
    g.add_argument(
        "-J", dest="jump", metavar="[USER@]HOST[:PORT]", help="jump host(s), comma-separated"
    )
    g.add_argument(
        "-F", dest="ssh_config", metavar="FILE", help="ssh config file (default ~/.ssh/config)"
    )
    g.add_argument("-l", dest="login", metavar="USER", help="user to log in as")
    g.add_argument(
        "-o",
        dest="ssh_option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an ssh option, e.g. StrictHostKeyChecking=accept-new to record an unknown host key",
    )
    g.add_argument(
        "--remote-python",
        default="python3",
        metavar="PATH",
        help="the interpreter that runs eagle3-tui's agent on the host (default python3)",
    )


def ssh_options(ns: argparse.Namespace) -> SshOptions:
    from eagle3_tui.transport.target import SshOptions, parse_port

    opts = SshOptions(remote_python=ns.remote_python)
    for text in ns.ssh_option:
        opts = opts.with_option(text)
    if ns.ssh_config is not None:
        if not os.path.isfile(ns.ssh_config):
            raise TargetError(f"-F {ns.ssh_config}: no such file")
        opts = replace(opts, config=(ns.ssh_config,))
    if ns.port is not None:
        opts = replace(opts, port=parse_port(ns.port))
    if ns.login is not None:
        opts = replace(opts, user=ns.login)
    if ns.identity:
        keys = tuple(os.path.expanduser(k) for k in ns.identity)
        opts = replace(opts, identities=keys + opts.identities)
    if ns.jump is not None:
        opts = replace(opts, jump=ns.jump)
    return opts


def cli_target(ns: argparse.Namespace) -> Target:
    """The command's TARGET; with --pid and no TARGET, this machine."""
    from eagle3_tui.transport.target import LocalTarget, parse_target

    if ns.target is None:
        if getattr(ns, "pid", None) is None:
            raise TargetError(
                "a TARGET is needed (a run directory, or [USER@]HOST[:DIR]), or --pid PID"
            )
        return LocalTarget(Path("."))  # --pid decides: see choose()
    return parse_target(ns.target, ssh_options(ns))


def build_kill_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "kill",
        (
            "Stop a run so that it saves its checkpoint: SIGTERM to the trainer (or the "
            "torchrun agent) after checking its PID is still the run's, wait for the save, "
            "then make sure every process of the run is gone (SIGKILL after the grace "
            "period). Exit status: 0 nothing of the run remains, 8 processes remain, "
            "9 refused (nothing signalled), 2 error (a missing run); 20-23 for a process "
            f"target (see summary); {INPUT_EXITS}."
        ),
    )
    p.add_argument(
        "target",
        metavar="TARGET",
        nargs="?",
        help="a local run or work directory, or [USER@]HOST[:DIR]",
    )
    add_pid_option(p)
    add_seconds_option(
        p,
        "--grace",
        KILL_GRACE_S,
        f"how long the trainer may take to save and exit before SIGKILL (default "
        f"{KILL_GRACE_S:.0f}: speculators gives up on its save after 120 s)",
    )
    add_seconds_option(
        p,
        "--save-wait",
        SAVE_WAIT_S,
        "if the run is writing a checkpoint, how long to wait for that save to finish "
        "before the first signal: a SIGTERM in the middle of a save leaves that checkpoint "
        f"incomplete (default {SAVE_WAIT_S:.0f}; 0: signal at once)",
    )
    add_seconds_option(
        p,
        "--stop-wait",
        None,
        "a run with telemetry is asked to stop at its next step boundary (nothing to redo "
        "on resume); how long to wait for that before SIGTERM (default: by the run's pace, "
        "max(60 s, 5 median steps, 1.5 x its longest gap between steps))",
    )
    p.add_argument(
        "--no-attach",
        dest="attach_first",
        action="store_false",
        help="a training without telemetry is attached first (eagle3-tui attach) so that it "
        "stops at a step boundary and a restart redoes nothing; with this, it is SIGTERM'd "
        "mid-step at once (a restart redoes the steps since its last checkpoint)",
    )
    return add_json_and_ssh_options(p, "the report as one JSON object")


def build_resume_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "resume",
        (
            "Relaunch a stopped run with its manifest's resume command, detached, in its "
            "directory and whole environment, appending to its log and metrics, only when "
            "its latest checkpoint is complete. A training started without eagle3-tui and "
            "stopped by its kill comes back with telemetry: the same command line, "
            "directory and environment, its output appended to its own log. Exit status: 0 "
            "started (its PID is printed), 8 the relaunched run exited at once, 9 refused "
            "(still running, no complete checkpoint, not stopped by eagle3-tui's kill), 2 "
            f"error; {INPUT_EXITS}."
        ),
    )
    p.add_argument(
        "target",
        metavar="TARGET",
        nargs="?",
        help="a local run or work directory, or [USER@]HOST[:DIR] (HOST alone: your latest "
        "stopped run there)",
    )
    p.add_argument(
        "--pid",
        type=process_id,
        metavar="PID",
        help="a training without telemetry that eagle3-tui's kill stopped (its trainer's or "
        "torchrun agent's PID): restarted with telemetry; without TARGET, on this machine",
    )
    add_seconds_option(
        p,
        "--wait",
        30.0,
        "how long to wait for the new run to take over its manifest (default 30)",
    )
    return add_json_and_ssh_options(p, "the report as one JSON object")


def build_runs_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "runs",
        "List the live trainings on a host (this machine without HOST), with "
        "or without telemetry, then your registered runs (--all: every user's), newest "
        "first. Exit status: 0 listed, 2 none found or error.",
    )
    p.add_argument("target", metavar="HOST", nargs="?", help="[USER@]HOST (default: this machine)")
    p.add_argument(
        "--all", action="store_true", help="runs of every user (default: the login user's own)"
    )
    p.add_argument(
        "--prune",
        action="store_true",
        help="first forget the registered runs whose directory is gone (the host's index of "
        "your runs; nothing on disk is touched)",
    )
    return add_json_and_ssh_options(p, "one JSON object")


def build_demo_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "demo",
        (
            "Train a tiny EAGLE-3 draft with the real speculators Trainer on the CPU, "
            "in the background, and monitor it."
        ),
    )
    p.add_argument(
        "--headless",
        action="store_true",
        help="no UI: train to completion, then print the run's summary (as the summary "
        "command does, its exit status too) and, on stderr, the run's directory; Ctrl-C "
        "or a closed terminal stops the training as well",
    )
    p.add_argument(
        "--out", type=Path, help="the run directory to create (default: a new temporary one)"
    )
    p.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="epochs to train (default: 3 headless, 6 with the UI)",
    )
    p.add_argument(
        "--step-delay",
        type=float,
        default=None,
        help="seconds added to each step so the curves can be watched (default: 0 headless, 0.15)",
    )
    p.add_argument("--workers", type=int, default=0, help="dataloader worker processes")
    return p


def build_summary_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "summary",
        "Print the state of a run, or of a training without telemetry (watched "
        "from outside for a few seconds). Exit status: 0 running/finished/waiting, "
        "3 silent, 4 stalled, 5 dead, 6 diverged (also after the end), 7 stopped "
        "(interrupted), 10 unreadable (no valid record, only malformed lines), 2 error; "
        "20 the PID is not a training, 22 it exited, 23 several live trainings (choose "
        f"with --pid); {INPUT_EXITS}.",
    )
    p.add_argument(
        "target",
        metavar="TARGET",
        nargs="?",
        help="a local run or work directory, or [USER@]HOST[:DIR] (HOST alone: your live "
        "training there, else its latest run)",
    )
    add_pid_option(p)
    return add_json_and_ssh_options(p, "one JSON object instead of text")


def say(text: str, *, err: bool = False) -> None:
    """Print ``text`` for a terminal and for a reader that may go away (``| head -1``).

    Every line a command prints goes through here, and what it quotes of a run (argv,
    a working directory, a path, a log line, an error naming one) is inert: every
    character a terminal would act on (ESC, BEL, C1 controls, bidi overrides, line
    separators) is shown escaped (``\\x1b``, ``\\u202e``, see ``model/inert.py``);
    only the report's own newlines stay. When the reader has gone, the rest of the
    output is dropped and the command still finishes, with its own exit status."""
    stream = sys.stderr if err else sys.stdout
    try:
        print(printable(text, keep="\n"), file=stream, flush=True)
    except OSError:  # a closed pipe (EPIPE), a closed terminal (EIO): nobody reads
        _drop_output(stream)


def say_json(text: str) -> None:
    """Print a JSON text (``--json``): every character outside printable ASCII written
    as its ``\\uXXXX`` escape, so the value is the same and a terminal shows it inert."""
    say(json_ascii(text))


def _drop_output(stream: Any) -> None:
    """Point the stream's descriptor at /dev/null: what is buffered and what follows
    is discarded quietly (no ``BrokenPipeError`` again at exit)."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return _command(args)
    except BrokenPipeError:  # argparse's own writes (--help, usage) into a closed pipe
        _drop_output(sys.stdout)
        return exits.OK
    finally:
        for stream in (sys.stdout, sys.stderr):  # argparse's help is printed unflushed
            try:
                stream.flush()
            except BrokenPipeError:
                _drop_output(stream)
            except (OSError, ValueError):
                pass


def _command(args: list[str]) -> int:
    commands: dict[
        str, tuple[Callable[[], argparse.ArgumentParser], Callable[[argparse.Namespace], int]]
    ] = {
        "demo": (build_demo_parser, cmd_demo),
        "summary": (build_summary_parser, cmd_summary),
        "kill": (build_kill_parser, cmd_kill),
        "resume": (build_resume_parser, cmd_resume),
        "runs": (build_runs_parser, cmd_runs),
        "attach": (build_attach_parser, cmd_attach),
        "compare": (build_compare_parser, cmd_compare),
    }
    try:
        if args and args[0] in commands:
            build, run = commands[args[0]]
            return run(build().parse_args(args[1:]))
        if args and args[0] == "help":  # help, help COMMAND: as --help
            if len(args) > 1 and args[1] in commands:
                commands[args[1]][0]().print_help()
            elif len(args) > 1:
                raise TargetError(not_a_command(args[1], commands) or f"{args[1]}: no such command")
            else:
                build_monitor_parser().print_help()
            return exits.OK
        mistyped = not_a_command(args[0], commands) if args else None
        if mistyped is not None:
            raise TargetError(mistyped)
        return cmd_monitor(build_monitor_parser().parse_args(args))
    except TargetError as e:
        from eagle3_tui.transport.control import exit_status_of

        say(f"eagle3-tui: {printable(str(e))}", err=True)
        return exit_status_of(e)
    except KeyboardInterrupt:
        return exits.INTERRUPTED


def not_a_command(word: str, commands: Collection[str]) -> str | None:
    """What to say of a first word that is no command, no directory here and no host
    written as one (``sumary``: 'did you mean eagle3-tui summary?'), where it reads as a
    command mistyped; None when it is none of those (a host name is a TARGET). A host
    whose name is that close to a command is written ``HOST:`` or ``USER@HOST``."""
    import difflib

    if word.startswith("-") or os.path.lexists(word) or any(c in word for c in "/:@.~["):
        return None
    if any(c.isdigit() for c in word):  # node0, gpu12: host names, never a command's typo
        return None
    meant = difflib.get_close_matches(word, [*commands, "help"], n=1, cutoff=0.75)
    if not meant:
        return None
    return (
        f"{word!r} is not a command: did you mean 'eagle3-tui {meant[0]}'? "
        f"(to monitor a host of that name: eagle3-tui {word}:)"
    )


# ---- summary ------------------------------------------------------------------


def load_local(run_dir: Path) -> Run:
    from eagle3_tui.model.run import Run
    from eagle3_tui.transport.local import check_run_dir, iter_chunks

    path = check_run_dir(run_dir)
    run = Run()
    for chunk in iter_chunks(path):
        run.feed(chunk.offset, chunk.data)
    return run


async def load_remote(target: SshTarget) -> tuple[Run, float]:
    """The run's metrics.jsonl read over SSH with its manifest and whether its trainer
    lives (one connection), and the host's clock. A multi-node run's other nodes (its
    manifest names them) are read too, each over its own connection."""
    from eagle3_tui.model.run import Run
    from eagle3_tui.transport.control import node_target, on_host, other_nodes, read_file
    from eagle3_tui.transport.replies import apply_status

    run = Run()

    async def read(host: Host) -> tuple[float, Status | None]:
        with Feeder(run) as feed:
            eof = await read_file(host, target.run_dir, feed)
        note_disk(run, eof.get("disk"))
        return float(eof.get("now") or time.time()), await host_status(host, target.run_dir)

    now, status = await on_host(target, read)
    if status is not None:
        nodes = other_nodes(status.manifest, str(status.host), str(status.run_dir))
        for i, node in enumerate(nodes, start=1):
            other = node_target(target, node)

            async def read_node(host: Host, i: int = i, other: SshTarget = other) -> None:
                with Feeder(run, i) as feed:
                    await read_file(host, other.run_dir, feed)

            await on_host(other, read_node)
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
    from eagle3_tui.transport.control import run_status

    try:
        return await run_status(host, run_dir)
    except TargetError:
        return None  # judged from the records alone


def local_status(run_dir: Path) -> Status | None:
    """A run on this machine: the agent's own ``status`` code, run in this process (no
    agent process to start); None without a manifest."""
    from eagle3_tui.transport import control
    from eagle3_tui.transport.channel import AgentAnswerError

    try:
        return control.local_status(str(run_dir))
    except AgentAnswerError:
        return None  # no manifest (a user's own writer), an unreadable one: the records


def load_target(target: Target, label: str) -> tuple[Run, float]:
    """A run's records, manifest and whether its trainer lives (the agent's ``status``
    on the run's host; in this process for a local run)."""
    import asyncio

    from eagle3_tui.agent.diskspace import disk_space
    from eagle3_tui.transport.replies import apply_status
    from eagle3_tui.transport.target import LocalTarget

    if isinstance(target, LocalTarget):
        run = load_local(target.run_dir)
        now = time.time()
        note_disk(run, disk_space(str(target.run_dir), str(target.run_dir / "metrics.jsonl")))
        status = local_status(target.run_dir)
        if status is not None:
            apply_status(run.state, status, now)
    else:
        run, now = asyncio.run(load_remote(target))
    if run.state.records == 0 and run.state.malformed_count == 0:
        raise TargetError(f"{label}: metrics.jsonl is empty (no record written yet)")
    return run, now


def needs_choice(target: Target, pid: int | None) -> bool:
    """Whether the host's agent must say what the target means (a process, a work
    directory, a host's live training) before it is read: all but a local run directory
    (its run.json, or eagle3-tui's metrics.jsonl: a user's own handler's file is a work
    directory's, whose training says how it is doing)."""
    from eagle3_tui.agent.discover import eagle3_metrics
    from eagle3_tui.transport.local import check_local_input
    from eagle3_tui.transport.target import LocalTarget

    if pid is not None:
        return True
    if isinstance(target, LocalTarget):
        d = target.run_dir
        check_local_input(d)  # unreadable or of the wrong kind: one line, its own status
        metrics = d / "metrics.jsonl"
        ours = (d / "run.json").exists() or (metrics.exists() and eagle3_metrics(str(metrics)))
        return d.is_dir() and not ours
    return True


def say_chosen(note: object) -> None:
    """What was chosen, on stderr (headless commands)."""
    if note:
        say(f"eagle3-tui: {printable(str(note))}", err=True)


async def load_chosen(target: Target, pid: int | None, label: str) -> tuple[Run, float]:
    """What the target means, read on its host over one connection: a run's
    metrics.jsonl (and manifest), or a few seconds' observation of a training without
    telemetry."""
    from eagle3_tui.model.run import Run
    from eagle3_tui.transport import control
    from eagle3_tui.transport.replies import Choice, apply_status

    async def go(host: Host) -> tuple[Run, float]:
        chosen = await control.choose(host, control.run_dir_of(target), pid)
        if chosen.choice is Choice.SEVERAL:
            raise control.several_error(chosen, label)
        say_chosen(chosen.note)
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

    return await control.on_host(target, go)


OBSERVE_S = 2.5
"""How long ``summary`` watches a training without telemetry (CPU and reads need two
samples; the log and checkpoints are read back at once)."""


def load_any(target: Target, label: str, pid: int | None = None) -> tuple[Run, float]:
    """Any run a target names: a run directory's records (:func:`load_target`), or what
    the host's agent says the target means (a process, a work directory, the host's
    live training: with telemetry or without, its metrics from its log, its own
    handler's file or its metric backend's files), looked at once."""
    import asyncio

    if not needs_choice(target, pid):
        return load_target(target, label)
    run, now = asyncio.run(load_chosen(target, pid, label))
    state = run.state
    if state.records == 0 and state.malformed_count == 0 and state.observed is None:
        raise TargetError(f"{label}: metrics.jsonl is empty (no record written yet)")
    return run, now


def cmd_summary(ns: argparse.Namespace) -> int:
    from eagle3_tui.model.summary import format_text, summarize

    target = cli_target(ns)
    run, now = load_any(target, ns.target or f"pid {ns.pid}", ns.pid)
    summary = summarize(run.state, now)
    if ns.json:
        say_json(json.dumps(summary, indent=None, sort_keys=False))
    else:
        say(format_text(summary))
    return exits.BY_HEALTH.get(summary["health"], exits.OK)


# ---- compare ------------------------------------------------------------------


def build_compare_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "compare",
        "Compare run A (this one) with run B (the previous one) at the furthest "
        "point both reached: loss, each TTT step's accuracies, tau, a verdict, validation "
        "per epoch and the hyperparameters that differ. Exit status: 0, 2 error (a missing "
        f"run, the same run twice); {INPUT_EXITS}.",
    )
    p.add_argument(
        "a",
        metavar="A",
        help="this run: a local run or work directory, or [USER@]HOST[:DIR] (a run "
        "without telemetry too: its metrics from its log, its own handler or its "
        "TensorBoard, MLflow or trackio files)",
    )
    p.add_argument("b", metavar="B", help="the previous run, likewise")
    p.add_argument(
        "--axis",
        choices=("step", "tokens", "time"),
        default="step",
        help="align by global step (default), training tokens or training time",
    )
    return add_json_and_ssh_options(p, "one JSON object instead of text")


def cmd_compare(ns: argparse.Namespace) -> int:
    from eagle3_tui.model.compare import compare, comparison_json, format_comparison
    from eagle3_tui.transport.target import parse_target

    options = ssh_options(ns)
    a, b = parse_target(ns.a, options), parse_target(ns.b, options)
    same = same_place(a, b)
    if same is not None:
        raise TargetError(
            f"{ns.a} and {ns.b} are the same run ({same}): compare it with another run"
        )
    run_a, _ = load_any(a, ns.a)
    run_b, _ = load_any(b, ns.b)
    result = compare(run_a.state, run_b.state, axis=ns.axis, labels=(ns.a, ns.b))
    if ns.json:
        say_json(json.dumps(comparison_json(result)))
    else:
        say(format_comparison(result))
    return exits.OK


def same_place(a: Target, b: Target) -> str | None:
    """Where both targets point, when they are one place however they are spelt
    (``RUN``, ``RUN/``, ``./RUN``, a link to it; the same host and directory); else
    None (two copies of a run are two runs)."""
    import posixpath

    from eagle3_tui.transport.target import LocalTarget

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


# ---- monitor ------------------------------------------------------------------


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


async def monitor(target: Target, ns: argparse.Namespace, nodes: Sequence[SshTarget] = ()) -> int:
    """Find what the target means first (errors as one line, before any UI; a picker when
    the host has several live trainings), then monitor it: a run's metrics.jsonl, or a
    training without telemetry watched from outside. Over SSH the live stream goes through
    the ``ssh`` binary where there is one (``--ssh-client``), control over asyncssh.

    A multi-node run: ``nodes`` are its other hosts (given on the command line), or, when
    none are given, the nodes its manifest names; every node's file is streamed into one
    view, and kill/resume act on every node."""
    from eagle3_tui.transport import control
    from eagle3_tui.transport.local import LocalTransport, check_run_dir
    from eagle3_tui.transport.replies import Choice
    from eagle3_tui.transport.target import LocalTarget

    pid = getattr(ns, "pid", None)
    host = control.open_host(target)
    hosts: list[Any] = [host]
    try:
        from eagle3_tui.app.app import make_app
        from eagle3_tui.app.control import RunControl

        if isinstance(target, LocalTarget) and not needs_choice(target, pid):
            check_run_dir(target.run_dir)
            app = make_app(
                LocalTransport(target.run_dir),
                control=RunControl.for_target(target),
                compare=compare_source(ns, target),
                open_run=open_run_for(target),
                export_dir=local_export_dir(target.run_dir),
            )
            app.owns_process = True
            await app.run_async()
            return app_exit_status(app)
        chosen = await control.choose(host, control.run_dir_of(target), pid)
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
                check_run_dir(pinned_local.run_dir)
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
        app = make_app(
            source,
            control=app_control,
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
    return app_exit_status(app)


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
    from eagle3_tui.app.control import RunControl
    from eagle3_tui.transport import control
    from eagle3_tui.transport.merge import MergedSource
    from eagle3_tui.transport.ssh import SshTransport

    others = list(nodes) or await control.node_targets(pinned)
    if not others:
        return source
    sources = [source]
    for node in others:
        host = control.open_host(node)
        hosts.append(host)
        run_dir = (await control.resolve(host, node.run_dir)).run_dir
        node_pinned = node.with_run_dir(run_dir)
        sources.append(SshTransport(stream_host(node_pinned, host, ns), run_dir))
        app_control.nodes.append(RunControl.for_target(node_pinned, host))
    return MergedSource(sources, [t.destination for t in (pinned, *others)])


def pinned_to(target: Target, run_dir: str) -> Target:
    """The target with the run directory a choice gave (a newer run does not take over)."""
    from eagle3_tui.transport.target import LocalTarget

    if isinstance(target, LocalTarget):
        return LocalTarget(Path(run_dir))
    return target.with_run_dir(run_dir)


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


def cmd_monitor(ns: argparse.Namespace) -> int:
    import asyncio

    from eagle3_tui.transport.target import SshTarget, parse_target

    if not ns.target:
        ns.target = None  # --pid alone: this machine
        return asyncio.run(monitor(cli_target(ns), ns))
    targets = [parse_target(t, ssh_options(ns)) for t in ns.target]
    if len(targets) > 1:
        remote = [t for t in targets if isinstance(t, SshTarget)]
        if len(remote) != len(targets):
            raise TargetError("several targets are the nodes of one run: give them as hosts")
        return asyncio.run(monitor(remote[0], ns, remote[1:]))
    return asyncio.run(monitor(targets[0], ns))


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


# ---- kill, resume, runs -------------------------------------------------------


def _print_progress(event: Any, prefix: str = "") -> None:
    from eagle3_tui.transport.control import format_progress

    line = format_progress(event)
    if line is not None:
        say(prefix + line, err=True)


def cmd_kill(ns: argparse.Namespace) -> int:
    import asyncio

    from eagle3_tui.transport import control
    from eagle3_tui.transport.replies import Choice, ChooseReply, KillReport, to_json

    target = cli_target(ns)
    label = ns.target or f"pid {ns.pid}"

    save_wait = max(0.0, ns.save_wait)

    async def kill(host: Host, t: Target) -> KillReport:
        run_dir = control.run_dir_of(t)
        return await control.kill_run(
            host,
            run_dir,
            ns.grace,
            on_progress=_print_progress,
            save_wait_s=save_wait,
            stop_wait_s=ns.stop_wait,
        )

    async def saves_done(targets: list[Target]) -> SaveWait | None:
        def call(t: Target) -> Callable[[], Awaitable[SaveWaitReport]]:
            return lambda: control.on_host(
                t,
                lambda h: control.wait_for_save(
                    h, control.run_dir_of(t), save_wait, _print_progress
                ),
            )

        return await control.saves_done([call(t) for t in targets])

    async def go() -> KillReport:
        if not needs_choice(target, ns.pid):
            return await on_every_node(target, "kill", kill, KillReport, first=saves_done)

        async def choose(host: Host) -> ChooseReply:
            return await control.choose(host, control.run_dir_of(target), ns.pid)

        chosen = await control.on_host(target, choose)
        if chosen.choice is Choice.SEVERAL:
            raise control.several_error(chosen, label)
        say_chosen(chosen.note)
        if chosen.choice is Choice.PROCESS:
            row = chosen.chosen_row()
            return await control.on_host(
                target,
                lambda h: control.kill_run(
                    h,
                    None,
                    ns.grace,
                    on_progress=_print_progress,
                    process=row,
                    save_wait_s=save_wait,
                    stop_wait_s=ns.stop_wait,
                    attach_first=ns.attach_first,
                ),
            )
        return await on_every_node(
            pinned_to(target, chosen.chosen_run_dir()), "kill", kill, KillReport, first=saves_done
        )

    try:
        result = asyncio.run(go())
    except KeyboardInterrupt:  # the agent runs in its own session: it is not interrupted
        say(
            "eagle3-tui kill: interrupted here; the host goes on with the kill (it never "
            "stops half-way): `eagle3-tui summary` shows where it stands",
            err=True,
        )
        raise
    if ns.json:
        say_json(to_json(result))
    else:
        say(control.format_kill(result))
    return control.kill_exit_status(result)


async def on_every_node(
    target: Target,
    op: str,
    call: Callable[[Host, Target], Awaitable[Report]],
    kind: type[Report],
    first: Callable[[list[Target]], Awaitable[SaveWait | None]] | None = None,
) -> Report:
    """``call(host, target)`` on the target's host, or, for a multi-node run whose manifest
    names its nodes, on every node at once; one (merged) report. ``first``: a step on
    every node before the calls on any (a kill's wait for a checkpoint save), what it
    waited for kept in the report."""
    from eagle3_tui.transport import control
    from eagle3_tui.transport.replies import KillReport

    others: list[Target] = list(await control.node_targets(target))
    if not others:
        return await control.on_host(target, lambda h: call(h, target))
    waited = await first([target, *others]) if first is not None else None
    report = control.merge_results(op, await control.on_nodes([target, *others], call, kind))
    if isinstance(report, KillReport):
        report = control.with_save_wait(report, waited)
    return report


def cmd_resume(ns: argparse.Namespace) -> int:
    import asyncio

    from eagle3_tui.transport import control
    from eagle3_tui.transport.replies import Choice, ResumeReport, to_json

    target = cli_target(ns)

    async def resume(host: Host, t: Target) -> ResumeReport:
        return await control.resume_run(host, control.run_dir_of(t), ns.wait)

    async def go() -> ResumeReport:
        if ns.pid is not None:  # a training without telemetry: the restart its kill recorded
            return await control.on_host(
                target, lambda h: control.resume_run(h, None, ns.wait, pid=ns.pid)
            )
        if not needs_choice(target, None):
            return await on_every_node(target, "resume", resume, ResumeReport)
        # a work directory or a host alone: the run it means (a live one is refused
        # by the agent, as for a run directory: kill it first)
        chosen = await control.on_host(
            target,
            lambda h: control.choose(h, control.run_dir_of(target), purpose=PURPOSE_RESUME),
        )
        if chosen.choice is Choice.SEVERAL:
            raise control.several_error(chosen, ns.target or "this machine")
        say_chosen(chosen.note)
        if chosen.choice is Choice.PROCESS:
            raise TargetError(
                f"{chosen.short} is running without telemetry: nothing to resume (kill it "
                "first: the kill records what resume reruns; or attach: eagle3-tui attach)"
            )
        return await on_every_node(
            pinned_to(target, chosen.chosen_run_dir()), "resume", resume, ResumeReport
        )

    result = asyncio.run(go())
    if ns.json:
        say_json(to_json(result))
    else:
        say(control.format_resume(result))
    return control.resume_exit_status(result)


def cmd_runs(ns: argparse.Namespace) -> int:
    import asyncio

    from eagle3_tui.transport import control
    from eagle3_tui.transport.replies import to_json
    from eagle3_tui.transport.target import LocalTarget, parse_host, parse_target

    opts = ssh_options(ns)
    target: Target = LocalTarget(Path("."))
    if ns.target is not None:  # always a host here, even where a local path has its name
        target = parse_target(ns.target, opts)
        if isinstance(target, LocalTarget):
            target = parse_host(ns.target, opts)

    result = asyncio.run(control.on_host(target, lambda h: control.discover(h, ns.all, ns.prune)))
    if not result.runs and not result.live and not result.ended and not result.pruned:
        raise control.no_runs_error(result, ns.target or "this machine")
    if ns.json:
        say_json(to_json(result))
    else:
        say(control.format_discovered(result))
    return exits.OK


# ---- attach -------------------------------------------------------------------


def build_attach_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "attach",
        (
            "Add eagle3-tui telemetry to a speculators training that runs without it, "
            "without restarting it: shows what will be done, asks, then has the trainer's "
            "own interpreter attach it at a safe point of its main thread (CPython 3.8-3.13: "
            "eagle3-tui's own injector on x86-64 Linux with glibc, else gdb; 3.14+: "
            "sys.remote_exec). Exit status: 0 attached, 2 error, 21 no permission (or "
            "another tracer holds it), 22 no such process, 30 not confirmed, 31 attached "
            "already, 32 queued (the main thread is in C code), 33 not a CPython speculators "
            "training, 34 no way in (the injector cannot go there and no usable gdb; remote "
            "debugging disabled on 3.14+), 35 failed, 36 which process (give --pid)."
        ),
    )
    p.add_argument(
        "target",
        metavar="TARGET",
        nargs="?",
        help="[USER@]HOST[:RUN_DIR], or a local RUN_DIR: where the attached run's metrics "
        "and manifest go (default: the trainer's working directory/eagle3-runs/attached-PID; "
        "no TARGET: this machine)",
    )
    p.add_argument(
        "--pid", type=process_id, help="the trainer's PID (default: the host's only training)"
    )
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    add_seconds_option(
        p,
        "--wait",
        10.0,
        "how long to wait for the attach to run in the trainer before reporting it "
        "queued (default 10)",
    )
    return add_json_and_ssh_options(p, "the result as one JSON object")


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        raise TargetError(f"{question.rstrip('? ')}: not confirmed (no terminal): add --yes")
    try:
        answer = input(question)
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def cmd_attach(ns: argparse.Namespace) -> int:
    import asyncio

    from eagle3_tui.transport import control
    from eagle3_tui.transport.replies import AttachPlan, AttachResult, to_json
    from eagle3_tui.transport.target import LocalTarget

    target: Target = cli_target(ns) if ns.target is not None else LocalTarget(Path("."))
    run_dir = control.run_dir_of(target) if ns.target is not None else None

    async def attach(host: Host) -> AttachResult | None:
        plan = await control.attach_plan(host, run_dir, ns.pid)
        if not isinstance(plan, AttachPlan):
            return plan  # refused: which check, and why
        say(control.format_attach_plan(plan), err=True)
        if not ns.yes:
            ok = await asyncio.to_thread(_confirm, "attach? [y/N] ")
            if not ok:
                return None
        return await control.attach_run(host, plan, wait_s=ns.wait)

    result = asyncio.run(control.on_host(target, attach))
    if result is None:
        say("eagle3-tui: not confirmed: nothing done", err=True)
        return exits.DECLINED
    if ns.json:
        say_json(to_json(result))
    else:
        say(control.format_attach(result))
    return control.attach_exit_status(result)


# ---- demo ---------------------------------------------------------------------


def _check_training_installed() -> None:
    import importlib.util

    missing = [m for m in ("torch", "speculators") if importlib.util.find_spec(m) is None]
    if missing:
        raise TargetError(
            f"the demo trains for real and needs {' and '.join(missing)} "
            "(on a CPU machine: ./scripts/install.sh)"
        )


def demo_training_command(
    run_dir: Path, *, epochs: int, step_delay: float, workers: int
) -> list[str]:
    """The demo's trainer: the tiny launcher writing into ``run_dir``, isolated from the
    directory the demo was started in (``python -I``: see telemetry/isolation.py)."""
    from eagle3_tui.telemetry.isolation import module_argv

    return module_argv(
        "eagle3_tui.train.tiny",
        *("--run-dir", str(run_dir.resolve()), "--epochs", str(epochs)),
        *("--step-delay", str(step_delay), "--workers", str(workers)),
    )


def cmd_demo(ns: argparse.Namespace) -> int:
    import subprocess
    import tempfile

    if ns.out is not None and ns.out.exists() and any(ns.out.iterdir()):
        raise TargetError(
            f"{ns.out}: exists and is not empty; the demo needs a fresh run directory"
        )
    _check_training_installed()  # after the arguments: a bad --out is said on any machine
    if ns.out is not None:
        run_dir = ns.out
        run_dir.mkdir(parents=True, exist_ok=True)
    else:
        run_dir = Path(tempfile.mkdtemp(prefix="eagle3-tui-demo-"))
    epochs = ns.epochs if ns.epochs is not None else (3 if ns.headless else 6)
    delay = ns.step_delay if ns.step_delay is not None else (0.0 if ns.headless else 0.15)
    cmd = demo_training_command(run_dir, epochs=epochs, step_delay=delay, workers=ns.workers)
    log_path = run_dir / "train.log"
    from eagle3_tui.telemetry.manifest import launch_env

    # The run marker is in the trainer's own /proc/PID/environ, not only its children's.
    env = dict(os.environ, **launch_env(run_dir))
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=run_dir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    if ns.headless:
        return demo_headless(run_dir, proc, log_path)
    from eagle3_tui.app.app import make_app
    from eagle3_tui.app.control import RunControl
    from eagle3_tui.transport.local import LocalTransport
    from eagle3_tui.transport.target import LocalTarget

    demo_target = LocalTarget(run_dir)
    app = make_app(
        LocalTransport(run_dir),
        control=RunControl.for_target(demo_target),
        open_run=open_run_for(demo_target),
        export_dir=local_export_dir(run_dir),
        quit_stops_run=True,
    )
    try:
        app.run()
    finally:
        stop_demo_run(demo_target, proc)
    say(f"eagle3-tui demo: the run is in {run_dir}", err=True)
    return app_exit_status(app)


def demo_headless(run_dir: Path, proc: subprocess.Popen[bytes], log_path: Path) -> int:
    """Train to completion, then print the run's summary (as ``summary`` does; its exit
    status too) and, on stderr, where the run is. Ctrl-C, a closed terminal (SIGHUP) or
    SIGTERM stop the training as well (it runs in a session of its own, which they do
    not reach): exit status 130."""
    from eagle3_tui.model.summary import format_text, summarize
    from eagle3_tui.transport.target import LocalTarget

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    target = LocalTarget(run_dir)
    say(f"eagle3-tui demo: training in {run_dir} (pid {proc.pid}, log {log_path})", err=True)
    for hang_up in (signal.SIGHUP, signal.SIGTERM):
        signal.signal(hang_up, interrupted)
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        stop_demo_run(target, proc)
        say(f"eagle3-tui demo: the run is in {run_dir}", err=True)
        return exits.INTERRUPTED
    if rc != 0:
        say(f"eagle3-tui demo: training exited with status {rc}; see {log_path}", err=True)
        return rc
    run, now = load_any(target, str(run_dir))
    summary = summarize(run.state, now)
    say(format_text(summary))
    say(f"eagle3-tui demo: the run is in {run_dir}", err=True)
    return exits.BY_HEALTH.get(summary["health"], exits.OK)


def stop_demo_run(target: LocalTarget, proc: subprocess.Popen[bytes]) -> None:
    """The demo owns its run: on quit, stop it as `k` would (whole tree, verified) —
    also when `r` relaunched it as another process. Says what it does meanwhile: the
    trainer's graceful save and exit take seconds. A run that ended (finished, or
    stopped by `k`) with nothing of it left: nothing to stop, nothing said."""
    import asyncio
    import subprocess

    from eagle3_tui.transport.control import kill_run, on_host, run_status, status_line

    if proc.poll() is not None:
        try:
            status = asyncio.run(on_host(target, lambda h: run_status(h, str(target.run_dir))))
        except (TargetError, OSError):
            status = None  # unknown: stopped as if it ran
        if status is not None and not status.alive and not status.leftovers:
            return
    say("eagle3-tui demo: stopping the run (at a step boundary, saved, then verified)…", err=True)
    try:
        result = asyncio.run(
            on_host(
                target,
                lambda h: kill_run(
                    h, str(target.run_dir), grace_s=60.0, on_progress=_demo_progress
                ),
            )
        )
        say(f"eagle3-tui demo: {status_line(result.status, result.message)}", err=True)
    except (TargetError, OSError) as e:
        say(f"eagle3-tui demo: could not stop the run cleanly: {e}", err=True)
    if proc.poll() is None:  # the launcher itself, if the agent could not reach it
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _demo_progress(event: Any) -> None:
    _print_progress(event, "eagle3-tui demo: ")
