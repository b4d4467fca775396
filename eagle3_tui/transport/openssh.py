"""The follow stream carried by the OpenSSH client, where one is installed.

asyncssh decrypts and parses every packet in Python: measured here, ~0.2 ms more
per record than ``ssh HOST tail -F`` (see benchmarks/bench_ssh.py). The stream
is the one latency-sensitive path, so when ``ssh`` is on PATH it runs the same
agent with the same request through ``ssh -T``: the user's own client, config,
agent, ControlMaster and known_hosts. Connecting first with asyncssh (host key
policy and its messages, authentication, finding the run) stays as it is, and
``ssh`` runs with ``BatchMode=yes`` and the same ``StrictHostKeyChecking``: it
never asks, and it accepts no key that known_hosts does not hold.

No textual, no asyncssh here.
"""

from __future__ import annotations

import asyncio
import shlex
import shutil
from typing import Any

from eagle3_tui.agent import BOOTSTRAP
from eagle3_tui.transport.channel import (
    AGENT_TAG,
    CONTROL_OPS,
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


def find_ssh() -> str | None:
    return shutil.which("ssh")


def _seconds(x: float) -> str:
    return str(max(1, round(x)))  # ssh takes whole seconds


def _quoted_paths(paths: tuple[str, ...]) -> str:
    return " ".join(f'"{p}"' if any(c.isspace() for c in p) else p for p in paths)


def remote_command(python: str) -> str:
    """The one command line the host runs: constant but for the quoted interpreter."""
    return f"exec {shlex.quote(python)} -c {shlex.quote(BOOTSTRAP)} {AGENT_TAG}"


def ssh_argv(target: SshTarget, ssh: str = "ssh") -> list[str]:
    """``ssh`` with this target's options, batch mode, and the agent's command line."""
    o = target.options
    argv = [ssh, "-T", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"]
    argv += ["-o", f"StrictHostKeyChecking={o.strict_host_key_checking}"]
    if o.config:
        argv += ["-F", o.config[0]]
    if o.port is not None:
        argv += ["-p", str(o.port)]
    user = target.user or o.user
    if user:
        argv += ["-l", user]
    for key in o.identities:
        argv += ["-i", key]
    if o.jump:
        argv += ["-J", o.jump]
    if o.known_hosts is not None:
        argv += ["-o", f"UserKnownHostsFile={_quoted_paths(o.known_hosts) or 'none'}"]
    argv += ["-o", f"ConnectTimeout={_seconds(o.connect_timeout or DEFAULT_CONNECT_TIMEOUT)}"]
    interval = o.keepalive_interval or DEFAULT_KEEPALIVE_INTERVAL
    argv += ["-o", f"ServerAliveInterval={_seconds(interval)}"]
    argv += ["-o", f"ServerAliveCountMax={o.keepalive_count_max or DEFAULT_KEEPALIVE_COUNT_MAX}"]
    return [*argv, "--", target.host, remote_command(o.remote_python)]


class OpenSshHost(TargetNames):
    """An SSH host reached through the ``ssh`` binary; one process per agent call."""

    def __init__(self, target: SshTarget, ssh: str = "ssh") -> None:
        self.target = target
        self.ssh = ssh

    async def start_agent(self, request: dict[str, Any]) -> LocalChannel:
        proc = await asyncio.create_subprocess_exec(
            *ssh_argv(self.target, self.ssh),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # no terminal: ssh never prompts
        )
        assert proc.stdin is not None
        proc.stdin.write(agent_payload(request))
        await proc.stdin.drain()
        if not keeps_stdin(request):
            proc.stdin.close()
        return LocalChannel(proc, finish_alone=request.get("op") in CONTROL_OPS)

    def exit_problem(self, status: int | None, stderr: str) -> tuple[bool, str] | None:
        """For an ssh that failed: (retrying cannot help, one line); None if it did not."""
        if status != SSH_FAILED:
            return None
        lines = [x.strip() for x in stderr.strip().splitlines() if x.strip()]
        last = lines[-1] if lines else "ssh failed"
        refused = any(r in stderr for r in REFUSALS)
        return refused, f"{self.label}: ssh: {last}"

    async def close(self) -> None:
        return None
