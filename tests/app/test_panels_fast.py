"""The text panels' lines drawn without Rich's layout pass look as Rich draws them.

:class:`~eagle3_tui.app.widgets.panels.TextLines` stands in for a Rich ``Group`` of
one-line texts. Each case here is drawn both ways through Textual's own
``Visual.to_strips`` (the widget's style, selection, links) and compared cell for cell:
character and full style.
"""

from __future__ import annotations

import random

from rich.console import Group
from rich.style import Style
from rich.text import Text
from textual.app import App, ComposeResult
from textual.visual import RichVisual, Visual
from textual.widget import Widget
from textual.widgets import Static

from eagle3_tui.app.widgets.panels import (
    AcceptanceTable,
    DataPanel,
    GpuPanel,
    Panel,
    ProgressPanel,
    TextLines,
    lines_of,
)
from tests.app.conftest import training
from tests.app.test_pilot import app_with
from tests.app.test_refresh_cost import settled

Cells = list[list[tuple[str, object]]]


def both(widget: Widget, group: Group, width: int, height: int) -> tuple[Cells, Cells] | None:
    fast = lines_of(group)
    if fast is None:
        return None
    style = widget.visual_style

    def cells(visual: Visual) -> Cells:
        strips = Visual.to_strips(widget, visual, width, height, style)
        return [[(ch, seg.style) for seg in strip for ch in seg.text] for strip in strips]

    return cells(fast), cells(RichVisual(widget, group))


WORDS = ["step", "1,234", "0.4995", "██▌", "⣿⡀", "…", "ETA", " ", "  ", "τ", "→ +0.05", "日本"]
STYLES = ["", "bold", "dim", "#5fafd7", "bold #ffd75f", "on #d70000", "italic green", "reverse"]


def random_text(rng: random.Random) -> Text:
    text = Text(
        no_wrap=True,
        overflow=rng.choice(["ellipsis", "crop", "fold", None]),
        style=rng.choice(STYLES),
    )
    for _ in range(rng.randint(0, 8)):
        text.append(rng.choice(WORDS), style=rng.choice(STYLES))
    return text


class Box(App[None]):
    CSS = "Static { border: round $accent; padding: 0 1; }"

    def compose(self) -> ComposeResult:
        yield Static(id="box")


async def test_random_lines_look_as_rich_draws_them() -> None:
    rng = random.Random(7)
    app = Box()
    async with app.run_test(size=(80, 20)):
        box = app.query_one("#box", Static)
        compared = 0
        for _ in range(400):
            group = Group(*(random_text(rng) for _ in range(rng.randint(0, 6))))
            got = both(box, group, rng.randint(1, 60), rng.randint(1, 8))
            assert got is not None
            assert got[0] == got[1]
            compared += 1
        assert compared == 400


async def test_what_is_not_one_line_of_text_goes_to_rich() -> None:
    async with Box().run_test():
        what_goes_to_rich()


def what_goes_to_rich() -> None:
    assert lines_of(Group(Text("a\nb", no_wrap=True))) is None
    assert lines_of(Group(Text("wraps"))) is None  # no_wrap unset: Rich wraps it
    assert lines_of(Group(Text("x", no_wrap=True, justify="right"))) is None
    assert lines_of(Group(Text("x", no_wrap=True, style=Style(link="https://x")))) is None
    assert lines_of(Group(Text("x", no_wrap=True, style="bold link https://x"))) is None
    text = Text("x", no_wrap=True)
    text.append("y", style=Style.from_meta({"@click": "app.bell"}))
    assert lines_of(Group(text)) is None
    fast = lines_of(Group(Text("a", no_wrap=True), Text("b", no_wrap=True)))
    assert isinstance(fast, TextLines) and len(fast.lines) == 2


async def test_the_panels_of_a_run_look_as_rich_draws_them() -> None:
    _, data = training(600, gpus=8)
    for size in ((120, 40), (80, 24), (200, 50), (60, 30)):
        app, _ = app_with(data)
        async with app.run_test(size=size) as pilot:
            await settled(app, pilot, 599)
            fast = 0
            for cls in (AcceptanceTable, ProgressPanel, GpuPanel, DataPanel):
                panel: Panel = app.query_one(cls)
                drawn = panel.draw()
                width, height = panel.content_size
                got = both(
                    panel, drawn if isinstance(drawn, Group) else Group(drawn), width, height
                )
                if got is not None:
                    fast += 1
                    assert got[0] == got[1], f"{cls.__name__} at {size}"
            assert fast >= 3, "most panels take the fast path"
