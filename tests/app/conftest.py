"""Helpers for the app tests: fixed data, a frozen clock, a fake run host, rendered text."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from rich.console import Console

from eagle3_tui.app.run_control import RunControl
from eagle3_tui.transport.base import TargetError
from eagle3_tui.transport.channel import Event, LocalHost, ProgressCallback
from eagle3_tui.transport.replies import KillReport, Status, decode
from tests.conftest import LiveRun, live_training, wait_until_async
from tests.records import Lines

T0 = 1_800_000_000.0
"""2027-01-15 08:00:00 UTC: every timestamp in the fixed data starts here."""


@pytest.fixture(autouse=True)
def utc() -> Iterator[None]:
    """Clock times in the panels are local: pin the zone so the pictures do not move."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if old is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = old
    time.tzset()


@pytest.fixture(autouse=True)
def charts_follow_quickly(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chart follows new data within 2 s here, not the live pace (up to
    ``DATA_REDRAW_MAX_S``): tests that wait for a chart to show new data wait less (a
    test of the pace sets its own)."""
    from eagle3_tui.app.widgets import plots

    monkeypatch.setattr(plots, "DATA_REDRAW_MAX_S", 2.0)


def text_of(widget: Any, width: int = 160) -> str:
    """What a widget's ``render()`` shows (a plain Static: its content), as plain text."""
    from textual.widgets import Static

    shown = widget.render()
    if type(widget) is Static:
        shown = widget.content
    with open(os.devnull, "w") as sink:
        console = Console(width=width, record=True, file=sink, color_system=None)
        console.print(shown)
    return console.export_text()


def training(
    steps: int = 600, lines: Lines | None = None, gpus: int = 8, start: int = 0, worse: float = 0
) -> tuple[Lines, bytes]:
    """A realistic run: loss falling with noise, accuracies rising, GPU and read samples
    every 10 steps, validation and checkpoints each epoch of 200 steps (``worse``: a
    higher loss and lower accuracies, for a previous run to compare with)."""
    lines = lines or Lines(t0=T0, dt=0.5)
    out: list[bytes] = []
    if start == 0:
        out.append(lines.event("start", pid=4242, global_step=0))
        out.append(lines.log("Training epoch 1/6 started"))
    for s in range(start, start + steps):
        loss = 3.0 * math.exp(-s / 300) + 0.4 + 0.08 * math.sin(s / 5) + worse
        acc = (0.55 + 0.3 * s / 1000 - worse / 4, 0.62 + 0.2 * s / 1000 - worse / 8, 0.7)
        out.append(lines.train(s, loss, acc=acc, epoch=s // 200))
        if s % 10 == 0:
            out.append(lines.gpu(92.0 - (s % 40), devices=gpus))
            out.append(lines.io(3.2e6 + 1e4 * (s % 17), files=(f"data/hs_{s:05d}.safetensors",)))
        if s % 200 == 199:
            e = s // 200
            out.append(lines.val(s, e, 2.2 - 0.3 * e))
            path = f"/runs/exp7/checkpoints/{e}"
            out.append(lines.ckpt("save_finished", path, bytes=2.1e9, duration_s=3.2, epoch=e))
            if e == 0:
                out.append(lines.ckpt("best", path, epoch=e))
            out.append(lines.log(f"Training epoch {e + 2}/6 started"))
    return lines, b"".join(out)


MANIFEST = {
    "run_id": "r-1",
    "pid": 4242,
    "pgid": 4242,
    "start_ticks": 987654,
    "boot_id": "b-1",
    "host": "gpu-box",
    "cwd": "/runs",
    "started_at": T0,
    "resume_command": ["python", "-m", "train", "--resume"],
    "epochs": 6,
}


class FakeControl(RunControl):
    """A run host with fixed answers, for pictures that must not move (snapshots: fixed
    PIDs and times) and dialogs whose real part needs a debugger (attach). Its replies go
    through the same decoding as the real agent's (``replies.decode``), so they have the
    shape the agent's replies are checked to have; every other app test drives the real
    agent (``real_control``, ``live_run``)."""

    def __init__(self, alive: bool = True, fail: str | None = None) -> None:
        super().__init__(LocalHost(), "/runs/exp7", "gpu-box:/runs/exp7", kill_grace_s=130)
        self.alive = alive
        self.fail = fail
        self.calls: list[str] = []

    async def status(self, plan: bool = False) -> Status:
        self.calls.append("status")
        if self.fail:
            raise TargetError(self.fail)
        reply = {
            "op": "status",
            "alive": self.alive,
            "problem": None if self.alive else "pid 4242 is gone",
            "manifest": MANIFEST,
            "host": "gpu-box",
            "run_dir": "/runs/exp7",
        }
        return decode(Status, reply)

    async def kill(self, on_progress: ProgressCallback | None = None) -> KillReport:
        self.calls.append("kill")
        if on_progress is not None:
            on_progress(
                Event(
                    "progress",
                    {
                        "step": "signal",
                        "pid": 4242,
                        "role": "trainer",
                        "signal": "SIGTERM",
                        "result": "sent",
                    },
                )
            )
        self.alive = False
        processes = [
            (4242, "trainer", "python", ["SIGTERM"], "exited"),
            (4243, "child", "pt_data_worker", [], "exited"),
            (4244, "marked", "python", ["SIGTERM", "SIGKILL"], "killed"),
        ]
        reply = {
            "op": "kill",
            "status": "stopped",
            "message": "all 3 process(es) of the run are gone",
            "processes": [
                {"pid": p, "role": r, "comm": c, "signals": s, "outcome": o}
                for p, r, c, s, o in processes
            ],
        }
        return decode(KillReport, reply)


@pytest.fixture(scope="module")
def live_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveRun]:
    """A tiny training that runs until the module's tests stop it (many epochs, paced):
    detached, its output in its log, the run marker in its environment."""
    from eagle3_tui.telemetry.manifest import launch_env

    run_dir = tmp_path_factory.mktemp("app-live") / "run"
    args = ("--epochs", "400", "--step-delay", "0.05")
    with live_training(run_dir, args, dict(os.environ, **launch_env(run_dir))) as run:
        yield run


async def wait_until(predicate: Any, timeout: float, what: str, run: LiveRun) -> None:
    """Outside an app: poll until ``predicate()`` holds (the training's log on failure)."""
    await wait_until_async(predicate, timeout, lambda: f"{what}:\n{run.log()}", interval=0.2)


async def open_dialog(app: Any, pilot: Any, key: str, state: str = "ready") -> Any:
    """``key`` (``k``, ``r``) pressed: the kill/resume dialog once it is in ``state``
    (its plan shown, or ``failed``)."""
    from eagle3_tui.app.screens.kill_resume import ControlDialog
    from tests.conftest import until

    await pilot.press(key)
    await until(pilot, lambda: isinstance(app.screen, ControlDialog), what="the dialog")
    dialog = app.screen
    assert isinstance(dialog, ControlDialog)
    await until(pilot, lambda: dialog.state == state, timeout=30, what=f"the dialog {state}")
    return dialog


def local_app(run_dir: Any, status_interval: float = 60.0, **kwargs: Any) -> Any:
    """The monitor on a run directory of this machine, with its real control (the agent
    here): what ``eagle3-tui RUN_DIR`` opens, refreshing every 50 ms."""
    from eagle3_tui.app.app import make_app
    from eagle3_tui.transport.local import LocalTransport
    from eagle3_tui.transport.target import LocalTarget

    kwargs.setdefault("refresh_interval", 0.05)
    control = RunControl.for_target(LocalTarget(run_dir))
    return make_app(
        LocalTransport(run_dir), control=control, status_interval=status_interval, **kwargs
    )
