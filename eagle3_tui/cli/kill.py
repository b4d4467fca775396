"""``eagle3-tui kill TARGET``: stop a run at a step boundary, its checkpoint saved, and
verify that nothing of it is left."""

from __future__ import annotations

import argparse

from eagle3_tui.agent.names import KILL_GRACE_S, SAVE_WAIT_S
from eagle3_tui.cli.common import (
    INPUT_EXITS,
    add_json_and_ssh_options,
    add_pid_option,
    add_seconds_option,
    command_parser,
    print_progress,
    say,
    say_chosen,
    say_json,
    ssh_options,
)


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "kill",
        (
            "Stop a run so that it saves its checkpoint: after checking its PID is still "
            "the run's, a run with telemetry is asked to stop at its next step boundary "
            "(its save becomes the numbered checkpoint a resume continues from, nothing "
            "redone); without one in time, or without telemetry, SIGTERM to the trainer "
            "(or torchrun's ranks); a trainer held stopped is continued first. Then every "
            "process of the run is made sure gone (SIGKILL after the grace period). Exit "
            "status: 0 nothing of the run remains, 8 processes remain, "
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


def run(ns: argparse.Namespace) -> int:
    from eagle3_tui import api, reports
    from eagle3_tui.transport.replies import to_json

    try:
        result = api.kill(
            ns.target,
            pid=ns.pid,
            grace=ns.grace,
            save_wait=ns.save_wait,
            stop_wait=ns.stop_wait,
            attach_first=ns.attach_first,
            ssh=ssh_options(ns),
            on_progress=print_progress,
            on_note=say_chosen,
        )
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
        say(reports.format_kill(result))
    return reports.kill_exit_status(result)
