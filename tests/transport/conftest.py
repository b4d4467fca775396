"""Fixtures for the transport tests: one real sshd per session, and helpers to use it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from eagle3_tui.transport.target import SshOptions, SshTarget
from tests.conftest import need
from tests.transport.sshd import ALIAS, Sshd, have_pid_namespaces, have_sshd


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A real OpenSSH sshd on 127.0.0.1 with its own keys (see tests/transport/sshd.py)."""
    need(have_sshd(), "OpenSSH sshd is not installed (apt-get install openssh-server)")
    need(os.geteuid() == 0, "the sshd fixture runs as root (privilege separation)")
    server = Sshd(tmp_path_factory.mktemp("sshd")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def private_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A host of its own: a real sshd in new PID and mount namespaces, whose sessions see
    only the processes started through it. What depends on the host's live trainings
    ("HOST" alone picks the user's live training) is tested here: other tests and other
    users' trainings run on this machine at the same time, but not on this host."""
    need(have_sshd(), "OpenSSH sshd is not installed (apt-get install openssh-server)")
    need(os.geteuid() == 0, "the sshd fixture runs as root (privilege separation)")
    need(have_pid_namespaces(), "unshare --pid --mount-proc is not permitted here")
    server = Sshd(tmp_path_factory.mktemp("private-sshd"), private=True).start()
    yield server
    server.stop()


def ssh_target(sshd: Sshd, run_dir: str | Path | None = None, **opts: object) -> SshTarget:
    """The fixture's host through its ssh config alias (as a user's ~/.ssh/config would)."""
    options = SshOptions(config=(str(sshd.ssh_config),), **opts)  # type: ignore[arg-type]
    return SshTarget(ALIAS, None, None if run_dir is None else str(run_dir), options)


def cli(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``eagle3-tui ARGS`` in a subprocess, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "eagle3_tui", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


def remote_env(sshd: Sshd) -> dict[str, str]:
    """The environment of a process started "on the host": the same per-user index."""
    return dict(os.environ, XDG_STATE_HOME=str(sshd.state_home), PYTHONUNBUFFERED="1")
