"""torchrun places and how a process ended, read without being its parent."""

from __future__ import annotations

import subprocess
import sys

from eagle3_tui.telemetry import procs
from eagle3_tui.telemetry.topology import Place, manifest_fields, nodes_of, place_from_env
from tests.conftest import wait_until


def test_a_grandchilds_exit_status_is_read_through_its_pidfd() -> None:
    # a helper starts the victim and reaps it: we are not its parent, as a sidecar is not
    helper = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            "p = subprocess.Popen(['sh', '-c', 'sleep 0.5; exit 3'])\n"
            "q = subprocess.Popen(['sleep', '60'])\n"
            "print(p.pid, q.pid, flush=True)\n"
            "p.wait(); sys.stdin.readline(); q.wait()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert helper.stdout is not None and helper.stdin is not None
    exits3, sleeper = map(int, helper.stdout.readline().split())
    fd3, fd_sleep = procs.open_pidfd(exits3), procs.open_pidfd(sleeper)
    assert procs.exit_status(sleeper, fd_sleep) is None  # alive: nothing to tell
    import os
    import signal

    os.kill(sleeper, signal.SIGKILL)
    status = wait_until(lambda: procs.exit_status(exits3, fd3), 10, "the exit status")
    assert status == 3
    helper.stdin.write("\n")
    helper.stdin.flush()
    helper.wait(10)  # the sleeper is reaped now: only the pidfd can tell
    assert procs.exit_status(sleeper, fd_sleep) == -9
    assert procs.describe_exit(-9) == "killed by SIGKILL"
    assert procs.describe_exit(3) == "exit status 3"
    assert procs.describe_exit(None) == "exit status unknown"
    for fd in (fd3, fd_sleep):
        if fd is not None:
            os.close(fd)


def test_places_and_nodes(monkeypatch: object) -> None:
    import pytest

    mp = pytest.MonkeyPatch()
    try:
        for k, v in {
            "RANK": "3",
            "LOCAL_RANK": "1",
            "WORLD_SIZE": "4",
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "1",
            "GROUP_WORLD_SIZE": "2",
            "TORCHELASTIC_RUN_ID": "job",
        }.items():
            mp.setenv(k, v)
        place = place_from_env()
    finally:
        mp.undo()
    assert place == Place(3, 1, 4, 2, 1, 2, place.launcher_pid) and place.launcher_pid
    assert not place.node_leader and place.distributed
    entries = [
        {"rank": r, "node_rank": r // 2, "host": f"n{r // 2}", "run_dir": f"/r/{r // 2}"}
        for r in (3, 0, 2, 1)
    ]
    nodes = nodes_of(entries)
    assert [(n["node_rank"], n["host"], n["ranks"]) for n in nodes] == [
        (0, "n0", [0, 1]),
        (1, "n1", [2, 3]),
    ]
    fields = manifest_fields(place, None, entries[0])
    assert fields["nnodes"] == 2 and "nodes" not in fields  # known once the store has them
