"""``eagle3-tui runs [HOST]``: the live trainings on a host, with or without telemetry,
then the registered runs."""

from __future__ import annotations

import argparse

from eagle3_tui import exits
from eagle3_tui.cli.common import (
    add_json_and_ssh_options,
    command_parser,
    say,
    say_json,
    ssh_options,
)


def build_parser() -> argparse.ArgumentParser:
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


def run(ns: argparse.Namespace) -> int:
    from eagle3_tui import api, reports
    from eagle3_tui.transport.replies import to_json

    result = api.runs(ns.target, all_users=ns.all, prune=ns.prune, ssh=ssh_options(ns))
    if ns.json:
        say_json(to_json(result))
    else:
        say(reports.format_discovered(result))
    return exits.OK
