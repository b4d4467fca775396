"""The header while the link is down, alike for every health (a STALLED run kept its own
label there and said "last known · LINK DOWN" after it, a RUNNING one said "LINK DOWN
last running"); and the note of a run RUNNING through a pause, which the monitor never
showed (its banner is only for runs not simply running)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from rich.text import Text
from textual.app import App, ComposeResult

from eagle3_tui.app.widgets.header import (
    HEALTH_STYLE,
    LINK_DOWN_STYLE,
    HealthBanner,
    RunHeader,
)
from eagle3_tui.model.snapshot import EMPTY, Snapshot
from eagle3_tui.model.verdict import Diagnosis, Health
from eagle3_tui.transport.base import Link, LinkChanged
from tests.app.conftest import text_of

DOWN_AT = 1_800_000_000.0
LINK_DOWN_HEALTHS = (
    Health.RUNNING,
    Health.WAITING,
    Health.SILENT,
    Health.STALLED,
    Health.DEAD,
    Health.DIVERGED,
    Health.DISK_FULL,
)
"""Every health a verdict keeps while the link is down (an end that reached the client,
finished, stopped, unreadable, stays as it is: ``health._while_link_down``)."""
PAUSE = (
    "No metric for 70 s (a step usually takes 2.0 s), but the trainer (pid 4242) is not "
    "idle (GPU 97 % busy): a pause between logged steps, as a checkpoint save or a "
    "validation makes; within the pause the run has shown (the longest 60 s). Silent only "
    "if none comes within 90 s."
)


def picture(health: Health, reason: str = "Step 5 logged.", down: float | None = None) -> Snapshot:
    return replace(EMPTY, now=DOWN_AT + 30.0, diagnosis=Diagnosis(health, reason, down))


class Banner(App[None]):
    CSS_PATH = str(Path(__file__).resolve().parents[2] / "eagle3_tui/app/app.tcss")

    def compose(self) -> ComposeResult:
        yield HealthBanner()


def styled(text: Text, word: str) -> str:
    """The style of the span of ``text`` that is `` word ``."""
    plain = text.plain
    at = plain.index(f" {word} ")
    for span in text.spans:
        if span.start == at and span.end == at + len(word) + 2:
            return str(span.style)
    raise AssertionError(f"no span for {word!r} in {plain!r}")


class Header(App[None]):
    def compose(self) -> ComposeResult:
        yield RunHeader("gpu-box:/runs/exp7")


@pytest.mark.parametrize("health", LINK_DOWN_HEALTHS, ids=lambda h: h.value)
async def test_every_health_reads_link_down_then_the_last_known_one_in_its_colours(
    health: Health,
) -> None:
    app = Header()
    async with app.run_test(size=(160, 5)) as pilot:
        header = app.query_one(RunHeader)
        header.snapshot = picture(health, down=DOWN_AT)
        header.link = LinkChanged(Link.RECONNECTING, "gpu-box: connection refused", retry_in=4.0)
        await pilot.pause()
        text = header.render()
    word = health.value.upper().replace("_", " ")
    shown = text.plain
    # what is true now first, then what was last known, said to be that
    assert shown.startswith(f" eagle3-tui   LINK DOWN  last known  {word}  "), shown
    assert styled(text, "LINK DOWN") == LINK_DOWN_STYLE
    # the last verdict keeps its own colours: an alarm is not turned grey
    assert styled(text, word) == HEALTH_STYLE[health]
    assert shown.count(word) == 1 and "last " + health.value not in shown, shown


@pytest.mark.parametrize("health", LINK_DOWN_HEALTHS, ids=lambda h: h.value)
def test_the_label_is_link_down_for_every_health(health: Health) -> None:
    assert Diagnosis(health, "…", DOWN_AT).label == "LINK DOWN"
    assert Diagnosis(health, "…").label == health.value.upper().replace("_", " ")


async def test_a_run_running_through_a_pause_shows_its_note_dim() -> None:
    app = Banner()
    async with app.run_test(size=(120, 10)) as pilot:
        banner = app.query_one(HealthBanner)
        banner.snapshot = picture(Health.RUNNING)  # simply running: no banner, as before
        await pilot.pause()
        assert not banner.display
        banner.snapshot = picture(Health.RUNNING, PAUSE)
        await pilot.pause()
        assert banner.display and banner.has_class("-note"), banner.classes
        assert not banner.has_class("-alarm") and not banner.has_class("-calm")
        said = " ".join(text_of(banner, 120).split())
        assert said.startswith("RUNNING No metric for 70 s"), said
        assert "within the pause the run has shown" in said, said
        # the note goes with the pause
        banner.snapshot = picture(Health.RUNNING, "Step 41 logged, 0.50 steps/s.")
        await pilot.pause()
        assert not banner.display


async def test_the_note_counting_up_repaints_without_a_layout() -> None:
    """The note's seconds change every second: the same box, words repainted; a layout of
    the whole screen is only for a banner that comes, goes or changes its height."""
    app = Banner()
    async with app.run_test(size=(120, 10)) as pilot:
        banner = app.query_one(HealthBanner)
        banner.snapshot = picture(Health.RUNNING, PAUSE)
        await pilot.pause()
        layouts: list[bool] = []
        refresh = banner.refresh

        def counted(*args: object, layout: bool = False, **kwargs: object) -> object:
            layouts.append(layout)
            return refresh(*args, layout=layout, **kwargs)  # type: ignore[arg-type]

        banner.refresh = counted  # type: ignore[method-assign,assignment]
        banner.snapshot = picture(Health.RUNNING, PAUSE.replace("70 s", "71 s", 1))
        await pilot.pause()
        assert layouts and not any(layouts), layouts
        assert "No metric for 71 s" in text_of(banner, 120)
