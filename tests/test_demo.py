"""`eagle3-tui demo`: the tiny real training, headless, and what the demo leaves behind."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3_tui.agent import processes
from eagle3_tui.cli.demo import demo_training_command, stop_demo_run
from eagle3_tui.exits import CRASHED as EXIT_CRASHED
from eagle3_tui.transport.target import LocalTarget
from tests.conftest import interruptible, need_training, read_jsonl, wait_for_a_training_step
from tests.transport.fakes import dead_pid, fake_manifest


def test_headless_demo_trains_to_completion_and_leaves_the_run(tmp_path: Path) -> None:
    need_training()
    out = tmp_path / "demo"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "eagle3_tui",
            "demo",
            "--headless",
            "--out",
            str(out),
            "--epochs",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    # what its help says: a summary (the run's verdict, step, loss), the directory on stderr
    assert proc.stdout.startswith("health   finished: "), proc.stdout
    assert "\nstep     " in proc.stdout and "\nloss     " in proc.stdout, proc.stdout
    assert f"the run is in {out}" in proc.stderr, proc.stderr
    records = read_jsonl(out / "metrics.jsonl")
    assert any(r["kind"] == "train" for r in records)
    events = [r["event"] for r in records if r["kind"] == "lifecycle"]
    assert events[0] == "start" and events[-1] == "finish"
    assert json.loads((out / "run.json").read_text())["status"] == "finished"
    assert (out / "train.log").stat().st_size > 0
    summary = subprocess.run(
        [sys.executable, "-m", "eagle3_tui", "summary", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert summary.returncode == 0 and json.loads(summary.stdout)["health"] == "finished"


def test_demo_refuses_a_run_directory_in_use(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("someone's file")
    proc = subprocess.run(
        [sys.executable, "-m", "eagle3_tui", "demo", "--headless", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2 and "not empty" in proc.stderr
    assert proc.stderr.count("\n") == 1 and (tmp_path / "x").read_text() == "someone's file"


@pytest.mark.parametrize(
    ("out", "said"),
    [
        ("file", "not a directory"),
        ("file/sub", "cannot create it (Not a directory)"),
        ("missing/under/proc", "cannot create it (No such file or directory)"),
    ],
)
def test_a_demo_out_that_cannot_be_a_run_directory_is_one_line(
    tmp_path: Path, out: str, said: str
) -> None:
    """``demo --out`` naming a file, a path under one, or under a directory that cannot
    hold one: one line and exit 2 (each was a traceback), the file untouched."""
    (tmp_path / "file").write_text("someone's file")
    path = "/proc/nope/x" if out.endswith("proc") else str(tmp_path / out)
    proc = subprocess.run(
        [sys.executable, "-m", "eagle3_tui", "demo", "--headless", "--out", path],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert (tmp_path / "file").read_text() == "someone's file"


def test_quitting_the_demo_stops_its_run_even_when_resumed_as_another_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After `r` the trainer is no longer the demo's child: quitting must still stop it,
    as `k` does: at a step boundary, its save the numbered checkpoint a restart takes."""
    need_training()
    run_dir = tmp_path / "run"
    trainer = subprocess.Popen(
        demo_training_command(run_dir, epochs=5, step_delay=0.3, workers=1),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for_a_training_step(run_dir, trainer, 180)
        the_demos_child = subprocess.Popen(["true"])  # the demo's own child, long gone
        the_demos_child.wait()
        stop_demo_run(LocalTarget(run_dir), the_demos_child)
        assert trainer.wait(timeout=5) == 0  # graceful: speculators saved and exited 0
        said = capsys.readouterr().err
        assert "asked the trainer to stop at its next step boundary" in said, said
        assert "stopped at a step boundary" in said and "demo: stopped: all" in said, said
        assert "no stop at a step boundary: SIGTERM" not in said, said
        events = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "lifecycle"]
        stop = next(e for e in events if e["event"] == "stop")  # right after a step
        g = stop["global_step"]
        assert events[-1]["event"] == "interrupt" and events[-1]["step"] == g, events[-2:]
        # its interrupted/ save became the numbered checkpoint speculators resumes from
        saved = run_dir / "checkpoints" / str(stop["epoch"])
        state = json.loads((saved / "training_state.json").read_text())
        assert state == {"epoch": stop["epoch"], "local_step": stop["local_step"], "global_step": g}
        assert (saved / "model.safetensors").is_file()
        assert not (run_dir / "checkpoints" / "interrupted").exists()
    finally:
        if trainer.poll() is None:
            trainer.kill()


def test_quitting_a_demo_whose_run_ended_says_nothing_about_stopping(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``q`` on a finished demo said "stopping the run (SIGTERM…)": nothing runs, so
    nothing is said about stopping (issue 28, item 7)."""
    run_dir = tmp_path / "run"
    fake_manifest(run_dir, dead_pid(), f"ended-{os.getpid()}", status="finished")
    the_demos_child = subprocess.Popen(["true"])
    the_demos_child.wait()
    stop_demo_run(LocalTarget(run_dir), the_demos_child)
    said = capsys.readouterr().err
    assert "stop" not in said and "SIGTERM" not in said, said


def hang_up_after_a_step(run_dir: Path, argv: list[str], env: dict[str, str]) -> int:
    """``argv`` (a demo) on a terminal of its own that is closed once its training logged
    a step, as a closed terminal window does; its exit status."""
    import pty
    import threading

    pid, master = pty.fork()
    if pid == 0:  # the child: the pty is its controlling terminal
        os.execvpe(argv[0], argv, env)
    screen = bytearray()
    hang_up = threading.Event()

    def drain() -> None:
        """Read what the demo draws (a full pty would block it), and close the terminal
        when asked: here, with no read of it under way in another thread (a close then
        leaves the terminal open until that read returns, and no hang-up comes)."""
        import select

        try:
            while not hang_up.is_set():
                if select.select([master], [], [], 0.1)[0]:
                    chunk = os.read(master, 65536)
                    if not chunk:
                        break
                    screen.extend(chunk)
        except OSError:
            pass
        finally:
            os.close(master)  # the terminal is gone: the kernel hangs up its session

    closer = threading.Thread(target=drain, daemon=True)
    closer.start()
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.exists() and b'"kind":"train"' in metrics.read_bytes()):
        assert time.monotonic() < deadline, bytes(screen[-2000:])
        assert os.waitpid(pid, os.WNOHANG) == (0, 0), bytes(screen[-2000:])
        time.sleep(0.2)
    hang_up.set()
    closer.join(5)
    deadline = time.monotonic() + 180  # a save and its check: seconds, more on a busy CI box
    while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0):
        assert time.monotonic() < deadline, (
            "the demo outlived its terminal by 180 s; its run's log ends:\n"
            + (run_dir / "train.log").read_text(errors="replace")[-3000:]
        )
        time.sleep(0.2)
    return done[1]


@pytest.mark.slow
def test_closing_the_demos_terminal_stops_its_training(tmp_path: Path) -> None:
    """SIGHUP (the terminal closed) ended the demo and orphaned its training, which runs
    in a session of its own: now the demo stops it as on ``q`` (issue 28, item 8)."""
    need_training()
    out = tmp_path / "demo"
    env = dict(os.environ, TERM="xterm-256color", XDG_STATE_HOME=str(tmp_path / "state"))
    argv = [sys.executable, "-m", "eagle3_tui", "demo", "--out", str(out), "--step-delay", "0.3"]
    hang_up_after_a_step(out, argv, env)
    marker = f"EAGLE3_TUI_RUN_DIR={out.resolve()}".encode()  # in each of its processes
    left = [p for p in processes.all_procs() if processes.has_marker(p, marker)]
    for p in left:  # the test leaves nothing behind either way
        os.kill(p, signal.SIGKILL)
    assert left == [], "the demo's training outlived the demo's terminal"
    assert json.loads((out / "run.json").read_text())["status"] in ("interrupted", "finished")


HUNG_EXIT = """
import os, signal, sys, threading, time
from pathlib import Path
import eagle3_tui.cli.demo as demo

marker = Path(sys.argv[1])
demo.EXIT_GRACE_S = 0.5
demo.stop_demo_run = lambda target, proc: marker.write_text("stopped")
stops = demo._HeldStops()
hung_up = demo._StopOnHangUp(None, None, marker.parent)
stops.arm(hung_up.start)
try:
    os.kill(os.getpid(), signal.SIGHUP)
    time.sleep(30)
except KeyboardInterrupt:
    pass
threading.Event().wait()  # the app's exit, hung as on a terminal that is gone
"""


def test_a_hang_up_stops_the_run_and_exits_though_the_apps_exit_hangs(tmp_path: Path) -> None:
    """The app's exit on a closed terminal can hang (Textual's threads on a hung-up
    terminal; asyncio's shutdown after a KeyboardInterrupt raised mid-task): seen in CI
    as a demo alive 180 s after its terminal closed, its training run to the end. The
    stop starts on the hang-up itself, and the process leaves after it either way."""
    marker = tmp_path / "stopped"
    proc = subprocess.Popen([sys.executable, "-c", HUNG_EXIT, str(marker)], cwd=tmp_path)
    try:
        rc = proc.wait(timeout=60)
    finally:
        proc.kill()
    assert marker.read_text() == "stopped"
    assert rc == 130


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "after"), [(signal.SIGHUP, 0.0), (signal.SIGTERM, 0.15), (signal.SIGINT, 0.3)]
)
def test_a_hang_up_before_the_monitor_is_up_stops_the_training_too(
    tmp_path: Path, how: signal.Signals, after: float
) -> None:
    """A closed terminal, a kill or Ctrl-C between the training's start and the
    monitor's mount: the demo died of the default SIGHUP and left its training running
    (in a session of its own); one that came inside an import left that package half
    made and the stop failed on it. Now it stops it, and says it was interrupted."""
    import pty

    need_training()
    out = tmp_path / "demo"
    env = dict(os.environ, TERM="xterm-256color", XDG_STATE_HOME=str(tmp_path / "state"))
    argv = [sys.executable, "-m", "eagle3_tui", "demo", "--out", str(out), "--step-delay", "0.3"]
    marker = f"EAGLE3_TUI_RUN_DIR={out.resolve()}".encode()
    pid, master = pty.fork()
    if pid == 0:
        os.execvpe(argv[0], argv, env)
    try:
        deadline = time.monotonic() + 120
        while not [p for p in processes.all_procs() if processes.has_marker(p, marker)]:
            assert time.monotonic() < deadline, "no training started"
            time.sleep(0.02)
        time.sleep(after)  # the training has just started: the monitor is not up
        os.kill(pid, how)
        status = None
        deadline = time.monotonic() + 180
        while status is None:
            done, code = os.waitpid(pid, os.WNOHANG)
            if done:
                status = code
            assert time.monotonic() < deadline, "the demo outlived its hang-up by 180 s"
            with contextlib.suppress(OSError):  # what it draws: a full pty would block it
                if select.select([master], [], [], 0.2)[0]:
                    os.read(master, 65536)
    finally:
        os.close(master)
    left = [p for p in processes.all_procs() if processes.has_marker(p, marker)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert left == [], "the demo's training outlived a hang-up before the monitor was up"
    assert os.waitstatus_to_exitcode(status) == 130


@pytest.mark.slow
@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGHUP])
def test_interrupting_the_headless_demo_stops_its_training(
    tmp_path: Path, how: signal.Signals
) -> None:
    """Ctrl-C or a closed terminal ended ``demo --headless`` and left its training
    running (in a session of its own, which they do not reach): now it stops it."""
    need_training()
    out = tmp_path / "demo"
    argv = [sys.executable, "-m", "eagle3_tui", "demo", "--headless", "--out", str(out)]
    demo = subprocess.Popen(
        [*argv, "--step-delay", "0.3", "--epochs", "5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state")),
        preexec_fn=interruptible,
    )
    try:
        wait_for_a_training_step(out, demo, 240)
        demo.send_signal(how)
        _, err = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            demo.kill()
    marker = f"EAGLE3_TUI_RUN_DIR={out.resolve()}".encode()
    left = [p for p in processes.all_procs() if processes.has_marker(p, marker)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert left == [], "the headless demo's training outlived it"
    assert demo.returncode == 130 and b"stopped: all" in err, err[-2000:]


# A monitor with a bug in one panel, run through the real command line: the patch is
# made in the child process before cli.main, the app itself has no hook for it.
CRASHING_PANEL = """
import sys
from eagle3_tui import cli
from eagle3_tui.app.widgets.panels import ProgressPanel

def render(self):
    raise ZeroDivisionError("a bug in a panel")

ProgressPanel.render = render
sys.exit(cli.main(sys.argv[1:]))
"""
HEADLESS = {"TEXTUAL_DRIVER": "textual.drivers.headless_driver:HeadlessDriver"}


@pytest.mark.slow
def test_a_crash_of_the_monitor_is_its_exit_status(tiny_run: Path, tmp_path: Path) -> None:
    env = dict(os.environ, **HEADLESS)
    monitor = subprocess.run(
        [sys.executable, "-c", CRASHING_PANEL, str(tiny_run)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert monitor.returncode == EXIT_CRASHED, monitor.stderr[-2000:]
    assert "ZeroDivisionError" in monitor.stderr  # Textual's traceback
    assert "the monitor stopped on an error" in monitor.stderr
    need_training()
    out = tmp_path / "demo"
    demo = subprocess.run(
        [sys.executable, "-c", CRASHING_PANEL, "demo", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        env=dict(env, XDG_STATE_HOME=str(tmp_path / "state")),
        check=False,
    )
    assert demo.returncode == EXIT_CRASHED, demo.stderr[-2000:]
    assert "the monitor stopped on an error" in demo.stderr
    assert "eagle3-tui demo: stopping the run" in demo.stderr  # and then it is stopped
    marker = f"EAGLE3_TUI_RUN_DIR={out.resolve()}".encode()  # in each of its processes
    assert [p for p in processes.all_procs() if processes.has_marker(p, marker)] == []
