"""The comparison screen on two real runs: the same "what differs" as ``eagle3-tui
compare``, no bookkeeping noise in it, and its panels inside the screen."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3_tui.api.reading import load_target
from eagle3_tui.app.app import make_app
from eagle3_tui.app.run_control import RunControl
from eagle3_tui.app.screens.compare import CompareScreen
from eagle3_tui.model.compare import compare
from eagle3_tui.transport.local import LocalTransport
from eagle3_tui.transport.target import LocalTarget
from tests.app.conftest import text_of
from tests.conftest import run_tiny, until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def other_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second real run with another recipe (one epoch, another learning rate)."""
    run_dir = tmp_path_factory.mktemp("other") / "run"
    proc = run_tiny(run_dir, "--epochs", "1", "--lr", "0.01")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return run_dir


@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
async def test_what_differs_is_the_clis_and_the_panels_fit(
    tiny_run: Path, other_run: Path, size: tuple[int, int]
) -> None:
    app = make_app(
        LocalTransport(other_run),
        control=RunControl.for_target(LocalTarget(other_run)),
        compare=LocalTransport(tiny_run),
        refresh_interval=0.05,
    )
    a, _ = load_target(LocalTarget(other_run), "a")
    b, _ = load_target(LocalTarget(tiny_run), "b")
    expected = compare(a.state, b.state).hparam_diff
    keys = {key for key, _, _ in expected}
    assert {"argv.--lr", "argv.--epochs", "run.epochs"} <= keys
    assert not keys & {"run.sampler_pid", "run.finished_at", "run.first_started_at"}
    assert not any(k.startswith("run.telemetry.") for k in keys)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.snapshot.global_step == 23, 60, "the run")
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, CompareScreen), what="the screen")
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        await until(
            pilot,
            lambda: screen.comparison is not None and screen.comparison.hparam_diff == expected,
            30,
            "the comparison with both manifests",
        )
        await pilot.pause(0.2)
        shown = text_of(screen.query_one("#cmp-sides-text"), 200)
        for key, va, vb in expected:
            assert f"{key}: {va} | {vb}" in shown
        assert "argv.--lr: 0.01 | –" in shown  # the other run used the default lr
        bottom = size[1] - 1  # the footer's row
        for panel in ("#cmp-rows", "#cmp-sides"):
            region = screen.query_one(panel).region
            assert region.bottom <= bottom, (panel, region, size)
        # the table's values are each run's mean over the window, said as such (its "τ
        # 1.1349" read as the τ at the step, beside the runs panel's last τ)
        c = screen.comparison
        assert c is not None and c.window is not None
        title = str(screen.query_one("#cmp-rows").border_title)
        assert title.startswith("mean over step ") and " – step " in title, title
        sides = screen.query_one("#cmp-sides")
        sides.scroll_end(animate=False)
        await pilot.pause(0.1)
        assert sides.scroll_y == sides.max_scroll_y  # the last line can be reached
