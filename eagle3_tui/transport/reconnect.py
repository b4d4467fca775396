"""A stream of one agent operation that reconnects: what :class:`SshTransport`
(``follow`` a run's file) and :class:`ObservedTransport` (``observe`` a process) share.

Each attempt starts the agent with the operation's request and hands its frames to
the operation, which turns them into stream events. When the channel is lost the
stream says so (``RECONNECTING``, with the wait) and starts again after the next
wait of the backoff; a refusal (what retrying will not change) ends it instead.

No textual here; asyncssh only where the host is an SSH host.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from eagle3_tui.transport.base import Link, LinkChanged, StreamEvent, TargetError
from eagle3_tui.transport.channel import AgentChannel, AgentSilentError, ChannelLostError

BACKOFF = (0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0)
"""Seconds to wait before each reconnect in a row (the last one repeats)."""


class StreamOver(Exception):  # noqa: N818 (not an error: the end, said by the operation)
    """Raised by an operation after its last event: the stream ends, with no retry."""


class Reconnecting:
    """The loop: one agent channel an attempt, the backoff between them.

    A subclass sets ``backoff`` and ``reconnects`` and says what is its own: the
    request of an attempt, what its frames mean, which errors are refusals and what
    the agent's exit says."""

    backoff: tuple[float, ...]
    reconnects: int
    """Attempts after the first (a count tests and benchmarks read)."""
    _failures: int = 0

    def _host_label(self) -> str:
        raise NotImplementedError

    async def _start(self) -> AgentChannel:
        """Start the agent for one attempt."""
        raise NotImplementedError

    def _events(self, channel: AgentChannel) -> AsyncIterator[StreamEvent]:
        """The events of one attempt's frames; :class:`StreamOver` after the last."""
        raise NotImplementedError

    def _refusal(self, e: TargetError | ChannelLostError) -> bool | None:
        """Whether ``e`` is a refusal (True) or a loss to retry (False); None: not the
        stream's to judge (it is raised)."""
        raise NotImplementedError

    def _exit_problem(self, status: int | None, stderr: str) -> tuple[bool, str] | None:
        """What the agent's exit says, when it says something: (refused, reason)."""
        raise NotImplementedError

    def _connected(self) -> None:
        """The attempt is through: the next loss waits the shortest again."""
        self._failures = 0

    async def _reconnecting(self) -> AsyncIterator[StreamEvent]:
        self._failures = 0
        yield LinkChanged(Link.CONNECTING, self._host_label())
        while True:
            reason = "the agent stopped"
            channel: AgentChannel | None = None
            status: int | None = None
            stderr = ""
            silent = False
            try:
                channel = await self._start()
                async for event in self._events(channel):
                    yield event
            except StreamOver:
                return
            except (TargetError, ChannelLostError) as e:
                silent = isinstance(e, AgentSilentError)
                refused = self._refusal(e)
                if refused is None:
                    raise
                if refused:
                    yield LinkChanged(Link.REFUSED, str(e))
                    return
                reason = str(e)
            finally:
                if channel is not None:  # on every way out, the consumer's aclose() too
                    channel.close()
                    status, stderr = await channel.finish()
            if channel is not None:
                problem = self._exit_problem(status, stderr)
                if problem is not None:
                    if problem[0]:
                        yield LinkChanged(Link.REFUSED, problem[1])
                        return
                    if not silent:  # a silent agent's channel was closed here: not news
                        reason = problem[1]
            delay = self.backoff[min(self._failures, len(self.backoff) - 1)]
            self._failures += 1
            self.reconnects += 1
            yield LinkChanged(Link.RECONNECTING, reason, retry_in=delay)
            await asyncio.sleep(delay)
            # the attempt now (an ssh connection can take its 15 s): no retry "in 1 s" left
            yield LinkChanged(Link.RECONNECTING, reason)
