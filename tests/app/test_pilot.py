"""The monitor driven by Pilot over a replay transport and a frozen clock: every key and
every state change; its control paths (status probes, kill, resume, the runs) through
the real agent on this machine, acting on a real tiny training."""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

from textual.widgets import OptionList

from eagle3_tui.app.app import MonitorApp, make_app
from eagle3_tui.app.run_control import RunControl
from eagle3_tui.app.screens.compare import CompareScreen
from eagle3_tui.app.screens.help import HelpScreen
from eagle3_tui.app.screens.kill_resume import ControlDialog
from eagle3_tui.app.screens.runs import RunPicker, run_row
from eagle3_tui.app.widgets.header import HealthBanner, RunHeader
from eagle3_tui.app.widgets.log import LogPanel
from eagle3_tui.app.widgets.panels import AcceptanceTable, DataPanel, GpuPanel, ProgressPanel
from eagle3_tui.app.widgets.plots import AcceptancePlot, LossPlot
from eagle3_tui.model.verdict import Health
from eagle3_tui.transport.base import Link, LinkChanged, StreamEvent
from eagle3_tui.transport.replay import ReplayTransport
from eagle3_tui.transport.target import LocalTarget
from tests.app.conftest import T0, local_app, open_dialog, text_of, training, wait_until
from tests.conftest import LiveRun, until
from tests.records import Lines
from tests.transport.fakes import alive, dead_pid, fake_manifest, register

NOW = T0 + 300.5 + 2  # just after the 600th step of training()


def app_with(
    data: bytes | Sequence[bytes | StreamEvent] = b"",
    *,
    control: RunControl | None = None,
    now: list[float] | None = None,
    export_dir: Path | None = None,
) -> tuple[MonitorApp, ReplayTransport]:
    clock = now if now is not None else [NOW]
    items = ([data] if data else []) if isinstance(data, bytes) else list(data)
    source = ReplayTransport(items, label="gpu-box:/runs/exp7")
    app = make_app(
        source,
        control=control,
        clock=lambda: clock[0],
        refresh_interval=0.02,
        status_interval=60.0,
        export_dir=export_dir,
    )
    return app, source


async def test_latest_values_are_rendered_and_follow_new_lines() -> None:
    lines = Lines(t0=T0)
    app, source = app_with([lines.train(s, 2.0 - s * 0.1) for s in range(5)])
    async with app.run_test(size=(120, 40)) as pilot:
        table = app.query_one(AcceptanceTable)
        await until(pilot, lambda: app.snapshot.global_step == 4, what="step 4")
        assert "step 5" in text_of(app.query_one(ProgressPanel))  # 5 steps done
        source.push(lines.train(5, 1.2345))
        await until(pilot, lambda: app.snapshot.global_step == 5, what="step 5")
        assert "step 6" in text_of(app.query_one(RunHeader))  # step 6 = global_step 5
        assert "0.4115" in text_of(table)  # loss_k = 1.2345 / 3
        assert app.snapshot.latest["train/loss"] == 1.2345


async def test_silent_banner_appears_and_clears() -> None:
    lines = Lines(t0=T0, dt=1.0)
    data = b"".join(lines.train(s, 2.0) for s in range(10))
    lines.at(T0 + 100)
    data += b"".join(lines.gpu(95.0) for _ in range(30))  # busy GPUs, no metric
    clock = [T0 + 131.0]
    app, source = app_with(data, now=clock)
    async with app.run_test(size=(120, 40)) as pilot:
        banner = app.query_one(HealthBanner)
        await until(pilot, lambda: app.snapshot.health == Health.SILENT, what="silent")
        await until(pilot, lambda: banner.display, what="the banner")
        shown = text_of(banner)
        assert "SILENT" in shown and "speculators.metrics logger may have no handler" in shown
        assert banner.has_class("-alarm")
        source.push(lines.at(T0 + 131.0).train(10, 1.9))
        await until(pilot, lambda: app.snapshot.health == Health.RUNNING, what="running")
        await until(pilot, lambda: not banner.display, what="the banner to go")


async def test_link_states_reconnecting_refused_and_back() -> None:
    lines = Lines(t0=T0)
    app, source = app_with([lines.train(0, 2.0)])
    async with app.run_test(size=(120, 40)) as pilot:
        header = app.query_one(RunHeader)
        source.push(LinkChanged(Link.RECONNECTING, "connection lost", retry_in=2.0))
        await until(pilot, lambda: "reconnecting in 2 s" in text_of(header), what="reconnect")
        source.push(LinkChanged(Link.CONNECTED, "gpu-box:/runs/exp7"))
        await until(pilot, lambda: "connected" in text_of(header), what="connected")
        assert "reconnecting" not in text_of(header)
        source.push(LinkChanged(Link.REFUSED, "host key for [bold]gpu-box[/] changed"))
        banner = app.query_one(HealthBanner)
        await until(pilot, lambda: "REFUSED" in text_of(banner), what="the refused banner")
        assert banner.display
        shown = text_of(banner)
        assert "REFUSED" in shown and "[bold]gpu-box[/] changed" in shown
        assert "refused" in text_of(header)


async def test_kill_cancelled_signals_nothing(live_run: LiveRun) -> None:
    """The real agent on the real trainer: the plan names its PID and start time, and
    ``n`` signals nothing."""
    await wait_until(
        lambda: (live_run.run_dir / "run.json").exists(), 120, "the manifest", live_run
    )
    pid = live_run.manifest()["pid"]
    app, _ = app_with(control=RunControl.for_target(LocalTarget(live_run.run_dir)))
    async with app.run_test(size=(100, 30)) as pilot:
        dialog: ControlDialog = await open_dialog(app, pilot, "k")
        plan = text_of(dialog.query_one("#plan"))
        assert f"SIGTERM the trainer, pid {pid}" in plan, plan
        assert f"tick {live_run.manifest()['start_ticks']}" in plan
        await pilot.press("n")
        await until(pilot, lambda: not isinstance(app.screen, ControlDialog), what="cancelled")
    assert alive(pid) and live_run.manifest()["pid"] == pid  # never signalled


async def test_kill_then_resume_a_real_training(live_run: LiveRun) -> None:
    """``k`` and ``r`` through the real agent on this machine: the probe says the trainer
    lives, the kill stops it at a step boundary (no signal; its save made the numbered
    checkpoint, every process gone, judged stopped), the resume starts it again from that
    checkpoint at the next step and the probe follows the new PID."""
    ckpt0 = live_run.run_dir / "checkpoints" / "0" / "training_state.json"
    await wait_until(ckpt0.exists, 240, "the first checkpoint", live_run)
    pid = live_run.manifest()["pid"]
    assert alive(pid), live_run.log()
    app = local_app(live_run.run_dir)
    async with app.run_test(size=(120, 40)) as pilot:
        state = app.pipeline.run.state
        await until(
            pilot, lambda: state.liveness.process_alive is True, timeout=30, what="the probe"
        )
        assert state.manifest["pid"] == pid
        await until(
            pilot, lambda: app.snapshot.health == Health.RUNNING, timeout=60, what="running"
        )
        dialog: ControlDialog = await open_dialog(app, pilot, "k")
        await pilot.press("y")
        await until(pilot, lambda: dialog.state == "done", timeout=180, what="the kill's report")
        outcome = text_of(dialog.query_one("#outcome"), 200)
        assert "stopped: all" in outcome and "process(es) of the run are gone" in outcome
        # the trainer stopped by itself at a step boundary: no signal, exit status 0
        assert re.search(rf"{pid}  trainer +\S+ +- +exited \(exit status 0\)", outcome), outcome
        boundary = re.search(
            r"stopped at a step boundary: the save holds global step (\d+) \(epoch (\d+), "
            r"step (\d+) of the epoch\); a restart continues at step (\d+)",
            outcome,
        )
        assert boundary is not None, outcome
        g, epoch, local, at = (int(x) for x in boundary.groups())
        assert at == g + 1 and 0 < local <= g and epoch >= 2  # after checkpoints/0
        saved = live_run.run_dir / "checkpoints" / str(epoch - 1)  # speculators' 0-based
        assert f"interrupted: written by this stop, now {saved}" in outcome, outcome
        assert f"interrupted/ is now {saved}, the checkpoint speculators resumes" in outcome
        assert f"a restart redoes nothing: it continues at step {g + 1}" in outcome, outcome
        state_file = saved / "training_state.json"
        state_saved = json.loads(state_file.read_text())
        assert state_saved == {"epoch": epoch - 1, "local_step": local, "global_step": g}
        assert not (live_run.run_dir / "checkpoints" / "interrupted").exists()
        await until(
            pilot, lambda: state.liveness.process_alive is False, timeout=30, what="a probe"
        )
        await until(
            pilot, lambda: app.snapshot.health == Health.STOPPED, timeout=30, what="stopped"
        )
        assert not alive(pid)
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, ControlDialog), what="closed")

        dialog = await open_dialog(app, pilot, "r")
        plan = text_of(dialog.query_one("#plan"), 300)
        assert "eagle3_tui.train.tiny" in plan, plan
        # before the question, as the README says: the checkpoint and the steps redone
        assert f"from     {saved} (step {g}, epoch {epoch})" in plan, plan
        assert "redo     0 step(s)" in plan, plan
        await pilot.click("#confirm")
        await until(pilot, lambda: dialog.state != "working", timeout=90, what="the resume")
        outcome = text_of(dialog.query_one("#outcome"), 200)
        started = re.search(r"started: pid (\d+)", outcome)
        assert started is not None, outcome + live_run.log()
        assert not dialog.query_one("#confirm").display  # done: no Resume (y) left to press
        new_pid = int(started.group(1))
        live_run.started.append(new_pid)
        # the stop's checkpoint, with its global step and its 1-based epoch
        assert f"{saved} (step {g}, epoch {epoch})" in outcome, outcome
        await until(
            pilot,
            lambda: state.liveness.process_alive is True and state.manifest.get("pid") == new_pid,
            timeout=60,
            what="the probe of the resumed trainer",
        )


async def test_a_run_without_a_manifest_is_judged_from_its_records(tmp_path: Path) -> None:
    """The agent says the directory has no run.json (its kind, not its text): the probe
    stops asking, and ``k`` says why it cannot kill."""
    control = RunControl.for_target(LocalTarget(tmp_path))
    _, data = training(50)
    app, _ = app_with(data, control=control)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.snapshot.global_step == 49, what="step 49")
        await until(pilot, lambda: not app._probe_ok, timeout=30, what="the probe to stop")
        dialog: ControlDialog = await open_dialog(app, pilot, "k", state="failed")
        shown = text_of(dialog.query_one("#plan"), 200)
        assert f"Cannot kill: {tmp_path}: no run.json here" in shown
        assert not dialog.query_one("#confirm").display  # no Kill (y) that does nothing
        await pilot.press("y")  # nothing to confirm
        assert dialog.state == "failed"


async def test_pause_freezes_the_view_and_counts_steps_behind() -> None:
    lines, data = training(100)
    app, source = app_with(data)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.global_step == 99, what="step 99")
        await pilot.press("p")
        assert app.view.paused
        _, more = training(50, lines=lines, start=100)
        source.push(more)
        await until(pilot, lambda: app.view.behind == 50, what="50 steps behind")
        assert app.snapshot.global_step == 99
        assert "PAUSED, 50 steps behind" in text_of(app.query_one(RunHeader))
        await pilot.press("p")
        await until(pilot, lambda: app.snapshot.global_step == 149, what="caught up")
        assert "PAUSED" not in text_of(app.query_one(RunHeader))


async def test_step_window_keys_halve_double_and_reset() -> None:
    _, data = training(600)
    app, _ = app_with(data)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.global_step == 599, what="step 599")

        def first_x() -> float:
            return next(line for line in app.snapshot.loss_lines if line.kind == "raw").x[0]

        assert first_x() == 0
        await pilot.press("left_square_bracket")
        assert app.view.window == 300
        await until(pilot, lambda: first_x() == 300, what="the last 300 steps")
        await pilot.press("left_square_bracket")
        await until(pilot, lambda: first_x() == 450, what="the last 150 steps")
        await pilot.press("right_square_bracket")
        await until(pilot, lambda: first_x() == 300, what="300 again")
        await pilot.press("right_square_bracket")
        assert app.view.window is None
        await until(pilot, lambda: first_x() == 0, what="the whole run")
        await pilot.press("left_square_bracket", "left_square_bracket", "0")
        assert app.view.window is None
        await until(pilot, lambda: first_x() == 0, what="the whole run again")


async def test_log_scale_drops_non_positive_points_and_says_so() -> None:
    lines = Lines(t0=T0)
    data = b"".join(lines.train(s, 2.0 - s * 0.1) for s in range(30))  # negative from step 21
    app, _ = app_with(data)
    async with app.run_test(size=(120, 40)) as pilot:
        plot = app.query_one(LossPlot)
        await until(pilot, lambda: app.snapshot.global_step == 29, what="step 29")
        assert "log" not in str(plot.border_subtitle)
        await pilot.press("s")  # smoothing 0.9
        await pilot.press("s", "s")  # 0.99, off: the raw line only
        await until(pilot, lambda: app.view.smoothing == 0.0, what="smoothing off")
        await until(
            pilot,
            lambda: [line.kind for line in app.snapshot.loss_lines] == ["raw"],
            what="no smoothed line",
        )
        await pilot.press("l")
        await until(pilot, lambda: "log" in str(plot.border_subtitle), what="log scale")
        assert "≤0 hidden" in str(plot.border_subtitle)
        # Repaints of the same figure (another panel changed, the screen was exposed):
        # plotext's own log axis took the log of a log on the second build and crashed.
        for _ in range(3):
            plot.refresh()
            await pilot.pause(0.05)
        plot._frame = None  # force a rebuild of the same figure, as an uncached render does
        frame = plot.render()
        plot._frame = None
        assert str(plot.render()) == str(frame)
        assert plot.frame() is plot.frame()  # an unchanged chart is not rebuilt
        await pilot.press("l", "s")
        await until(pilot, lambda: "log" not in str(plot.border_subtitle), what="linear")
        assert app.view.smoothing == 0.6


async def test_plots_redraw_only_when_data_changes_and_a_backlog_coalesces() -> None:
    lines = Lines(t0=T0)
    app, source = app_with([lines.train(0, 2.0)])
    async with app.run_test(size=(120, 40)) as pilot:
        plot = app.query_one(AcceptancePlot)
        await until(pilot, lambda: app.snapshot.global_step == 0, what="step 0")
        draws = plot.draws
        for _ in range(10):
            await pilot.pause(0.03)
        assert plot.draws == draws  # ticks without new data draw nothing
        for s in range(1, 401):
            source.push(lines.train(s, 2.0 - s / 1000))
        await until(pilot, lambda: app.snapshot.global_step == 400, what="step 400")
        assert app.pipeline.feeds < 100  # 400 chunks, far fewer model updates


async def test_export_writes_the_window_as_csv(tmp_path: Path) -> None:
    _, data = training(100)
    app, _ = app_with(data, export_dir=tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.global_step == 99, what="step 99")
        await pilot.press("left_square_bracket", "left_square_bracket")  # last 25 steps
        await until(pilot, lambda: app.view.window == 25, what="the window")
        await until(pilot, lambda: app.snapshot.loss_lines[0].x[0] == 75, what="redrawn")
        await pilot.press("e")
        path = tmp_path / "exp7-steps76-100.csv"  # steps as shown (global steps 75..99)
        await until(pilot, path.exists, what="the CSV")
        await until(pilot, lambda: len(path.read_text().splitlines()) == 26, what="26 lines")
        rows = list(csv.reader(path.open()))
        assert rows[0][:3] == ["step", "global_step", "ts"] and "train/loss" in rows[0]
        assert rows[1][:2] == ["76", "75"] and rows[-1][:2] == ["100", "99"]


async def test_help_compare_picker_and_quit(tmp_path: Path) -> None:
    """The picker lists the runs the host's agent finds in its index (a registered run
    with markup in its name among them) and opens the one picked."""
    current, previous_dir = tmp_path / "exp7", tmp_path / "exp6 [bold]x"
    fake_manifest(current, dead_pid(), f"cur-{os.getpid()}")
    fake_manifest(previous_dir, dead_pid(), f"prev-{os.getpid()}", status="finished")
    register(Path(os.environ["XDG_STATE_HOME"]), f"prev-{os.getpid()}", previous_dir)
    control = RunControl.for_target(LocalTarget(current))
    _, data = training(300)
    _, previous = training(200)
    opened: list[str] = []

    def open_run(run_dir: str) -> ReplayTransport:
        opened.append(run_dir)
        return ReplayTransport([previous], label=run_dir)

    app, _ = app_with(data, control=control)
    app.open_run = open_run
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, HelpScreen), what="help closed")
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, RunPicker), what="the picker")
        picker = app.screen
        assert isinstance(picker, RunPicker)
        await until(
            pilot, lambda: picker.query_one("#runs", OptionList).option_count > 0, what="runs"
        )
        listed = [r.run_dir for r in picker._runs]
        assert str(previous_dir) in listed and str(current) not in listed
        index = listed.index(str(previous_dir))
        row = run_row(picker._runs[index]).plain
        assert f"finished     {previous_dir}" in row  # markup kept as text
        picker.query_one("#runs", OptionList).highlighted = index
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, CompareScreen), what="the comparison")
        assert opened == [str(previous_dir)]
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        await until(
            pilot,
            lambda: screen.comparison is not None and screen.comparison.at_step_b == 199,
            what="compared at the previous run's last step",
        )
        assert "loss" in [r.metric for r in screen.comparison.rows]  # type: ignore[union-attr]
        assert "exp6 [bold]x" in text_of(screen.query_one("#cmp-sides-text"))
        await pilot.press("a")
        await until(pilot, lambda: screen.comparison.axis == "tokens", what="tokens axis")  # type: ignore[union-attr]
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, CompareScreen), what="back")
        await pilot.press("c")  # the same comparison again, no picker
        await until(pilot, lambda: isinstance(app.screen, CompareScreen), what="again")
        await pilot.press("q")
    assert app.return_code == 0


async def test_keys_without_a_host_say_so() -> None:
    app, _ = app_with()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("k", "r", "c")
        assert not isinstance(app.screen, ControlDialog | RunPicker)
        assert sum("no run host" in str(n.message) for n in app._notifications) == 3


async def test_run_text_is_inert_and_gpus_without_a_driver_are_said_plainly() -> None:
    lines = Lines(t0=T0)
    data = lines.train(0, 2.0)
    data += lines.log("\x1b[31mred\x1b[0m [bold]not bold[/bold] \x07bell", level="WARNING")
    data += lines.no_driver()
    data += lines.io(1e6, files=("data/[b]evil[i]\x1b]0;title\x07.safetensors",))
    data += b'{"v": 1, "kind": "train", torn\n'
    app, _ = app_with(data)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.malformed == 1, what="the malformed line")
        log = text_of(app.query_one(LogPanel))
        assert "red [bold]not bold[/bold] \\x07bell" in log and "\x1b" not in log
        assert "malformed" in log
        assert "no NVIDIA driver" in text_of(app.query_one(GpuPanel))
        files = text_of(app.query_one(DataPanel))
        # a file name is shown whole, its escape escaped (the name it really has)
        assert "[b]evil[i]\\x1b]0;title\\x07.safetensors" in files and "\x1b" not in files
        assert "1 malformed" in str(app.query_one(LogPanel).border_subtitle)


async def test_dialogs_closed_while_loading_and_keys_during_quit_are_harmless(
    tmp_path: Path,
) -> None:
    fake_manifest(tmp_path / "run", dead_pid(), f"closed-{os.getpid()}")
    app, _ = app_with(control=RunControl.for_target(LocalTarget(tmp_path / "run")))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("k", "escape", "c", "escape", "r", "escape")
        await until(
            pilot, lambda: not isinstance(app.screen, ControlDialog | RunPicker), what="closed"
        )
        await pilot.pause(0.1)
        assert not [w for w in app.workers if w.error is not None]
        await pilot.press("q", "r")  # a dialog pushed while the app quits
    assert app.return_code == 0


async def test_a_save_in_progress_shows_its_growing_size_and_waiting_is_calm() -> None:
    lines, data = training(50, gpus=1)
    app, source = app_with([LinkChanged(Link.WAITING, "waiting for /runs/exp7/metrics.jsonl")])
    async with app.run_test(size=(120, 40)) as pilot:
        header, banner = app.query_one(RunHeader), app.query_one(HealthBanner)
        await until(pilot, lambda: "waiting for metrics.jsonl" in text_of(header), what="wait")
        await until(pilot, lambda: banner.display and banner.has_class("-calm"), what="calm")
        source.push(LinkChanged(Link.CONNECTED, "gpu-box:/runs/exp7"))
        source.push(data)
        path = "/runs/exp7/checkpoints/3"
        source.push(lines.at(NOW - 5).ckpt("save_started", path, epoch=3))
        source.push(lines.ckpt("save_progress", path, bytes=1.5 * 2**30))
        progress = app.query_one(ProgressPanel)
        await until(
            pilot, lambda: "⟳ saving checkpoints/3  1.5 GiB…" in text_of(progress), what="save"
        )
        assert app.snapshot.health == Health.RUNNING and not banner.display
        source.push(lines.ckpt("save_finished", path, bytes=2 * 2**30, duration_s=6.0))
        await until(pilot, lambda: "saving" not in text_of(progress), what="saved")
        assert "checkpoints/3  2.0 GiB in 6.0 s" in text_of(progress)


async def test_a_run_without_telemetry_says_silent_and_what_is_not_available() -> None:
    """What the agent writes about a training it observes from outside: the panels show
    what exists (log, checkpoints, validation, progress from the epoch bars) and say what
    does not (per-step loss and acceptance)."""
    started = T0 - 600
    obs = Lines(writer="obs", t0=started, dt=0.0)
    log = Lines(writer="log", t0=NOW - 30, dt=0.0)
    data = [
        log.bar(0, 24, 24, elapsed_s=12.0),
        log.log("/x/trainer.py:539: UserWarning: autocast", level="WARNING", logger="stdout"),
        obs.at(NOW - 20).ckpt("save_finished", "/work/exp7/checkpoints/0", bytes=1.1e6, epoch=0),
        obs.at(NOW - 19).make(
            "val",
            epoch=0,
            step=24,
            val={"loss_epoch": 0.03, "loss_0_epoch": 0.01, "full_acc_0_epoch": 0.25,
                 "cond_acc_0_epoch": 0.25},
        ),
        *(obs.at(NOW - 10 + i).proc(started=started) for i in range(10)),
        *(obs.at(NOW - 10 + i).io(4096.0) for i in range(10)),
    ]  # fmt: skip
    app, _ = app_with(data, now=[NOW])
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.health == Health.SILENT, what="SILENT")
        banner = " ".join(text_of(app.query_one(HealthBanner)).split())  # unwrapped
        assert "speculators.metrics logger has no handler" in banner and "pid 4242" in banner
        table = text_of(app.query_one(AcceptanceTable))
        assert "not available without telemetry" in table and "val loss" in table
        assert "0.250" in table  # the validation's full acceptance of TTT step 0
        progress = text_of(app.query_one(ProgressPanel))
        assert "step 24" in progress and "checkpoints/0" in progress  # 24 steps done
        assert "UserWarning" in text_of(app.query_one(LogPanel))
        loss = app.query_one(LossPlot)
        await until(pilot, lambda: loss.is_current, what="the loss plot")
        assert "not available without telemetry" in str(loss.plt.build())


async def test_several_live_trainings_are_picked_before_the_monitor() -> None:
    from eagle3_tui.app.chooser import LiveChooser
    from eagle3_tui.transport.replies import ChooseReply, decode

    rows = [
        {"pid": 11, "started": T0, "health": "silent", "cwd": "/work/a", "command": ["py", "a.py"]},
        {"pid": 22, "started": T0, "health": "running", "run_dir": "/runs/b", "telemetry": True,
         "command": ["py", "b.py"]},
    ]  # fmt: skip
    reply = {"op": "choose", "choice": "several", "runs": rows, "host": "gpu-box",
             "note": "2 live trainings"}  # fmt: skip
    chooser = LiveChooser(decode(ChooseReply, reply))
    async with chooser.run_test(size=(100, 20)) as pilot:
        await pilot.press("down", "enter")
    assert chooser.return_value is not None and chooser.return_value.pid == 22
    assert chooser.return_value.run_dir == "/runs/b"
    chooser = LiveChooser(decode(ChooseReply, reply))
    async with chooser.run_test(size=(100, 20)) as pilot:
        await pilot.press("q")
    assert chooser.return_value is None


async def test_a_run_that_ended_stops_ticking() -> None:
    """Looked at 13 minutes after an 8 s run ended (issue 28): not "up 12m53s" and its
    last minute's pace, but when it ended and how long it ran, at its average pace; its
    reads are over and its GPU rows say they are the last sample."""
    lines = Lines(t0=T0, dt=0.5)
    data = [lines.event("start", pid=4242)]
    for s in range(16):
        data += [lines.train(s, 2.0 - s / 100), lines.io(164 * 2**20), lines.gpu(95.0)]
    data.append(lines.event("finish", step=16))
    ended = lines.ts - 0.5
    app, _ = app_with(data, now=[ended + 13 * 60])
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.health == Health.FINISHED, what="finished")
        progress = text_of(app.query_one(ProgressPanel))
        assert "up " not in progress and "ETA" not in progress, progress
        assert "ended 08:00:24 · ran 24 s" in progress, progress
        assert "steps/s" in progress and "its average" in progress
        data_panel = text_of(app.query_one(DataPanel))
        assert "MiB/s" not in data_panel and "the run ended" in data_panel, data_panel
        assert app.query_one(GpuPanel).border_subtitle == "the run ended; sampled 08:00:24"


async def test_a_nan_stretch_stays_on_the_screen_after_the_run_recovered() -> None:
    """Loss NaN for 15 steps mid-run, then finite again, then finished (issue 28): the
    verdict is FINISHED, and the progress panel keeps the stretch in view."""
    lines = Lines(t0=T0, dt=0.5)
    data = [lines.event("start", pid=4242)]
    for s in range(120):
        if 40 <= s < 55:
            nan = {"loss": "NaN", "loss_0": "NaN", "full_acc_0": 0.3, "cond_acc_0": 0.3}
            data.append(lines.make("train", step=s, global_step=s, epoch=0, train=nan, lr=1e-3))
        else:
            data.append(lines.train(s, 2.0 - s / 200))
    data.append(lines.event("finish", step=120))
    app, _ = app_with(data, now=[lines.ts + 60])
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.health == Health.FINISHED, what="finished")
        panel = app.query_one(ProgressPanel)
        await until(pilot, lambda: "hist" in text_of(panel), what="the history line")
        shown = text_of(panel, width=panel.content_size.width)  # as wide as on screen
        assert "hist  loss NaN from step 41 to 55 (15 logged steps)" in shown, shown


async def test_an_exports_name_says_the_steps_it_holds_while_the_run_goes_on(
    tmp_path: Path,
) -> None:
    """A live run's table is ahead of the picture: the file was named by the picture's
    last step and held the table's ("run1-steps1-38.csv" with steps 1-39)."""
    from eagle3_tui.app.pipeline import Pipeline

    lines, data = training(100)
    app, source = app_with(data, export_dir=tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.global_step == 99, what="step 99")
        source.push(b"".join(lines.train(s, 1.0) for s in range(100, 103)))
        pipeline: Pipeline = app.pipeline
        await until(pilot, lambda: pipeline.run.state.table.last_step == 102, what="read")
        path, rows = await pipeline.export_csv(tmp_path, "exp7", None)
        got = list(csv.reader(path.open()))[1:]
        assert rows == len(got) == 103 and path.name == "exp7-steps1-103.csv", path
        assert (got[0][0], got[-1][0]) == ("1", "103")
