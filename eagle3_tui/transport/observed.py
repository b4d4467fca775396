"""A run without telemetry, watched from outside: the agent's ``observe`` stream.

The agent on the run's host writes records of the JSON-lines schema about a training
process it discovered (its tree, GPUs, reads, checkpoints, log: see
``agent/observe.py``). :class:`ObservedTransport` hands them on as :class:`Chunk`
values of one growing stream, as a metrics file would be: offsets are counted here,
so they keep growing across reconnects. After a disconnect it reconnects with backoff
and passes back the agent's last ``cursor`` (the log's offset and identity, the log
records' sequence numbers, the parser's state): the log resumes where it was, and
any record sent twice is dropped by the reader as a duplicate.

No textual here; asyncssh only when the host is an SSH host.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from eagle3_tui.agent.names import EV_CURSOR, EV_ENDED, EV_ERROR, EV_OBSERVED
from eagle3_tui.transport.base import Chunk, Link, LinkChanged, StreamEvent, TargetError
from eagle3_tui.transport.channel import (
    AgentAnswerError,
    AgentChannel,
    AgentFailedError,
    ChannelLostError,
    DataFrame,
)
from eagle3_tui.transport.replies import ErrorKind, ProcessRow

BACKOFF = (0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0)


class ObserveHost(Protocol):
    """A host that runs the agent (LocalHost, SshHost, OpenSshHost)."""

    @property
    def label(self) -> str: ...

    async def start_agent(self, request: dict[str, Any]) -> AgentChannel: ...


def _refused(e: BaseException) -> bool:
    """An answer that retrying will not change (a refused host key, a missing process)."""
    if isinstance(e, AgentFailedError | AgentAnswerError):
        return True
    ssh = sys.modules.get("eagle3_tui.transport.ssh")
    return ssh is not None and isinstance(e, ssh.HostRefusedError)


def describe_row(row: ProcessRow, middle: str = "") -> str:
    """``pid 4242 train.py in /work/exp7`` for labels and messages (``middle`` before
    the directory, which may be long)."""
    command = row.command
    script = next((a for a in command[1:] if not a.startswith("-")), command[0] if command else "")
    where = f" in {row.cwd}" if row.cwd else ""
    return f"pid {row.pid} {script.rsplit('/', 1)[-1]}{middle}{where}"


class ObservedTransport:
    """Records about a discovered training process (no telemetry), as a stream."""

    def __init__(
        self,
        host: ObserveHost,
        row: ProcessRow,
        *,
        interval_s: float = 1.0,
        backoff: Sequence[float] = BACKOFF,
    ) -> None:
        self.host = host
        self.row = row
        self.pid = row.pid
        self.start_ticks = row.start_ticks
        self.interval_s = interval_s
        self.backoff = tuple(backoff)
        self.reconnects = 0
        self.ended = False

    @property
    def label(self) -> str:
        prefix = getattr(self.host, "prefix", "")
        return f"{prefix}{describe_row(self.row, ' (no telemetry)')}"

    async def stream(self, offset: int = 0) -> AsyncIterator[StreamEvent]:
        position = offset  # where the next byte goes in the stream the model reads
        cursor: dict[str, Any] = {}
        attempt = 0
        connected = False
        yield LinkChanged(Link.CONNECTING, self.host.label)
        while True:
            reason = "the agent stopped"
            channel: AgentChannel | None = None
            status: int | None = None
            stderr = ""
            try:
                channel = await self.host.start_agent(
                    {
                        "op": "observe",
                        "pid": self.pid,
                        "start_ticks": self.start_ticks,
                        "cursor": cursor,
                        "interval_s": self.interval_s,
                    }
                )
                async for frame in channel.frames():
                    if isinstance(frame, DataFrame):
                        yield Chunk(position, frame.data)
                        position += len(frame.data)
                    elif frame.event == EV_OBSERVED:
                        attempt = 0
                        connected = True
                        yield LinkChanged(Link.CONNECTED, self.label)
                    elif frame.event == EV_CURSOR:
                        cursor = dict(frame.fields)
                    elif frame.event == EV_ENDED:
                        self.ended = True
                        return  # the trainer exited: its last records said so
                    elif frame.event == EV_ERROR:
                        if connected and ErrorKind.of(frame.get("kind")) is ErrorKind.GONE:
                            self.ended = True
                            return  # it exited while we were away: the probe says so
                        yield LinkChanged(Link.REFUSED, str(frame.get("message")))
                        return
            except ChannelLostError as e:
                reason = str(e)
            except TargetError as e:
                if _refused(e):
                    yield LinkChanged(Link.REFUSED, str(e))
                    return
                reason = str(e)
            finally:
                if channel is not None:
                    channel.close()
                    status, stderr = await channel.finish()
            problem = getattr(self.host, "exit_problem", None)
            if channel is not None and problem is not None:
                found = problem(status, stderr)
                if found is not None:
                    refused, reason = found
                    if refused:
                        yield LinkChanged(Link.REFUSED, reason)
                        return
            delay = self.backoff[min(attempt, len(self.backoff) - 1)]
            attempt += 1
            self.reconnects += 1
            yield LinkChanged(Link.RECONNECTING, reason, retry_in=delay)
            await asyncio.sleep(delay)
