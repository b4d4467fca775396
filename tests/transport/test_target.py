"""Targets and ssh options as users write them (pure: no sshd)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3_tui.transport.base import TargetError, printable
from eagle3_tui.transport.target import LocalTarget, SshOptions, SshTarget, parse_target
from tests.transport.conftest import cli


@pytest.mark.parametrize(
    ("text", "host", "user", "run_dir"),
    [
        ("gpu-box", "gpu-box", None, None),
        ("gpu-box:", "gpu-box", None, None),
        ("root@gpu-box", "gpu-box", "root", None),
        ("root@gpu-box:/runs/a", "gpu-box", "root", "/runs/a"),
        ("gpu-box:runs/a b", "gpu-box", None, "runs/a b"),
        ("me@[::1]:/runs/x", "::1", "me", "/runs/x"),
        ("[fe80::1]", "fe80::1", None, None),
        ("host:/r/$(touch x);`y`", "host", None, "/r/$(touch x);`y`"),
    ],
)
def test_remote_targets(text: str, host: str, user: str | None, run_dir: str | None) -> None:
    t = parse_target(text)
    assert isinstance(t, SshTarget)
    assert (t.host, t.user, t.run_dir) == (host, user, run_dir)


@pytest.mark.parametrize("text", ["/abs/run", "./run", "../run", "~/run", "runs/a:b", "a/b"])
def test_local_targets(text: str) -> None:
    t = parse_target(text)
    assert isinstance(t, LocalTarget) and t.run_dir == Path(text)


def test_an_existing_local_directory_wins_over_a_host_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpu-box").mkdir()
    assert isinstance(parse_target("gpu-box"), LocalTarget)


@pytest.mark.parametrize("text", ["", "-oProxyCommand=sh", "@host:/x", "[::1", "ho st:/x"])
def test_bad_targets_are_one_line_errors(text: str) -> None:
    with pytest.raises(TargetError):
        parse_target(text)


def test_ssh_options() -> None:
    o = SshOptions()
    assert o.with_option("StrictHostKeyChecking=accept-new").strict_host_key_checking == (
        "accept-new"
    )
    assert o.with_option("StrictHostKeyChecking ask").strict_host_key_checking == "yes"
    assert o.with_option("UserKnownHostsFile=/a /b").known_hosts == ("/a", "/b")
    assert o.with_option("Port=2222").port == 2222
    assert o.with_option("ServerAliveInterval=0.5").keepalive_interval == 0.5
    for bad in ("StrictHostKeyChecking=no", "Port=x", "Ciphers=aes", "novalue"):
        with pytest.raises(TargetError):
            o.with_option(bad)


def test_printable_keeps_one_line() -> None:
    assert printable("run\n$(x)\t`y`") == "run\\n$(x)\\t`y`"
    assert printable("plain é τ") == "plain é τ"


def test_cli_rejects_an_unsupported_ssh_option_in_one_line() -> None:
    proc = cli("summary", "-o", "Ciphers=aes128-ctr", "somehost:/x")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Ciphers: not supported" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_ssh_binary_gets_the_same_options_and_a_constant_command() -> None:
    from eagle3_tui.transport.openssh import ssh_argv

    opts = SshOptions(
        port=2222,
        identities=("/k/id",),
        jump="j@bastion:22",
        config=("/c/cfg",),
        known_hosts=("/a b/kh",),
        strict_host_key_checking="accept-new",
        keepalive_interval=0.3,
        remote_python="python3; rm -rf x",
    )
    argv = ssh_argv(SshTarget("gpu-box", "me", "/runs/$(x)", opts))
    assert argv[:2] == ["ssh", "-T"] and "BatchMode=yes" in argv
    assert "StrictHostKeyChecking=accept-new" in argv
    assert argv[argv.index("-F") + 1] == "/c/cfg" and argv[argv.index("-p") + 1] == "2222"
    assert argv[argv.index("-l") + 1] == "me" and argv[argv.index("-J") + 1] == "j@bastion:22"
    assert 'UserKnownHostsFile="/a b/kh"' in argv and "ServerAliveInterval=1" in argv
    assert argv[-3:-1] == ["--", "gpu-box"]
    assert argv[-1].startswith("exec 'python3; rm -rf x' -I -c ")  # quoted: one word; isolated
    assert "/runs" not in " ".join(argv)  # the run directory travels in the request only
