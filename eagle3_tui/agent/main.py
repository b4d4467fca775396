"""The agent's entry point: one JSON request on stdin, frames on stdout."""

from __future__ import annotations

import importlib
import os
import sys
from typing import IO, NoReturn

from eagle3_tui.agent.frames import AgentError, emit
from eagle3_tui.agent.names import (
    ERR_INVALID,
    EV_ERROR,
    OP_ATTACH,
    OP_CHOOSE,
    OP_DESCRIBE,
    OP_DISCOVER,
    OP_FOLLOW,
    OP_GLANCE,
    OP_JOB_CONTROL,
    OP_JOBS,
    OP_KILL,
    OP_LOOK,
    OP_OBSERVE,
    OP_READ,
    OP_RESOLVE,
    OP_RESUME,
    OP_RUNS,
    OP_SAVE_WAIT,
    OP_STATUS,
    PROTOCOL,
)
from eagle3_tui.telemetry.parsing import parse_json

OPS: dict[str, tuple[str, str]] = {
    OP_FOLLOW: ("follow", "op_follow"),
    OP_RESOLVE: ("runs", "op_resolve"),
    OP_READ: ("follow", "op_read"),
    OP_RUNS: ("runs", "op_runs"),
    OP_KILL: ("kill_resume", "op_kill"),
    OP_RESUME: ("kill_resume", "op_resume"),
    OP_STATUS: ("runs", "op_status"),
    OP_DISCOVER: ("discover", "op_discover"),
    OP_CHOOSE: ("choose", "op_choose"),
    OP_LOOK: ("choose", "op_look"),
    OP_DESCRIBE: ("choose", "op_describe"),
    OP_OBSERVE: ("observe", "op_observe"),
    OP_ATTACH: ("attach", "op_attach"),
    OP_SAVE_WAIT: ("kill_resume", "op_save_wait"),
    OP_GLANCE: ("glance", "op_glance"),
    OP_JOBS: ("slurm", "op_jobs"),
    OP_JOB_CONTROL: ("slurm", "op_job_control"),
}
"""Operation -> (module of ``eagle3_tui.agent``, function). The module is imported when
its operation is asked for: every call is a fresh process, and the 60 s status probe
should not compile and run follow, observe, discover and control (with their samplers
and regexes) only to answer whether a pid is alive."""


def _user_site_last() -> None:
    """The agent runs isolated (``python -I``): no working directory, no ``PYTHON*``
    variables and no user site on ``sys.path``. The user's own site-packages (where
    ``pip install --user nvidia-ml-py`` puts NVML's binding) is this user's alone:
    it goes back, last, so nothing in it can shadow the standard library."""
    try:
        import site

        path = site.getusersitepackages()
    except Exception:  # a stripped-down site module
        return
    if isinstance(path, str) and path not in sys.path and os.path.isdir(path):
        sys.path.append(path)


def main(stdin: IO[bytes] | None = None) -> NoReturn:
    _user_site_last()
    stream = sys.stdin.buffer if stdin is None else stdin
    line = stream.readline()
    try:
        req = parse_json(line)
        if not isinstance(req, dict) or req.get("op") not in OPS:
            raise ValueError("unknown operation")
        if req.get("protocol", PROTOCOL) != PROTOCOL:
            raise ValueError(f"protocol {req.get('protocol')} (this agent speaks {PROTOCOL})")
    except ValueError as e:
        emit(EV_ERROR, kind=ERR_INVALID, message=f"bad request: {e}")
        sys.exit(2)
    try:
        module, function = OPS[req["op"]]
        op = getattr(importlib.import_module("eagle3_tui.agent." + module), function)
        rc = op(req)
    except AgentError as e:
        emit(EV_ERROR, kind=e.kind, message=str(e))
        rc = 3
    except KeyboardInterrupt:
        rc = 130
    sys.exit(rc)
