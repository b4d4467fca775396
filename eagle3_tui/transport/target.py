"""Targets as users write them: ``RUN_DIR``, ``[USER@]HOST[:RUN_DIR]``, and ssh's options.

The rules follow scp: a colon before any slash makes a remote target
(``host:runs/x``, ``user@host:``, ``user@[::1]:/runs/x``); a path that exists
here, or that starts with ``/``, ``./``, ``../`` or ``~``, or contains a slash
and no such colon, is local; a bare word that is not a local path is a host
(``eagle3-tui gpu-box`` follows the latest run registered there). ``HOST:job/ID`` (or
``job/ID`` on this machine, where no such path exists) names a Slurm job through the
host where Slurm answers (a login node).

No textual, no asyncssh here.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from eagle3_tui.transport.base import TargetError

STRICT_VALUES = {"yes": "yes", "ask": "yes", "accept-new": "accept-new"}
DEFAULT_CONNECT_TIMEOUT = 15.0
DEFAULT_KEEPALIVE_INTERVAL = 5.0
DEFAULT_KEEPALIVE_COUNT_MAX = 3


@dataclass(frozen=True)
class SshOptions:
    """What ``-p``, ``-i``, ``-J``, ``-F``, ``-l`` and ``-o KEY=VALUE`` set.

    ``None`` or empty means: whatever ``~/.ssh/config`` (or ``-F``) says for the
    host, then ssh's default.
    """

    port: int | None = None
    user: str | None = None
    identities: tuple[str, ...] = ()
    jump: str | None = None
    config: tuple[str, ...] = ()
    strict_host_key_checking: str = "yes"
    known_hosts: tuple[str, ...] | None = None
    connect_timeout: float | None = None
    keepalive_interval: float | None = None
    keepalive_count_max: int | None = None
    remote_python: str = "python3"
    ssh_options: tuple[str, ...] = field(default=(), compare=False)

    def with_option(self, text: str) -> SshOptions:
        """These options plus one ``-o KEY=VALUE`` (or ``KEY VALUE``)."""
        key, sep, value = text.partition("=")
        if not sep:
            key, _, value = text.strip().partition(" ")
        key, value = key.strip(), value.strip()
        lower = key.lower()
        if not key or not value:
            raise TargetError(f"-o {text!r}: expected KEY=VALUE")
        if lower == "stricthostkeychecking":
            strict = STRICT_VALUES.get(value.lower())
            if strict is None:
                raise TargetError(
                    f"-o StrictHostKeyChecking={value}: use yes or accept-new "
                    "(a changed host key is never accepted)"
                )
            return replace(self, strict_host_key_checking=strict)
        if lower == "userknownhostsfile":
            return replace(self, known_hosts=tuple(value.split()))
        if lower == "port":
            return replace(self, port=parse_port(value))
        if lower == "user":
            return replace(self, user=value)
        if lower == "identityfile":
            return replace(self, identities=(*self.identities, value))
        if lower == "proxyjump":
            return replace(self, jump=value)
        if lower == "connecttimeout":
            return replace(self, connect_timeout=_positive(key, value))
        if lower == "serveraliveinterval":
            return replace(self, keepalive_interval=_positive(key, value))
        if lower == "serveralivecountmax":
            return replace(self, keepalive_count_max=int(_positive(key, value)))
        if lower in ("batchmode", "identitiesonly", "loglevel", "requesttty"):
            return self  # always batch mode, never a tty: nothing to change
        raise TargetError(
            f"-o {key}: not supported here (supported: StrictHostKeyChecking, "
            "UserKnownHostsFile, Port, User, IdentityFile, ProxyJump, ConnectTimeout, "
            "ServerAliveInterval, ServerAliveCountMax); put it in ~/.ssh/config"
        )


def _positive(key: str, value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        x = -1.0
    if x <= 0:
        raise TargetError(f"-o {key}={value}: expected a positive number")
    return x


def parse_port(value: str | int) -> int:
    try:
        port = int(value)
    except ValueError:
        port = 0
    if not 0 < port < 65536:
        raise TargetError(f"{value}: not a port number")
    return port


JOB_PATH = re.compile(r"^job/([0-9]+(?:_[0-9]+)?)$")
"""A Slurm job as a target's path: ``job/1234`` (an array task: ``job/1234_7``)."""


@dataclass(frozen=True)
class LocalTarget:
    run_dir: Path
    job: str | None = None
    """A Slurm job, asked of this machine's Slurm (``job/ID``)."""

    @property
    def label(self) -> str:
        return f"job/{self.job}" if self.job else str(self.run_dir)


@dataclass(frozen=True)
class SshTarget:
    host: str
    user: str | None = None
    run_dir: str | None = None
    options: SshOptions = SshOptions()
    job: str | None = None
    """A Slurm job, asked of this host's Slurm (``HOST:job/ID``): ``run_dir`` is None."""

    @property
    def destination(self) -> str:
        """``user@host`` as written (the host may be an alias from ~/.ssh/config)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.user}@{host}" if self.user else host

    @property
    def label(self) -> str:
        if self.job:
            return f"{self.destination}:job/{self.job}"
        return f"{self.destination}:{self.run_dir or '(latest run)'}"

    def with_run_dir(self, run_dir: str) -> SshTarget:
        return replace(self, run_dir=run_dir)


Target = LocalTarget | SshTarget


def _check_host(host: str, text: str) -> str:
    if not host:
        raise TargetError(f"{text!r}: no host name")
    if host.startswith("-") or any(c.isspace() or not c.isprintable() for c in host):
        raise TargetError(f"{text!r}: not a host name")
    return host


def parse_host(text: str, options: SshOptions | None = None) -> SshTarget:
    """``[USER@]HOST`` (or ``[USER@][V6ADDR]``) without a run directory."""
    user, at, host = text.rpartition("@")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if at and not user:
        raise TargetError(f"{text!r}: empty user name")
    return SshTarget(_check_host(host, text), user or None, None, options or SshOptions())


def _looks_local(text: str) -> bool:
    return text.startswith(("/", "./", "../", "~")) or text in (".", "..")


def parse_target(text: str, options: SshOptions | None = None) -> Target:
    """A local run directory or ``[USER@]HOST[:RUN_DIR]`` (see the module's rules)."""
    if not text:
        raise TargetError("empty target")
    if _looks_local(text) or os.path.exists(text):
        return LocalTarget(Path(text))
    job = JOB_PATH.match(text)
    if job:
        return LocalTarget(Path("."), job.group(1))
    rest = text
    user = None
    at = rest.find("@")
    colon = rest.find(":")
    slash = rest.find("/")
    bracket = rest.find("[")
    remote = (colon >= 0 and (slash < 0 or colon < slash)) or (
        bracket >= 0 and (slash < 0 or bracket < slash)
    )
    if not remote:
        if slash >= 0:
            return LocalTarget(Path(text))  # a missing local path: check_run_dir says so
        return parse_host(text, options)
    if 0 <= at < (colon if colon >= 0 else len(rest)) and (bracket < 0 or at < bracket):
        user, rest = rest[:at], rest[at + 1 :]
        if not user:
            raise TargetError(f"{text!r}: empty user name")
    if rest.startswith("["):
        end = rest.find("]")
        if end < 0:
            raise TargetError(f"{text!r}: unclosed [ in the host")
        host, after = rest[1:end], rest[end + 1 :]
        if after and not after.startswith(":"):
            raise TargetError(f"{text!r}: expected :RUN_DIR after [{host}]")
        path = after[1:] if after else ""
    else:
        host, _, path = rest.partition(":")
    job = JOB_PATH.match(path)
    if job:
        return SshTarget(_check_host(host, text), user, None, options or SshOptions(), job.group(1))
    return SshTarget(_check_host(host, text), user, path or None, options or SshOptions())


class TargetNames:
    """What a host reached through an :class:`SshTarget` is called in messages, and the
    Python that runs the agent there (shared by the asyncssh and the ssh-binary host)."""

    target: SshTarget

    @property
    def label(self) -> str:
        return self.target.destination

    @property
    def prefix(self) -> str:
        """What goes before a path from this host in a message."""
        return f"{self.target.destination}:"

    @property
    def python(self) -> str:
        return self.target.options.remote_python
