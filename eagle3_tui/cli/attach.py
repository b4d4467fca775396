"""``eagle3-tui attach [TARGET] --pid N``: add telemetry to a live training without
restarting it (shows the plan, asks, attaches)."""

from __future__ import annotations

import argparse
import sys

from eagle3_tui import exits
from eagle3_tui.cli.common import (
    add_json_and_ssh_options,
    add_seconds_option,
    command_parser,
    process_id,
    say,
    say_json,
    ssh_options,
)
from eagle3_tui.transport.base import TargetError


def build_parser() -> argparse.ArgumentParser:
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


def run(ns: argparse.Namespace) -> int:
    from eagle3_tui import api, reports
    from eagle3_tui.transport.replies import AttachPlan, to_json

    def confirm(plan: AttachPlan) -> bool:
        say(reports.format_attach_plan(plan), err=True)
        return bool(ns.yes) or _confirm("attach? [y/N] ")

    result = api.attach(ns.target, pid=ns.pid, confirm=confirm, wait=ns.wait, ssh=ssh_options(ns))
    if result is None:
        say("eagle3-tui: not confirmed: nothing done", err=True)
        return exits.DECLINED
    if ns.json:
        say_json(to_json(result))
    else:
        say(reports.format_attach(result))
    return reports.attach_exit_status(result)
