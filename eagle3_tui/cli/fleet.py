"""``eagle3-tui fleet [TARGET…]``: every live and recent run on several hosts, one row
each, live (``fleet.py``; the screen: ``app/fleet.py``), or printed once (``--once``)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from eagle3_tui import exits
from eagle3_tui.cli.common import add_ssh_options, command_parser, say, say_json, seconds
from eagle3_tui.transport.base import TargetError

if TYPE_CHECKING:
    from eagle3_tui.fleet import Fleet

ONCE_WAIT_S = 60.0
opening = False
back_to: list[str] | None = None
"""The arguments of the monitor whose ``F`` opens this fleet (``then_fleet``): Esc or
``F`` in the fleet goes back to it."""
"""A run opened from the fleet is being monitored (its ``F`` then only comes back)."""


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "fleet",
        "Every live and recent run on several hosts, one row each: health with its cause, "
        "step/total, loss, τ and its trend, pace, ETA, GPUs busy, last checkpoint; live, "
        "sortable (s, S), filterable (/); Enter opens a run in the monitor, c compares the "
        "marked run (space) with the selected one, k stops the selected run. One SSH "
        "connection per host. Hosts without TARGET: 'hosts' in ~/.config/eagle3-tui/"
        "config.toml, else this machine. Exit status: 0 after q (--once: listed), 2 none "
        "found or an error.",
    )
    p.add_argument(
        "target",
        metavar="TARGET",
        nargs="*",
        help="[USER@]HOST (every live training of yours there and your runs started in the "
        "last --recent hours), localhost for this machine without SSH, or one run "
        "(a directory, HOST:DIR)",
    )
    p.add_argument(
        "--recent",
        type=seconds,
        default=None,
        metavar="HOURS",
        help="registered runs started this recently are rows too (24)",
    )
    p.add_argument(
        "--interval",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="between looks once every run was read (10)",
    )
    p.add_argument(
        "--once",
        action="store_true",
        help="print the table once every run was read (at most a minute), then exit",
    )
    p.add_argument("--json", action="store_true", help="with --once: one JSON object")
    add_ssh_options(p)
    return p


def run(ns: argparse.Namespace) -> int:
    import asyncio

    from eagle3_tui.cli.watch import watch_targets
    from eagle3_tui.config import load_config
    from eagle3_tui.fleet import LOOK_S, RECENT_S, Fleet

    config = load_config()
    if not ns.target:
        ns.target = list(config.hosts) or ["localhost"]
    for name, value in (("--recent", ns.recent), ("--interval", ns.interval)):
        if value is not None and not value > 0:
            raise TargetError(f"{name} {value}: must be a positive number")
    recent_h = ns.recent or config.recent_hours
    fleet = Fleet(
        watch_targets(ns),
        recent_s=recent_h * 3600 if recent_h else RECENT_S,
        interval_s=ns.interval or config.interval or LOOK_S,
    )
    if ns.once or ns.json:
        return asyncio.run(once(fleet, ns.json))
    return interactive(fleet, ns)


async def once(fleet: Fleet, as_json: bool) -> int:
    """Follow until every run was read (or a minute passed), then print the rows."""
    import asyncio
    import json
    import time

    from eagle3_tui.fleet import format_fleet

    start = time.monotonic()
    try:
        while True:
            await fleet.turn()
            if fleet.all_read() or time.monotonic() - start > ONCE_WAIT_S:
                break
            await asyncio.sleep(0.5)
        rows = fleet.sorted_rows()
        problems = [hs.said() for hs in fleet.hosts_state.values() if hs.problem]
        if as_json:
            doc = {
                "runs": [r.to_json() for r in rows],
                "unreached": {
                    hs.text: hs.problem for hs in fleet.hosts_state.values() if hs.problem
                },
            }
            say_json(json.dumps(doc, indent=2))
        else:
            say(format_fleet(rows, problems, time.time()))
        return exits.OK if rows else exits.ERROR
    finally:
        await fleet.close()


def interactive(fleet: Fleet, ns: argparse.Namespace) -> int:
    """The live table; a run opened from it (Enter, c) is monitored in this terminal,
    then the table comes back (following again from the hosts)."""
    from eagle3_tui.app.fleet import FleetApp
    from eagle3_tui.cli import main
    from eagle3_tui.cli.watch import ssh_argv

    ssh_args = ssh_argv(ns)
    while True:
        app = FleetApp(fleet, back_to)
        app.run()
        action = app.chosen
        if action is None:
            return exits.OK
        global opening
        opening = True
        try:
            main([*action, *ssh_args])
        finally:
            opening = False
        fleet = fleet.fresh()
