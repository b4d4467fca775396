"""What both launchers share: the run's log file, telemetry options, the closing line."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_tui.telemetry.isolation import module_argv
from eagle3_tui.telemetry.safefs import claim_append, open_append
from eagle3_tui.telemetry.schema import LOG_FILE

LOG_MODES = ("auto", "tee", "file", "none")


@dataclass(frozen=True)
class LogSetup:
    log_file: str | None
    """The log's name inside the run dir (for the manifest), or None."""
    tee_pid: int | None = None
    """The copier process (not a dataloader worker)."""


def _same_file(fd: int, path: Path) -> bool:
    try:
        a = os.fstat(fd)
        b = path.stat()
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def setup_log(run_dir: Path, mode: str) -> LogSetup:
    """Send this process's stdout and stderr to ``run_dir/train.log`` as well.

    ``auto``: nothing when stdout already is that file (``eagle3-tui demo``
    redirects it), else ``tee``. ``tee``: a copier process writes the file and
    the original stdout. ``file``: the file only. ``none``: leave output alone.
    Only rank 0 writes the log under torchrun. Never raises.
    """
    log = run_dir / LOG_FILE
    if mode == "none" or os.environ.get("RANK", "0") != "0":
        return LogSetup(None)
    if _same_file(1, log):
        return LogSetup(LOG_FILE)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    try:
        # made (or checked) here, where a refusal can be said: what another user planted
        # at the path (a link to a root-only file...) is moved aside, never written through
        fd, moved, found = claim_append(log)
        os.close(fd)
        if moved is not None:
            print(f"[eagle3] {log}: {found} was there: moved aside to {moved}", file=sys.stderr)
        if mode in ("auto", "tee"):
            proc = subprocess.Popen(
                module_argv("eagle3_tui.train.tee", str(log)),  # isolated: python -I
                stdin=subprocess.PIPE,
                stdout=None,  # the original stdout
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
            assert proc.stdin is not None
            os.dup2(proc.stdin.fileno(), 1)
            os.dup2(proc.stdin.fileno(), 2)
            proc.stdin.close()  # fds 1 and 2 hold the pipe now
            return LogSetup(LOG_FILE, proc.pid)
        fd, _ = open_append(log)  # never through a link or into another user's file
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        return LogSetup(LOG_FILE)
    except OSError as e:
        why = e.strerror or e
        print(f"[eagle3] cannot write {log}: {why}; output stays where it was", file=sys.stderr)
        return LogSetup(None)


def add_telemetry_args(p: argparse.ArgumentParser, *, progress_every: int) -> None:
    g = p.add_argument_group("telemetry")
    g.add_argument(
        "--log",
        choices=LOG_MODES,
        default="auto",
        help="copy stdout/stderr to RUN_DIR/train.log: auto (tee unless already there), "
        "tee, file (only), none",
    )
    g.add_argument(
        "--progress-every",
        type=int,
        default=progress_every,
        metavar="N",
        help="print a one-line summary every N steps (0: never)",
    )
    g.add_argument(
        "--interval", type=float, default=1.0, help="seconds between samples (GPU, reads, ...)"
    )
    g.add_argument(
        "--no-samplers",
        dest="samplers",
        action="store_const",
        const=[],
        default=None,
        help="no GPU/reads/checkpoint/heartbeat samplers",
    )
    g.add_argument(
        "--sampler-host",
        choices=("sidecar", "thread"),
        default="sidecar",
        help="run the samplers in a sidecar process (default) or a thread",
    )


def telemetry_kwargs(a: argparse.Namespace) -> dict[str, Any]:
    return {
        "interval": a.interval,
        "samplers": True if a.samplers is None else a.samplers,
        "sampler_host": a.sampler_host,
        "progress_every": a.progress_every,
    }


def closing_line(telemetry: Any) -> str:
    """What the writer did, as it was: records written and not written (why), and what
    happened to the file meanwhile (``JsonlWriter.outcome``)."""
    return f"[eagle3] telemetry: {telemetry.writer.outcome()}"
