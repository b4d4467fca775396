"""SSH: connections that behave like ``ssh``, and a stream that survives bad networks.

:class:`SshHost` connects as ``ssh`` would (``~/.ssh/config`` or ``-F``, aliases,
``-p``/``-i``/``-J``, ssh-agent, keepalive) and verifies the host key against the
user's ``known_hosts``: an unknown or changed key is refused with its
fingerprint; ``-o StrictHostKeyChecking=accept-new`` records an unknown one
(never a changed one). It runs the agent (:mod:`eagle3_tui.agent`)
with a constant command line; requests travel as JSON on stdin.

:class:`SshTransport` follows a run file over one long-lived channel. It tracks
the offset just past the last complete line it delivered and, after any
disconnect, reconnects with backoff and asks the agent to resume there with the
file's identity, so every record arrives exactly once; the agent notices a
truncated, replaced or deleted file and restarts at 0, and the stream says which and
when (``FileChanged``), and the room on the run's filesystem (``DiskSpace``).

No textual here.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import math
import shlex
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any, Protocol

from eagle3_tui.agent import BOOTSTRAP
from eagle3_tui.agent.names import COLUMNS_WANTED, COMPRESS_ZLIB
from eagle3_tui.model.glance import GlanceData
from eagle3_tui.model.samples import SAMPLES_KEPT
from eagle3_tui.telemetry.schema import METRICS_FILE
from eagle3_tui.transport.base import (
    Chunk,
    DiskSpace,
    FileChanged,
    Link,
    LinkChanged,
    StreamEvent,
    TargetError,
)
from eagle3_tui.transport.channel import (
    AGENT_TAG,
    NOT_FOUND_STATUS,
    STREAM_IDLE_S,
    AgentChannel,
    AgentFailedError,
    ChannelLostError,
    DataFrame,
    Frame,
    Heard,
    agent_error,
    agent_payload,
    keeps_stdin,
    read_frames,
)
from eagle3_tui.transport.glancing import glance_remote
from eagle3_tui.transport.hostkeys import HostKeyCheck, HostKeyClient, known_hosts_files
from eagle3_tui.transport.reconnect import BACKOFF, Reconnecting, StreamOver
from eagle3_tui.transport.sshlib import asyncssh
from eagle3_tui.transport.target import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_KEEPALIVE_COUNT_MAX,
    DEFAULT_KEEPALIVE_INTERVAL,
    SshOptions,
    SshTarget,
    TargetNames,
    parse_host,
    parse_port,
)

FAST_CIPHERS = (
    # asyncssh's defaults, AES-GCM first: with AES-NI it costs ~0.15 ms less per
    # record than chacha20-poly1305 in asyncssh (measured on loopback); all are
    # OpenSSH defaults. A Ciphers line in ssh_config overrides this.
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes256-ctr",
    "aes192-ctr",
    "aes128-ctr",
)


class HostRefusedError(TargetError):
    """The host answered and said no (host key, authentication): retrying will not help."""


class HostUnreachableError(TargetError):
    """The host could not be reached or the connection dropped: worth retrying."""


def connect_error(
    exc: BaseException, target: SshTarget, check: HostKeyCheck | None, jump: bool = False
) -> TargetError:
    """A one-line error for a failed connection: refused (permanent) or unreachable."""
    dest = f"jump host {target.destination}" if jump else target.destination
    if isinstance(exc, TargetError):
        return exc
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        msg = check.message(exc.reason) if check is not None else f"{dest}: {exc.reason}"
        return HostRefusedError(msg)
    if isinstance(exc, asyncssh.PermissionDenied):
        # the configuration read: -F FILE's, else the default (as asyncssh reads it)
        config = ", ".join(target.options.config) or "~/.ssh/config"
        return HostRefusedError(
            f"{dest}: permission denied ({exc.reason}); check -i KEY, ssh-agent, "
            f"or IdentityFile/User in {config}"
        )
    if isinstance(exc, asyncssh.KeyImportError | asyncssh.KeyEncryptionError):
        return HostRefusedError(f"{dest}: cannot use the private key: {exc}")
    if isinstance(exc, socket.gaierror):
        hint = ""
        if not target.user and target.run_dir is None and not jump:
            hint = " (and it is not a local directory either)"
        name = f"jump host {target.host}" if jump else target.host
        return HostUnreachableError(f"{name}: cannot resolve host name{hint}")
    if isinstance(exc, ConnectionRefusedError):
        return HostUnreachableError(
            f"{dest}: connection refused (is sshd running, is the port right?)"
        )
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return HostUnreachableError(f"{dest}: connection timed out")
    if isinstance(exc, asyncssh.ConnectionLost):
        return HostUnreachableError(f"{dest}: connection lost")
    if isinstance(exc, asyncssh.DisconnectError):
        return HostUnreachableError(f"{dest}: disconnected: {exc.reason}")
    if isinstance(exc, asyncssh.ChannelOpenError):
        return HostUnreachableError(f"{dest}: the server refused a session channel: {exc.reason}")
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return HostRefusedError(f"{dest}: {exc.filename}: no such file")
    if isinstance(exc, OSError):
        return HostUnreachableError(f"{dest}: {exc.strerror or exc}")
    if isinstance(exc, ValueError):  # asyncssh's option and config validation
        return HostRefusedError(f"{dest}: {exc}")
    return HostUnreachableError(f"{dest}: {type(exc).__name__}: {exc}")


# ---- connections ------------------------------------------------------------------------


def _jump_hops(spec: str, options: SshOptions) -> list[SshTarget]:
    hops = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        hop_opts = replace(options, port=None, jump=None, user=None, identities=options.identities)
        text, port = part, None
        if not part.endswith("]") and part.count(":") == 1:
            text, _, p = part.partition(":")
            port = parse_port(p)
        hop = parse_host(text, replace(hop_opts, port=port))
        hops.append(hop)
    return hops


async def _connect_one(
    target: SshTarget,
    tunnel: asyncssh.SSHClientConnection | None,
    jump: bool = False,
    known_hosts: list[str] | None = None,
) -> tuple[asyncssh.SSHClientConnection, list[asyncssh.SSHClientConnection]]:
    """The connection to ``target`` (through ``tunnel`` or its jump hosts), and the hops.

    ``jump``: ``target`` is itself a jump host (for the messages); ``known_hosts``
    receives the files its host key was checked against."""
    o = target.options
    config: Any = list(o.config) if o.config else ()
    base: dict[str, Any] = {}
    if o.port is not None:
        base["port"] = o.port
    user = target.user or o.user
    if user:
        base["username"] = user
    check: HostKeyCheck | None = None
    hops: list[asyncssh.SSHClientConnection] = []
    try:
        probe = await asyncssh.SSHClientConnectionOptions.construct(
            config=config, host=target.host, **base
        )
        check = HostKeyCheck(
            known_hosts_files(o, probe.known_hosts), o.strict_host_key_checking, target.destination
        )
        if known_hosts is not None:
            known_hosts[:] = [str(f) for f in check.files]
        the_check = check
        kwargs: dict[str, Any] = dict(base)
        kwargs["config"] = config
        kwargs["known_hosts"] = check.known
        kwargs["client_factory"] = lambda: HostKeyClient(the_check)
        if o.identities:
            kwargs["client_keys"] = list(o.identities)
        kwargs["connect_timeout"] = (
            o.connect_timeout or probe.connect_timeout or DEFAULT_CONNECT_TIMEOUT
        )
        kwargs["keepalive_interval"] = (
            o.keepalive_interval or probe.keepalive_interval or DEFAULT_KEEPALIVE_INTERVAL
        )
        kwargs["keepalive_count_max"] = o.keepalive_count_max or DEFAULT_KEEPALIVE_COUNT_MAX
        if not probe.config.get("Ciphers"):
            kwargs["encryption_algs"] = FAST_CIPHERS
        hops_spec = o.jump
        if hops_spec is None and isinstance(probe.tunnel, str) and probe.tunnel.lower() != "none":
            hops_spec = probe.tunnel
        if tunnel is not None:
            kwargs["tunnel"] = tunnel
        elif hops_spec:
            for hop in _jump_hops(hops_spec, o):
                conn, _ = await _connect_one(hop, hops[-1] if hops else None, jump=True)
                hops.append(conn)
            kwargs["tunnel"] = hops[-1]
        conn = await asyncssh.connect(target.host, **kwargs)
    except BaseException as e:
        for h in reversed(hops):
            h.close()
        if isinstance(e, asyncio.CancelledError | KeyboardInterrupt):
            raise
        raise connect_error(e, target, check, jump) from None
    return conn, hops


class SshChannel:
    """The agent running over one SSH session channel."""

    def __init__(self, proc: asyncssh.SSHClientProcess[bytes]) -> None:
        self.proc = proc
        self.heard = Heard()
        self._stderr = asyncio.ensure_future(self._read_stderr())

    async def _read_stderr(self) -> bytes:
        try:
            return await self.proc.stderr.read()
        except (asyncssh.Error, OSError):
            return b""

    def frames(self, idle_s: float | None = None) -> AsyncIterator[Frame]:
        return read_frames(
            self.proc.stdout, lost=(asyncssh.Error, OSError), idle_s=idle_s, heard=self.heard
        )

    async def finish(self) -> tuple[int | None, str]:
        with contextlib.suppress(TimeoutError, asyncssh.Error, OSError):
            await asyncio.wait_for(self.proc.wait_closed(), 10)
        err = await self._stderr if self._stderr.done() else b""
        if not self._stderr.done():
            self._stderr.cancel()
        return self.proc.exit_status, err.decode("utf-8", "replace")

    def close(self) -> None:
        self.proc.close()


class SshHost(TargetNames):
    """One SSH host: a connection made on demand and remade after it drops."""

    def __init__(self, target: SshTarget) -> None:
        self.target = target
        self._conn: asyncssh.SSHClientConnection | None = None
        self._hops: list[asyncssh.SSHClientConnection] = []
        self._lock = asyncio.Lock()
        self.known_hosts: list[str] | None = None
        """The known_hosts files the host key was checked against (once connected): the
        ``ssh`` binary that carries the stream is given the same ones."""

    async def connect(self) -> asyncssh.SSHClientConnection:
        async with self._lock:
            if self._conn is not None and not self._conn.is_closed():
                return self._conn
            self.drop()
            files: list[str] = []
            self._conn, self._hops = await _connect_one(self.target, None, known_hosts=files)
            self.known_hosts = files
            return self._conn

    def drop(self) -> None:
        """Forget the connection (after it was lost); the next call reconnects."""
        for c in [self._conn, *reversed(self._hops)]:
            if c is not None:
                c.close()
        self._conn, self._hops = None, []

    async def close(self) -> None:
        conns = [c for c in [self._conn, *reversed(self._hops)] if c is not None]
        self.drop()
        for c in conns:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.wait_closed(), 5)

    def command(self) -> str:
        """The remote command line: constant but for the interpreter, which is quoted."""
        python = shlex.quote(self.python)
        return f"exec {python} -I -c {shlex.quote(BOOTSTRAP)} {AGENT_TAG}"  # -I: see agent_argv

    def exit_problem(self, status: int | None, stderr: str) -> tuple[bool, str] | None:
        """Connection problems surface as exceptions here, not as exit statuses."""
        return None

    async def start_agent(self, request: dict[str, Any]) -> SshChannel:
        conn = await self.connect()
        try:
            proc = await conn.create_process(self.command(), encoding=None)
        except (asyncssh.Error, OSError) as e:
            # other channels may share the connection: connect() remakes it once closed
            raise connect_error(e, self.target, None) from None
        try:
            proc.stdin.write(agent_payload(request))
            if not keeps_stdin(request):
                proc.stdin.write_eof()
        except BrokenPipeError:
            pass  # the command ended before its request went (no such --remote-python):
            # its exit status and stderr say why (SshChannel.finish, agent_error)
        except (asyncssh.Error, OSError) as e:
            raise connect_error(e, self.target, None) from None
        return SshChannel(proc)


# ---- streaming --------------------------------------------------------------------------


class StreamHost(Protocol):
    """What a stream needs of its host: :class:`SshHost` or ``openssh.OpenSshHost``."""

    @property
    def label(self) -> str: ...

    @property
    def python(self) -> str: ...

    async def start_agent(self, request: dict[str, Any]) -> AgentChannel: ...

    def exit_problem(self, status: int | None, stderr: str) -> tuple[bool, str] | None: ...


class SshTransport(Reconnecting):
    """Follows ``RUN_DIR/metrics.jsonl`` on an SSH host; yields chunks and link changes."""

    def __init__(
        self,
        host: StreamHost,
        run_dir: str | None,
        file: str = METRICS_FILE,
        backoff: Sequence[float] = BACKOFF,
        compress: bool = True,
        columns: bool = True,
        batch_s: float = 0.0,
    ) -> None:
        self.host = host
        self.run_dir = run_dir
        self.file = file
        self.backoff = tuple(backoff)
        self.compress = compress
        """Ask for the catch-up in zlib Z frames (an older agent sends D frames anyway)."""
        self.columns = columns
        """Ask for the training steps the run's companion file indexes as columns (C
        frames: agent/column_plan.py), with the compressed catch-up."""
        self.batch_s = batch_s
        """Appends within this long go out as one frame (``watch``: a look every few
        seconds needs no frame per write; 0, the monitor: each at once)."""
        self.reconnects = 0

    @property
    def label(self) -> str:
        return f"{self.host.label}:{self.run_dir or '(latest run)'}"

    def fork(self) -> SshTransport:
        """Another stream of the same run beside this one (its own position; the host's
        connection shared)."""
        return copy.copy(self)  # a stream's place is set when it starts

    async def glance(self, tail_rows: int, min_size: int) -> GlanceData | str:
        """The run at a glance (transport/glancing.py), or why there is none."""
        return await glance_remote(self.host, self.run_dir, self.file, tail_rows, min_size)

    async def stream(self, offset: int = 0) -> AsyncIterator[StreamEvent]:
        self._complete = offset  # just past the last complete line delivered
        self._identity: str | None = None
        self._vanished = False
        """The file was there and the agent found it gone (deleted, not yet back)."""
        async for event in self._reconnecting():
            yield event

    def _host_label(self) -> str:
        return self.host.label

    async def _start(self) -> AgentChannel:
        request: dict[str, Any] = {
            "op": "follow",
            "run_dir": self.run_dir,
            "file": self.file,
            "offset": self._complete,
            "identity": self._identity,
        }
        if self.batch_s > 0:
            request["batch_s"] = self.batch_s
        if self.compress:
            request["compress"] = COMPRESS_ZLIB
            if self.columns:
                request["columns"] = COLUMNS_WANTED
                request["samples"] = SAMPLES_KEPT
        return await self.host.start_agent(request)

    async def _events(self, channel: AgentChannel) -> AsyncIterator[StreamEvent]:
        async for frame in channel.frames(STREAM_IDLE_S):
            if isinstance(frame, DataFrame):
                off, data = frame.offset, frame.data
                if off < self._complete:
                    self._complete = off  # restarted (truncated or replaced)
                yield Chunk(off, data, span=frame.span)
                if frame.span >= 0:  # whole lines, as columns
                    self._complete = off + frame.span
                    continue
                nl = data.rfind(b"\n")
                if nl >= 0:
                    self._complete = off + nl + 1
            elif frame.event == "resolved":
                self.run_dir = str(frame.get("run_dir"))  # pinned for reconnects
            elif frame.event == "waiting":
                if self._identity is not None and not self._vanished:
                    self._vanished = True  # it was there: deleted (said once)
                    yield FileChanged("deleted", _number(frame.get("now")), self._complete)
                yield LinkChanged(Link.WAITING, f"waiting for {frame.get('path')}")
            elif frame.event == "disk":
                report = DiskSpace.of(frame.fields)
                if report is not None:
                    yield report
            elif frame.event == "opened":
                self._identity = str(frame.get("identity"))
                self._vanished = False
                self._connected()
                size, now = frame.get("size"), frame.get("now")
                yield LinkChanged(
                    Link.CONNECTED,
                    self.label,
                    size=size if isinstance(size, int) else None,
                    host_time=float(now) if isinstance(now, int | float) else None,
                )
            elif frame.event == "restarted":
                reason = "deleted" if self._vanished else str(frame.get("reason"))
                expected, size = frame.get("expected"), frame.get("size")
                yield FileChanged(
                    reason,
                    _number(frame.get("now")),
                    expected if isinstance(expected, int) else None,
                    size if isinstance(size, int) else None,
                )
                self._complete = 0
            elif frame.event == "error":
                yield LinkChanged(Link.REFUSED, str(frame.get("message")))
                raise StreamOver

    def _refusal(self, e: TargetError | ChannelLostError) -> bool | None:
        if isinstance(e, HostRefusedError | AgentFailedError):
            return True
        if isinstance(e, HostUnreachableError | ChannelLostError):
            return False
        return None  # not a link's problem: raised

    def _exit_problem(self, status: int | None, stderr: str) -> tuple[bool, str] | None:
        problem = self.host.exit_problem(status, stderr)
        if problem is None and status not in (None, 0):
            err = agent_error(self.host.label, self.host.python, status, stderr)
            return status == NOT_FOUND_STATUS, str(err)
        return problem


def _number(x: object) -> float | None:
    """A time in an agent's event (an older agent's has none)."""
    return float(x) if isinstance(x, int | float) and math.isfinite(x) else None
