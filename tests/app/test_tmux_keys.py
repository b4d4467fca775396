"""Every key, in a real terminal, on a live run: ``eagle3-tui demo`` (the real tiny
training) in tmux, each binding pressed (the comparison screen's, the help, the
messages, the command palette, kill and resume too) and each state kept for several
refreshes, the screen read each time: the app lives and shows that state. Then ``q``:
the demo says it stops its run, stops it, and exits 0."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from eagle3_tui.agent import processes
from tests.app.test_tmux import Tmux, tmux  # noqa: F401 - the fixture
from tests.conftest import need_training

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
REFRESH_S = 0.5
"""The monitor's refresh interval: a state is held for several of them."""
STEP = re.compile(r"step (\d[\d,]*)/")


def step_of(screen: str) -> int | None:
    m = STEP.search(screen)
    return None if m is None else int(m.group(1).replace(",", ""))


class Session:
    """The demo in a tmux pane, driven key by key."""

    def __init__(self, pane: Tmux) -> None:
        self.tmux = pane
        self.seen_steps: set[int] = set()

    def press(self, *keys: str) -> None:
        self.tmux.keys(*keys)

    def close(self, gone: str) -> None:
        """Escape, and wait until ``gone`` is off the screen: a key sent right after an
        Escape would reach the terminal as Alt+key."""
        self.tmux.keys("Escape")
        self.wait(lambda sc: gone not in sc, f"{gone!r} to close")

    def wait(self, check: Callable[[str], object], what: str, timeout: float = 60) -> str:
        return self.tmux.wait(check, timeout, what)

    def hold(self, check: Callable[[str], object], what: str, refreshes: int = 4) -> str:
        """The state shows now and for ``refreshes`` refreshes more, the app alive each
        time (its header or comparison line on screen, no traceback)."""
        screen = self.wait(check, what)
        for _ in range(refreshes):
            time.sleep(REFRESH_S)
            screen = self.tmux.screen()
            assert "Traceback" not in screen and "EXIT=" not in screen, screen
            assert check(screen), f"{what} did not stay; screen:\n{screen}"
            step = step_of(screen)
            if step is not None:
                self.seen_steps.add(step)
        return screen


@pytest.fixture
def demo_dir(tmp_path: Path) -> Iterator[Path]:
    """Where the demo trains; afterwards no process of it may remain (killed if so)."""
    run_dir = tmp_path / "demo"
    yield run_dir
    marker = f"EAGLE3_TUI_RUN_DIR={run_dir.resolve()}".encode()
    for pid in [p for p in processes.all_procs() if processes.has_marker(p, marker)]:
        os.kill(pid, signal.SIGKILL)


def test_every_key_on_a_live_demo(
    tmux: Tmux,  # noqa: F811
    tiny_run: Path,
    demo_dir: Path,
    tmp_path: Path,
) -> None:
    need_training()
    state, data = tmp_path / "state", tmp_path / "data"
    index = state / "eagle3-tui" / "runs.jsonl"  # this test's own index: the previous run
    index.parent.mkdir(parents=True)
    manifest = json.loads((tiny_run / "run.json").read_text())
    entry = {k: manifest[k] for k in ("run_id", "run_dir", "host", "pid", "started_at")}
    index.write_text(json.dumps(entry) + "\n")
    demo = [sys.executable, "-m", "eagle3_tui", "demo", "--out", str(demo_dir)]
    demo += ["--epochs", "40", "--step-delay", "0.3", "--workers", "2"]
    env = f"XDG_STATE_HOME={state} XDG_DATA_HOME={data} TZ=UTC TERM=xterm-256color"
    command = f"env -u COLUMNS -u LINES {env} {shlex.join(demo)}; echo EXIT=$?; sleep 600"
    tmux.run("new-session", "-d", "-x", "120", "-y", "40", command)
    s = Session(tmux)

    def main(screen: str) -> bool:
        return " eagle3-tui " in screen and "RUNNING" in screen

    first = s.wait(lambda sc: main(sc) and step_of(sc) is not None, "the first steps", 300)
    assert "loss · all steps · smoothing 0.6" in first
    assert "acceptance · all steps · smoothing 0.6" in first and "k=0" in first

    # view keys: each state where the eye is, held while the run goes on
    s.press("l")
    s.hold(lambda sc: main(sc) and "smoothing 0.6 · log" in sc, "the log scale")
    s.press("l")
    s.hold(lambda sc: main(sc) and "· log" not in sc, "the linear scale")
    for key, shown in (("s", "0.9"), ("s", "0.99"), ("s", "off"), ("s", "0.6")):
        s.press(key)
        s.hold(lambda sc, w=shown: main(sc) and f"all steps · smoothing {w}" in sc, key)  # type: ignore[misc]
    s.press("[")
    s.hold(lambda sc: main(sc) and re.search(r"loss · last [\d,]+ steps", sc), "a window")
    s.press("]")
    s.hold(lambda sc: main(sc) and ("all steps" in sc or "last" in sc), "a wider window")
    s.press("0")
    s.hold(lambda sc: main(sc) and "loss · all steps" in sc, "the whole run")
    s.press("p")
    s.hold(lambda sc: "PAUSED" in sc, "paused", refreshes=8)
    s.wait(lambda sc: "PAUSED" in sc and " behind" in sc, "the run going on", 120)
    s.press("p")
    s.hold(lambda sc: main(sc) and "PAUSED" not in sc, "running again")
    assert len(s.seen_steps) >= 3, "the steps shown moved on while the keys were pressed"

    # export, messages, help, command palette
    s.press("e")
    s.wait(lambda sc: "steps written to" in sc, "the export")  # the full path: Pilot tests
    assert list((demo_dir / "exports").glob("demo-steps1-*.csv"))
    s.press("m")
    s.hold(lambda sc: "messages and events" in sc and "Training epoch" in sc, "the messages")
    s.close("messages and events")
    s.press("?")
    s.hold(lambda sc: "keys and panels" in sc and "stop the demo's run" in sc, "the help")
    s.close("keys and panels")
    s.press("C-p")
    s.hold(lambda sc: "Attach (a)" in sc and "Kill (k)" in sc, "the command palette")
    s.press("s", "m", "o")  # the palette lists more than fits: a few letters find one
    s.hold(lambda sc: "Smooth (s)" in sc and "Kill (k)" not in sc, "the palette's search")
    s.close("Smooth (s)")
    s.hold(main, "the main screen again")

    # compare with the previous run picked on the host, every axis
    s.press("c")
    s.wait(lambda sc: "1 run(s) on" in sc and str(tiny_run) in sc, "the run picker")
    s.press("Enter")
    s.hold(lambda sc: "COMPARE" in sc and "aligned by global step" in sc, "the comparison")
    # the comparison shows as soon as it opens; what differs once both runs are read
    compared = s.wait(lambda sc: "argv.--epochs: 40 | 3" in sc, "what differs")
    assert "argv.--epochs: 40 | 3" in compared  # what differs, both manifests read
    for axis in ("training tokens", "training time", "global step"):
        s.press("a")
        s.hold(lambda sc, a=axis: "COMPARE" in sc and f"aligned by {a}" in sc, axis)  # type: ignore[misc]
    s.close("COMPARE")
    s.hold(main, "back from the comparison")

    # kill (confirmed), then resume (confirmed): the run stops, then runs again
    deadline = time.monotonic() + 300
    while not (demo_dir / "checkpoints" / "0" / "training_state.json").exists():
        assert time.monotonic() < deadline, "no checkpoint to resume from"
        time.sleep(0.5)
    s.press("k")
    s.wait(lambda sc: "SIGTERM the trainer, pid" in sc, "the kill plan")
    s.press("y")
    s.wait(lambda sc: "stopped: all" in sc, "the kill's result", 200)
    s.close("stopped: all")
    s.hold(lambda sc: "STOPPED" in sc and "Interrupted after step" in sc, "stopped", refreshes=4)
    s.press("r")
    s.wait(lambda sc: "detached (new session" in sc, "the resume plan")
    s.press("y")
    started = s.wait(lambda sc: "started: pid" in sc, "the new pid", 200)
    new_pid = re.search(r"started: pid (\d+)", started)
    assert new_pid is not None
    s.close("started: pid")
    s.hold(lambda sc: main(sc) and new_pid.group(1) in sc, "the resumed run", refreshes=4)

    # the same live run at 80x24 (issue 28): the header's words, a chart, keys that act
    s.tmux.run("resize-window", "-x", "80", "-y", "24")
    small = s.wait(lambda sc: max(map(len, sc.splitlines())) <= 80 and main(sc), "80x24")
    steps_before = step_of(small)
    assert steps_before is not None, small
    assert "loss ·" in small and "Traceback" not in small, small
    s.press("l")
    s.hold(lambda sc: main(sc) and "· log" in sc, "the log scale at 80x24")
    s.press("l")
    s.hold(lambda sc: main(sc) and "· log" not in sc, "the linear scale at 80x24")
    s.press("?")
    s.hold(lambda sc: "keys and panels" in sc, "the help at 80x24")
    s.close("keys and panels")
    later = s.hold(main, "the main screen at 80x24")
    moved = s.wait(lambda sc: (step_of(sc) or 0) > steps_before, "steps going on at 80x24")
    assert len(later.splitlines()) <= 24 and "RUNNING" in moved

    # quit: the demo says what it does while it stops its run, then exits 0
    s.press("q")
    bye = s.wait(lambda sc: "EXIT=" in sc, "the demo to exit", 120)
    assert "eagle3-tui demo: stopping the run" in bye
    assert "eagle3-tui demo: stopped: all" in bye
    assert "EXIT=0" in bye
