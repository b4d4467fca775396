"""A glance at a long run (agent/glance.py) from where it lives: this machine's file,
read in-process, or a host's, through the agent's ``glance`` operation.

Either way the answer is a :class:`~eagle3_tui.model.glance.GlanceData`, or why there
is none (a short line; the run is then read whole, as it always was). A glance that
fails on the way (the link, an agent that cannot run, frames that do not add up) is
such a reason too: the stream that follows reports the host's trouble itself.

No textual.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from eagle3_tui.agent.glance import glance as agent_glance
from eagle3_tui.agent.names import EV_ERROR, EV_GLANCE, OP_GLANCE
from eagle3_tui.telemetry.parsing import parse_json
from eagle3_tui.telemetry.safefs import open_regular
from eagle3_tui.transport.base import TargetError
from eagle3_tui.transport.channel import AgentChannel, ChannelLostError, DataFrame

if TYPE_CHECKING:  # (the model, and numpy, where a glance is made: not in `runs` or `kill`)
    from eagle3_tui.model.glance import GlanceData

GLANCE_KEYS = ["train."]
"""The columns whose stats a glance's digest carries: what the charts draw."""
MIN_GLANCE_BYTES = 32 << 20
"""Files shorter than this are read whole (a few hundred ms at most, and exact)."""


_decode = msgspec.json.Decoder().decode


def fast_loads(data: bytes) -> Any:
    """``json.loads`` of a glance's digests, ~3x faster (msgspec parses their floats in
    C): the same values; what msgspec refuses (a NaN, a number past a float's range,
    another encoding) is parsed by ``json.loads`` instead."""
    try:
        return _decode(data)
    except msgspec.DecodeError:
        return json.loads(data)


class AgentHost(Protocol):
    async def start_agent(self, request: dict[str, Any]) -> AgentChannel: ...


def glance_local(path: Path, tail_rows: int, min_size: int) -> GlanceData | str:
    """This machine's file at a glance (in-process: the agent's own code)."""
    try:
        fd, _ = open_regular(path)
    except OSError as e:
        return f"{path}: {e.strerror or e}"
    try:
        g = agent_glance(fd, str(path), GLANCE_KEYS, tail_rows, min_size=min_size, loads=fast_loads)
    except (OSError, ValueError) as e:
        return f"{path}: {e}"
    finally:
        os.close(fd)
    if isinstance(g, str):
        return g
    from eagle3_tui.model.glance import GlanceData

    return GlanceData(g.size, g.tail_from, g.tail, tuple(g.marks), g.digest)


async def glance_remote(
    host: AgentHost, run_dir: str | None, file: str, tail_rows: int, min_size: int
) -> GlanceData | str:
    """A host's file at a glance, through the agent."""
    request = {
        "op": OP_GLANCE,
        "run_dir": run_dir,
        "file": file,
        "keys": GLANCE_KEYS,
        "tail_rows": tail_rows,
        "min_size": min_size,
    }
    said: dict[str, Any] | None = None
    frames: list[DataFrame] = []
    try:
        channel = await host.start_agent(request)
        try:
            async for frame in channel.frames():
                if isinstance(frame, DataFrame):
                    frames.append(frame)
                elif frame.event == EV_GLANCE:
                    said = frame.fields
                elif frame.event == EV_ERROR:
                    return str(frame.get("message", "the agent refused"))
        finally:
            channel.close()
            await channel.finish()
    except (TargetError, ChannelLostError, OSError) as e:
        return f"no glance: {e}"
    if said is None:
        return "the agent sent no glance"
    return assemble(said, frames)


def assemble(said: dict[str, Any], frames: list[DataFrame]) -> GlanceData | str:
    """The glance the agent's frames carry (see agent/glance.py), or why they are not one."""
    if said.get("ok") is not True:
        return str(said.get("why") or "no glance")
    size, tail_from = said.get("size"), said.get("tail_from")
    if type(size) is not int or type(tail_from) is not int or not 0 <= tail_from <= size:
        return "a glance without its size"
    digest_b = [f.data for f in frames if f.offset == -2]
    marks_b = [f.data for f in frames if f.offset == -1]
    tail = [f for f in frames if f.offset >= 0]
    if len(digest_b) != 1 or len(marks_b) != 1:
        return "a glance without its digest"
    try:
        digest = parse_json(digest_b[0])
    except ValueError:
        return "a glance whose digest is not JSON"
    places = digest.pop("marks", None) if isinstance(digest, dict) else None
    if not isinstance(places, list):
        return "a glance without its events' places"
    marks: list[tuple[int, bytes]] = []
    data, at = marks_b[0], 0
    for p in places:
        if not (isinstance(p, list) and len(p) == 2 and all(type(v) is int for v in p)):
            return "a glance whose events' places are not places"
        off, n = p
        if n <= 0 or at + n > len(data):
            return "a glance whose events do not add up"
        marks.append((off, data[at : at + n]))
        at += n
    if at != len(data):
        return "a glance whose events do not add up"
    pos, parts = tail_from, []
    for f in tail:
        if f.offset != pos:
            return "a glance whose tail is not in one piece"
        parts.append(f.data)
        pos += len(f.data)
    if pos != size:
        return "a glance whose tail ends before the file's size"
    from eagle3_tui.model.glance import GlanceData

    return GlanceData(size, tail_from, b"".join(parts), tuple(marks), digest)
