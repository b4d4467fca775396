"""The follow stream carried by the OpenSSH client, where one is installed.

asyncssh decrypts and parses every packet in Python: measured here, ~0.2 ms more
per record than ``ssh HOST tail -F`` (see benchmarks/bench_ssh.py). The stream
is the one latency-sensitive path, so when ``ssh`` is on PATH it runs the same
agent with the same request through ``ssh -T``: the user's own client, config,
agent, ControlMaster and known_hosts. Connecting first with asyncssh (host key
policy and its messages, authentication, finding the run) stays as it is, and
``ssh`` runs with ``BatchMode=yes`` and the same ``StrictHostKeyChecking``: it
never asks, and it accepts no key that known_hosts does not hold.

Both read the same configuration: asyncssh reads ``-F FILE`` or ``$HOME/.ssh/config``
(never ``/etc/ssh/ssh_config``), while ``ssh`` would read the home directory of the
password database and the system file; so ``ssh`` is given that same file (``-F``,
``-F none`` when there is none) and the known_hosts files the asyncssh connection
checked the host key against. When ``ssh`` fails, its own message is shown (``Could
not resolve hostname …``) and the stream retries, unless it was a refusal that no
retry can change (authentication, host key, a bad configuration).

No textual, no asyncssh here.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

from eagle3_tui.agent import BOOTSTRAP
from eagle3_tui.transport.channel import (
    AGENT_TAG,
    CONTROL_OPS,
    AgentFailedError,
    LocalChannel,
    agent_payload,
    keeps_stdin,
)
from eagle3_tui.transport.target import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_KEEPALIVE_COUNT_MAX,
    DEFAULT_KEEPALIVE_INTERVAL,
    SshTarget,
    TargetNames,
)

SSH_FAILED = 255  # ssh's own exit status for a connection or authentication failure
REFUSALS = (
    "Host key verification failed",
    "REMOTE HOST IDENTIFICATION HAS CHANGED",
    "Permission denied",
    "No such file or directory",
    "Bad configuration option",
)
"""ssh's messages for what a retry cannot change: authentication, the host key, a
missing or bad configuration file. Anything else (a name that does not resolve, a
refused or timed-out connection) is retried as after any disconnect."""


def find_ssh() -> str | None:
    return shutil.which("ssh")


def _seconds(x: float) -> str:
    return str(max(1, round(x)))  # ssh takes whole seconds


def _quoted_paths(paths: tuple[str, ...]) -> str:
    return " ".join(f'"{p}"' if any(c.isspace() for c in p) else p for p in paths)


def remote_command(python: str) -> str:
    """The one command line the host runs: constant but for the quoted interpreter
    (``-I``: isolated, as ``channel.agent_argv`` says)."""
    return f"exec {shlex.quote(python)} -I -c {shlex.quote(BOOTSTRAP)} {AGENT_TAG}"


def config_file(config: Sequence[str]) -> str:
    """The configuration asyncssh reads for these options: ``-F FILE``, else
    ``$HOME/.ssh/config`` when readable, else none (``ssh -F none``)."""
    if config:
        return config[0]
    default = os.path.expanduser(os.path.join("~", ".ssh", "config"))
    return default if os.access(default, os.R_OK) else "none"


def ssh_argv(
    target: SshTarget, ssh: str = "ssh", known_hosts: Sequence[str] | None = None
) -> list[str]:
    """``ssh`` with this target's options, batch mode, and the agent's command line;
    ``known_hosts``: the files the asyncssh connection checked the host key against."""
    o = target.options
    argv = [ssh, "-T", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"]
    argv += ["-o", f"StrictHostKeyChecking={o.strict_host_key_checking}"]
    argv += ["-F", config_file(o.config)]
    if o.port is not None:
        argv += ["-p", str(o.port)]
    user = target.user or o.user
    if user:
        argv += ["-l", user]
    for key in o.identities:
        argv += ["-i", key]
    if o.jump:
        argv += ["-J", o.jump]
    files = o.known_hosts if o.known_hosts is not None else known_hosts
    if files is not None:
        argv += ["-o", f"UserKnownHostsFile={_quoted_paths(tuple(files)) or 'none'}"]
    argv += ["-o", f"ConnectTimeout={_seconds(o.connect_timeout or DEFAULT_CONNECT_TIMEOUT)}"]
    interval = o.keepalive_interval or DEFAULT_KEEPALIVE_INTERVAL
    argv += ["-o", f"ServerAliveInterval={_seconds(interval)}"]
    argv += ["-o", f"ServerAliveCountMax={o.keepalive_count_max or DEFAULT_KEEPALIVE_COUNT_MAX}"]
    return [*argv, "--", target.host, remote_command(o.remote_python)]


class OpenSshHost(TargetNames):
    """An SSH host reached through the ``ssh`` binary; one process per agent call."""

    def __init__(
        self, target: SshTarget, ssh: str = "ssh", known_hosts: Sequence[str] | None = None
    ) -> None:
        self.target = target
        self.ssh = ssh
        self.known_hosts = known_hosts
        """The known_hosts files of the asyncssh connection (None: the options' or ssh's)."""

    async def start_agent(self, request: dict[str, Any]) -> LocalChannel:
        try:
            proc = await asyncio.create_subprocess_exec(
                *ssh_argv(self.target, self.ssh, self.known_hosts),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # no terminal: ssh never prompts
            )
        except OSError as e:
            raise AgentFailedError(f"{self.label}: cannot run {self.ssh}: {e.strerror or e}") from e
        assert proc.stdin is not None
        try:
            proc.stdin.write(agent_payload(request))
            await proc.stdin.drain()
        except (ConnectionResetError, BrokenPipeError):
            pass  # ssh exited at once (a name that does not resolve...): its status says why
        if not keeps_stdin(request):
            proc.stdin.close()
        return LocalChannel(proc, finish_alone=request.get("op") in CONTROL_OPS)

    def exit_problem(self, status: int | None, stderr: str) -> tuple[bool, str] | None:
        """For an ssh that failed: (retrying cannot help, ssh's own message on one line);
        None if it did not."""
        if status != SSH_FAILED:
            return None
        lines = [x.strip() for x in stderr.strip().splitlines() if x.strip()]
        last = lines[-1] if lines else "ssh failed (exit status 255)"
        last = last.removeprefix("ssh: ")
        refused = any(r in stderr for r in REFUSALS)
        if "Host key verification failed" in stderr:  # the key changed since it connected
            o = self.target.options
            known = o.known_hosts if o.known_hosts is not None else self.known_hosts
            files = ", ".join(known or ()) or "known_hosts"
            host = self._known_as()
            remove = f"ssh-keygen -R {shlex.quote(host)}"
            if known:  # a file of its own: without -f, ssh-keygen edits ~/.ssh/known_hosts
                remove += f" -f {shlex.quote(str(next(iter(known))))}"
            return True, (
                f"{self.label}: ssh: Host key verification failed: the host's key no longer "
                f"matches {files}, as it did when this session connected. Someone may be "
                f"intercepting the connection; if the change is expected, remove the old key "
                f"({remove}) and connect again"
            )
        return refused, f"{self.label}: ssh: {last}"

    def _known_as(self) -> str:
        """The name known_hosts holds the host's key under (``[name]:port`` off port 22),
        as ``ssh -G`` resolves the target (an alias of the configuration is not it)."""
        o = self.target.options
        name, port = self.target.host, o.port
        argv = [self.ssh, "-G", "-F", config_file(o.config)]
        if port is not None:
            argv += ["-p", str(port)]
        try:
            out = subprocess.run(
                [*argv, "--", name], capture_output=True, text=True, timeout=5, check=False
            ).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        for line in out.splitlines():
            key, _, value = line.partition(" ")
            if key == "hostname" and value:
                name = value
            elif key == "port" and value.isdigit():
                port = int(value)
        return name if port in (None, 22) else f"[{name}]:{port}"

    async def close(self) -> None:
        return None
