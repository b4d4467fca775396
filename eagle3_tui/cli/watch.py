"""``eagle3-tui watch TARGET… [--notify SPEC]…``: follow runs headless and send an alert
on each change of verdict that needs a human, and on the good news (``watch.py``)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

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
        "status: 0 stopped (Ctrl-C, SIGTERM); with --once the worst health found (as "
        "summary: 3 silent, 4 stalled, 5 dead, 6 diverged, 7 stopped, 10 unreadable, 11 "
        "disk full), 2 error.",
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
        "--interval", type=seconds, default=10.0, metavar="SECONDS", help="between looks (10)"
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
        help="where what was sent is kept (default: one file per set of targets under "
        "~/.local/state/eagle3-tui/watch/)",
    )
    add_ssh_options(p)
    return p


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

    try:
        notifiers = [parse_notify(spec) for spec in ns.notify]
    except ValueError as e:
        raise TargetError(f"--notify {e}") from None
    for flag in ("interval", "hold", "gap", "link_down"):
        if getattr(ns, flag) < 0 or (flag == "interval" and ns.interval <= 0):
            raise TargetError(f"--{flag.replace('_', '-')}: a number of seconds above 0")
    targets = watch_targets(ns)
    path = state_path([t.text for t in targets], ns.state)
    older = state_path(ns.target)  # the default file of targets as typed, before
    if not ns.state and not path.exists() and older.exists():
        state = WatchState.load(older)
        state.path = path
    else:
        state = WatchState.load(path)
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

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await watcher.run(stop)

    asyncio.run(main())
    report(f"stopped; {watcher.outbox.pending()} deliveries kept for the next start")
    return 0
