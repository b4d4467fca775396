"""A training without telemetry whose dataloader workers alone are held stopped
(``kill -STOP`` on its training loader's workers as an epoch's validation begins, with
workers of its own): a tester saw STALLED, SILENT, STALLED within 20 s. While the
validation runs it is neither stalled nor silent, the held workers named; once the next
epoch needs them it is STALLED and stays so; and each ``summary`` says for how long
from the first look that found them held, not its own 2.5 s look's "at least 3 s".

A user's own script (it imports speculators: that is how discovery knows it), launched
as in the story (``nohup … > train.log 2>&1``)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.telemetry import procs
from tests.conftest import need_training, wait_until

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    # my training script: the tiny EAGLE-3 draft, no monitoring of any kind
    import sys

    import speculators  # noqa: F401
    from eagle3_tui.train.tiny import main

    if __name__ == "__main__":  # (its dataloader workers import this file again)
        sys.exit(main(sys.argv[1:]))
    """
)
EAGLE3_TUI = str(Path(sys.executable).parent / "eagle3-tui")


@pytest.fixture
def validating(tmp_path: Path) -> Iterator[tuple[int, list[int], Path]]:
    """The training as its first validation begins, its training loader's two workers
    held stopped: its PID, theirs, its log."""
    need_training()
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(SCRIPT)
    # 16 training steps and 4 validation steps an epoch, 2 s each: a summary (2.5 s)
    # fits in its validation
    args = ["--run-dir", str(work / "run"), "--no-telemetry", "--log", "none", "--rows", "40"]
    args += ["--workers", "2", "--epochs", "4", "--step-delay", "2.0"]
    log = work / "train.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "train.py", *args],
            cwd=work,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    held: list[int] = []
    try:
        wait_until(  # the epoch's training bar is printed when its loop ends
            lambda: re.search(rb"^Epoch 0 ", log.read_bytes(), re.M) is not None,
            300,
            lambda: f"epoch 0's bar; log:\n{log.read_text(errors='replace')[-2000:]}",
            0.1,
        )
        held = sorted(
            p for p in procs.descendants(proc.pid) if _comm(p) == "pt_data_worker"
        )  # (its validation's workers start after this, named so once their loop runs)
        assert len(held) == 2, held
        for pid in held:
            os.kill(pid, signal.SIGSTOP)
        yield proc.pid, held, log
    finally:
        for pid in held:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def _comm(pid: int) -> str | None:
    st = procs.stat(pid)
    return st.comm if st is not None else None


def _summary(pid: int) -> dict[str, Any]:
    proc = subprocess.run(
        [EAGLE3_TUI, "summary", "--pid", str(pid), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.stdout, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def test_workers_held_while_it_validates_then_stalled_for_as_long_as_they_are(
    validating: tuple[int, list[int], Path],
) -> None:
    pid, held, log = validating
    stopped = time.time()
    said: list[tuple[float, str, str]] = []
    validated: list[bool] = []  # its validation had ended as each summary returned
    while True:
        out = _summary(pid)
        said.append((time.time() - stopped, out["health"], out["reason"]))
        validated.append(len(re.findall(rb"^Epoch 0 ", log.read_bytes(), re.M)) >= 2)
        stalled = [s for s in said if s[1] == "stalled"]
        if len(stalled) >= 3 and stalled[-1][0] - stalled[0][0] >= 10:
            break
        assert time.time() - stopped < 150, said
    cont = f"kill -CONT {held[0]} {held[1]}"
    for _, health, reason in said:
        assert health != "silent", said  # it works, or waits on the held workers
        assert cont in reason and "held stopped" in reason, said
    # while it validates (with workers of its own) it waits on no held worker
    during = [s for s, done in zip(said, validated, strict=True) if not done]
    assert during, said  # (a summary's look fell in its validation)
    assert all(health in ("running", "waiting") for _, health, _ in during), said
    healths = [health for _, health, _ in said]
    first = healths.index("stalled")
    assert set(healths[first:]) == {"stalled"}, said  # once it waits on them, for good
    assert set(healths[:first]) <= {"running", "waiting"}, said
    # for how long: from the first look that found them held, not this look's 2.5 s
    at, _, reason = said[-1]
    m = re.search(r"held stopped \(.*?\) for at least (\d+(?:\.\d)?) s", reason)
    assert m is not None, reason
    assert float(m.group(1)) >= at - said[0][0] - 3.0, said
