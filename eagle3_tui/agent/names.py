"""Names the agent and its client share: the protocol version, files, the run marker,
operations, events and error kinds. Standard library only (the agent runs on the host)."""

from __future__ import annotations

PROTOCOL = 1
MANIFEST = "run.json"
RUN_ID_ENV = "EAGLE3_TUI_RUN_ID"

# Operations (the request's "op").
OP_FOLLOW = "follow"
OP_RESOLVE = "resolve"
OP_READ = "read"
OP_RUNS = "runs"
OP_KILL = "kill"
OP_RESUME = "resume"
OP_STATUS = "status"
OP_ATTACH = "attach"

# Events (a J frame's "event").
EV_RESOLVED = "resolved"
EV_WAITING = "waiting"
EV_OPENED = "opened"
EV_RESTARTED = "restarted"
EV_PROGRESS = "progress"
EV_RESULT = "result"
EV_EOF = "eof"
EV_ERROR = "error"

# Error kinds (an error event's "kind").
ERR_INVALID = "invalid"  # a request the agent does not understand
ERR_MISSING = "missing"  # no such run, file or manifest
ERR_REFUSED = "refused"  # understood, and refused (resume a running run...)
