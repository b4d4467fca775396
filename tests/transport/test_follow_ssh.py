"""``api.follow`` of a run over SSH (a real sshd on 127.0.0.1): each look reads on from
where the last one ended, as a local run's looks do (issue 31: following costs next to
nothing; a look at a 1M-step run had read its whole file again), and a file replaced or
truncated between looks is read whole again (a new run, as a local run's look reads it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui import api
from eagle3_tui.transport import calls
from eagle3_tui.transport.base import TargetError
from eagle3_tui.transport.channel import Host
from eagle3_tui.transport.target import Target
from tests.conftest import wait_until
from tests.transport.conftest import ssh_target
from tests.transport.sshd import ALIAS, Sshd


def _steps(lines: list[bytes]) -> list[int]:
    return [i for i, line in enumerate(lines) if json.loads(line).get("kind") == "train"]


def test_each_look_reads_on_and_a_changed_file_keeps_the_history(
    sshd: Sshd, tiny_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = (tiny_run / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    whole = api.open_run(tiny_run).summary()
    opened: list[object] = []
    open_host = calls.open_host

    def counted(target: Target) -> Host:
        opened.append(target)
        return open_host(target)

    monkeypatch.setattr(calls, "open_host", counted)
    live = tmp_path / "live"
    live.mkdir()
    path = live / "metrics.jsonl"
    half = len(lines) // 2
    path.write_bytes(b"".join(lines[:half]) + lines[half][:7])  # a torn last line
    looks = api.follow(ssh_target(sshd, live), every=0.01)
    first = next(looks)
    assert first.summary()["global_step"] < whole["global_step"]
    with path.open("ab") as f:
        f.write(lines[half][7:] + b"".join(lines[half + 1 :]))
    second = next(looks)
    assert second.run is first.run  # fed on, not read again
    got = second.summary()
    for key in ("global_step", "records", "loss", "lost_records", "duplicate_records"):
        assert got[key] == whole[key], key
    # nothing was sent twice: a read from 0 again would have been a restart of the file
    assert got["malformed_lines"] == 0 and got["file_changes"] == []
    assert first.summary()["global_step"] < got["global_step"]  # each look as of its time

    steps = _steps(lines)
    shorter = live / "metrics.new"  # another, shorter file under the name
    shorter.write_bytes(b"".join(lines[: steps[9] + 1]))
    shorter.rename(path)
    third = next(looks)
    # the run's own records again (its writer's): the same history, as the monitor keeps
    # it, not a run read anew from step 9; the change said
    assert third.run is second.run
    assert third.summary()["global_step"] == whole["global_step"]
    changes = third.summary()["file_changes"]
    assert changes and changes[-1]["change"] == "replaced", changes

    os.truncate(path, len(b"".join(lines[: steps[4] + 1])))  # cut below the last look's end
    fourth = next(looks)
    assert fourth.run is third.run  # the history read before is kept
    assert fourth.summary()["global_step"] == whole["global_step"]
    assert len(fourth.summary()["file_changes"]) > len(changes)
    with path.open("ab") as f:  # and on from there again
        f.write(b"".join(lines[steps[4] + 1 : steps[6] + 1]))
    fifth = next(looks)  # (its writer's records read before: repeats, nothing new)
    assert fifth.run is fourth.run
    assert fifth.summary()["global_step"] == whole["global_step"]
    assert fifth.summary()["records"] == whole["records"]
    assert fifth.summary()["malformed_lines"] == 0
    assert len(opened) == 1  # one connection for every look

    assert sshd.kill_sessions() >= 1  # the connection drops between two looks
    with path.open("ab") as f:
        f.write(b"".join(lines[steps[6] + 1 :]))  # on to the end: still nothing new
    sixth = next(looks)
    assert sixth.run is fifth.run and sixth.summary()["records"] == whole["records"]
    assert sixth.summary()["malformed_lines"] == 0
    assert len(sixth.summary()["file_changes"]) == len(fifth.summary()["file_changes"])
    looks.close()  # its connection closed with it


def test_a_script_that_leaves_its_follow_unfinished_exits(
    sshd: Sshd, tiny_run: Path, tmp_path: Path
) -> None:
    """The looks' connection is kept in a thread of its own: a script that takes a look
    and ends without closing the generator must still end (its generator is finalized
    after that thread has stopped running), its connection closed."""
    code = (
        "import sys\n"
        "from eagle3_tui import api\n"
        "from eagle3_tui.transport.target import SshOptions, SshTarget\n"
        "target = SshTarget(sys.argv[1], None, sys.argv[2], SshOptions(config=(sys.argv[3],)))\n"
        "looks = api.follow(target, every=0.01)\n"
        "print(next(looks).summary()['global_step'])\n"
    )
    args = [sys.executable, "-c", code, ALIAS, str(tiny_run), str(sshd.ssh_config)]
    before = len(sshd.sessions())
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout) == api.open_run(tiny_run).summary()["global_step"]
    wait_until(lambda: len(sshd.sessions()) <= before, 10, "its connection closed")


def test_a_look_cut_short_after_its_read_reads_on_from_as_far_as_it_got(
    sshd: Sshd, tiny_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A look whose connection fails after its read fed the run (lost as the answer
    ended, say) is made again on a new connection, from as far as the run got: nothing is fed
    twice (which the run would take for the file starting over)."""
    lines = (tiny_run / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    live = tmp_path / "live"
    live.mkdir()
    path = live / "metrics.jsonl"
    half = len(lines) // 2
    path.write_bytes(b"".join(lines[:half]))
    reads: list[int] = []
    look = calls.look

    async def cut_short(*args: Any) -> Any:
        got = await look(*args)
        since = args[6]  # (run_dir, offset, identity) of the last look
        reads.append(0 if since is None else since[1])
        if len(reads) == 2:
            raise TargetError("e3-test: connection lost after the read (a test's)")
        return got

    monkeypatch.setattr(calls, "look", cut_short)
    looks = api.follow(ssh_target(sshd, live), every=0.01)
    first = next(looks)
    with path.open("ab") as f:
        f.write(b"".join(lines[half:]))
    second = next(looks)
    size = len(b"".join(lines[:half]))
    assert reads == [0, size, path.stat().st_size]  # the third: on from the run's end
    assert second.run is first.run
    got = second.summary()
    assert got["records"] == len(lines) and got["duplicate_records"] == 0
    assert got["file_changes"] == [] and got["malformed_lines"] == 0
    looks.close()
