"""``a`` in the monitor: which training, the plan, a confirmation, the result; refusals
shown in the dialog. A fake host answers here; test_ssh_attach.py does it for real."""

from __future__ import annotations

from typing import Any

from eagle3_tui.app.app import make_app
from eagle3_tui.app.screens.attach import AttachDialog
from eagle3_tui.transport.replay import ReplayTransport
from eagle3_tui.transport.replies import AttachPlan, AttachResult, decode, decode_plan
from tests.app.conftest import FakeControl, text_of
from tests.conftest import until

PLAN = {
    "status": "plan",
    "pid": 5151,
    "host": "gpu-box",
    "user": "alice",
    "argv": ["python", "train.py"],
    "python": {"label": "CPython 3.11 (/usr/bin/python3.11)"},
    "mechanism": "ptrace",
    "evidence": "train.py imports speculators",
    "run_dir": "/runs/exp7",
    "files": "/home/alice/.cache/eagle3-tui",
}


class AttachHost(FakeControl):
    """The agent's replies as written here, decoded as the real agent's are. Its run
    directory has no telemetry yet (no manifest: ``a`` is offered only there, or on a live
    training without telemetry; never into a run that writes its own)."""

    def __init__(self, plans: list[dict[str, Any]], result: dict[str, Any]) -> None:
        super().__init__(fail="/runs/exp7: no run.json here")
        self.plans = plans
        self.result = result
        self.asked: list[int | None] = []
        self.attached: list[int] = []

    async def attach_plan(self, pid: int | None) -> AttachPlan | AttachResult:
        self.asked.append(pid)
        return decode_plan({"op": "attach", **self.plans.pop(0)})

    async def attach(self, plan: AttachPlan) -> AttachResult:
        self.attached.append(plan.pid)
        return decode(AttachResult, {"op": "attach", **self.result})


async def open_dialog(app: Any, pilot: Any) -> AttachDialog:
    """``a`` pressed in the monitor: the attach dialog, once it is on screen."""
    await pilot.press("a")
    await until(pilot, lambda: isinstance(app.screen, AttachDialog), what="the dialog")
    dialog = app.screen
    assert isinstance(dialog, AttachDialog)
    return dialog


async def test_choose_a_training_confirm_and_see_the_result() -> None:
    choose = {
        "status": "refused",
        "reason": "choose",
        "message": "2 trainings here",
        "candidates": [
            {"pid": 4242, "user": "bob", "argv": ["python", "other.py"]},
            {"pid": 5151, "user": "alice", "argv": ["python", "train.py"]},
        ],
    }
    result = {
        "status": "attached",
        "message": "telemetry attached after step 41",
        "global_step": 41,
        "run_dir": "/runs/exp7",
        "stopped_ms": 1.43,
        "registers": "verified",
        "pause_ms": 31.0,
        "first_step": 42,
        "first_metric_s": 0.8,
        "plan": PLAN,
    }
    host = AttachHost([choose, PLAN], result)
    app = make_app(ReplayTransport([], label="gpu-box:/runs/exp7"), control=host)
    async with app.run_test(size=(120, 40)) as pilot:
        dialog = await open_dialog(app, pilot)
        await until(pilot, lambda: dialog.state == "choosing", what="the choice")
        assert "pid 5151" in text_of(dialog.query_one("#plan"))
        await pilot.press("y")  # nothing to confirm yet
        assert host.attached == []
        await pilot.press("2")
        await until(pilot, lambda: dialog.state == "ready", what="the plan")
        assert host.asked == [None, 5151]
        shown = text_of(dialog.query_one("#plan"))
        assert "attach telemetry to pid 5151" in shown and "/runs/exp7" in shown
        assert "eagle3-tui's injector (ptrace)" in shown.replace("\n", " ")
        await pilot.press("y")
        await until(pilot, lambda: dialog.state == "done", what="the result")
        assert host.attached == [5151]
        outcome = text_of(dialog.query_one("#outcome"))
        assert "attached: telemetry attached after step 41" in outcome
        assert "main thread stopped 1.4 ms by eagle3-tui's injector" in outcome
        assert "registers given back and checked" in outcome.replace("\n", " ")
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, AttachDialog), what="closed")


async def test_a_refusal_is_shown_and_nothing_is_attached() -> None:
    refused = {
        "status": "refused",
        "reason": "no_gdb",
        "message": "pid 5151 uses musl libc (ld-musl-x86_64.so.1): eagle3-tui's injector "
        "supports glibc only; gdb, the other way in, is not on PATH on this host: install it "
        "(apt-get install gdb, dnf install gdb)",
    }
    host = AttachHost([refused], {})
    app = make_app(ReplayTransport([], label="gpu-box:/runs/exp7"), control=host)
    async with app.run_test(size=(120, 40)) as pilot:
        dialog = await open_dialog(app, pilot)
        await until(pilot, lambda: dialog.state == "failed", what="the refusal")
        assert "apt-get install gdb" in text_of(dialog.query_one("#plan"))
        await pilot.press("y")
        assert host.attached == []
