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

import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from eagle3_tui.agent.names import EV_CURSOR, EV_ENDED, EV_ERROR, EV_OBSERVED
from eagle3_tui.transport.base import Chunk, Link, LinkChanged, StreamEvent, TargetError
from eagle3_tui.transport.channel import (
    STREAM_IDLE_S,
    AgentAnswerError,
    AgentChannel,
    AgentFailedError,
    ChannelLostError,
    DataFrame,
)
from eagle3_tui.transport.reconnect import BACKOFF, Reconnecting, StreamOver
from eagle3_tui.transport.replies import ErrorKind, ProcessRow


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


class ObservedTransport(Reconnecting):
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
        self._position = offset  # where the next byte goes in the stream the model reads
        self._cursor: dict[str, Any] = {}
        self._seen = False  # observed once: an answer "gone" afterwards is its end
        async for event in self._reconnecting():
            yield event

    def _host_label(self) -> str:
        return self.host.label

    async def _start(self) -> AgentChannel:
        return await self.host.start_agent(
            {
                "op": "observe",
                "pid": self.pid,
                "start_ticks": self.start_ticks,
                "cursor": self._cursor,
                "interval_s": self.interval_s,
            }
        )

    async def _events(self, channel: AgentChannel) -> AsyncIterator[StreamEvent]:
        async for frame in channel.frames(STREAM_IDLE_S):
            if isinstance(frame, DataFrame):
                yield Chunk(self._position, frame.data)
                self._position += len(frame.data)
            elif frame.event == EV_OBSERVED:
                self._connected()
                self._seen = True
                yield LinkChanged(Link.CONNECTED, self.label)
            elif frame.event == EV_CURSOR:
                self._cursor = dict(frame.fields)
            elif frame.event == EV_ENDED:
                self.ended = True
                raise StreamOver  # the trainer exited: its last records said so
            elif frame.event == EV_ERROR:
                if self._seen and ErrorKind.of(frame.get("kind")) is ErrorKind.GONE:
                    self.ended = True
                    raise StreamOver  # it exited while we were away: the probe says so
                yield LinkChanged(Link.REFUSED, str(frame.get("message")))
                raise StreamOver

    def _refusal(self, e: TargetError | ChannelLostError) -> bool:
        return isinstance(e, TargetError) and _refused(e)

    def _exit_problem(self, status: int | None, stderr: str) -> tuple[bool, str] | None:
        problem = getattr(self.host, "exit_problem", None)
        return None if problem is None else problem(status, stderr)
