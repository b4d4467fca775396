"""Where a trainer without telemetry is stuck: its main thread's stack, read from outside.

When an observed trainer's tree has been idle (no CPU, no data read, no log growth)
for :data:`QUIET_S`, ``py-spy dump --nonblocking`` reads every thread's Python stack
from the process's memory: it never stops the trainer (``--nonblocking``: a stuck
process's stack does not move, so nothing is torn) and never writes into it. The
main thread's frames become a ``stack`` record of the schema the telemetry writes
(``telemetry/stacks.py``), which the model turns into "stuck in …".

py-spy must be on the host: on the agent's ``PATH``, beside the agent's interpreter,
or on the trainer's own ``PATH`` (a ``pip install py-spy`` in the training's
environment). A binary another user could change is never run (the agent may be
root). Without one, the record says so and how to get it.

Standard library only (the agent).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from typing import Any

from eagle3_tui.telemetry import procs
from eagle3_tui.telemetry.parsing import parse_json
from eagle3_tui.telemetry.safefs import trust_problem

QUIET_S = 20.0
"""Idle this long (the telemetry's own stack watch waits as long) before a look."""
AGAIN_S = 300.0
"""A trainer that stays idle is looked at again this often (it may have moved on)."""
DUMP_TIMEOUT_S = 10.0
MAX_FRAMES = 40
HOW_TO_GET = "pip install py-spy (on the host, in any environment on PATH)"
PY_SPY_ENV = "EAGLE3_TUI_PY_SPY"
"""The py-spy binary to use (a path), or ``off``."""
_STDLIB = re.compile(r"/lib/python3\.\d+/(?!site-packages/|dist-packages/)")


def find_py_spy(pid: int) -> tuple[str | None, str]:
    """The py-spy to run for ``pid``, or None and why not (one line, with the fix).
    ``EAGLE3_TUI_PY_SPY`` (in the agent's environment) names it, or turns it off."""
    named = os.environ.get(PY_SPY_ENV)
    if named is not None:
        if named in ("", "off"):
            return None, f"reading it is turned off ({PY_SPY_ENV}={named})"
        if not os.path.isfile(named):
            return None, f"{PY_SPY_ENV} names {named}, which is not a file: {HOW_TO_GET}"
        problem = trust_problem(named)
        if problem is not None:
            return None, f"{problem}: py-spy not run"
        return named, ""
    env = procs.environ(pid) or {}
    dirs = (os.environ.get("PATH") or "").split(os.pathsep)
    dirs.append(os.path.dirname(sys.executable))
    dirs += (env.get("PATH") or "").split(os.pathsep)
    refused = ""
    for folder in dirs:
        if not folder or not os.path.isabs(folder):
            continue
        path = shutil.which("py-spy", path=folder)
        if path is None:
            continue
        problem = trust_problem(path)
        if problem is None:
            return path, ""
        refused = f" ({problem}: not run)"
    return None, f"py-spy is not on the host{refused}: {HOW_TO_GET}"


def origin(path: str) -> str:
    """``stdlib``, ``library`` or ``user``, as the telemetry's frames say it."""
    if "/site-packages/" in path or "/dist-packages/" in path:
        return "library"
    if _STDLIB.search(path) or path.startswith("<frozen "):
        return "stdlib"
    return "user"


def _frames(thread: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for f in thread.get("frames") or []:
        if not isinstance(f, dict):
            continue
        line = f.get("line")
        out.append(
            {
                "func": str(f.get("name") or "?"),
                "file": str(f.get("filename") or "?"),
                "line": line if isinstance(line, int) else 0,
                "origin": origin(str(f.get("filename") or "")),
            }
        )
        if len(out) >= MAX_FRAMES:
            break
    return out


def parse_dump(text: str, pid: int) -> dict[str, Any] | None:
    """The ``stack`` payload (main thread, other threads' innermost frames) of
    ``py-spy dump --json`` output; None when it holds no thread."""
    try:
        threads = parse_json(text)
    except ValueError:
        return None
    if not isinstance(threads, list):
        return None
    threads = [t for t in threads if isinstance(t, dict)]
    if not threads:
        return None
    main = next(
        (
            t
            for t in threads
            if t.get("os_thread_id") == pid or t.get("thread_name") == "MainThread"
        ),
        threads[0],
    )
    others = [
        {"name": str(t.get("thread_name") or t.get("thread_id")), "frames": _frames(t)[:3]}
        for t in threads
        if t is not main
    ][:8]
    return {
        "thread": str(main.get("thread_name") or "MainThread"),
        "frames": _frames(main),
        "threads": others,
        "source": "py-spy",
    }


def dump(pid: int) -> tuple[dict[str, Any] | None, str]:
    """The main thread's stack of ``pid`` from py-spy, or None and why not."""
    exe, why = find_py_spy(pid)
    if exe is None:
        return None, why
    try:
        proc = subprocess.run(
            [exe, "dump", "--pid", str(pid), "--json", "--nonblocking"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=DUMP_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            cwd="/",
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, f"py-spy dump did not answer within {DUMP_TIMEOUT_S:.0f} s"
    except OSError as e:
        return None, f"py-spy could not be run ({e.strerror or e})"
    payload = parse_dump(proc.stdout, pid)
    if payload is None:
        err = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return None, f"py-spy could not read the stack: {err}"
    return payload, ""


class StuckWatch:
    """When to look: after :data:`QUIET_S` of an idle tree, once per idle spell (again
    every :data:`AGAIN_S` while it lasts); a one-shot look (``summary``) at its end when
    the tree was idle throughout and the trainer is older than :data:`QUIET_S`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.idle_since: float | None = None
        self.looked_at: float | None = None
        self.unavailable = ""
        """Why no stack can be read (said once per idle spell), or ""."""

    def round(self, now: float, idle: bool, force: bool = False) -> dict[str, Any] | None:
        """The ``stack`` payload to write this round, if a look is due and works."""
        if not idle:
            self.idle_since = self.looked_at = None
            return None
        if self.idle_since is None:
            self.idle_since = now
        quiet = now - self.idle_since
        due = force or quiet >= QUIET_S
        if not due or (self.looked_at is not None and now - self.looked_at < AGAIN_S):
            return None
        self.looked_at = now
        payload, why = dump(self.pid)
        self.unavailable = why
        if payload is not None:
            payload["quiet_s"] = round(quiet, 1)
        return payload
