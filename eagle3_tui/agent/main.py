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
from eagle3_tui.agent.names import ERR_INVALID, EV_ERROR, PROTOCOL
from eagle3_tui.agent.observe import op_observe
from eagle3_tui.agent.runs import op_resolve, op_runs, op_status


def op_attach(req: dict[str, Any]) -> int:
    """Imported when used: a follow does not compile gdb and /proc inspection code."""
    from eagle3_tui.agent.attach import op_attach as attach

    return attach(req)


OPS: dict[str, Callable[[dict[str, Any]], int]] = {
    "follow": op_follow,
    "resolve": op_resolve,
    "read": op_read,
    "runs": op_runs,
    "kill": op_kill,
    "resume": op_resume,
    "status": op_status,
    "discover": op_discover,
    "choose": op_choose,
    "describe": op_describe,
    "observe": op_observe,
    "attach": op_attach,
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
