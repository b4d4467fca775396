"""What the screen says, read as a newcomer reads it: the view's state where the eye
is, whole log lines, one checkpoint line per save, live workers only, plain grammar,
the GPU panel's one-line cause, the acceptance chart's scales and legend, the help
that matches what ``q`` does, and exports named after the run in a folder one finds."""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from eagle3_tui.app.run_control import RunControl
from eagle3_tui.app.screens.help import HelpScreen
from eagle3_tui.app.screens.runs import RunPicker, run_row
from eagle3_tui.app.widgets.header import HealthBanner
from eagle3_tui.app.widgets.log import LogPanel
from eagle3_tui.app.widgets.panels import AcceptanceTable, DataPanel, GpuPanel, ProgressPanel
from eagle3_tui.app.widgets.plots import TAU_MIN_HEIGHT, AcceptancePlot, LossPlot
from eagle3_tui.telemetry import nvml
from eagle3_tui.transport.channel import LocalHost
from eagle3_tui.transport.replies import RunEntry, RunsReport
from tests.app.conftest import T0, text_of, training
from tests.app.test_pilot import app_with
from tests.conftest import until
from tests.records import Lines

LONG = (
    "torch.utils.data.dataloader: This DataLoader will create 8 worker processes in total. "
    "Our suggested max number of worker in current system is 2, which is smaller than what "
    "this DataLoader is going to create; lower the worker number to avoid a freeze. END"
)


async def test_the_plot_titles_say_window_smoothing_and_log_scale() -> None:
    _, data = training(600)
    app, _ = app_with(data)
    async with app.run_test(size=(120, 40)) as pilot:
        loss, acc = app.query_one(LossPlot), app.query_one(AcceptancePlot)
        await until(pilot, lambda: app.snapshot.global_step == 599, what="step 599")
        assert loss.border_title == "loss · all steps · smoothing 0.6"
        assert acc.border_title == "acceptance · all steps · smoothing 0.6"
        await pilot.press("s", "left_square_bracket", "l")
        assert loss.border_title == "loss · last 300 steps · smoothing 0.9 · log"
        assert acc.border_title == "acceptance · last 300 steps · smoothing 0.9"
        await pilot.press("s", "s", "0", "l")
        assert loss.border_title == "loss · all steps · smoothing off"
    narrow_app = app_with(data)[0]
    async with narrow_app.run_test(size=(80, 24)) as pilot:  # a narrow chart
        plot = narrow_app.query_one(LossPlot)
        await until(pilot, lambda: narrow_app.snapshot.global_step == 599, what="step 599")
        await pilot.press("s", "s", "s", "left_square_bracket", "l")
        assert plot.border_title == "loss · last 300 · raw · log"
        assert plot.border_title is not None and len(plot.border_title) < plot.size.width


async def help_shown(quit_stops_run: bool) -> str:
    app, _ = app_with()
    app.quit_stops_run = quit_stops_run
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
        return text_of(app.screen.query_one("#help").children[0], width=120)


async def test_help_says_what_q_does_here_and_the_comparison_keys() -> None:
    monitor, demo = await help_shown(False), await help_shown(True)
    assert "quit; the run goes on" in monitor and "stop the demo's run" not in monitor
    assert "quit and stop the demo's run" in demo and "the run goes on" not in demo
    for shown in (monitor, demo):
        assert "a changes the axis" in shown  # on the comparison screen
        assert "plots' titles show the window" in shown


async def test_log_lines_are_shown_whole_and_m_opens_them_all() -> None:
    lines = Lines(t0=T0)
    data = lines.train(0, 2.0) + lines.log(LONG, "WARNING") + lines.log("short one after")
    app, _ = app_with(data)
    async with app.run_test(size=(120, 40)) as pilot:
        panel = app.query_one(LogPanel)
        await until(pilot, lambda: "short one after" in text_of(panel, 118), what="the log")
        shown = text_of(panel, 118)
        assert "…" not in shown
        assert " ".join(shown.split()).count(" ".join(LONG.split())) == 1  # wrapped, whole
        assert "m: all" in str(panel.border_title)
    from eagle3_tui.app.screens.log import LogScreen

    app, _ = app_with(data)
    async with app.run_test(size=(80, 24)) as pilot:  # the panel has two rows here
        await until(pilot, lambda: app.snapshot.warnings == 1, what="the warning")
        await pilot.press("m")
        await until(pilot, lambda: isinstance(app.screen, LogScreen), what="the messages")
        await pilot.pause(0.2)
        whole = text_of(app.screen.query_one("#messages-text"), 80)
        assert " ".join(LONG.split()) in " ".join(whole.split()) and "…" not in whole
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, LogScreen), what="closed")


async def test_a_save_on_a_signal_is_one_checkpoint_line() -> None:
    lines, data = training(50, gpus=1)
    path = "/runs/exp7/checkpoints/interrupted"
    data += lines.ckpt("save_started", path, label="interrupted")
    data += lines.ckpt("save_finished", path, bytes=2.0 * 2**30, duration_s=4.5, complete=True)
    data += lines.ckpt("interrupted", path, bytes=2.0 * 2**30, complete=True)
    data += lines.event("interrupt", step=49)
    app, _ = app_with(data)
    async with app.run_test(size=(120, 40)) as pilot:
        progress = app.query_one(ProgressPanel)
        await until(pilot, lambda: "interrupted" in text_of(progress), what="the checkpoint")
        shown = text_of(progress)
        assert shown.count("checkpoints/interrupted") == 1
        assert "checkpoints/interrupted  2.0 GiB in 4.5 s  interrupted" in shown


async def test_after_a_resume_the_data_panel_shows_the_live_processes_only() -> None:
    lines = Lines(t0=T0)

    def io(*pids: int) -> bytes:
        workers = [
            {"pid": p, "role": "main" if i == 0 else "worker", "read_bytes": 1e5}
            for i, p in enumerate(pids)
        ]
        return lines.make("io", interval_s=1.0, workers=workers, bytes=1e5 * len(pids))

    data = lines.train(0, 2.0) + io(4242, 4250, 4251) + lines.event("interrupt", step=0)
    data += lines.event("resume", pid=5151) + io(5151, 5160, 5161)
    app, _ = app_with(data)
    async with app.run_test(size=(120, 40)) as pilot:
        panel = app.query_one(DataPanel)
        await until(pilot, lambda: "5151" in text_of(panel), what="the new trainer")
        shown = text_of(panel)
        assert "5160" in shown and "5161" in shown
        assert "4242" not in shown and "4250" not in shown


async def test_a_training_without_telemetry_shows_its_process_tree() -> None:
    """Issue 28, item 5: the README promised the observed run's process tree with CPU
    and memory; no panel showed it (the data panel listed only processes that read)."""
    obs = Lines(writer="obs", t0=T0, dt=1.0)
    members = [
        {"pid": 4242, "role": "trainer", "comm": "python", "state": "R", "cpu_pct": 97.0,
         "rss": 3 * 2**30},
        {"pid": 4250, "role": "worker", "comm": "pt_data_worker", "state": "D", "cpu_pct": 4.0,
         "rss": 200 * 2**20},
        {"pid": 4251, "role": "worker", "comm": "pt_data_worker", "state": "S"},
    ]  # fmt: skip
    proc = json.loads(obs.proc(started=T0 - 60))
    data = [(json.dumps(proc | {"processes": members}) + "\n").encode()]
    reads = [{"pid": 4250, "role": "worker", "read_bytes": 5 * 2**20}]
    data.append(obs.make("io", interval_s=1.0, workers=reads, bytes=5 * 2**20))
    app, _ = app_with(data, now=[T0 + 1])
    async with app.run_test(size=(120, 40)) as pilot:
        panel = app.query_one(DataPanel)
        await until(pilot, lambda: "4251" in text_of(panel), what="the tree")
        rows = {r.split()[0]: r for r in text_of(panel).splitlines()[2:] if r.strip()}
        assert "trainer" in rows["4242"] and "97%" in rows["4242"] and "3.0 GiB" in rows["4242"]
        assert "worker" in rows["4250"] and "in I/O wait" in rows["4250"]
        assert "5.0 MiB/s" in rows["4250"]  # its reads, on its row
        assert "–%" in rows["4251"]
        assert panel.border_title == "data · processes"


@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
async def test_the_silent_banner_keeps_its_cause_and_remedy(size: tuple[int, int]) -> None:
    """Issue 28, item 5: at 120x40 the banner of a training without telemetry ended
    "Attach live (a, or": three lines cut the remedy. Its middle is cut instead."""
    obs = Lines(writer="obs", t0=T0, dt=1.0)
    data = [obs.at(T0 + k).proc(started=T0 - 120, log_grew=100.0) for k in range(0, 60, 2)]
    for k in range(10, 60, 10):  # every piece of evidence the reason can name: its longest
        data.append(obs.at(T0 + k).bar(k // 10, 24, 24, 6.0))
        data.append(obs.at(T0 + k).ckpt("save_finished", f"/w/checkpoints/{k // 10}", bytes=9))
    data.sort(key=lambda line: json.loads(line)["ts"])
    app, _ = app_with(data, now=[T0 + 60])
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.snapshot.health.value == "silent", what="silent")
        banner = app.query_one(HealthBanner)
        # on the screen, not a fresh render: the banner laid out for what it says now
        await until(pilot, lambda: "telemetry." in "".join(on_screen(app, banner)), what="remedy")
        shown = " ".join(text_of(banner).split())
        reason = app.snapshot.diagnosis.reason
        assert shown.endswith("restart it with telemetry."), shown
        wrapped = banner.render().wrap(app.console, banner.content_size.width)
        assert len(wrapped) <= banner.content_size.height <= 3  # all of it is seen
        if size[0] >= 120:  # the cause, whole, with the remedy
            assert "Attach live (a, or eagle3-tui attach)" in shown
            assert "the speculators.metrics logger has no handler" in shown, (shown, reason)
        assert len(reason) > 300, reason  # more than three lines hold


async def test_a_trend_over_one_step_says_step() -> None:
    lines = Lines(t0=T0)
    data = b"".join(lines.train(s, 2.0, acc=(0.5 + s / 10, 0.3, 0.2)) for s in range(4))
    app, _ = app_with(data)
    async with app.run_test(size=(120, 40)) as pilot:
        table = app.query_one(AcceptanceTable)
        await until(pilot, lambda: " in 1 step" in text_of(table), what="the τ trend")
        assert "in 1 steps" not in text_of(table)


def on_screen(app: Any, widget: Any) -> list[str]:
    """The rows of ``widget``'s content as the terminal shows them (not a re-render)."""
    with open(os.devnull, "w") as sink:
        console = Console(width=app.size.width, record=True, file=sink, color_system=None)
        console.print(app.screen._compositor.render_update(full=True))
    rows = console.export_text().splitlines()
    r = widget.content_region
    return [row[r.x : r.x + r.width].rstrip() for row in rows[r.y : r.y + r.height]]


def have_nvidia_driver() -> bool:
    return any(os.path.exists(p) for p in ("/proc/driver/nvidia/version", "/dev/nvidiactl"))


def sampled(tmp_path: Path, api: nvml.Nvml) -> bytes:
    """The GPU sampler's record through the real NVML seam (PynvmlApi), as written."""
    from eagle3_tui.telemetry.samplers import GpuSampler
    from eagle3_tui.telemetry.writer import JsonlWriter

    path = tmp_path / "metrics.jsonl"
    path.unlink(missing_ok=True)
    writer = JsonlWriter(path, background=False)
    sampler = GpuSampler(writer, api, entries=None, run_pids=set)
    sampler.sample(T0)
    sampler.close()
    writer.close()
    return path.read_bytes()


async def gpu_panel_rows(data: bytes, size: tuple[int, int]) -> list[str]:
    app, _ = app_with(Lines(t0=T0).train(0, 2.0) + data)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.snapshot.gpu_status is not None, what="the GPU record")
        await pilot.pause(0.1)
        return [row for row in on_screen(app, app.query_one(GpuPanel)) if row.strip()]


async def test_the_no_driver_line_names_the_cause_and_fix_on_this_machine(
    tmp_path: Path,
) -> None:
    """The real NVML seam on this machine (no NVIDIA driver): one line on the screen,
    the cause first; with a driver but without the binding: the binding and its fix."""
    if have_nvidia_driver():
        pytest.skip("this machine has an NVIDIA driver")
    data = sampled(tmp_path, nvml.PynvmlApi())
    assert await gpu_panel_rows(data, (120, 40)) == [
        "no NVIDIA driver on the training host (CPU only)"
    ]
    narrow = await gpu_panel_rows(data, (80, 24))
    assert len(narrow) == 1 and narrow[0].startswith("no NVIDIA driver on the training")
    if importlib.util.find_spec("pynvml") is None:  # a driver, no binding: said so, its fix
        nvml_files = nvml.DRIVER_FILES
        fake = tmp_path / "version"
        fake.write_text("NVRM version: 570.124.06\n")
        nvml.DRIVER_FILES = (str(fake),)
        try:
            data = sampled(tmp_path, nvml.PynvmlApi())
        finally:
            nvml.DRIVER_FILES = nvml_files
        assert await gpu_panel_rows(data, (120, 40)) == [nvml.NO_BINDING]


async def test_the_acceptance_chart_scales_accuracies_and_tau_apart_with_a_legend() -> None:
    lines = Lines(t0=T0)
    data = b"".join(lines.train(s, 1.0, acc=(0.25 + 0.05 * (s % 3), 0.3, 0.3)) for s in range(60))
    app, _ = app_with(data)
    async with app.run_test(size=(120, 40)) as pilot:
        plot = app.query_one(AcceptancePlot)
        await until(pilot, lambda: app.snapshot.global_step == 59, what="step 59")
        await until(pilot, lambda: app.lines_current and plot.is_current, what="drawn")
        shown = text_of(plot, 58)
        axis = [m.group() for row in shown.splitlines() if (m := re.match(r"\d+\.\d+", row))]
        # accuracies up to 0.35 on an axis to 0.40 (not 1.00), τ (~1.45) on its own
        assert axis[0] == "0.40" and "1.00" not in axis
        tau = [float(a) for a in axis if float(a) >= 1.0]
        assert tau and all(1.3 < t < 1.6 for t in tau)
        legend = str(plot.border_subtitle)
        assert "k=0" in legend and "k=1" in legend and "k=2" in legend and "τ" in legend
        rows = [m.group() for row in shown.splitlines() if (m := re.match(r"\d+\.\d+", row))]
        assert rows.index("0.40") < rows.index(max(rows, key=float))  # τ underneath, as help says
    small = app_with(data)[0]
    async with small.run_test(size=(80, 24)) as pilot:  # no room for τ's strip: in the table
        plot, table = small.query_one(AcceptancePlot), small.query_one(AcceptanceTable)
        await until(pilot, lambda: small.snapshot.global_step == 59, what="step 59")
        await until(pilot, lambda: small.lines_current and plot.is_current, what="drawn")
        assert plot.size.height < TAU_MIN_HEIGHT and "τ" not in str(plot.border_subtitle)
        assert "τ" in "".join(on_screen(small, table)), on_screen(small, table)
    help_shown_text = await help_shown(False)
    assert "τ on the right" not in help_shown_text and "τ in a strip" in help_shown_text
    assert f"underneath where the panel has {TAU_MIN_HEIGHT} rows" in help_shown_text


class CountingControl(RunControl):
    """The real agent, and which runs were asked of it."""

    calls: list[str]

    async def runs(self, all_users: bool = False) -> RunsReport:
        self.calls.append("runs of all users" if all_users else "runs")
        return await super().runs(all_users)


async def test_the_run_picker_lists_your_runs_and_a_shows_all_users(tmp_path: Path) -> None:
    row = run_row(RunEntry(run_dir="/runs/exp6", exists=True, alive=False, status="interrupted"))
    assert "interrupted  /runs/exp6" in row.plain  # the status never runs into the path
    control = CountingControl(LocalHost(), str(tmp_path), str(tmp_path))
    control.calls = []
    app, _ = app_with(control=control)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, RunPicker), what="the picker")
        picker = app.screen
        assert isinstance(picker, RunPicker)
        await until(pilot, lambda: "runs" in control.calls, what="the runs")
        status = picker.query_one("#picker-status")
        await until(pilot, lambda: "Listing" not in text_of(status), timeout=30, what="listed")
        assert "runs of all users" not in control.calls
        await pilot.press("a")
        await until(pilot, lambda: "runs of all users" in control.calls, what="all users")


async def test_export_is_named_after_the_run_and_never_lands_in_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clone = tmp_path / "clone"
    clone.mkdir()
    monkeypatch.chdir(clone)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    _, data = training(100)
    (tmp_path / "a-file").write_text("")
    path = tmp_path / "data" / "eagle3-tui" / "exports" / "exp7-steps1-100.csv"
    said = await export_notice(data, None, path)
    assert f"100 steps written to {path}" in said
    path.unlink()
    # the run's own folder cannot be made (a file is in the way): the data folder then
    said = await export_notice(data, tmp_path / "a-file" / "exports", path)
    assert f"100 steps written to {path}" in said and str(tmp_path / "a-file") in said
    assert os.listdir(clone) == []


async def export_notice(data: bytes, export_dir: Path | None, expected: Path) -> str:
    app, _ = app_with(data, export_dir=export_dir)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.global_step == 99, what="step 99")
        await pilot.press("e")
        await until(pilot, expected.exists, what="the CSV")
        await until(pilot, lambda: bool(app._notifications), what="the notice")
        return " ".join(str(n.message) for n in app._notifications)


def test_the_log_says_events_steps_as_the_banner_does() -> None:
    """The log's events said "start at step 0", "interrupt at step 22" and "resume at
    step 22", where the banner says "Interrupted after step 22" and the progress
    panel "resumed at step 23" (steps count from 1; an event's step is the steps done)."""
    from eagle3_tui.app.widgets.log import log_entries
    from eagle3_tui.model.run import Run
    from eagle3_tui.model.snapshot import ViewParams, build_snapshot
    from tests.records import Lines

    lines = Lines(t0=T0)
    data = lines.event("start", pid=1, global_step=0)
    data += b"".join(lines.train(s, 1.0) for s in range(22))
    data += lines.event("interrupt", step=22)
    data += lines.event("resume", pid=2, global_step=22)
    run = Run()
    run.feed(0, data)
    snap = build_snapshot(run.state, lines.ts, ViewParams())
    said = [body.plain for _, body in log_entries(snap, 10)]
    assert "start (pid 1)" in said, said
    assert "interrupt after step 22" in said and "resume after step 22 (pid 2)" in said, said
    assert not any("at step" in s for s in said), said
    # a kill's stop and a crash its sidecar saw carry the last step's 0-based index: the
    # log said "stop after step 77" and "crash after step 59" beside "after step 78/60"
    data += lines.event("stop", step=29, global_step=30)
    gone = "the trainer process 2 exited without a finish event (killed by SIGKILL)"
    data += lines.event("crash", step=34, error=gone)
    run = Run()
    run.feed(0, data)
    snap = build_snapshot(run.state, lines.ts, ViewParams())
    said = [body.plain for _, body in log_entries(snap, 10)]
    assert "stop after step 30" in said, said
    assert any(s.startswith("crash after step 35: the trainer process 2") for s in said), said


async def test_the_acceptance_table_shows_the_last_validation_where_it_has_a_row() -> None:
    """The table's last validation row needed a row more than its header, TTT steps
    and τ take: at 120×40 (six rows, three TTT steps) it was never drawn."""
    lines = Lines(t0=T0)
    data = b"".join(lines.train(s, 1.0, acc=(0.5, 0.3, 0.2)) for s in range(10))
    app, _ = app_with(data + lines.val(10, 0, 0.9))
    async with app.run_test(size=(120, 40)) as pilot:
        table = app.query_one(AcceptanceTable)
        await until(pilot, lambda: "val e1 loss 0.9000 acc0 0.400" in text_of(table), what="val")
        assert text_of(table).count("\n") <= table.rows, text_of(table)
