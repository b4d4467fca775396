"""The ``k`` dialog on a real process with telemetry attached mid-way: when it says the
trainer started (the process's own start, not the attach), and a trainer held stopped
(kill -STOP) is said to be continued first."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console, RenderableType

from eagle3_tui.app.run_control import RunControl
from eagle3_tui.app.screens.kill_resume import kill_plan
from eagle3_tui.telemetry import manifest as mf
from eagle3_tui.telemetry import procs
from eagle3_tui.transport.calls import local_status
from eagle3_tui.transport.channel import LocalHost
from tests.conftest import wait_until

TRAINER = textwrap.dedent(
    """
    import sys, time
    time.sleep(float(sys.argv[2]))  # it trains a while before telemetry is attached
    from eagle3_tui.telemetry import attach
    attach(sys.argv[1], samplers=False)
    print("attached", flush=True)
    time.sleep(300)
    """
)


def state_of(pid: int) -> str | None:
    st = procs.stat(pid)
    return st.state if st is not None else None


def plain(shown: RenderableType) -> str:
    with open(os.devnull, "w") as sink:
        console = Console(width=400, record=True, file=sink, color_system=None)
        console.print(shown)
    return " ".join(console.export_text().split())


@pytest.fixture
def attached_later(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A process whose telemetry was attached 2.5 s after it started."""
    env = {k: v for k, v in os.environ.items() if k not in (mf.RUN_ID_ENV, mf.RUN_DIR_ENV)}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(run_dir), "2.5"],
        env=env,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"attached\n"
        yield proc, run_dir
    finally:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            os.killpg(proc.pid, sig)
        proc.wait()


def test_the_kill_plan_says_when_the_process_started_not_when_telemetry_attached(
    attached_later: tuple[subprocess.Popen[bytes], Path],
) -> None:
    """It said ``started 16:11:35`` (the attach) of a trainer ``ps -o lstart`` says
    started 16:09:48: the process's own start now (boot time plus its start ticks)."""
    proc, run_dir = attached_later
    status = local_status(str(run_dir), True)
    assert status.alive, status
    lstart = subprocess.run(
        ["ps", "-o", "lstart=", "-p", str(proc.pid)], capture_output=True, text=True, check=True
    ).stdout.strip()
    began = time.strftime("%Y-%m-%d %H:%M:%S", time.strptime(lstart, "%a %b %d %H:%M:%S %Y"))
    attached = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(status.manifest["started_at"]))
    assert began != attached  # 2.5 s apart
    said = plain(kill_plan(status, RunControl(LocalHost(), str(run_dir), str(run_dir))))
    assert f"started {began}; its start time (tick {procs.start_ticks(proc.pid)})" in said, said
    assert attached not in said, said


def test_a_trainer_held_stopped_is_said_to_be_continued_first(
    attached_later: tuple[subprocess.Popen[bytes], Path],
) -> None:
    """``kill -STOP``: the plan said "the trainer (pid N) is asked, not signalled" and the
    result then showed SIGCONT sent to it. Held stopped, and continued first, it says."""
    proc, run_dir = attached_later
    control = RunControl(LocalHost(), str(run_dir), str(run_dir))
    running = plain(kill_plan(local_status(str(run_dir), True), control))
    assert f"the trainer (pid {proc.pid}) is asked, not signalled" in running, running
    assert "held stopped" not in running and "SIGCONT" not in running, running
    os.kill(proc.pid, signal.SIGSTOP)
    wait_until(lambda: state_of(proc.pid) == "T", 10, "the trainer held stopped")
    status = local_status(str(run_dir), True)
    assert status.alive and status.state == "T", status
    said = plain(kill_plan(status, control))
    assert f"The trainer (pid {proc.pid}) is held stopped" in said, said
    assert "it is continued first (SIGCONT)" in said, said
    assert "is asked, not signalled" not in said, said
    assert f"the trainer (pid {proc.pid}) is continued (SIGCONT), then asked to stop" in said


def test_a_resumed_runs_plan_names_its_telemetrys_start_as_that() -> None:
    """A resumed run's manifest keeps its first run's start (``first_started_at``) and
    its own telemetry's (``started_at``): neither is said to be the process's start."""
    from eagle3_tui.app.screens.kill_resume import started_line
    from eagle3_tui.transport.replies import Status

    first, resumed = 1_800_000_000.0, 1_800_003_600.0
    m = {"resumes": 1, "first_started_at": first, "started_at": resumed}
    said = started_line(Status(alive=True, manifest=m))
    assert said == "its telemetry started " + time.strftime(
        "%Y-%m-%d %H:%M:%S", time.localtime(resumed)
    )


def test_the_resume_plan_of_a_live_trainer_says_it_lives_and_how() -> None:
    """``r`` on a trainer held by SIGSTOP said "The run is still running" under the
    header's STALLED, held stopped."""
    from eagle3_tui.app.screens.kill_resume import resume_plan
    from eagle3_tui.transport.replies import Status

    control = RunControl(LocalHost(), "/runs/exp7", "/runs/exp7")
    held = plain(resume_plan(Status(alive=True, state="T", manifest={"pid": 4242}), control))
    assert "The run's trainer is still alive (pid 4242, held stopped)" in held, held
    assert "still running" not in held
    live = plain(resume_plan(Status(alive=True, state="S", manifest={"pid": 4242}), control))
    assert "The run's trainer is still alive (pid 4242): resume will be refused" in live, live
