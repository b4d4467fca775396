"""``eagle3-tui runs [HOST…]``: the live trainings on a host, with or without telemetry,
then the registered runs; several hosts one after the other (one that cannot be reached
is said, and the others listed). Their rows with figures, live: ``fleet``."""

from __future__ import annotations

import argparse
import os
import shlex

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
        "first; several hosts one after the other (the fleet's live rows with figures: "
        "eagle3-tui fleet HOST...). Exit status: 0 listed, 2 none found or error.",
    )
    p.add_argument(
        "target", metavar="HOST", nargs="*", help="[USER@]HOST ... (default: this machine)"
    )
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
    import json

    from eagle3_tui import api, runs_text
    from eagle3_tui.model.inert import printable
    from eagle3_tui.transport.base import TargetError
    from eagle3_tui.transport.replies import to_builtins, to_json

    for target in ns.target:  # a path given as a host: said, not "cannot resolve"
        path_like = "/" in target or target in (".", "..") or target.startswith("~")
        if path_like and ":" not in target and "@" not in target and os.path.isdir(target):
            raise TargetError(
                f"{target}: a directory here, and runs takes hosts ([USER@]HOST; none: this "
                f"machine's trainings). A run directory: eagle3-tui summary {shlex.quote(target)}"
            )
    if len(ns.target) <= 1:
        host = ns.target[0] if ns.target else None
        result = api.runs(host, all_users=ns.all, prune=ns.prune, ssh=ssh_options(ns))
        if ns.json:
            say_json(to_json(result))
        else:
            say(runs_text.format_discovered(result))
        return exits.OK
    blocks: list[str] = []
    by_host: dict[str, dict[str, object]] = {}
    listed = 0
    for host in ns.target:
        try:
            result = api.runs(host, all_users=ns.all, prune=ns.prune, ssh=ssh_options(ns))
        except TargetError as e:
            by_host[host] = {"error": str(e)}
            blocks.append(f"== {printable(host)} ==\n(not listed: {printable(str(e))})")
            continue
        by_host[host] = to_builtins(result)
        listed += 1
        blocks.append(f"== {printable(host)} ==\n{runs_text.format_discovered(result)}")
    if ns.json:
        say_json(json.dumps({"hosts": by_host}, indent=2))
    else:
        say("\n\n".join(blocks))
    return exits.OK if listed else exits.ERROR
