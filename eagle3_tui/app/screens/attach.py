"""``a``: add telemetry to a live training, its metrics written into this view's run
directory, then the view comes alive.

What works before the monitor can show a run without telemetry: open the monitor on
a directory of the host (``eagle3-tui HOST:runs/new``, "waiting for metrics.jsonl"),
press ``a``: the host's training (the only one, or one picked by its number) is
planned, shown, confirmed with ``y``, attached; its metrics then arrive in the stream
that was waiting. Same pattern as the kill/resume dialog: the plan, a confirmation,
the result; refusals shown here.
"""

from __future__ import annotations

from typing import ClassVar

from rich.console import Group
from rich.text import Text
from textual import work
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import Static

from eagle3_tui.app.run_control import RunControl
from eagle3_tui.app.screens.dialog import ConfirmDialog, headed
from eagle3_tui.app.text import inert
from eagle3_tui.reports import format_attach, format_attach_plan, status_line
from eagle3_tui.transport.replies import AttachCandidate, AttachPlan, AttachResult

MAX_CHOICES = 9


class AttachDialog(ConfirmDialog):
    """Attach: which training, the plan, a confirmation, the result.

    ``state`` is also ``choosing``: several trainings, one is picked by its number."""

    BINDINGS: ClassVar[list[BindingType]] = [
        *(Binding(str(i), f"choose({i})", show=False) for i in range(1, MAX_CHOICES + 1)),
    ]

    class Finished(Message):
        """The attach ran to its end (whatever it found)."""

        def __init__(self, result: AttachResult) -> None:
            super().__init__()
            self.result = result

    def __init__(self, control: RunControl, pid: int | None = None) -> None:
        super().__init__(
            control,
            box_id="attach",
            title=f"attach telemetry to a live training · {control.where}",
            asking="Asking the host…",
            confirm="Attach (y)",
            variant="warning",
        )
        self.pid = pid
        self.plan: AttachPlan | None = None
        self.choices: list[AttachCandidate] = []

    @work(exclusive=True, group="attach", exit_on_error=False)
    async def load(self) -> None:
        plan: AttachPlan | AttachResult
        try:
            plan = await self.control.attach_plan(self.pid)
        except Exception as e:  # shown: unreachable host, refused key...
            plan = AttachResult(status="error", message=f"cannot ask the host: {e}")
        if not self.is_attached:
            return
        if isinstance(plan, AttachPlan):
            self.plan = plan
            self.ready(headed(format_attach_plan(plan), "bold"))
            return
        if plan.reason == "choose" and plan.candidates:
            self.choices = plan.candidates[:MAX_CHOICES]
            self.state = "choosing"
            rows = [Text("Several trainings on the host; press the number of one:", style="bold")]
            for i, c in enumerate(self.choices, 1):
                argv = " ".join(c.argv)
                rows.append(inert(f"  {i}  pid {c.pid}  {c.user}  {argv}"[:200]))
            self.query_one("#plan", Static).update(Group(*rows))
            return
        self.failed(headed(status_line(plan.status, plan.message), "bold #d7af5f"))

    @work(exclusive=True, group="attach", exit_on_error=False)
    async def execute(self) -> None:
        outcome = self.query_one("#outcome", Static)
        outcome.update(Text("Attaching…"))
        if self.plan is None:  # only "ready" confirms (action_confirm): there is one
            return
        try:
            result = await self.control.attach(self.plan)
        except Exception as e:  # shown: a lost link
            self.state = "failed"
            if self.is_attached:
                outcome.update(inert(f"attach failed: {e}", style="bold #ff5f5f", wrap=True))
            return
        self.state = "done"
        self.app.post_message(self.Finished(result))
        if not self.is_attached:
            return
        ok = result.status in ("attached", "queued")
        self.show_outcome(headed(format_attach(result), "bold #5fd75f" if ok else "bold #ff5f5f"))
        self.closing(focus=True)

    def action_choose(self, number: int) -> None:
        if self.state != "choosing" or not 1 <= number <= len(self.choices):
            return
        self.pid = self.choices[number - 1].pid
        self.state = "loading"
        self.query_one("#plan", Static).update(Text("Asking the host…", style="dim"))
        self.load()
