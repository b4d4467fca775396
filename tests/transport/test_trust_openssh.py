"""When the ``ssh`` binary fails, its own message and a retry; and the stream's ``ssh``
reads the configuration the asyncssh connection read (issue 13, item 11)."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from eagle3_tui.transport.base import Link, LinkChanged
from eagle3_tui.transport.openssh import OpenSshHost, find_ssh, ssh_argv
from eagle3_tui.transport.ssh import SshHost, SshTransport
from eagle3_tui.transport.target import SshOptions, SshTarget
from tests.conftest import need
from tests.records import Lines
from tests.transport.sshd import ALIAS, Sshd


async def _links(transport: SshTransport, until: int, timeout: float = 60.0) -> list[LinkChanged]:
    """The stream's link changes until ``until`` of them came (or it ended)."""
    seen: list[LinkChanged] = []

    async def collect() -> None:
        async for event in transport.stream(0):
            if isinstance(event, LinkChanged):
                seen.append(event)
                if len(seen) >= until:
                    return

    await asyncio.wait_for(collect(), timeout)
    return seen


async def test_ssh_that_cannot_resolve_the_host_says_so_and_retries(tmp_path: Path) -> None:
    need(find_ssh() is not None, "the OpenSSH client (ssh) is not installed")
    config = tmp_path / "empty_config"
    config.write_text("")
    target = SshTarget("no-such-host.invalid", None, "/runs/x", SshOptions(config=(str(config),)))
    transport = SshTransport(OpenSshHost(target), "/runs/x", backoff=(0.05, 0.1))
    links = await _links(transport, until=4)
    assert [x.link for x in links] == [Link.CONNECTING, *[Link.RECONNECTING] * 3]
    # each wait said, then the attempt itself (no "in 1 s" while ssh tries for 15 s)
    assert [x.retry_in for x in links[1:]] == [0.05, None, 0.1], links
    for link in links[1:]:
        assert "Could not resolve hostname no-such-host.invalid" in link.detail
        assert "ssh: ssh:" not in link.detail


async def test_an_ssh_that_exits_before_reading_its_input_is_retried(tmp_path: Path) -> None:
    """ssh fails before it reads what the agent needs (more than a pipe holds): writing
    it fails with "Connection lost". That is ssh's failure, said in ssh's words."""
    fake = tmp_path / "ssh"
    fake.write_text(
        "#!/bin/sh\n"
        'echo "ssh: Could not resolve hostname gpu-box: Temporary failure in name '
        'resolution" >&2\n'
        "exit 255\n"
    )
    fake.chmod(0o755)
    run_dir = "/runs/" + "x" * (128 * 1024)  # the request outgrows the pipe's buffer
    target = SshTarget("gpu-box", None, run_dir, SshOptions())
    transport = SshTransport(OpenSshHost(target, str(fake)), run_dir, backoff=(0.05,))
    links = await _links(transport, until=3)
    assert [x.link for x in links] == [Link.CONNECTING, Link.RECONNECTING, Link.RECONNECTING]
    assert links[1].detail == (
        "gpu-box: ssh: Could not resolve hostname gpu-box: Temporary failure in name resolution"
    )


@pytest.mark.slow
async def test_the_streams_ssh_reads_the_connections_configuration(
    sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$HOME/.ssh/config names the host (as asyncssh reads it): the ssh binary, which
    would read the password database's home, must be given the same file."""
    need(find_ssh() is not None, "the OpenSSH client (ssh) is not installed")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(sshd.ssh_config.read_text())
    monkeypatch.setenv("HOME", str(home))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_bytes(Lines().train(0, 1.0))
    target = SshTarget(ALIAS, None, str(run_dir), SshOptions())
    assert ssh_argv(target)[ssh_argv(target).index("-F") + 1] == str(home / ".ssh" / "config")
    control = SshHost(target)  # the connection for commands (asyncssh)
    try:
        await control.connect()
        assert control.known_hosts == [str(sshd.known_hosts)]
        stream = OpenSshHost(target, known_hosts=control.known_hosts)
        links = await _links(SshTransport(stream, str(run_dir), backoff=(0.05,)), until=2)
        assert links[-1].link == Link.CONNECTED, links
        assert links[-1].size == len(Lines().train(0, 1.0)) and links[-1].host_time
    finally:
        await control.close()
    assert os.environ["HOME"] == str(home)


def test_a_changed_key_says_how_to_remove_it_from_the_file_it_names(tmp_path: Path) -> None:
    """ "the host's key no longer matches /tmp/u/known_hosts … (ssh-keygen -R
    '[127.0.0.1]:22941')": without -f that edits ~/.ssh/known_hosts, not the file named."""
    need(shutil.which("ssh") is not None, "no OpenSSH client")
    config = tmp_path / "ssh_config"
    config.write_text("")
    known = tmp_path / "known_hosts"
    target = SshTarget("127.0.0.1", None, "/runs/x", SshOptions(config=(str(config),), port=2222))
    problem = OpenSshHost(target, known_hosts=[str(known)]).exit_problem(
        255, "Host key verification failed.\n"
    )
    assert problem is not None and problem[0], problem
    assert f"ssh-keygen -R '[127.0.0.1]:2222' -f {known}" in problem[1], problem[1]
