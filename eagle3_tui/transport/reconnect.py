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
import time
from collections.abc import AsyncIterator

from eagle3_tui.transport.base import Link, LinkChanged, StreamEvent, TargetError
from eagle3_tui.transport.channel import AgentChannel, AgentSilentError, ChannelLostError

BACKOFF = (0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0)
"""Seconds to wait before each reconnect in a row (the last one repeats)."""
REFUSAL_RETRY_S = 30.0
"""A host key that no longer matches known_hosts is refused, and tried again this often:
once the key is put back (or the old one removed, deliberately), the stream reads on."""
HOST_KEY_SIGNS = (
    "Host key verification failed",
    "HOST KEY CHANGED",
    "REMOTE HOST IDENTIFICATION HAS CHANGED",
)


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
    refusal_retry_s: float = REFUSAL_RETRY_S

    def _retried(self, reason: str) -> bool:
        """Whether a refusal is tried again (slowly): a host key that does not match,
        which its owner may put right while the monitor runs; never anything else."""
        return any(sign in reason for sign in HOST_KEY_SIGNS)

    def _refused(self, reason: str) -> LinkChanged:
        if not self._retried(reason):
            return LinkChanged(Link.REFUSED, reason)
        every = f"{self.refusal_retry_s:g} s"
        return LinkChanged(
            Link.REFUSED, f"{reason} (tried again every {every})", retry_in=self.refusal_retry_s
        )

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
            refusal: LinkChanged | None = None
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
                    refusal = self._refused(str(e))
                reason = str(e)
            finally:
                if channel is not None:  # on every way out, the consumer's aclose() too
                    channel.close()
                    status, stderr = await channel.finish()
            if channel is not None and refusal is None:
                problem = self._exit_problem(status, stderr)
                if problem is not None:
                    if problem[0]:
                        refusal = self._refused(problem[1])
                    elif not silent:  # a silent agent's channel was closed here: not news
                        reason = problem[1]
            if refusal is not None:
                yield refusal
                if refusal.retry_in is None:
                    return
                await asyncio.sleep(refusal.retry_in)
                continue
            delay = self.backoff[min(self._failures, len(self.backoff) - 1)]
            self._failures += 1
            self.reconnects += 1
            yield LinkChanged(Link.RECONNECTING, reason, retry_in=delay, silent_s=_quiet(channel))
            await asyncio.sleep(delay)
            # the attempt now (an ssh connection can take its 15 s): no retry "in 1 s" left
            yield LinkChanged(Link.RECONNECTING, reason)


QUIET_S = 2.0
"""A channel whose last byte came longer ago than this went down with it (a keepalive's
timeout, a frozen agent); a shorter quiet is any stream's between two writes."""


def _quiet(channel: AgentChannel | None) -> float | None:
    """How long before now the channel's last byte came, where that says the link went
    down then; None: it went down now (as far as can be told)."""
    heard = getattr(channel, "heard", None)
    if heard is None:
        return None
    quiet = time.monotonic() - heard.last
    return quiet if quiet > QUIET_S else None
