"""A run without telemetry leaves a record (issue 26): a handler-less speculators
training, launched as in the story (``nohup … > train.log 2>&1``, a session of its own),
seen once by eagle3-tui while it lives, is known after it exits: ``runs`` lists it as
ended, ``summary --pid PID`` and ``summary WORKDIR`` say how it ended from its record
(files on the host), the same whenever they are asked; and a trainer SIGKILLed with 2
dataloader workers is ``DEAD`` with the processes of it still alive at that moment
named, by PID.

The user's script is the real tiny speculators training (``train/tiny.py``) with no
monitoring of any kind."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.agent import discover
from eagle3_tui.agent.timeline import records_root
from eagle3_tui.model.run import Run
from eagle3_tui.telemetry import procs
from eagle3_tui.transport.calls import observe_once
from eagle3_tui.transport.channel import LocalHost
from eagle3_tui.transport.replies import ProcessRow, decode
from tests.conftest import need_training, wait_until

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    # my training script: the tiny EAGLE-3 draft, no monitoring of any kind
    import sys

    import speculators  # noqa: F401
    from eagle3_tui.train.tiny import main

    if __name__ == "__main__":  # (its dataloader workers import this file again)
        sys.exit(main(sys.argv[1:]))
    """
)
EAGLE3_TUI = str(Path(sys.executable).parent / "eagle3-tui")
BARE = ["--run-dir", "out", "--no-telemetry", "--log", "none"]
"""Its checkpoints go to ``out/checkpoints`` of its working directory."""


def launch(
    work: Path,
    script: str,
    *args: str,
    log: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """``cd WORK; nohup python train.py ARGS > LOG 2>&1 &``: detached, a session of its own
    (with ``env`` added to the environment)."""
    need_training()
    work.mkdir(parents=True, exist_ok=True)
    (work / "train.py").write_text(script)
    with open(log or work / "train.log", "ab") as out:
        return subprocess.Popen(
            [sys.executable, "train.py", *args],
            cwd=work,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )


@contextlib.contextmanager
def ending(proc: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    """Whatever is left of the training's session is killed on leaving."""
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def cli(*args: str) -> tuple[int, dict[str, Any], str]:
    """``eagle3-tui ARGS --json``: its status, its JSON, its stderr."""
    proc = subprocess.run(
        [EAGLE3_TUI, *args, "--json"], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.stdout, f"{args}: {proc.returncode} {proc.stderr}"
    out: dict[str, Any] = json.loads(proc.stdout)
    return proc.returncode, out, proc.stderr


def live_row(pid: int) -> dict[str, Any]:
    """``runs``' row of the training ``pid`` (a look: it is observed from now on)."""
    found: list[dict[str, Any]] = []

    def listed() -> bool:
        _, out, _ = cli("runs")
        found[:] = [r for r in out["live"] if r["pid"] == pid]
        return bool(found)

    wait_until(listed, 120, lambda: f"pid {pid} listed by runs", 0.5)
    return found[0]


def ended_row(pid: int) -> dict[str, Any]:
    _, out, _ = cli("runs")
    rows = [r for r in out.get("ended") or [] if r["pid"] == pid]
    assert rows, out
    row: dict[str, Any] = rows[0]
    return row


def age_record(pid: int, seconds: float) -> int:
    """Move the mtime of every file of the training's record (and of its log) back by
    ``seconds``: what the host's files look like that much later. Returns how many."""
    aged = 0
    for rec in records_root().iterdir():
        if f"-{pid}-" not in rec.name:
            continue
        for f in rec.iterdir():
            st = f.lstat()
            os.utime(f, (st.st_atime - seconds, st.st_mtime - seconds), follow_symlinks=False)
            aged += 1
    return aged


def test_a_finished_run_without_telemetry_is_said_so_from_its_record(tmp_path: Path) -> None:
    work = tmp_path / "work"
    args = [*BARE, "--rows", "20", "--epochs", "2", "--step-delay", "0.2"]
    with ending(launch(work, SCRIPT, *args)) as proc:
        row = live_row(proc.pid)  # seen once, alive
        assert row["telemetry"] is False and row["cwd"] == str(work)
        assert proc.wait(240) == 0, (work / "train.log").read_text()[-2000:]
    # it is gone: /proc forgot it, its record did not
    ended = ended_row(proc.pid)
    assert ended["alive"] is False and ended["cwd"] == str(work)
    assert isinstance(ended["ended_at"], float) and ended["ended_at"] <= time.time()
    verdicts = []
    for target in (["--pid", str(proc.pid)], [str(work)]):
        rc, out, err = cli("summary", *target)
        assert (rc, out["health"]) == (0, "finished"), (out["reason"], err)
        assert f"The trainer (pid {proc.pid}) finished" in out["reason"]
        assert "after step 16 (epoch 2/2)" in out["reason"]  # 2 epochs of 8 steps
        assert out["observed"]["alive"] is False and out["step"] == 16
        assert (out["epoch"], out["epochs"]) == (2, 2)  # its last epoch, not one after it
        assert "its record, kept since eagle3-tui first saw it" in err
        verdicts.append(out["reason"])
    assert verdicts[0] == verdicts[1]
    # later (the files as they are 10 minutes on): the same verdict, read from files
    assert age_record(proc.pid, 600) >= 3
    log = work / "train.log"
    st = log.stat()
    os.utime(log, (st.st_atime - 600, st.st_mtime - 600))
    rc, out, _ = cli("summary", "--pid", str(proc.pid))
    assert (rc, out["health"], out["reason"]) == (0, "finished", verdicts[0])


def _tree(pid: int) -> dict[int, str]:
    """The processes below ``pid`` now: their names."""
    out = {}
    for p in procs.descendants(pid):
        st = procs.stat(p)
        if st is not None and not st.zombie:
            out[p] = st.comm
    return out


def test_a_trainer_sigkilled_with_two_workers_is_dead_with_its_leftovers_named(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    args = [*BARE, "--workers", "2", "--epochs", "50", "--step-delay", "0.2"]
    with ending(launch(work, SCRIPT, *args)) as proc:
        wait_until(
            lambda: list(_tree(proc.pid).values()).count("pt_data_worker") == 2,
            240,
            lambda: f"2 dataloader workers; log:\n{(work / 'train.log').read_text()[-1500:]}",
            0.2,
        )
        found = [t for t in discover.scan()[0] if t.trainer.pid == proc.pid]
        assert found, "the training is not found"
        row = decode(ProcessRow, discover._rows(found)[0])
        run = Run()
        at_the_kill: dict[int, str] = {}

        async def watch_and_kill() -> str:
            """The monitor's observation of it, and a SIGKILL of its trainer meanwhile."""
            observing = asyncio.create_task(
                observe_once(LocalHost(), row, lambda f: run.feed(f.offset, f.data), 60.0)
            )
            await asyncio.sleep(2.5)  # a few looks at it alive
            at_the_kill.update(_tree(proc.pid))
            os.kill(proc.pid, signal.SIGKILL)
            end = await observing
            return end.event

        assert asyncio.run(watch_and_kill()) == "ended"
        workers = {p for p, comm in at_the_kill.items() if comm == "pt_data_worker"}
        assert len(workers) == 2, at_the_kill
        # what the monitor saw at that moment: the trainer gone, its workers alive
        state = run.state
        assert state.observed is not None and state.observed.alive is False
        assert state.observed.info.exit_status == -signal.SIGKILL
        left = {x.pid for x in state.liveness.leftovers}
        assert left == set(at_the_kill), (left, at_the_kill)  # the resource tracker too
        # the workers notice their parent's death within 5 s and exit; the record stays
        wait_until(
            lambda: not any(procs.alive(p) for p in at_the_kill),
            30,
            lambda: f"the leftovers end: {_tree(1)}",
            0.2,
        )
        rc, out, _ = cli("summary", "--pid", str(proc.pid))
        assert (rc, out["health"]) == (5, "dead"), out["reason"]
        reason = out["reason"]
        assert "died at " in reason and "(killed by SIGKILL)" in reason, reason
        assert "Still alive when it ended: " in reason
        for pid in workers:
            assert f"pid {pid} pt_data_worker" in reason, reason
        assert {x["pid"] for x in out["leftovers"]} == left
        assert not any(x["alive"] for x in out["leftovers"]), out["leftovers"]  # since gone
        ended = ended_row(proc.pid)
        assert ended["exit_status"] == -signal.SIGKILL


def test_a_kill_after_the_trainer_was_sigkilled_ends_what_outlived_it(tmp_path: Path) -> None:
    """Its dataloader workers held (stopped: they do not notice their parent's death),
    the trainer SIGKILLed: the monitor listed them ("Still alive when it ended"), but
    ``kill --pid`` said "nothing to stop", exit 0, and left ~1 GB of workers: a training
    without telemetry has no marker to find them by. The observer's record of it does."""
    work = tmp_path / "work"
    args = [*BARE, "--workers", "2", "--epochs", "50", "--step-delay", "0.2"]
    with ending(launch(work, SCRIPT, *args)) as proc:
        wait_until(
            lambda: list(_tree(proc.pid).values()).count("pt_data_worker") == 2,
            240,
            lambda: f"2 dataloader workers; log:\n{(work / 'train.log').read_text()[-1500:]}",
            0.2,
        )
        found = [t for t in discover.scan()[0] if t.trainer.pid == proc.pid]
        row = decode(ProcessRow, discover._rows(found)[0])
        run = Run()

        async def watch_and_kill() -> dict[int, str]:
            observing = asyncio.create_task(
                observe_once(LocalHost(), row, lambda f: run.feed(f.offset, f.data), 60.0)
            )
            await asyncio.sleep(2.5)  # a few looks at it alive: its record names its tree
            tree = _tree(proc.pid)
            for pid, comm in tree.items():
                if comm == "pt_data_worker":
                    os.kill(pid, signal.SIGSTOP)
            os.kill(proc.pid, signal.SIGKILL)
            await observing
            return tree

        tree = asyncio.run(watch_and_kill())
        left = {p for p in tree if p != proc.pid and procs.alive(p)}
        assert len([p for p in left if tree[p] == "pt_data_worker"]) == 2, (left, tree)
        rc, out, err = cli("kill", "--pid", str(proc.pid), "--no-attach")
        assert rc == 0, (rc, out, err)
        assert out["status"] == "stopped", out
        reported = {p["pid"] for p in out["processes"]}
        assert left <= reported, (left, out["processes"])
        wait_until(lambda: not any(procs.alive(p) for p in left), 10, lambda: str(_tree(1)))
