"""A user's three findings: the fleet's table cut a figure that grew (``105/14``), the
export's ``epoch`` counted from 0 beside the screen's ``epoch 3/6``, and the progress
panel named the oldest resume where the newest is the one the run goes on from."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

from textual.widgets import DataTable

from eagle3_tui.app.fleet import FleetApp
from eagle3_tui.app.widgets.header import RunHeader
from eagle3_tui.app.widgets.panels import ProgressPanel
from eagle3_tui.fleet import Fleet, FleetRow
from eagle3_tui.model.verdict import Health
from tests.app.conftest import T0, text_of, training
from tests.app.test_pilot import NOW, app_with
from tests.conftest import until
from tests.records import Lines


def _table_text(table: DataTable[object]) -> str:
    return "\n".join(table.render_line(y).text for y in range(table.size.height))


async def test_the_fleets_cells_widen_as_their_figures_grow() -> None:
    """A run at step 96/144, then 105/144: the STEP column kept the width of ``96/144``
    and showed ``105/14``. Every column grows with its figures (health, τ, checkpoint…)."""
    fleet = Fleet([])
    small = FleetRow(
        key="h:/r",
        host="h",
        run="/r",
        opens=("h:/r",),
        health="running",
        reason="/r is running",
        step=96,
        total_steps=144,
        loss=2.5,
        tau=1.5,
        steps_per_s=3.25,
        eta_s=100.0,
        gpus=8,
        gpus_busy=7,
        checkpoint="c/1",
    )
    grown = dataclasses.replace(
        small,
        health="stopped",
        link_down=True,
        step=105,
        loss=2.34567,
        tau=1.834,
        tau_trend=0.05,
        steps_per_s=13.25,
        eta_s=None,
        gpus=16,
        gpus_busy=16,
        checkpoint="checkpoints/10",
    )
    app = FleetApp(fleet)
    async with app.run_test(size=(160, 20)) as pilot:
        table = app.query_one(DataTable)
        for r in (small, grown):
            fleet.rows = {r.key: r}
            fleet.generation += 1
            app.redraw()
            await pilot.pause(0.2)
        shown = _table_text(table)
    for figure in ("STOPPED (link down)", "105/144", "2.346", "1.83 ↑0.05", "13.25/s"):
        assert figure in shown, shown
    assert "16/16 busy" in shown and "checkpoints/10" in shown, shown


async def test_the_exports_epoch_counts_from_1_as_the_screen_does(tmp_path: Path) -> None:
    """Step 600 of epochs of 200 steps: the header says epoch 3; the CSV said 2."""
    _, data = training(600)
    app, _ = app_with(data, export_dir=tmp_path, now=[NOW])
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.global_step == 599, what="step 599")
        header = app.query_one(RunHeader)
        await until(pilot, lambda: "epoch 3" in text_of(header), what="epoch 3 in the header")
        path, _rows = await app.pipeline.export_csv(tmp_path, "exp7", None)
    got = list(csv.DictReader(path.open()))
    assert (got[0]["step"], got[0]["epoch"]) == ("1", "1")
    assert (got[199]["step"], got[199]["epoch"]) == ("200", "1")
    assert (got[200]["step"], got[200]["epoch"]) == ("201", "2")
    assert (got[-1]["step"], got[-1]["epoch"]) == ("600", "3")


async def test_the_history_line_names_the_newest_resume() -> None:
    """Resumed at step 40, then at 49: the panel said the first, with "1 more"; the run
    goes on from the second."""
    lines = Lines(t0=T0, dt=0.5)
    data = [lines.event("start", pid=4242)]
    data += [lines.train(s, 2.0 - s / 200) for s in range(45)]
    data.append(lines.event("resume", pid=4243, step=39))
    data += [lines.train(s, 2.0 - s / 200) for s in range(39, 57)]
    data.append(lines.event("resume", pid=4244, step=48))
    data += [lines.train(s, 2.0 - s / 200) for s in range(48, 70)]
    data.append(lines.event("finish", step=70))
    app, _ = app_with(data, now=[lines.ts + 60])
    async with app.run_test(size=(160, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.health == Health.FINISHED, what="finished")
        panel = app.query_one(ProgressPanel)
        await until(pilot, lambda: "hist" in text_of(panel), what="the history line")
        shown = text_of(panel, width=panel.content_size.width)
    said = "hist  resumed at step 49 (steps 49 to 57 done again) · 1 earlier in summary"
    assert said in shown, shown
