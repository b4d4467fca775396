"""``eagle3-tui compare A B``: this run against a previous one at the furthest point
both reached."""

from __future__ import annotations

import argparse
import json

from eagle3_tui import exits
from eagle3_tui.cli.common import (
    INPUT_EXITS,
    add_json_and_ssh_options,
    command_parser,
    say,
    say_chosen,
    say_json,
    ssh_options,
)


def build_parser() -> argparse.ArgumentParser:
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


def run(ns: argparse.Namespace) -> int:
    from eagle3_tui import api
    from eagle3_tui.model.compare import comparison_json, format_comparison

    result = api.compare(ns.a, ns.b, axis=ns.axis, ssh=ssh_options(ns), on_note=say_chosen)
    if ns.json:
        say_json(json.dumps(comparison_json(result)))
    else:
        say(format_comparison(result))
    return exits.OK
