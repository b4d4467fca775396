"""The agent's entry point: one JSON request on stdin, frames on stdout."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import IO, Any, NoReturn

from eagle3_tui.agent.control import op_kill, op_resume
from eagle3_tui.agent.discover import op_choose, op_describe, op_discover
from eagle3_tui.agent.follow import op_follow, op_read
from eagle3_tui.agent.frames import AgentError, emit
from eagle3_tui.agent.names import (
    ERR_INVALID,
    EV_ERROR,
    OP_ATTACH,
    OP_CHOOSE,
    OP_DESCRIBE,
    OP_DISCOVER,
    OP_FOLLOW,
    OP_KILL,
    OP_OBSERVE,
    OP_READ,
    OP_RESOLVE,
    OP_RESUME,
    OP_RUNS,
    OP_STATUS,
    PROTOCOL,
)
from eagle3_tui.agent.observe import op_observe
from eagle3_tui.agent.runs import op_resolve, op_runs, op_status


def op_attach(req: dict[str, Any]) -> int:
    """Imported when used: a follow does not compile gdb and /proc inspection code."""
    from eagle3_tui.agent.attach import op_attach as attach

    return attach(req)


OPS: dict[str, Callable[[dict[str, Any]], int]] = {
    OP_FOLLOW: op_follow,
    OP_RESOLVE: op_resolve,
    OP_READ: op_read,
    OP_RUNS: op_runs,
    OP_KILL: op_kill,
    OP_RESUME: op_resume,
    OP_STATUS: op_status,
    OP_DISCOVER: op_discover,
    OP_CHOOSE: op_choose,
    OP_DESCRIBE: op_describe,
    OP_OBSERVE: op_observe,
    OP_ATTACH: op_attach,
}


def main(stdin: IO[bytes] | None = None) -> NoReturn:
    stream = sys.stdin.buffer if stdin is None else stdin
    line = stream.readline()
    try:
        req = json.loads(line)
        if not isinstance(req, dict) or req.get("op") not in OPS:
            raise ValueError("unknown operation")
        if req.get("protocol", PROTOCOL) != PROTOCOL:
            raise ValueError(f"protocol {req.get('protocol')} (this agent speaks {PROTOCOL})")
    except ValueError as e:
        emit(EV_ERROR, kind=ERR_INVALID, message=f"bad request: {e}")
        sys.exit(2)
    try:
        rc = OPS[req["op"]](req)
    except AgentError as e:
        emit(EV_ERROR, kind=e.kind, message=str(e))
        rc = 3
    except KeyboardInterrupt:
        rc = 130
    sys.exit(rc)
