"""``eagle3-tui watch TARGET… [--notify SPEC]…``: follow runs headless and send an alert
on each change of verdict that needs a human, and on the good news (``watch.py``)."""

from __future__ import annotations

import argparse
import math
import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from eagle3_tui import exits
from eagle3_tui.cli.common import add_ssh_options, command_parser, say, seconds, ssh_options
from eagle3_tui.transport.base import TargetError

if TYPE_CHECKING:
    from eagle3_tui.following import WatchTarget


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "watch",
        "Follow runs without a screen and send an alert when one needs a human (silent, "
        "stalled, dead, diverged, disk full, its link down) and when it finishes, stops or "
        "recovers: once per change, after the verdict held (--hold), with the run, host, "
        "PID, the diagnosis, its step and the command that acts on it. What was sent is "
        "kept (--state): a restarted watcher neither repeats nor loses an alert. Exit "
        "status: 0 stopped by SIGTERM (systemctl stop, kill: a service's normal stop), 130 "
        "interrupted (Ctrl-C); with --once the worst health found (as summary: 3 silent, "
        "4 stalled, 5 dead, 6 diverged, 7 stopped, 10 unreadable, 11 disk full, 12 copy), "
        "2 error.",
    )
    p.add_argument(
        "target",
        metavar="TARGET",
        nargs="+",
        help="a run or work directory, [USER@]HOST:DIR, or a host alone ([USER@]HOST, or "
        "localhost for this machine without SSH): every live training of yours there, "
        "those that start later too, with or without telemetry",
    )
    p.add_argument(
        "--notify",
        metavar="SPEC",
        action="append",
        type=notify_spec,
        default=[],
        help="where alerts go, several allowed: exec:CMD (the alert as JSON on stdin and in "
        "EAGLE3_TUI_ALERT_* variables), an http(s):// webhook URL (Slack's and Discord's "
        "payloads chosen by their URL; slack:URL, discord:URL, json:URL to choose), or "
        "desktop (notify-send, else the bell); always printed on stdout",
    )
    p.add_argument(
        "--once",
        action="store_true",
        help="look once, alert on what changed since the last look (cron), exit with the "
        "worst health's status",
    )
    p.add_argument(
        "--interval",
        type=positive_seconds,
        default=10.0,
        metavar="SECONDS",
        help="between looks (10)",
    )
    p.add_argument(
        "--hold",
        type=seconds,
        default=15.0,
        metavar="SECONDS",
        help="how long a new verdict must hold before it is sent (15; two looks at least)",
    )
    p.add_argument(
        "--gap",
        type=seconds,
        default=30.0,
        metavar="SECONDS",
        help="at most one alert per run in this long (30); a change meanwhile waits for it",
    )
    p.add_argument(
        "--link-down",
        type=seconds,
        default=60.0,
        metavar="SECONDS",
        help="a host unreachable this long is an alert, and its return another (60)",
    )
    p.add_argument(
        "--state",
        metavar="FILE",
        type=state_file,
        help="where what was sent is kept: a file, read and written, in a directory that "
        "exists (default: one file per set of targets under ~/.local/state/eagle3-tui/"
        "watch/, made if need be)",
    )
    add_ssh_options(p)
    return p


def positive_seconds(text: str) -> float:
    """``--interval``'s value: a finite number of seconds above 0 (0 would look without
    pause)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: a number of seconds above 0")
    return value


def notify_spec(text: str) -> str:
    """A ``--notify`` spec that names a destination (a URL with a host and a port in
    range): one that can never be delivered to is a usage error, not 8 tries."""
    from eagle3_tui.notify import parse_notify

    try:
        parse_notify(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def state_file(text: str) -> str:
    """``--state``: a file this user may read and replace, in a directory that exists
    (none is made: a typo would be a tree of directories; the default's, under the
    user's state directory, is). What is there and is no file, or cannot be read, is a
    usage error: the watcher would start afresh and save nothing, repeating alerts."""
    path = Path(text)
    said = repr(text)
    if not text:
        raise argparse.ArgumentTypeError("a file's path, not empty")
    if path.exists() and not path.is_file():
        what = "a directory" if path.is_dir() else "not a regular file"
        raise argparse.ArgumentTypeError(f"{said}: {what}; --state names a file")
    if path.is_file():
        try:
            with open(path, "rb"):
                pass
        except OSError as e:
            raise argparse.ArgumentTypeError(f"{said}: not readable ({e.strerror})") from None
    parent = path.parent
    if not parent.is_dir():
        why = "is not a directory" if parent.exists() else "does not exist, and is not made"
        raise argparse.ArgumentTypeError(
            f"{said}: {str(parent)!r} {why}; name a file in a directory that exists"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{said}: {str(parent)!r} is not writable")
    return text


def watch_targets(ns: argparse.Namespace) -> list[WatchTarget]:
    """The targets, a local directory as its resolved path: its key in the state file,
    and the run its alerts (and their commands) name, whatever the spelling (``r2``,
    ``./r2/``, ``/tmp/x/r2`` would each send its alerts again). A remote path stays as
    typed: it cannot be resolved here."""
    from eagle3_tui.following import WatchTarget
    from eagle3_tui.transport.target import LocalTarget, SshTarget, parse_target

    opts = ssh_options(ns)
    out = []
    for text in ns.target:
        if text == "localhost" and not (ns.port or ns.login or ns.jump):
            out.append(WatchTarget(text, LocalTarget(Path(".")), discover=True))
            continue
        target = parse_target(text, opts)
        discover = isinstance(target, SshTarget) and target.run_dir is None and not target.job
        if isinstance(target, LocalTarget) and not target.job and not target.run_dir.exists():
            raise TargetError(f"{text}: no such directory (a run directory, HOST:DIR or HOST)")
        if isinstance(target, LocalTarget) and not target.job:
            target = LocalTarget(target.run_dir.resolve())
            text = str(target.run_dir)
        out.append(WatchTarget(text, target, discover))
    return out


def ssh_argv(ns: argparse.Namespace) -> list[str]:
    """The ssh options given, as a command line repeats them (in an alert's command)."""
    out: list[str] = []
    for flag, value in (("-p", ns.port), ("-J", ns.jump), ("-F", ns.ssh_config), ("-l", ns.login)):
        if value is not None:
            out += [flag, str(value)]
    for key in ns.identity:
        out += ["-i", key]
    for option in ns.ssh_option:
        out += ["-o", option]
    return out


def run(ns: argparse.Namespace) -> int:
    import asyncio
    import signal

    from eagle3_tui.notify import parse_notify, shown
    from eagle3_tui.watch import Rules, Watcher, WatchState, state_path

    notifiers = [parse_notify(spec) for spec in dict.fromkeys(ns.notify)]  # checked: once each
    targets = watch_targets(ns)
    path = state_path([t.text for t in targets], ns.state)
    older = state_path(ns.target)  # the default file of targets as typed, before
    if not ns.state and not path.exists() and older.exists():
        state = WatchState.load(older)
        state.path = path
    else:
        state = WatchState.load(path)
    state.make_dirs = not ns.state  # the default's directories only: --state's exists
    if state.problem:
        say(f"eagle3-tui watch: {state.problem}", err=True)
    rules = Rules(hold_s=ns.hold, gap_s=ns.gap, link_down_s=ns.link_down)

    def report(line: str) -> None:
        say(f"eagle3-tui watch: {line}", err=True)

    watcher = Watcher(
        targets,
        notifiers,
        state,
        rules=rules,
        interval_s=ns.interval,
        ssh_args=ssh_argv(ns),
        say=say,
        report=report,
    )
    if ns.once:
        from eagle3_tui.watch import once

        return once(watcher)
    destinations = ", ".join(shown(n.spec) for n in notifiers) or "stdout only"
    report(
        f"following {' '.join(shlex.quote(t.text) for t in targets)}; alerts to "
        f"{destinations}; state in {path}"
    )

    stopped_by: list[int] = []

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def stopping(sig: int) -> None:
            stopped_by.append(sig)
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping, sig)
        await watcher.run(stop)

    asyncio.run(main())
    report(f"stopped; {watcher.outbox.pending()} deliveries kept for the next start")
    if stopped_by and stopped_by[0] == signal.SIGINT:
        return exits.INTERRUPTED  # Ctrl-C: as every command (a script sees it was)
    return exits.OK  # SIGTERM: a service manager's (systemctl stop) or kill's normal stop
