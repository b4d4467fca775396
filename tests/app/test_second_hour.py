"""The second hour (issue 28), as a user meets it: a real tiny training launched
headless without telemetry (the story's run), the monitor opened on it over a real
loopback sshd in a real terminal (tmux) at 120x40 and then 80x24; its words while it is
silent (the banner's cause and remedy whole, the process tree, ``a`` offered), its end
(finished at its own totals, no save under way, nothing ticking), then every key of the
monitor pressed on the ended run: each acts or says why in one line, nothing breaks."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from eagle3_tui.agent import discover
from tests.app.test_tmux import Tmux, tmux  # noqa: F401 - the fixture
from tests.conftest import need_training, wait_until
from tests.transport.conftest import remote_env, sshd  # noqa: F401 - the session's sshd
from tests.transport.fakes import alive
from tests.transport.sshd import ALIAS, Sshd

pytestmark = pytest.mark.slow
EPOCHS = 3


def flat(screen: str) -> str:
    """The screen's words in one line (a banner wraps where the width says)."""
    return " ".join(screen.split())


def shows(words: str, shown: bool = True) -> Callable[[str], bool]:
    """Whether a screen shows ``words`` (or, ``shown`` False, no longer does)."""
    return lambda screen: (words in flat(screen)) == shown


@pytest.fixture
def silent_run(sshd: Sshd, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:  # noqa: F811
    """``nohup python train.py > train.log 2>&1 &`` without telemetry: no metric at all."""
    need_training()
    work = tmp_path / "exp"
    work.mkdir()
    with open(work / "train.log", "ab") as log:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "eagle3_tui.train.tiny", "--run-dir", str(work / "run")),
                *("--no-telemetry", "--epochs", str(EPOCHS), "--workers", "2"),
                *("--step-delay", "0.4"),
            ],
            cwd=work,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=remote_env(sshd),
            start_new_session=True,
        )
    yield proc
    with contextlib.suppress(ProcessLookupError):
        if alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def group_alive(pgid: int) -> bool:
    """Whether a process of the group ``pgid`` leads still runs (a zombie has ended)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # gone meanwhile
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def test_a_silent_run_then_every_key_on_its_end(
    sshd: Sshd,  # noqa: F811
    silent_run: subprocess.Popen[bytes],
    tmux: Tmux,  # noqa: F811
) -> None:
    proc = silent_run
    # opened once it can be told a speculators training (in its first seconds the host
    # looks again for up to 20 s: test_discover; importing under two test workers can
    # take longer)
    wait_until(lambda: any(t.trainer.pid == proc.pid for t in discover.scan()[0]), 120, "found")
    monitor = [sys.executable, "-m", "eagle3_tui", *sshd.args(), ALIAS, "--pid", str(proc.pid)]
    command = "env -u COLUMNS -u LINES TZ=UTC TERM=xterm-256color " + shlex.join(monitor)
    # its exit and last words stay on the pane (a failure shows why, not a blank screen)
    command = f"{command}; echo eagle3-tui exited $?; sleep 600"
    tmux.run("new-session", "-d", "-x", "120", "-y", "40", command)

    # silent: the banner says what is seen, the cause and the remedy, whole
    silent = tmux.wait(lambda s: "SILENT" in s and "data · processes" in s, 240, "SILENT")
    said = flat(silent)
    assert said.split(" ╭")[0].endswith("restart it with telemetry."), said  # the banner's end
    assert "the speculators.metrics logger has no handler" in said, said
    assert f"{proc.pid} trainer" in said and " worker " in said, said  # the process tree
    assert "a Attach" in silent.splitlines()[-1], silent.splitlines()[-1]
    tmux.run("resize-window", "-x", "80", "-y", "24")
    small = tmux.wait(lambda s: len(s.splitlines()[0]) <= 80, 30, "80x24")
    small = tmux.wait(lambda s: "telemetry." in flat(s), 30, "the remedy at 80x24")
    assert "SILENT" in small

    # its end: at its own totals, nothing under way, nothing ticking
    tmux.run("resize-window", "-x", "120", "-y", "40")
    assert proc.wait(300) == 0
    steps = EPOCHS * 24
    ended = tmux.wait(lambda s: "FINISHED" in s and "ended " in s, 120, "FINISHED")
    said = flat(ended)
    assert f"step {steps}/{steps}" in said and f"epoch {EPOCHS}/{EPOCHS}" in said, said
    assert "⟳" not in ended and "saving" not in said, said
    assert said.count("★ best") == 1, said
    assert "none now: the run ended" in said, said
    # its helpers (the dataloader's workers) can outlive the trainer for a moment, and
    # k rightly offers to kill what is left: the keys below are pressed once none is
    wait_until(lambda: not group_alive(proc.pid), 60, "the run's helpers gone")
    # said while a look finds them ("Left behind, still alive: pid ... (k ends them)")
    ended = tmux.wait(lambda s: "still alive" not in flat(s), 60, "no leftovers")
    span = re.search(r"ran (\S+)", said)
    assert span is not None, said
    time.sleep(3)  # a finished run's span is its own: it does not grow with the clock
    tmux.wait(lambda s: "still alive" not in flat(s), 60, "no leftovers, a look later")
    assert re.search(r"ran (\S+)", flat(tmux.screen())) is not None
    assert f"ran {span.group(1)}" in flat(tmux.screen())

    # every key on the ended run: it acts (a screen, closed again) or says why
    words = {  # each notice's first words (a longer one wraps in its toast)
        "r": "resume: the run finished",
        "k": "kill: the run finished",
        "a": "attach: the training",
        "e": "export: no per-step",
    }
    views = {  # the plot keys: the titles say what they set
        "l": "· log",
        "s": "smoothing 0.9",
        "[": "last ",
        "]": "all steps",
        "p": "PAUSED",
    }
    for key, shown in {**words, **views}.items():
        tmux.keys(key)
        tmux.wait(shows(shown), 20, f"{key}: {shown!r}")
    tmux.keys("p")
    tmux.wait(lambda s: "PAUSED" not in s, 20, "running again")
    screens = {
        "m": "messages and events",
        "?": "keys and panels",
        "c": "compare with a previous run",
    }
    for key, title in screens.items():  # a screen of its own: opened, closed again
        tmux.keys(key)
        tmux.wait(shows(title), 20, f"{key}: {title!r}")
        tmux.keys("Escape")
        tmux.wait(shows(title, False), 20, f"{key} closed")
    assert "Traceback" not in tmux.screen()
    tmux.keys("q")
    tmux.wait(lambda s: "eagle3-tui exited 0" in s, 30, "the app to quit")
