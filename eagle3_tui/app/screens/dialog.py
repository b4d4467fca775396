"""What the dialogs that act on a run's host share (kill, resume, attach): the plan
asked of the host, a confirmation with ``y``, then the result; ``esc`` or ``n``
cancels, except while the host works (it finishes either way).

A dialog names its frame and does its two steps: ``load`` (ask the host, then
:meth:`ConfirmDialog.ready` or :meth:`ConfirmDialog.failed`) and ``execute`` (after the
confirmation).
"""

from __future__ import annotations

from typing import ClassVar

from rich.console import Group, RenderableType
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static
from textual.widgets.button import ButtonVariant

from eagle3_tui.app.run_control import RunControl
from eagle3_tui.app.text import inert


def headed(text: str, first_style: str) -> RenderableType:
    """A report as the host wrote it: its first line in ``first_style``, the rest plain."""
    first, _, rest = text.partition("\n")
    return Group(
        inert(first, style=first_style, wrap=True),
        *(inert(ln, wrap=True) for ln in rest.splitlines()),
    )


class ConfirmDialog(ModalScreen[None]):
    """The plan (``#plan``), a confirmation (``#confirm``), the result (``#outcome``).

    ``state``: loading, ready, working, done, failed (and what a dialog adds)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "confirm", "Confirm"),
        Binding("escape,n", "close", "Cancel"),
    ]

    def __init__(
        self,
        control: RunControl,
        *,
        box_id: str,
        title: str,
        asking: str,
        confirm: str,
        variant: ButtonVariant,
    ) -> None:
        super().__init__()
        self.control = control
        self.state = "loading"
        self._dialog_box = box_id
        self._dialog_title = title
        self._dialog_asking = asking
        self._dialog_confirm = confirm
        self._dialog_variant: ButtonVariant = variant

    def compose(self) -> ComposeResult:
        box = Vertical(id=self._dialog_box, classes="dialog")
        box.border_title = inert(self._dialog_title)  # it names the run: never markup
        with box:
            with VerticalScroll(id="control-body"):
                yield Static(Text(self._dialog_asking, style="dim"), id="plan")
                yield Static("", id="outcome")
            with Horizontal(id="buttons"):
                yield Button(
                    self._dialog_confirm, id="confirm", variant=self._dialog_variant, disabled=True
                )
                yield Button("Cancel (esc)", id="close")

    def on_mount(self) -> None:
        self.load()

    def load(self) -> object:
        """Ask the host for the plan (a worker)."""
        raise NotImplementedError

    def execute(self) -> object:
        """Do what was confirmed (a worker)."""
        raise NotImplementedError

    def ready(self, plan: RenderableType) -> None:
        """The plan is shown: it may be confirmed."""
        self.query_one("#plan", Static).update(plan)
        self.state = "ready"
        confirm = self.query_one("#confirm", Button)
        confirm.disabled = False
        confirm.focus()

    def failed(self, why: RenderableType) -> None:
        """No plan: only closing is left."""
        self.state = "failed"
        self.query_one("#plan", Static).update(why)
        self.closing()

    def show_outcome(self, what: RenderableType) -> None:
        """The result, scrolled into view below a plan that may fill the dialog."""
        outcome = self.query_one("#outcome", Static)
        outcome.update(what)
        body = self.query_one("#control-body", VerticalScroll)
        self.call_after_refresh(body.scroll_to_widget, outcome, animate=False, top=True)

    def closing(self, *, focus: bool = False) -> None:
        """Cancelling has become closing (the confirmation is gone: nothing is left to
        confirm, and a button that does nothing would say otherwise)."""
        self.query_one("#confirm", Button).display = False
        close = self.query_one("#close", Button)
        close.label = "Close (esc)"
        if focus:
            close.focus()

    def action_confirm(self) -> None:
        if self.state != "ready":
            return
        self.state = "working"
        self.query_one("#confirm", Button).disabled = True
        self.execute()

    def action_close(self) -> None:
        if self.state == "working":
            self.notify("still working: the host finishes it either way", timeout=3)
            return
        self.dismiss(None)

    @on(Button.Pressed, "#confirm")
    def _confirm_pressed(self) -> None:
        self.action_confirm()

    @on(Button.Pressed, "#close")
    def _close_pressed(self) -> None:
        self.action_close()
