"""``eagle3-tui resume TARGET``: relaunch a stopped run from its last complete
checkpoint (a training without telemetry comes back with it)."""

from __future__ import annotations

import argparse

from eagle3_tui.cli.common import (
    INPUT_EXITS,
    add_json_and_ssh_options,
    add_seconds_option,
    command_parser,
    process_id,
    say,
    say_chosen,
    say_json,
    ssh_options,
)


def build_parser() -> argparse.ArgumentParser:
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


def run(ns: argparse.Namespace) -> int:
    from eagle3_tui import api, reports
    from eagle3_tui.transport.replies import to_json

    result = api.resume(
        ns.target, pid=ns.pid, wait=ns.wait, ssh=ssh_options(ns), on_note=say_chosen
    )
    if ns.json:
        say_json(to_json(result))
    else:
        say(reports.format_resume(result))
    return reports.resume_exit_status(result)
