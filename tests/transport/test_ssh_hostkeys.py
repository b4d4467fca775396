"""Host keys verified as ssh does, and connection failures as one line on stderr."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from eagle3_tui.transport.sshlib import asyncssh
from tests.transport.conftest import cli
from tests.transport.sshd import Sshd, free_port

pytestmark = pytest.mark.slow


def fingerprint(sshd: Sshd) -> str:
    key = asyncssh.import_public_key(sshd.host_public)
    fp: str = key.get_fingerprint("sha256")
    return fp


def explicit(sshd: Sshd, known_hosts: Path, *extra: str) -> list[str]:
    """Options without the fixture's config file: -p, -i, -o UserKnownHostsFile."""
    return [
        "-p",
        str(sshd.port),
        "-i",
        str(sshd.client_key),
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        *extra,
    ]


def one_line_error(proc: object, status: int = 2) -> str:
    assert proc.returncode == status, (proc.stdout, proc.stderr)  # type: ignore[attr-defined]
    err: str = proc.stderr  # type: ignore[attr-defined]
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_an_unknown_host_key_is_refused_naming_its_fingerprint(sshd: Sshd, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    proc = cli("runs", *explicit(sshd, known), "root@127.0.0.1")
    err = one_line_error(proc)
    assert "unknown host key" in err and fingerprint(sshd) in err
    assert "StrictHostKeyChecking=accept-new" in err and "ssh-keyscan" in err
    assert not known.exists()  # nothing was recorded


def test_accept_new_records_an_unknown_key_then_it_is_known(sshd: Sshd, tmp_path: Path) -> None:
    known = tmp_path / "ssh" / "known_hosts"
    args = explicit(sshd, known, "-o", "StrictHostKeyChecking=accept-new")
    proc = cli("summary", *args, f"root@127.0.0.1:{tmp_path / 'nope'}")
    assert "no such run directory" in one_line_error(proc)  # connected, then the run is missing
    recorded = known.read_text()
    assert recorded.startswith(f"[127.0.0.1]:{sshd.port} ssh-ed25519 ")
    assert sshd.host_public.split()[1] in recorded
    proc = cli("summary", *explicit(sshd, known), f"root@127.0.0.1:{tmp_path / 'nope'}")
    assert "no such run directory" in one_line_error(proc)  # now known without the option
    assert known.read_text() == recorded


@pytest.mark.parametrize("strict", ["yes", "accept-new"])
def test_a_changed_host_key_is_refused_even_with_accept_new(
    sshd: Sshd, tmp_path: Path, strict: str
) -> None:
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    known = tmp_path / "known_hosts"
    known.write_text(f"# a comment\n[127.0.0.1]:{sshd.port} {other}\n")
    before = known.read_text()
    args = explicit(sshd, known, "-o", f"StrictHostKeyChecking={strict}")
    proc = cli("summary", *args, "root@127.0.0.1:/tmp")
    err = one_line_error(proc)
    assert "HOST KEY CHANGED" in err and fingerprint(sshd) in err
    assert f"{known}:2" in err and "ssh-keygen -R" in err
    assert known.read_text() == before


def test_the_monitor_refuses_before_any_ui(sshd: Sshd, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    proc = cli(*explicit(sshd, known), f"root@127.0.0.1:{tmp_path}", timeout=60)
    err = one_line_error(proc)
    assert "unknown host key" in err and proc.stdout == ""


def test_a_wrong_key_is_permission_denied(sshd: Sshd, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong_key"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(wrong))
    wrong.chmod(0o600)
    args = ["-p", str(sshd.port), "-i", str(wrong), "-o", f"UserKnownHostsFile={sshd.known_hosts}"]
    err = one_line_error(cli("runs", *args, "root@127.0.0.1"))
    assert "permission denied" in err


def test_a_closed_port_and_an_unknown_host(sshd: Sshd, tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as s:  # nothing listens there
        assert s.connect_ex(("127.0.0.1", port)) != 0
    err = one_line_error(cli("kill", "-p", str(port), "root@127.0.0.1:/tmp/x"))
    assert "connection refused" in err
    err = one_line_error(cli("runs", "no-such-host.invalid"))
    assert "cannot resolve host name" in err


def test_a_jump_host_and_its_errors(sshd: Sshd) -> None:
    proc = cli("runs", *sshd.explicit_args(), "-J", f"root@127.0.0.1:{sshd.port}", "127.0.0.1")
    assert proc.returncode in (0, 2), proc.stderr
    assert proc.returncode == 0 or "no run registered" in proc.stderr  # reached through the jump
    err = one_line_error(cli("runs", *sshd.args(), "-J", "nohost.invalid", "e3-test"))
    assert "jump host nohost.invalid: cannot resolve host name" in err
