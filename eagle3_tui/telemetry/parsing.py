"""JSON that a run, a process or another user wrote, parsed so that every way it can be
bad is a ``ValueError``.

``json.loads`` raises ``RecursionError``, not ``ValueError``, for a document nested
deeper than the interpreter's stack: ``[`` 100,000 times is 100 KB, inside any bound a
reader here sets, and every reader here takes a ``ValueError`` for "not what it should
be" (a manifest that is not one, a line that is malformed). Each file, line or request
another process could have written is parsed by :func:`parse_json`.

Standard library only, Python 3.8+: imported inside the trainer and by the agent.
"""

from __future__ import annotations

import json
from typing import Any


def parse_json(data: str | bytes | bytearray) -> Any:
    """``json.loads(data)``; a document nested past the parser's stack is a ValueError."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested deeper than a parser's stack") from None
