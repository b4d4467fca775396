"""The fleet (issue 32): rows made from the same snapshot the monitor draws, read from
real tiny trainings; their order, filter and words; the settings file; the screen's keys
(Textual's pilot) on real runs. Over SSH, several hosts and runs in every state:
``tests/transport/test_fleet_ssh.py``."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import time
from pathlib import Path

import pytest

from eagle3_tui.config import load_config
from eagle3_tui.fleet import (
    COLUMNS,
    SORT_KEYS,
    Fleet,
    FleetRow,
    cells,
    format_fleet,
    matches,
    sort_rows,
)
from eagle3_tui.following import WatchTarget
from eagle3_tui.model.verdict import WORST_FIRST, Health
from eagle3_tui.transport.base import TargetError
from eagle3_tui.transport.target import LocalTarget


def row(run: str, health: str = "running", **kw: object) -> FleetRow:
    fields: dict[str, object] = {
        "key": f"h:{run}",
        "host": "h",
        "run": run,
        "opens": (f"h:{run}",),
        "health": health,
        "reason": f"{run} is {health}",
    }
    fields.update(kw)
    return FleetRow(**fields)  # type: ignore[arg-type]


# ---- order, filter, words -------------------------------------------------------------


def test_rows_sort_worst_first_and_those_without_the_figure_last_either_way() -> None:
    rows = [
        row("a", "running", loss=0.5, step=10),
        row("b", "dead", loss=None, step=3),
        row("c", "silent", loss=0.2, step=None),
        row("d", "finished", loss=float("nan"), step=40),
    ]
    assert [r.run for r in sort_rows(rows)] == ["b", "c", "a", "d"]
    assert [r.run for r in sort_rows(rows, "loss")] == ["c", "a", "b", "d"]
    assert [r.run for r in sort_rows(rows, "loss", reverse=True)] == ["a", "c", "b", "d"]
    assert [r.run for r in sort_rows(rows, "step", reverse=True)] == ["d", "a", "b", "c"]
    assert set(WORST_FIRST) == {h.value for h in Health}  # every health has its place
    for key in SORT_KEYS:  # every key the screen cycles through sorts
        assert sorted(r.run for r in sort_rows(rows, key)) == ["a", "b", "c", "d"]


def test_the_filter_matches_every_word_in_host_run_health_or_cause() -> None:
    r = row("/runs/ablation-lr3", "stalled", reason="Rank 1 stopped at step 12")
    assert matches(r, "") and matches(r, "ABLATION stalled") and matches(r, "rank 1")
    assert not matches(r, "ablation running") and not matches(r, "lr4")


def test_cells_say_each_figure_and_only_what_is_true_now() -> None:
    now = 10_000.0
    r = row(
        "/r",
        step=1200,
        total_steps=45000,
        loss=2.34567,
        tau=1.834,
        tau_trend=0.05,
        steps_per_s=3.25,
        eta_s=3 * 3600 + 5 * 60,
        gpus=8,
        gpus_busy=7,
        checkpoint="checkpoints/2",
        checkpoint_at=now - 125,
    )
    assert cells(r, now) == (
        "h",
        "/r",
        "RUNNING",
        "1,200/45,000",
        "2.346",
        "1.83 ↑0.05",
        "3.25/s",
        "3h05m",
        "7/8 busy",
        "checkpoints/2 (2 min 5 s ago)",
    )
    ended = dataclasses.replace(r, health="stopped", tau_trend=-0.001, link_down=True)
    c = cells(ended, now)
    assert c[2] == "STOPPED (link down)" and c[5] == "1.83"  # a flat trend: no arrow
    assert c[7] == "-"  # no ETA for a run that is not running
    assert cells(row("/x"), now)[3:] == ("-",) * 7


def test_the_table_says_each_cause_the_unreached_hosts_and_nothing_raw() -> None:
    hostile = row("/tmp/\x1b]0;pwned\x07run", "silent", reason="no metric \x1b[2J since 40 s")
    text = format_fleet([row("/ok"), hostile], ["gpu-b: connection refused"], 0.0)
    assert "\x1b" not in text and "\x07" not in text
    lines = text.splitlines()
    assert tuple(lines[0].split()) == COLUMNS
    assert lines[2].strip() == "/ok is running" and "since 40 s" in lines[4]
    assert lines[-1] == "(not reached: gpu-b: connection refused)"
    assert format_fleet([], [], 0.0).endswith("(no live or recent runs found)")


# ---- the settings file ------------------------------------------------------------------


def test_the_settings_file_gives_hosts_and_defaults_and_a_bad_one_is_one_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "config.toml"
    assert load_config(path).hosts == ()  # none: the defaults
    path.write_text('hosts = ["gpu-a", "alice@gpu-b"]\n[fleet]\nrecent_hours = 6\ninterval = 1\n')
    c = load_config(path)
    assert (c.hosts, c.recent_hours, c.interval) == (("gpu-a", "alice@gpu-b"), 6.0, 1.0)
    for text, said in [
        ("hosts = [", "not TOML"),
        ('hosts = "gpu-a"', "hosts must be a list"),
        ("hosts = [1]", "hosts must be a list"),
        ("fleet = 3", "[fleet] must be a table"),
        ("[fleet]\ninterval = -1", "fleet.interval must be a positive number"),
        ("[fleet]\nrecent_hours = true", "fleet.recent_hours must be a positive number"),
        ("\xff\xfe", "not TOML"),
    ]:
        path.write_bytes(text.encode("latin-1"))
        with pytest.raises(TargetError) as e:
            load_config(path)
        assert str(e.value).startswith(f"{path}: ") and said in str(e.value), e.value
        assert "\n" not in str(e.value)
    path.write_text("# " + "x" * 300_000)
    with pytest.raises(TargetError, match="larger than"):
        load_config(path)


# ---- rows of real runs ------------------------------------------------------------------


def two_runs(tiny_run: Path, tmp_path: Path) -> list[Path]:
    """The session's finished tiny run, and a copy of it cut after its 10th step's line
    (a run read as far as it got; a slow start writes many samples before any step)."""
    cut = tmp_path / "cut"
    shutil.copytree(tiny_run, cut)
    lines = (cut / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    steps = [i for i, line in enumerate(lines) if b'"kind":"train"' in line]
    (cut / "metrics.jsonl").write_bytes(b"".join(lines[: steps[9] + 1]))
    (cut / "metrics.cols").unlink(missing_ok=True)
    return [tiny_run, cut]


async def read_fleet(dirs: list[Path]) -> Fleet:
    fleet = Fleet([WatchTarget(str(d), LocalTarget(d), discover=False) for d in dirs])
    deadline = time.monotonic() + 90  # a busy machine reads slowly
    while time.monotonic() < deadline:
        await fleet.turn()
        if fleet.all_read() and len(fleet.rows) == len(dirs):
            break
        await asyncio.sleep(0.1)
    return fleet


def test_a_row_says_what_summary_says_of_the_same_run(tiny_run: Path, tmp_path: Path) -> None:
    from eagle3_tui import api

    dirs = two_runs(tiny_run, tmp_path)

    async def rows() -> dict[str, FleetRow]:
        fleet = await read_fleet(dirs)
        try:
            assert fleet.all_read(), fleet.rows
            return {r.run: r for r in fleet.rows.values()}
        finally:
            await fleet.close()

    by_run = asyncio.run(rows())
    for d in dirs:
        r, s = by_run[str(d)], api.open_run(d).summary()
        assert (r.health, r.reason, r.step, r.total_steps) == (
            s["health"],
            s["reason"],
            s["step"],
            s["total_steps"],
        )
        assert r.loss == pytest.approx(s["loss"]) and r.tau == pytest.approx(s["tau"])
        assert r.opens == (str(d),) and r.host == "this machine"
    assert by_run[str(tiny_run)].health == "finished"
    assert by_run[str(tiny_run)].checkpoint is not None
    assert by_run[str(dirs[1])].step is not None
    assert by_run[str(dirs[1])].step < by_run[str(tiny_run)].step  # type: ignore[operator]


def test_fleet_once_prints_the_rows_as_json_and_a_missing_run_as_a_line(
    tiny_run: Path, tmp_path: Path
) -> None:
    from tests.transport.conftest import cli

    done = cli("fleet", "--once", "--json", str(tiny_run))
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    [r] = doc["runs"]
    assert r["run"] == str(tiny_run) and r["health"] == "finished" and doc["unreached"] == {}
    missing = cli("fleet", "--once", str(tmp_path / "nope"))
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.count("\n") == 1 and "no such directory" in missing.stderr
    bad = cli("fleet", "--once", "--interval", "0", str(tiny_run))
    assert bad.returncode == 2 and "--interval 0.0: must be a positive number" in bad.stderr


# ---- the screen ---------------------------------------------------------------------------


def test_the_screens_keys_on_real_runs(tiny_run: Path, tmp_path: Path) -> None:
    from textual.widgets import DataTable

    from eagle3_tui.app.fleet import FleetApp
    from eagle3_tui.app.screens.kill_resume import ControlDialog

    dirs = two_runs(tiny_run, tmp_path)

    async def drive() -> list[object]:
        fleet = Fleet([WatchTarget(str(d), LocalTarget(d), discover=False) for d in dirs])
        app = FleetApp(fleet)
        seen: list[object] = []
        async with app.run_test(size=(140, 30)) as pilot:
            deadline = time.monotonic() + 90
            while len(app.shown) < 2 and time.monotonic() < deadline:
                await pilot.pause(0.1)
            table = app.query_one(DataTable)
            assert table.row_count == 2
            seen.append(sorted(r.run for r in app.shown))
            await pilot.press("s")  # health -> host
            seen.append(app.sort_key)
            await pilot.press("slash", "c", "u", "t")  # typed, not keys: c is compare
            await pilot.pause(0.2)
            seen.append([r.run for r in app.shown])
            await pilot.press("escape")
            await pilot.pause(0.2)
            seen.append((app.filtering, app.filter, len(app.shown)))
            await pilot.press("k")
            await pilot.pause(0.2)
            seen.append(isinstance(app.screen, ControlDialog))
            await pilot.press("escape")
            await pilot.pause(0.2)
            await pilot.press("c")  # nothing marked: said, nothing opened
            seen.append(app.chosen)
            await pilot.press("space", "down", "c")
            await pilot.pause(0.2)
        seen.append(app.chosen)
        return seen

    seen = asyncio.run(drive())
    assert seen[0] == sorted(str(d) for d in dirs)
    assert seen[1] == "host"
    assert seen[2] == [str(dirs[1])]
    assert seen[3] == (False, "", 2)
    assert seen[4] is True
    assert seen[5] is None
    chosen = seen[6]
    assert isinstance(chosen, list) and chosen[1] == "--compare", chosen
    assert {chosen[0], chosen[2]} == {str(d) for d in dirs}


def test_f_in_the_monitor_shows_this_hosts_fleet_and_q_there_ends_both(
    tiny_run: Path, tmp_path: Path
) -> None:
    """In a real terminal: the monitor of a run, ``F``: the fleet of this machine, the
    run among its rows; Esc there goes back to the monitor (it did nothing), ``F`` shows
    the fleet again; Enter opens the run in the monitor again, ``F`` there comes back to
    the fleet (not a fleet in a fleet), ``q`` ends it all."""
    import shlex
    import shutil
    import sys

    from tests.app.test_tmux import Tmux
    from tests.conftest import need

    need(shutil.which("tmux") is not None, "tmux is not installed (apt-get install tmux)")
    tmux = Tmux(tmp_path / "tmux.sock")
    argv = [sys.executable, "-m", "eagle3_tui", str(tiny_run)]
    done = tmp_path / "done"
    command = "env -u COLUMNS -u LINES TERM=xterm-256color " + shlex.join(argv)
    try:
        tmux.run("new-session", "-d", "-x", "160", "-y", "30", f"{command}; touch {done}")
        tmux.wait(lambda s: "FINISHED" in s and "loss" in s, 60, "the monitor")
        tmux.keys("F")
        fleet = tmux.wait(lambda s: "run(s) on 1 target" in s, 60, "the fleet")
        tmux.wait(lambda s: str(tiny_run) in s, 60, "the run among the fleet's rows")
        tmux.keys("Escape")  # back to the monitor it came from
        tmux.wait(
            lambda s: "FINISHED" in s and "loss" in s and "run(s) on 1 target" not in s,
            60,
            "the monitor after Esc in the fleet",
        )
        tmux.keys("F")
        tmux.wait(lambda s: str(tiny_run) in s and "run(s) on 1 target" in s, 60, "the fleet")
        tmux.keys("/")
        tmux.keys("-l", str(tiny_run))  # its row alone (typed as text)
        tmux.keys("Enter")
        tmux.wait(lambda s: "(1 shown)" in s, 30, "the run's row alone")
        tmux.keys("Enter")
        tmux.wait(lambda s: "FINISHED" in s and "loss" in s, 60, "the monitor again")
        tmux.keys("F")
        tmux.wait(lambda s: "run(s) on 1 target" in s, 60, "the fleet again")
        tmux.keys("q")
        deadline = time.monotonic() + 30
        while not done.exists():
            assert time.monotonic() < deadline, f"still running:\n{tmux.screen()}"
            time.sleep(0.2)
        assert "TARGET" not in fleet  # a table of runs, not an error or a usage line
    finally:
        tmux.run("kill-server")


def test_the_fleets_tau_trend_is_the_monitors() -> None:
    """The fleet read its trend from the unsmoothed τ: a tiny run's noisy τ read ↓0.14 in
    the fleet beside the monitor's "τ ↑ +0.077". It is built with the monitor's
    smoothing: the two say the same."""
    import math
    import random

    from eagle3_tui.fleet import VIEW
    from eagle3_tui.model.run import Run
    from eagle3_tui.model.snapshot import ViewParams, build_snapshot
    from tests.records import Lines

    noise = random.Random(3)
    for seed in range(20):
        noise.seed(seed)
        lines = Lines(t0=1_800_000_000.0, dt=0.5)
        data = b""
        for s in range(96):  # rising, with noise larger than the rise over a quarter
            base = 0.4 + 0.2 * s / 96
            acc = tuple(min(0.99, max(0.0, base + noise.gauss(0, 0.08))) for _ in range(3))
            data += lines.train(s, 2.0, acc=acc)
        run = Run()
        run.feed(0, data)
        fleet = build_snapshot(run.state, lines.ts, VIEW).tau_line
        monitor = build_snapshot(run.state, lines.ts, ViewParams()).tau_line
        assert fleet is not None and monitor is not None
        a, b = fleet.trend(), monitor.trend()
        assert a is not None and b is not None
        assert a == b, (seed, a, b)
        assert math.isfinite(a[0])
