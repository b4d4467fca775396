"""A training without telemetry, seen from outside: its dataloader workers held stopped
while it goes on (a validation with workers of its own) is neither STALLED nor SILENT,
and STALLED for good once it waits on them; "(a step takes …)" comes from a training
bar only; a process held stopped is said to be so from the first look that found it,
a later look's (a summary's) included. Records as the agent writes them, a frozen
clock; the agent's own parts on real processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.agent import observe
from eagle3_tui.agent.timeline import open_timeline
from eagle3_tui.model.health import diagnose
from eagle3_tui.model.run import Run
from eagle3_tui.model.verdict import Diagnosis, Health
from eagle3_tui.telemetry import procs
from tests.records import Lines

T0 = 1_800_000_000.0
TRAINER = 4242
TRAIN_WORKERS = (4243, 4244)
VAL_WORKERS = (4245, 4246)


class Watched:
    """A training without telemetry, second by second: the trainer, its training
    loader's workers and its validation loader's (persistent, as speculators' are)."""

    def __init__(self) -> None:
        self.obs = Lines(writer="obs", t0=T0, dt=0.0)
        self.log = Lines(writer="log", t0=T0, dt=0.0)
        self.t = T0
        self.run = Run()
        self.offset = 0
        self.held: dict[int, float] = {}

    def feed(self, data: bytes) -> None:
        self.run.feed(self.offset, data)
        self.offset += len(data)

    def second(
        self,
        trainer: float,
        workers: float = 0.0,
        reads: float = 0.0,
        states: dict[int, str] | None = None,
        first: bool = False,
    ) -> None:
        """One look: the trainer's CPU, each live worker's, the data its workers read;
        ``states`` the processes' states where not ``S`` (``T``: held since the first
        look that found it so); ``first``: a first look (no CPU figure yet)."""
        states = states or {}
        members: list[dict[str, Any]] = []
        for pid in (TRAINER, *TRAIN_WORKERS, *VAL_WORKERS):
            state = states.get(pid, "S")
            cpu = trainer if pid == TRAINER else (0.0 if state == "T" else workers)
            m: dict[str, Any] = {
                "pid": pid,
                "role": "trainer" if pid == TRAINER else "worker",
                "comm": "python" if pid == TRAINER else "pt_data_worker",
                "state": state,
                "cpu_pct": None if first else cpu,
            }
            if state == "T":
                m["held_since"] = self.held.setdefault(pid, self.t)
            else:
                self.held.pop(pid, None)
            members.append(m)
        total = None if first else sum(m["cpu_pct"] for m in members)
        process = {
            "pid": TRAINER,
            "started": T0,
            "telemetry": False,
            "command": ["python", "train.py"],
            "cwd": "/work/exp7",
            "log_file": "/work/exp7/train.log",
            "log_bytes": 1000.0,
            "log_grew": 0.0,
            "checkpoint_dir": "/work/exp7/checkpoints",
            "cpu_pct": total,
        }
        self.feed(self.obs.at(self.t).make("proc", alive=True, process=process, processes=members))
        self.feed(self.obs.at(self.t).io(reads))
        self.t += 1.0

    def bar(self, epoch: int, n: int, total: int, elapsed_s: float, phase: str) -> None:
        self.feed(self.log.at(self.t).bar(epoch, n, total, elapsed_s, phase))

    def verdict(self) -> Diagnosis:
        return diagnose(self.run.state, self.t)


HELD = {pid: "T" for pid in TRAIN_WORKERS}


def _trained_an_epoch(o: Watched, seconds: int = 40) -> None:
    for _ in range(seconds):
        o.second(trainer=100.0, workers=30.0, reads=8192.0)
    o.bar(0, 24, 24, 36.0, "train")
    for _ in range(5):
        o.second(trainer=100.0, workers=30.0, reads=8192.0)
    o.bar(0, 6, 6, 3.0, "val")


def test_workers_held_during_a_validation_are_not_stalled_until_it_waits_on_them() -> None:
    """Seen by a tester: the training loader's workers held (kill -STOP) as an epoch's
    validation began, with workers of its own. The verdict went STALLED, SILENT, STALLED
    within 20 s: one look of the trainer idle (waiting for a validation batch) said it
    waits on the held workers; the next, busy, said SILENT with no word of the stop.
    While it validates: not stalled, not silent, the held workers named; once it waits
    on them (nothing of it moves): STALLED, and stays so."""
    o = Watched()
    _trained_an_epoch(o)
    for _ in range(8):  # epoch 1's training
        o.second(trainer=100.0, workers=30.0, reads=8192.0)
    o.bar(1, 24, 24, 36.0, "train")
    said: list[tuple[str, Diagnosis]] = []
    # the validation, the training workers held: one look waits for a batch
    for i in range(20):
        idle = i == 6
        o.second(
            trainer=3.0 if idle else 95.0,
            workers=0.0 if idle else 40.0,
            reads=0.0 if idle else 8192.0,
            states=HELD,
        )
        said.append(("validating", o.verdict()))
    o.bar(1, 6, 6, 20.0, "val")
    for _ in range(30):  # epoch 2's training needs the held workers: nothing moves
        o.second(trainer=1.0, states=HELD)
        said.append(("waiting", o.verdict()))
    for phase, d in said:
        assert "held stopped" in d.reason and "kill -CONT 4243 4244" in d.reason, (phase, d)
        assert d.health != Health.SILENT, (phase, d)
    validating = [d for phase, d in said if phase == "validating"]
    assert all(d.health == Health.RUNNING for d in validating), validating
    waiting = [d.health for phase, d in said if phase == "waiting"]
    first = waiting.index(Health.STALLED)
    assert first <= 2 and set(waiting[first:]) == {Health.STALLED}, waiting
    last = said[-1][1].reason
    assert "waits on them" in last and "for at least 30 s" in last, last


def test_a_summary_s_look_at_held_workers_of_an_idle_trainer_is_stalled() -> None:
    """summary looks for 2.5 s: a first look without CPU, then two. Nothing moves, the
    training workers held: STALLED naming them, for as long as the looks watched."""
    o = Watched()
    o.second(trainer=0.0, states=HELD, first=True)
    o.second(trainer=1.0, states=HELD)
    o.second(trainer=0.0, states=HELD)
    o.t -= 0.5  # (the verdict comes at the look's end)
    d = o.verdict()
    assert d.health == Health.STALLED, d
    assert "waits on them" in d.reason and "for at least 2.5 s" in d.reason, d.reason


def test_held_workers_while_the_trainer_works_are_not_silent_in_a_first_look() -> None:
    """A summary during the validation: busy trainer and validation workers."""
    o = Watched()
    o.second(trainer=0.0, states=HELD, first=True)
    o.second(trainer=90.0, workers=40.0, reads=8192.0, states=HELD)
    o.second(trainer=90.0, workers=40.0, reads=8192.0, states=HELD)
    d = o.verdict()
    assert d.health == Health.RUNNING, d
    assert "its CPU is busy" in d.reason and "kill -CONT 4243 4244" in d.reason, d.reason


def _hung(o: Watched) -> Diagnosis:
    """Nothing moves for 40 s: the hung verdict, whose reason may say a step's time."""
    for _ in range(40):
        o.second(trainer=0.0)
    d = o.verdict()
    assert d.health == Health.STALLED and "looks hung" in d.reason, d
    return d


def test_a_step_s_time_is_never_a_validation_bar_s() -> None:
    """A training cut short (``max_steps``) closes its bar at 10/24; the validation's
    bar after it (6 steps, 0.2 s each) was read as the training's by an agent counting
    bars that ended at 100%: "(a step takes 0.2 s)" of a 3 s step."""
    o = Watched()
    _trained_an_epoch(o)  # epoch 0: a training bar (1.5 s a step) and its validation's
    for _ in range(10):
        o.second(trainer=100.0, workers=30.0, reads=8192.0)
    o.bar(1, 10, 24, 15.0, "train")
    o.second(trainer=100.0, workers=30.0, reads=8192.0)
    o.bar(1, 6, 6, 1.2, "train")  # (its validation, as such an agent called it)
    d = _hung(o)
    assert "0.2 s" not in d.reason, d.reason


def test_a_first_look_inside_a_long_log_says_no_step_time_from_a_lone_bar() -> None:
    """A first look reads a long log's last 4 MiB: the first bar it sees may be an
    epoch's validation's, called its training's (nothing before it in view)."""
    o = Watched()
    o.second(trainer=0.0, first=True)
    o.bar(5, 6, 6, 1.2, "train")
    d = _hung(o)
    assert "a step takes" not in d.reason, d.reason


def test_a_step_s_time_comes_from_the_training_bar() -> None:
    o = Watched()
    _trained_an_epoch(o)
    for _ in range(10):
        o.second(trainer=100.0, workers=30.0, reads=8192.0)
    o.bar(1, 24, 24, 36.0, "train")
    d = _hung(o)
    assert "(a step takes 1.5 s)" in d.reason, d.reason


# ---- the agent's parts ------------------------------------------------------------------


def _row(pid: int, log: Path | None = None) -> dict[str, Any]:
    st = procs.stat(pid)
    assert st is not None
    return {
        "pid": pid,
        "start_ticks": st.start_ticks,
        "started": time.time(),
        "cwd": str(Path.cwd()),
        "command": ["python"],
        "log": str(log) if log is not None else None,
        "boot_id": procs.boot_id(),
    }


def test_the_log_s_validation_bar_after_a_training_cut_short_is_a_validation_s(
    tmp_path: Path,
) -> None:
    """speculators prints ``Epoch N`` for both bars of an epoch; a training loop that
    stops early (``max_steps``) closes its bar below 100%: the bar after it is still
    the epoch's validation."""
    log = tmp_path / "train.log"
    log.write_text(
        "Epoch 0 100% ━━━━━━━━━━ 24/24  [ 0:01:12 < 0:00:00 , 0 it/s ]\n"
        "Epoch 0 100% ━━━━━━━━━━ 6/6  [ 0:00:01 < 0:00:00 , 5 it/s ]\n"
        "Epoch 1 42% ━━━━━━━━━━ 10/24  [ 0:00:30 < 0:00:42 , 0 it/s ]\n"
        "Epoch 1 100% ━━━━━━━━━━ 6/6  [ 0:00:01 < 0:00:00 , 5 it/s ]\n"
    )
    obs = observe.Observer(_row(os.getpid(), log), {}, 1.0)
    try:
        obs.round(time.time())
        bars = [
            rec["bar"]
            for rec in (json.loads(line) for line in b"".join(obs.out).splitlines())
            if rec["kind"] == "progress"
        ]
    finally:
        obs.close()
    phases = [(b["epoch"], b["n"], b["phase"]) for b in bars]
    assert phases == [(0, 24, "train"), (0, 6, "val"), (1, 10, "train"), (1, 6, "val")], phases


@pytest.fixture
def a_tree() -> Iterator[tuple[int, int]]:
    """A process with a child (the trainer and a worker, as far as /proc shows)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; subprocess.run(['sleep', '120'])"],
        stdin=subprocess.DEVNULL,
    )
    try:
        child = None
        for _ in range(100):
            kids = procs.children(proc.pid)
            if kids:
                child = kids[0]
                break
            time.sleep(0.05)
        assert child is not None
        yield proc.pid, child
    finally:
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGCONT)
                os.kill(child, signal.SIGKILL)
        proc.kill()
        proc.wait(10)


def _held_since(row: dict[str, Any], child: int) -> float | None:
    """One look by a fresh observer (as a summary's) with the run's record."""
    obs = observe.Observer(row, {}, 1.0, open_timeline(row))
    try:
        obs.round(time.time())
        records = [json.loads(line) for line in b"".join(obs.out).splitlines()]
    finally:
        obs.close()
    (proc,) = [r for r in records if r["kind"] == "proc"]
    found = [m for m in proc["processes"] if m["pid"] == child]
    return found[0].get("held_since") if found else None


def test_a_later_look_says_the_stop_from_the_first_look_that_saw_it(
    a_tree: tuple[int, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """summary said "held stopped for at least 3 s" at every call: its own look's
    bound. A later look carries the first look's time, while the process has not run
    since (a stop continued and made again is a new one)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    parent, child = a_tree
    row = _row(parent)
    os.kill(child, signal.SIGSTOP)
    try:
        time.sleep(0.3)
        first = _held_since(row, child)
        assert first is not None
        time.sleep(1.5)
        later = _held_since(row, child)
        assert later == pytest.approx(first, abs=1e-3), (first, later)
        os.kill(child, signal.SIGCONT)
        time.sleep(0.3)
        os.kill(child, signal.SIGSTOP)
        time.sleep(0.3)
        again = _held_since(row, child)
        assert again is not None and again > first + 1.0, (first, again)
    finally:
        os.kill(child, signal.SIGCONT)
