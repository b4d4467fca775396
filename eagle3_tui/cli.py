"""Command line: ``eagle3-tui TARGET``, ``eagle3-tui demo``, ``eagle3-tui summary``.

Every failure a user can cause (a missing run, a bad flag) ends with one line on
stderr and a non-zero exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from eagle3_tui import __version__
from eagle3_tui.transport.base import TargetError

if TYPE_CHECKING:
    from eagle3_tui.model.run import Run

# Exit statuses (documented in the README).
EXIT_OK = 0
EXIT_ERROR = 2  # usage, missing run, unreachable target

SUBCOMMANDS = ("demo", "summary")


def _version() -> str:
    return f"eagle3-tui {__version__}"


def build_monitor_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eagle3-tui",
        description="Live terminal monitor for EAGLE-3 draft-model training with speculators.",
        epilog=(
            "commands:\n"
            "  eagle3-tui RUN_DIR                  monitor a run directory on this machine\n"
            "  eagle3-tui demo [--headless]        train a tiny model on the CPU and monitor it\n"
            "  eagle3-tui summary RUN_DIR [--json] print the run's state (exit status = health)\n"
            "\nRun 'eagle3-tui COMMAND --help' for a command's options."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=_version())
    p.add_argument("target", metavar="TARGET", help="a run directory (a local path)")
    return p


def build_demo_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eagle3-tui demo",
        description=(
            "Train a tiny EAGLE-3 draft with the real speculators Trainer on the CPU, "
            "in the background, and monitor it."
        ),
    )
    p.add_argument(
        "--headless", action="store_true", help="no UI: train to completion and print a summary"
    )
    p.add_argument(
        "--out", type=Path, help="the run directory to create (default: a new temporary one)"
    )
    p.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="epochs to train (default: 3 headless, 6 with the UI)",
    )
    p.add_argument(
        "--step-delay",
        type=float,
        default=None,
        help="seconds added to each step so the curves can be watched (default: 0 headless, 0.15)",
    )
    p.add_argument("--workers", type=int, default=0, help="dataloader worker processes")
    return p


def build_summary_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eagle3-tui summary",
        description="Print the state of a run. Exit status: 0 running/finished/waiting, "
        "3 silent, 4 stalled, 5 dead, 6 diverged, 7 stopped (interrupted), 2 error.",
    )
    p.add_argument("target", metavar="RUN_DIR")
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args and args[0] == "demo":
            return cmd_demo(build_demo_parser().parse_args(args[1:]))
        if args and args[0] == "summary":
            return cmd_summary(build_summary_parser().parse_args(args[1:]))
        return cmd_monitor(build_monitor_parser().parse_args(args))
    except TargetError as e:
        print(f"eagle3-tui: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


# ---- summary ------------------------------------------------------------------


def load_local(run_dir: Path) -> Run:
    from eagle3_tui.model.run import Run
    from eagle3_tui.transport.local import check_run_dir, read_from

    path = check_run_dir(run_dir)
    run = Run()
    for chunk in read_from(path):
        run.feed(chunk.offset, chunk.data)
    return run


def cmd_summary(ns: argparse.Namespace) -> int:
    from eagle3_tui.model.summary import EXIT_BY_HEALTH, format_text, summarize

    run = load_local(Path(ns.target))
    if run.state.records == 0 and run.state.malformed_count == 0:
        raise TargetError(f"{ns.target}: metrics.jsonl is empty (no record written yet)")
    summary = summarize(run.state, time.time())
    if ns.json:
        print(json.dumps(summary, indent=None, sort_keys=False))
    else:
        print(format_text(summary))
    return EXIT_BY_HEALTH.get(summary["health"], EXIT_OK)


# ---- monitor ------------------------------------------------------------------


def cmd_monitor(ns: argparse.Namespace) -> int:
    from eagle3_tui.transport.local import LocalTransport, check_run_dir

    run_dir = Path(ns.target)
    check_run_dir(run_dir)
    from eagle3_tui.app.app import MonitorApp

    MonitorApp(LocalTransport(run_dir)).run()
    return EXIT_OK


# ---- demo ---------------------------------------------------------------------


def _check_training_installed() -> None:
    import importlib.util

    missing = [m for m in ("torch", "speculators") if importlib.util.find_spec(m) is None]
    if missing:
        raise TargetError(
            f"the demo trains for real and needs {' and '.join(missing)} "
            "(on a CPU machine: ./scripts/install.sh)"
        )


def cmd_demo(ns: argparse.Namespace) -> int:
    import subprocess
    import tempfile

    _check_training_installed()
    if ns.out is not None:
        if ns.out.exists() and any(ns.out.iterdir()):
            raise TargetError(
                f"{ns.out}: exists and is not empty; the demo needs a fresh run directory"
            )
        run_dir = ns.out
        run_dir.mkdir(parents=True, exist_ok=True)
    else:
        run_dir = Path(tempfile.mkdtemp(prefix="eagle3-tui-demo-"))
    epochs = ns.epochs if ns.epochs is not None else (3 if ns.headless else 6)
    delay = ns.step_delay if ns.step_delay is not None else (0.0 if ns.headless else 0.15)
    cmd = [
        sys.executable,
        "-m",
        "eagle3_tui.train.tiny",
        "--run-dir",
        str(run_dir),
        "--epochs",
        str(epochs),
        "--step-delay",
        str(delay),
        "--workers",
        str(ns.workers),
    ]
    log_path = run_dir / "train.log"
    from eagle3_tui.telemetry.manifest import launch_env

    # The run marker is in the trainer's own /proc/PID/environ, not only its children's.
    env = dict(os.environ, **launch_env(run_dir))
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    if ns.headless:
        print(
            f"eagle3-tui demo: training in {run_dir} (pid {proc.pid}, log {log_path})",
            file=sys.stderr,
        )
        rc = proc.wait()
        if rc != 0:
            print(
                f"eagle3-tui demo: training exited with status {rc}; see {log_path}",
                file=sys.stderr,
            )
            return rc
        print(str(run_dir))
        return EXIT_OK
    from eagle3_tui.app.app import MonitorApp
    from eagle3_tui.transport.local import LocalTransport

    try:
        MonitorApp(LocalTransport(run_dir)).run()
    finally:
        if proc.poll() is None:
            proc.terminate()  # the trainer's graceful handler saves interrupted/
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
    print(f"eagle3-tui demo: the run is in {run_dir}", file=sys.stderr)
    return EXIT_OK
