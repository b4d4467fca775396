"""Issue 28, item 2 on a host over SSH: a run directory that is not what it must be, or
that the SSH user may not read, is one line naming it with the same exit status as on
this machine (25 not what it should be, 21 no permission), in every command. Before,
the host's agent said "not a directory" or "no run.json here" with exit 2, like a
missing run, and a dangling link was "no metrics.jsonl here".

The refused reader is the host's agent run as root without the two capabilities that let
root read any file (``--remote-python`` names a wrapper that drops them, as
tests/test_second_hour_cli.py does for the local CLI): mode 000 refuses it as it refuses
an ordinary user on their own file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import need
from tests.test_second_hour_cli import (
    EXIT_MISSING,
    EXIT_PERMISSION,
    EXIT_WRONG_KIND,
    a_run,
    one_line,
)
from tests.transport.sshd import ALIAS, Sshd

COMMANDS = ["summary", "summary --json", "kill", "resume", "compare A", "compare B", "monitor"]


def on_host(sshd: Sshd, command: str, run: Path, other: Path, *opts: str) -> list[str]:
    """The command line of ``command`` on ``run`` on the fixture's host."""
    remote, second = f"{ALIAS}:{run}", f"{ALIAS}:{other}"
    words = {
        "summary": ["summary", remote],
        "summary --json": ["summary", remote, "--json"],
        "kill": ["kill", remote],
        "resume": ["resume", remote],
        "compare A": ["compare", remote, second],
        "compare B": ["compare", second, remote],
        "monitor": [remote],
    }[command]
    first = [] if command == "monitor" else words[:1]
    return [sys.executable, "-m", "eagle3_tui", *first, *sshd.args(), *opts, *words[len(first) :]]


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=90, check=False, stdin=subprocess.DEVNULL
    )


def test_an_input_of_the_wrong_kind_on_a_host_is_one_line_and_25(
    sshd: Sshd, tmp_path: Path
) -> None:
    other = a_run(tmp_path / "other")
    file = tmp_path / "file"
    file.write_text("{}\n")
    cases: dict[Path, Path] = {file: file}  # the target: what the line names
    for name in ("dir", "fifo", "link", "manifest dir"):
        run_dir = tmp_path / name
        run_dir.mkdir()
        named = run_dir / ("run.json" if name == "manifest dir" else "metrics.jsonl")
        if name in ("dir", "manifest dir"):
            named.mkdir()
        elif name == "fifo":
            os.mkfifo(named)
        else:
            named.symlink_to(tmp_path / "nowhere")
        cases[run_dir] = named
    # every command on one kind; each other kind by one command (the agent's one check)
    fifo = tmp_path / "fifo"
    plan = [(fifo, command) for command in COMMANDS]
    plan += [(t, COMMANDS[i]) for i, t in enumerate(t for t in cases if t != fifo)]
    for target, command in plan:
        err = one_line(run(on_host(sshd, command, target, other)), EXIT_WRONG_KIND)
        assert f"{ALIAS}:{cases[target]}: " in err, (command, err)
    err = one_line(run(on_host(sshd, "summary", Path("/dev/null"), other)), EXIT_WRONG_KIND)
    assert "/dev/null: is a character device, not a directory" in err
    err = one_line(run(on_host(sshd, "kill", tmp_path / "none", other)), EXIT_MISSING)
    assert "no such run directory" in err, err  # and a missing one is still 2


def test_a_chmod_000_input_on_a_host_is_one_line_and_21(sshd: Sshd, tmp_path: Path) -> None:
    need(shutil.which("setpriv") is not None, "setpriv (util-linux) is not installed")
    wrapper = tmp_path / "python-without-dac"
    wrapper.write_text(
        "#!/bin/sh\nexec setpriv --bounding-set=-dac_override,-dac_read_search -- "
        '/usr/bin/python3 "$@"\n'
    )
    wrapper.chmod(0o755)
    probe = tmp_path / "probe"
    probe.write_text("x")
    probe.chmod(0)
    refused = run([str(wrapper), "-c", f"open({str(probe)!r})"])
    assert refused.returncode != 0 and "PermissionError" in refused.stderr, refused.stderr
    other = a_run(tmp_path / "other")
    target, closed = a_run(tmp_path / "run"), a_run(tmp_path / "closed")
    (target / "metrics.jsonl").chmod(0)
    closed.chmod(0)
    try:  # each command on one or the other
        for i, command in enumerate(COMMANDS):
            path = target / "metrics.jsonl" if i % 2 else closed
            opts = ("--remote-python", str(wrapper))
            argv = on_host(sshd, command, target if i % 2 else closed, other, *opts)
            err = one_line(run(argv), EXIT_PERMISSION)
            assert f"{ALIAS}:{path}: permission denied (mode 000, owner root)" in err, err
    finally:
        closed.chmod(0o755)


def test_the_check_opens_no_file_a_link_names(tmp_path: Path) -> None:
    """The check runs in the agent, maybe as root in another user's directory: a
    metrics.jsonl planted as a link to a device must not be opened (a device's open may act).
    A FIFO stands for it here: a writer waiting for a reader is released by any open."""
    import threading

    from eagle3_tui.agent.inputs import BadInputError, check_input

    fifo = tmp_path / "device"
    os.mkfifo(fifo)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").symlink_to(fifo)
    opened = threading.Event()

    def writer() -> None:
        with open(fifo, "wb"):  # blocks until a reader opens the FIFO
            opened.set()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        with pytest.raises(BadInputError, match="is a FIFO, not a regular file"):
            check_input(str(run_dir))
        assert not opened.wait(0.5), "the check opened what the link names"
    finally:
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # release the writer
        thread.join(5)


def test_another_users_link_to_a_file_they_may_not_read_is_not_followed(tmp_path: Path) -> None:
    """As root: a user's run directory whose metrics.jsonl is their link to root's 0600
    run file was read through the link and shown as their run (a file of the other user's
    link to /etc/shadow leaked its line count)."""
    from eagle3_tui.agent.inputs import BadInputError, check_input

    if os.geteuid() != 0:
        pytest.skip("needs root (a link owned by another user)")
    private = tmp_path / "private.jsonl"
    private.write_text("{}\n")
    private.chmod(0o600)
    run_dir = tmp_path / "theirs"
    run_dir.mkdir()
    link = run_dir / "metrics.jsonl"
    link.symlink_to(private)
    os.lchown(link, 65534, 65534)  # nobody's link
    with pytest.raises(BadInputError, match="symbolic link of user nobody"):
        check_input(str(run_dir))
    private.chmod(0o644)  # every user may read it: nothing to keep from its maker
    check_input(str(run_dir))
    os.lchown(link, 0, 0)  # root's own link: followed
    private.chmod(0o600)
    check_input(str(run_dir))
