"""``eagle3-tui summary TARGET``: a run's state and verdict, as text or JSON; its exit
status is the run's health."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eagle3_tui.cli.common import (
    INPUT_EXITS,
    add_json_and_ssh_options,
    add_pid_option,
    command_parser,
    say,
    say_chosen,
    say_json,
    ssh_options,
)
from eagle3_tui.telemetry.schema import METRICS_FILE


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "summary",
        "Print the state of a run, or of a training without telemetry (watched "
        "from outside for a few seconds). Exit status: 0 running/finished/waiting, "
        "3 silent, 4 stalled, 5 dead, 6 diverged (also after the end), 7 stopped "
        "(interrupted), 10 unreadable (no valid record, only malformed lines), 11 disk "
        "full (no record for a while, no room on its filesystem), 12 a copy of another "
        "run's directory (nothing writes it), 2 error; 20 the PID is "
        "not a training, 22 it exited, 23 several live trainings (choose with --pid); "
        f"{INPUT_EXITS}.",
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


def run(ns: argparse.Namespace) -> int:
    _start_reading(ns)
    from eagle3_tui import api
    from eagle3_tui.model.summary import format_text

    opened = api.open_run(
        ns.target, pid=ns.pid, ssh=ssh_options(ns), on_note=say_chosen, whole_history=False
    )
    summary = opened.summary()
    if ns.json:
        say_json(json.dumps(summary, indent=None, sort_keys=False))
    else:
        say(format_text(summary))
    return opened.exit_status


def _start_reading(ns: argparse.Namespace) -> None:
    """A local run's long read starts now, beside the imports the summary needs
    (transport/forked.py's ``start_early``); anything else is the API's to decide."""
    if ns.pid is not None or not ns.target:
        return
    path = Path(ns.target) / METRICS_FILE
    try:
        if not path.is_file():
            return
    except OSError:  # (no permission: the read says so, in its words)
        return
    from eagle3_tui.agent.names import SUMMARY_HISTORY
    from eagle3_tui.transport.forked import start_early

    start_early(path, SUMMARY_HISTORY)
