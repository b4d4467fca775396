"""Talking to the agent: the request, the frames it answers with, and where it runs.

A host (this machine, or an SSH host in :mod:`eagle3_tui.transport.ssh`) starts
:mod:`eagle3_tui.agent` and returns an :class:`AgentChannel`; the
caller reads :class:`DataFrame` and :class:`Event` frames from it. Locally the
agent is a ``python -c BOOTSTRAP`` subprocess, so local and remote control take
the same code path.

No textual, no asyncssh here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

from eagle3_tui.agent import BOOTSTRAP
from eagle3_tui.agent.names import EV_ERROR, FINAL_EVENTS, PROTOCOL, TICK_S
from eagle3_tui.transport.base import TargetError
from eagle3_tui.transport.bundle import LEAN_MISS, LEAN_MISS_STATUS, bundle, lean_bundle
from eagle3_tui.transport.replies import ErrorKind

AGENT_TAG = "eagle3-tui-agent"  # argv[1] of the agent: visible in ps
CONTROL_OPS = ("kill", "resume", "attach")  # finish on the host when the client goes away
STREAMING_OPS = ("follow", "observe")  # run until the client closes their stdin
MAX_FRAME = 64 * 1024 * 1024
READ_SIZE = 1 << 20
STREAM_IDLE_S = 4 * TICK_S
"""How long a stream (follow, observe) waits for a byte before its channel is lost:
under the shortest quiet limit (30 s), so a frozen agent is a link down, never a run
called stalled for the records it no longer sends."""


def keeps_stdin(request: dict[str, Any]) -> bool:
    """Whether the agent's stdin stays open: a stream ends when the client closes it (a
    one-shot observation, ``until_s``, ends by itself)."""
    return request.get("op") in STREAMING_OPS and request.get("until_s") is None


_LEAN: ContextVar[bool] = ContextVar("eagle3_tui_lean_bundle", default=False)
"""Set by :func:`call_agent` around a host's ``start_agent``: send the lean bundle."""
_CACHED: dict[str, bool] = {}
"""By host label: True where an agent this process started there ran from the whole
bundle (so the host's code cache holds its modules); False where a lean bundle found no
cache there (the host keeps none: every call sends the whole bundle)."""


def agent_payload(request: dict[str, Any]) -> bytes:
    """What the agent reads on stdin: the bundle (its loader and sources; the loader
    alone where :func:`call_agent` found the host's cache holds the sources), the request."""
    req = json.dumps({"protocol": PROTOCOL, **request}, separators=(",", ":"))
    return (lean_bundle() if _LEAN.get() else bundle()) + req.encode() + b"\n"


@dataclass(frozen=True, slots=True)
class DataFrame:
    offset: int
    data: bytes
    span: int = -1
    """-1: ``data`` is the file's bytes at ``offset``. Otherwise ``data`` is a columns
    payload (a ``C`` frame, agent/column_plan.py) standing for ``span`` bytes at ``offset``:
    feed it with ``Run.feed(offset, data, stream, span)``, never as text."""


@dataclass(frozen=True, slots=True)
class Event:
    event: str
    fields: dict[str, Any]

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)


Frame = DataFrame | Event


class Reader(Protocol):
    """What asyncio's StreamReader and asyncssh's SSHReader both offer."""

    def read(self, n: int = -1) -> Awaitable[bytes]: ...


class ChannelLostError(Exception):
    """The agent's output ended without a clean end (connection dropped, agent died)."""


class AgentSilentError(ChannelLostError):
    """Not a byte from a stream's agent for its idle limit: the client let go of it (its
    channel's exit then says only that it was closed)."""


class FrameParser:
    """Cuts frames out of the agent's output, however it is split into reads.

    A ``Z`` frame (compressed, see :mod:`eagle3_tui.agent.frames`) becomes the
    :class:`DataFrame` of the bytes it packs, once it is whole: a frame torn by a
    disconnect is never delivered, so the resume offset stays exact.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pending: tuple[int, int, int] | None = None
        """A data frame's (offset, bytes to read, length unpacked: -1 for a D frame,
        -2 - the bytes it stands for for a C frame)."""

    @property
    def partial(self) -> bool:
        """Whether a frame has started but not ended."""
        return bool(self._buf) or self._pending is not None

    def feed(self, data: bytes) -> list[Frame]:
        buf = self._buf
        buf += data
        out: list[Frame] = []
        pos = 0
        while True:
            if self._pending is not None:
                offset, length, unpacked = self._pending
                if len(buf) - pos < length:
                    break
                data = bytes(buf[pos : pos + length])
                if unpacked >= 0:
                    data = _inflate(data, unpacked, offset)
                elif unpacked < -1:  # a C frame: -2 - the bytes it stands for
                    out.append(DataFrame(offset, data, -2 - unpacked))
                    pos += length
                    self._pending = None
                    continue
                out.append(DataFrame(offset, data))
                pos += length
                self._pending = None
                continue
            nl = buf.find(b"\n", pos)
            if nl < 0:
                break
            header = bytes(buf[pos:nl])
            pos = nl + 1
            if header.startswith(b"D "):
                try:
                    _, off, n = header.split()
                    offset, length = int(off), int(n)
                except ValueError:
                    continue
                if length < 0 or length > MAX_FRAME:
                    raise ChannelLostError(f"bad frame length {length}")
                self._pending = (offset, length, -1)
            elif header.startswith(b"Z "):
                try:
                    _, off, n, zn = header.split()
                    offset, unpacked, length = int(off), int(n), int(zn)
                except ValueError:
                    continue
                if not (0 <= length <= MAX_FRAME and 0 <= unpacked <= MAX_FRAME):
                    raise ChannelLostError(f"bad frame length {length} ({unpacked} unpacked)")
                self._pending = (offset, length, unpacked)
            elif header.startswith(b"C "):
                try:
                    _, off, n, size = header.split()
                    offset, span, length = int(off), int(n), int(size)
                except ValueError:
                    continue
                if not (0 <= length <= MAX_FRAME and span >= 0 and offset >= 0):
                    raise ChannelLostError(f"bad columns frame length {length} ({span} bytes)")
                self._pending = (offset, length, -2 - span)
            elif header.startswith(b"J "):
                try:
                    obj = json.loads(header[2:])
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    out.append(Event(str(obj.pop("event", "")), obj))
            # anything else: a line a shell start-up file printed; not ours
        del buf[:pos]
        return out


def _inflate(packed: bytes, length: int, offset: int) -> bytes:
    """A Z frame's bytes, exactly ``length`` of them (never more: a frame that would
    inflate past its length is refused without inflating it all)."""
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(packed, length + 1)
    except zlib.error as e:
        raise ChannelLostError(f"bad compressed frame at offset {offset}: {e}") from None
    if len(data) != length or not inflater.eof or inflater.unused_data:
        raise ChannelLostError(
            f"bad compressed frame at offset {offset}: not {length} bytes of one zlib stream"
        )
    return data


class Heard:
    """When the last byte of a channel came (``time.monotonic``): a link found down later
    (a keepalive's timeout, a frozen agent) went down then."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last = time.monotonic()


async def read_frames(
    reader: Reader,
    lost: tuple[type[BaseException], ...] = (),
    idle_s: float | None = None,
    heard: Heard | None = None,
) -> AsyncIterator[Frame]:
    """Frames until the agent's output ends.

    Raises :class:`ChannelLostError` when the output ends inside a frame (a torn
    frame is never delivered), with one of ``lost`` (the transport's errors), or, with
    ``idle_s``, when not one byte came for that long: a stream's agent says ``tick``
    every :data:`TICK_S` (a long frame on a slow link is bytes arriving), so its
    silence means it is stopped or frozen, or the link is, whatever the connection says.
    """
    errors: tuple[type[BaseException], ...] = (ConnectionError, *lost)
    parser = FrameParser()
    while True:
        try:
            if idle_s is None:
                data = await reader.read(READ_SIZE)
            else:
                data = await asyncio.wait_for(reader.read(READ_SIZE), idle_s)
        except TimeoutError:
            raise AgentSilentError(
                f"not a byte from the host's agent for {idle_s:.0f} s (it says something "
                f"every {TICK_S:.0f} s): the agent is stopped or frozen, or the link is"
            ) from None
        except errors as e:
            raise ChannelLostError(str(e) or type(e).__name__) from e
        if heard is not None:
            heard.last = time.monotonic()
        if not data:
            if parser.partial:
                raise ChannelLostError("the output ended inside a frame")
            return
        for frame in parser.feed(data):
            yield frame


class AgentChannel(Protocol):
    """A running agent: its frames, then its exit status and stderr."""

    def frames(self, idle_s: float | None = None) -> AsyncIterator[Frame]: ...

    async def finish(self) -> tuple[int | None, str]: ...

    def close(self) -> None: ...


class AgentFailedError(TargetError):
    """The agent could not run (no python3 on the host, a crash)."""


class AgentAnswerError(TargetError):
    """The agent's one-line answer to a request it could not serve, with its kind
    (:class:`~eagle3_tui.transport.replies.ErrorKind`: ``REFUSED``, ``MISSING``,
    ``NO_MANIFEST``, ``GONE``...): callers branch on the kind, never on the text."""

    def __init__(self, message: str, kind: ErrorKind) -> None:
        super().__init__(message)
        self.kind = kind


NOT_FOUND_STATUS = 127
"""The shell's exit status for a command it cannot find (``--remote-python``)."""


def agent_error(host: str, python: str, status: int | None, stderr: str) -> AgentFailedError:
    tail = " ".join(stderr.strip().splitlines()[-3:])[:300]
    if status == NOT_FOUND_STATUS:
        return AgentFailedError(
            f"{host}: cannot start the agent: {python} not found ({tail}); use --remote-python PATH"
        )
    return AgentFailedError(
        f"{host}: the agent failed (exit status {status}): {tail or 'no output'}"
    )


TERMINATE_AFTER_S = 1.0  # a local agent still running this long after close() is terminated


class LocalChannel:
    """The agent as a subprocess of this process."""

    def __init__(self, proc: asyncio.subprocess.Process, *, finish_alone: bool = False) -> None:
        self.proc = proc
        self.finish_alone = finish_alone
        self.heard = Heard()
        assert proc.stderr is not None
        self._stderr = asyncio.ensure_future(proc.stderr.read())

    def frames(self, idle_s: float | None = None) -> AsyncIterator[Frame]:
        assert self.proc.stdout is not None
        return read_frames(self.proc.stdout, idle_s=idle_s, heard=self.heard)

    async def finish(self) -> tuple[int | None, str]:
        status = await self.proc.wait()
        err = await self._stderr
        return status, err.decode("utf-8", "replace")

    def close(self) -> None:
        """Stop reading; a follow or read ends, a kill or resume finishes its work.

        Closing stdin ends the agent by itself; it is terminated only if still running a
        moment later. Terminating at once would race its own exit: ``Popen.terminate``
        reaps an exited child before asyncio's child watcher sees it, which then prints
        "Unknown child process pid N" on the user's terminal."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        if self.proc.returncode is None and not self.finish_alone:
            try:
                asyncio.get_running_loop().call_later(TERMINATE_AFTER_S, self._terminate)
            except RuntimeError:  # no loop running: nothing will reap it anyway
                self._terminate()

    def _terminate(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()


def agent_argv(python: str) -> list[str]:
    """The agent's command line: isolated (``-I``: neither the working directory nor
    ``PYTHON*`` variables reach its ``sys.path``; a ``json.py`` another user left in the
    directory eagle3-tui was started from is never imported, as root or not)."""
    return [python, "-I", "-c", BOOTSTRAP, AGENT_TAG]


def absolute_paths(request: dict[str, Any]) -> dict[str, Any]:
    """``request`` with a relative ``run_dir`` made absolute here: the local agent runs
    in ``/``, not in the caller's directory (``~`` is the agent's to expand)."""
    run_dir = request.get("run_dir")
    if isinstance(run_dir, str) and run_dir and not run_dir.startswith(("/", "~")):
        return {**request, "run_dir": os.path.abspath(run_dir)}
    return request


class LocalHost:
    """This machine, reached without SSH."""

    label = "local"
    prefix = ""

    async def start_agent(self, request: dict[str, Any]) -> LocalChannel:
        proc = await asyncio.create_subprocess_exec(
            *agent_argv(sys.executable),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # a Ctrl+C here must not cut a kill short there
            cwd="/",  # nothing of the caller's directory: its paths are made absolute
        )
        assert proc.stdin is not None
        proc.stdin.write(agent_payload(absolute_paths(request)))
        await proc.stdin.drain()
        if not keeps_stdin(request):
            proc.stdin.close()
        return LocalChannel(proc, finish_alone=request.get("op") in CONTROL_OPS)

    async def close(self) -> None:
        return None


class Host(Protocol):
    """Where the agent runs: :class:`LocalHost` or ``ssh.SshHost``."""

    @property
    def label(self) -> str: ...

    @property
    def prefix(self) -> str: ...

    async def start_agent(self, request: dict[str, Any]) -> AgentChannel: ...

    async def close(self) -> None: ...


ProgressCallback = Callable[[Event], None]


async def call_agent(
    host: Host,
    request: dict[str, Any],
    on_progress: ProgressCallback | None = None,
    on_data: Callable[[DataFrame], object] | None = None,
    python: str = "python3",
) -> Event:
    """Run one agent operation to its end; returns its ``result`` (or ``eof``) event.

    An ``error`` event becomes an :class:`AgentAnswerError`: the agent's message and
    its kind.

    Once an agent started from the whole bundle has answered on a host, the calls after
    it there send the loader alone (~250 KB less each: its sources are in the host's
    code cache, transport/bundle.py); where the cache turns out not to hold them (the
    loader then does nothing and says so), the call is made again with the whole bundle,
    and so is every later one on that host.
    """
    lean = request.get("op") not in STREAMING_OPS and _CACHED.get(host.label) is True
    token = _LEAN.set(lean)
    try:
        channel = await host.start_agent(request)
    finally:
        _LEAN.reset(token)
    final: Event | None = None
    status: int | None = None
    stderr = ""
    answered = False
    try:
        async for frame in channel.frames():
            answered = True
            if isinstance(frame, DataFrame):
                if on_data is not None:
                    on_data(frame)
            elif frame.event in FINAL_EVENTS:
                final = frame
            elif frame.event == EV_ERROR:
                message = str(frame.get("message", "the agent refused"))
                if host.prefix:  # name the host: "gpu-box:/runs/x: no such run directory"
                    sep = "" if message.startswith("/") else " "
                    message = f"{host.prefix}{sep}{message}"
                raise AgentAnswerError(message, ErrorKind.of(frame.get("kind")))
            elif on_progress is not None:
                on_progress(frame)
    except ChannelLostError as e:
        raise TargetError(
            f"{host.label}: connection lost during {request.get('op')} ({e}); the host finishes "
            "it anyway: run it again to see where it stands"
        ) from None
    finally:
        channel.close()
        status, stderr = await channel.finish()
        if answered and not lean:
            _CACHED.setdefault(host.label, True)
    if final is None:
        if lean and not answered and status == LEAN_MISS_STATUS and LEAN_MISS in stderr:
            _CACHED[host.label] = False
            return await call_agent(host, request, on_progress, on_data, python)
        raise agent_error(host.label, python, status, stderr)
    return final
