"""``eagle3-tui demo``: train a tiny EAGLE-3 draft with the real speculators Trainer on
the CPU, in the background, and monitor it (or, ``--headless``, summarize it at the end)."""

from __future__ import annotations

import argparse
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_tui import exits
from eagle3_tui.cli.common import command_parser, print_progress, say, seconds
from eagle3_tui.transport.base import TargetError

if TYPE_CHECKING:
    import subprocess

    from eagle3_tui.transport.target import LocalTarget


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "demo",
        (
            "Train a tiny EAGLE-3 draft with the real speculators Trainer on the CPU, "
            "in the background, and monitor it."
        ),
    )
    p.add_argument(
        "--headless",
        action="store_true",
        help="no UI: train to completion, then print the run's summary (as the summary "
        "command does, its exit status too) and, on stderr, the run's directory; Ctrl-C "
        "or a closed terminal stops the training as well",
    )
    p.add_argument(
        "--out", type=Path, help="the run directory to create (default: a new temporary one)"
    )
    p.add_argument(
        "--epochs",
        type=_whole(1),
        default=None,
        help="epochs to train (default: 3 headless, 6 with the UI)",
    )
    p.add_argument(
        "--step-delay",
        type=seconds,
        default=None,
        help="seconds added to each step so the curves can be watched (default: 0 headless, 0.15)",
    )
    p.add_argument("--workers", type=_whole(0), default=0, help="dataloader worker processes")
    return p


def _whole(least: int) -> Callable[[str], int]:
    """An option's type: a whole number from ``least`` (else a usage error)."""

    def whole(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"{text!r}: a whole number from {least}")
        return value

    return whole


def _check_out(out: Path) -> None:
    """``--out`` names a fresh run directory: none yet, or an empty one (a file, or a
    directory that cannot be listed, is one line saying so)."""
    try:
        if not out.exists():
            return
        if not out.is_dir():
            raise TargetError(f"--out {out}: not a directory; the demo needs a fresh run directory")
        if any(out.iterdir()):
            raise TargetError(
                f"{out}: exists and is not empty; the demo needs a fresh run directory"
            )
    except OSError as e:
        raise TargetError(f"--out {out}: {e.strerror}") from None


def run(ns: argparse.Namespace) -> int:
    import subprocess
    import tempfile

    if ns.out is not None:
        _check_out(ns.out)
    _check_training_installed()  # after the arguments: a bad --out is said on any machine
    if ns.out is not None:
        run_dir = ns.out
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TargetError(f"--out {run_dir}: cannot create it ({e.strerror})") from None
    else:
        run_dir = Path(tempfile.mkdtemp(prefix="eagle3-tui-demo-"))
    epochs = ns.epochs if ns.epochs is not None else (3 if ns.headless else 6)
    delay = ns.step_delay if ns.step_delay is not None else (0.0 if ns.headless else 0.15)
    cmd = demo_training_command(run_dir, epochs=epochs, step_delay=delay, workers=ns.workers)
    log_path = run_dir / "train.log"
    from eagle3_tui.telemetry.manifest import launch_env

    # The run marker is in the trainer's own /proc/PID/environ, not only its children's.
    env = dict(os.environ, **launch_env(run_dir))
    # A closed terminal, a kill or Ctrl-C from the training's start until the app takes
    # them (its mount) stops the training as well: it runs in a session of its own,
    # which they do not reach. One that comes while it starts is held until it has.
    stops = _HeldStops()
    try:
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                cmd,
                cwd=run_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )
    except BaseException:
        stops.restore()
        raise
    if ns.headless:
        return demo_headless(run_dir, proc, log_path, stops)
    from eagle3_tui.transport.target import LocalTarget

    demo_target = LocalTarget(run_dir)
    hung_up = _StopOnHangUp(demo_target, proc, run_dir)
    try:
        # imported with the stops held: one raised inside an import leaves its package
        # half made (asyncio's, then the stop's own import of it, failed so)
        _import_the_stop()
        from eagle3_tui.app.app import make_app
        from eagle3_tui.app.run_control import RunControl
        from eagle3_tui.cli.monitor import app_exit_status, local_export_dir, open_run_for
        from eagle3_tui.transport.local import LocalTransport

        app = make_app(
            LocalTransport(run_dir),
            control=RunControl.for_target(demo_target),
            open_run=open_run_for(demo_target),
            export_dir=local_export_dir(run_dir),
            quit_stops_run=True,
            on_hang_up=hung_up.start,
        )
        stops.arm(hung_up.start)
        app.run()
    except KeyboardInterrupt:
        _hold_hang_ups()  # the stop is not cut short
        if not hung_up.wait():
            stop_demo_run(demo_target, proc)
            say(f"eagle3-tui demo: the run is in {run_dir}", err=True)
        return exits.INTERRUPTED
    except BaseException:
        _hold_hang_ups()
        if not hung_up.wait():
            stop_demo_run(demo_target, proc)
        raise
    _hold_hang_ups()
    if hung_up.wait():
        return exits.INTERRUPTED
    stop_demo_run(demo_target, proc)
    say(f"eagle3-tui demo: the run is in {run_dir}", err=True)
    return app_exit_status(app)


EXIT_GRACE_S = 10.0
"""After a hang-up's stop, how long the demo's own exit may take before it is cut."""


class _StopOnHangUp:
    """A closed terminal or a kill (SIGHUP, SIGTERM) while the app runs: the run is
    stopped at once, from a thread of its own, while the app quits. The app's exit on a
    terminal that is gone can hang (measured: ~1 in 30 after a KeyboardInterrupt
    raised mid-task, asyncio's shutdown waits on a task forever; Textual's input thread
    reads the hung-up terminal's end of file forever unless the app's exit stops it),
    and the training must not wait on it: ``EXIT_GRACE_S`` after the stop the process
    leaves, whether or not its main thread got there (exit status 130)."""

    def __init__(self, target: LocalTarget, proc: subprocess.Popen[bytes], run_dir: Path):
        import threading

        self.target, self.proc, self.run_dir = target, proc, run_dir
        self.thread: threading.Thread | None = None
        self.stopped = threading.Event()

    def start(self) -> None:
        """Called on the main thread (a signal's handler): the stop's thread, once."""
        import threading

        if self.thread is None:
            self.thread = threading.Thread(target=self._stop, name="demo-stop", daemon=True)
            self.thread.start()

    def wait(self) -> bool:
        """Whether a hang-up stopped the run (it is, when this returns True)."""
        if self.thread is None:
            return False
        self.stopped.wait()
        return True

    def _stop(self) -> None:
        try:
            stop_demo_run(self.target, self.proc)
            say(f"eagle3-tui demo: the run is in {self.run_dir}", err=True)
        finally:
            self.stopped.set()
        time.sleep(EXIT_GRACE_S)  # the main thread's own exit, where it can
        os._exit(exits.INTERRUPTED)


class _HeldStops:
    """SIGHUP, SIGTERM and SIGINT held (noted, not acted on) from before the training
    starts until ``arm``, inside the ``try`` that stops it: one that came in between
    would have ended the demo and left the training running."""

    def __init__(self) -> None:
        self.pending: list[int] = []
        self.before = {s: signal.signal(s, self._hold) for s in _STOPS}

    def _hold(self, signum: int, frame: object) -> None:
        self.pending.append(signum)

    def restore(self) -> None:
        for s, handler in self.before.items():
            signal.signal(s, handler)

    def arm(self, on_hang_up: Callable[[], None] | None = None) -> None:
        """From here a stop raises KeyboardInterrupt (a hang-up or a kill calls
        ``on_hang_up`` first); one held raises it now."""

        def interrupted(signum: int, frame: object) -> None:
            if on_hang_up is not None:
                on_hang_up()
            raise KeyboardInterrupt

        signal.signal(signal.SIGINT, self.before[signal.SIGINT])
        for hang_up in (signal.SIGHUP, signal.SIGTERM):
            signal.signal(hang_up, interrupted)
        if self.pending:
            raise KeyboardInterrupt


_STOPS = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)


def _hold_hang_ups() -> None:
    """While the demo stops its run, a closed terminal or a kill does not cut the stop
    short (a second Ctrl-C still does: someone asked for it)."""
    for hang_up in (signal.SIGHUP, signal.SIGTERM):
        signal.signal(hang_up, signal.SIG_IGN)


def _import_the_stop() -> None:
    """What ``stop_demo_run`` imports, imported before a stop may raise."""
    import asyncio  # noqa: F401

    import eagle3_tui.reports
    import eagle3_tui.transport.calls  # noqa: F401


def demo_headless(
    run_dir: Path, proc: subprocess.Popen[bytes], log_path: Path, stops: _HeldStops
) -> int:
    """Train to completion, then print the run's summary (as ``summary`` does; its exit
    status too) and, on stderr, where the run is. Ctrl-C, a closed terminal (SIGHUP) or
    SIGTERM stop the training as well (it runs in a session of its own, which they do
    not reach): exit status 130."""
    from eagle3_tui import api
    from eagle3_tui.model.summary import format_text
    from eagle3_tui.transport.target import LocalTarget

    target = LocalTarget(run_dir)
    _import_the_stop()
    try:
        stops.arm()
        say(f"eagle3-tui demo: training in {run_dir} (pid {proc.pid}, log {log_path})", err=True)
        rc = proc.wait()
    except KeyboardInterrupt:
        _hold_hang_ups()
        stop_demo_run(target, proc)
        say(f"eagle3-tui demo: the run is in {run_dir}", err=True)
        return exits.INTERRUPTED
    if rc != 0:
        say(f"eagle3-tui demo: training exited with status {rc}; see {log_path}", err=True)
        return rc
    opened = api.open_run(target, label=str(run_dir))
    say(format_text(opened.summary()))
    say(f"eagle3-tui demo: the run is in {run_dir}", err=True)
    return opened.exit_status


def stop_demo_run(target: LocalTarget, proc: subprocess.Popen[bytes]) -> None:
    """The demo owns its run: on quit, stop it as `k` would (whole tree, verified) —
    also when `r` relaunched it as another process. Says what it does meanwhile: the
    trainer's graceful save and exit take seconds. A run that ended (finished, or
    stopped by `k`) with nothing of it left: nothing to stop, nothing said."""
    import asyncio
    import subprocess

    from eagle3_tui.reports import status_line
    from eagle3_tui.transport.calls import kill_run, on_host, run_status

    if proc.poll() is not None:
        try:
            status = asyncio.run(on_host(target, lambda h: run_status(h, str(target.run_dir))))
        except (TargetError, OSError):
            status = None  # unknown: stopped as if it ran
        if status is not None and not status.alive and not status.leftovers:
            return
    say("eagle3-tui demo: stopping the run (at a step boundary, saved, then verified)…", err=True)
    try:
        result = asyncio.run(
            on_host(
                target,
                lambda h: kill_run(
                    h, str(target.run_dir), grace_s=60.0, on_progress=_demo_progress
                ),
            )
        )
        say(f"eagle3-tui demo: {status_line(result.status, result.message)}", err=True)
    except (TargetError, OSError) as e:
        say(f"eagle3-tui demo: could not stop the run cleanly: {e}", err=True)
    if proc.poll() is None:  # the launcher itself, if the agent could not reach it
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def demo_training_command(
    run_dir: Path, *, epochs: int, step_delay: float, workers: int
) -> list[str]:
    """The demo's trainer: the tiny launcher writing into ``run_dir``, isolated from the
    directory the demo was started in (``python -I``: see telemetry/isolation.py)."""
    from eagle3_tui.telemetry.isolation import module_argv

    return module_argv(
        "eagle3_tui.train.tiny",
        *("--run-dir", str(run_dir.resolve()), "--epochs", str(epochs)),
        *("--step-delay", str(step_delay), "--workers", str(workers)),
    )


def _check_training_installed() -> None:
    import importlib.util

    missing = [m for m in ("torch", "speculators") if importlib.util.find_spec(m) is None]
    if missing:
        raise TargetError(
            f"the demo trains for real and needs {' and '.join(missing)} "
            "(on a CPU machine: ./scripts/install.sh)"
        )


def _demo_progress(event: Any) -> None:
    print_progress(event, "eagle3-tui demo: ")
