"""Verdicts on a training without telemetry must be true when shown: a busy trainer is
never hung, a trainer held stopped is said so (and how to continue it), and each sign
of work a reason names happened recently, not once in the process's life. Records as
the agent writes them, a frozen clock."""

from __future__ import annotations

import re
from typing import Any

from eagle3_tui.model.health import diagnose
from eagle3_tui.model.run import Run
from eagle3_tui.model.verdict import Diagnosis, Health
from tests.records import Lines

T0 = 1_800_000_000.0
EVENTS = "/work/exp7/logs/run/events.out.tfevents.1.host.4242.0"
CKPT = "/work/exp7/checkpoints"


class Watched:
    """A training without telemetry as the agent reports it, second by second."""

    def __init__(self, started: float = T0, **info: Any) -> None:
        self.obs = Lines(writer="obs", t0=started, dt=0.0)
        self.log = Lines(writer="log", t0=started, dt=0.0)
        self.own = Lines(writer="own", t0=started, dt=0.0)
        self.started = started
        self.info = info
        self.t = started
        self.run = Run()
        self.offset = 0

    def feed(self, data: bytes) -> None:
        self.run.feed(self.offset, data)
        self.offset += len(data)

    def proc(
        self, cpu: float = 100.0, log_grew: float = 0.0, states: str = "RS", **more: Any
    ) -> None:
        """A ``proc`` record: the trainer and one dataloader worker, in ``states``
        (``T``: held stopped, since ``held_since``)."""
        held = more.pop("held_since", None)
        info = {**self.info, **more}
        process = {
            "pid": 4242,
            "started": self.started,
            "telemetry": False,
            "command": ["python", "train.py"],
            "cwd": "/work/exp7",
            "log_file": "/work/exp7/train.log",
            "log_bytes": 1000.0,
            "log_grew": log_grew,
            "checkpoint_dir": CKPT,
            "cpu_pct": cpu,
            **info,
        }
        members: list[dict[str, Any]] = [
            {"pid": 4242, "role": "trainer", "comm": "python", "state": states[0], "cpu_pct": cpu},
            {"pid": 4243, "role": "worker", "comm": "pt_data_worker", "state": states[1]},
        ]
        for m in members:
            if m["state"] == "T" and held is not None:
                m["held_since"] = held
        self.feed(self.obs.at(self.t).make("proc", alive=True, process=process, processes=members))

    def second(
        self, cpu: float = 100.0, reads: float = 0.0, log_grew: float = 0.0, **more: Any
    ) -> None:
        self.proc(cpu=cpu, log_grew=log_grew, **more)
        self.feed(self.obs.at(self.t).io(reads))
        self.t += 1.0

    def step(self, step: int) -> None:
        self.feed(self.own.at(self.t).train(step, loss=2.0 - 0.001 * step))

    def verdict(self) -> Diagnosis:
        return diagnose(self.run.state, self.t)


def _trained(o: Watched, steps: int, step_s: float, reads: float = 4096.0) -> int:
    """``steps`` logged steps ``step_s`` apart, the trainer busy and reading."""
    for step in range(steps):
        o.step(step)
        for _ in range(int(step_s)):
            o.second(cpu=100.0, reads=reads)
        o.t += step_s - int(step_s)
    return steps


def test_a_cpu_busy_validation_of_a_tensorboard_run_is_neither_stalled_nor_silent() -> None:
    """Seen by a user: speculators' TensorBoard backend logs each step (4.2 s); at the
    epoch's end a checkpoint is saved, then a validation computes on the CPU for 75 s,
    printing nothing and reading nothing. The monitor said STALLED ("the training loop
    looks hung") 34 s in, and summary SILENT ("although checkpoints are being written …
    the trainer no longer logs them, or the handler fails") 43 s in. Its CPU is busy:
    no hang; no checkpoint was written for 70 s; a 75 s pause is no failing handler."""
    o = Watched(handler="tensorboard", metrics_file=EVENTS)
    steps = _trained(o, 20, 4.2)
    o.feed(o.obs.at(o.t).ckpt("save_started", f"{CKPT}/0", started=o.t))
    o.second(cpu=100.0)
    o.feed(o.obs.at(o.t).ckpt("save_finished", f"{CKPT}/0", bytes=9, complete=True))
    o.second(cpu=100.0)
    verdicts = []
    for _ in range(75):  # the validation: the CPU busy, nothing else
        o.second(cpu=100.0)
        verdicts.append(o.verdict())
    for d in verdicts:
        assert d.health not in (Health.STALLED, Health.SILENT), d.reason
        assert "hung" not in d.reason and "no longer logs" not in d.reason, d.reason
        assert "checkpoints are being written" not in d.reason, d.reason
    noted = [d for d in verdicts if "No metric for" in d.reason]
    assert noted and all("its CPU is busy (100%)" in d.reason for d in noted), noted[-1]
    o.step(steps)  # the metrics resume after it
    o.second(cpu=100.0, reads=4096.0)
    assert o.verdict().health == Health.RUNNING


def test_summary_and_monitor_agree_on_the_same_pause() -> None:
    """summary looks for 2.5 s (the metrics, the checkpoints with their own times, a few
    samples); the monitor has watched all along: one verdict, for the same reasons."""
    o = Watched(handler="tensorboard", metrics_file=EVENTS)
    one_shot = Watched(handler="tensorboard", metrics_file=EVENTS)
    for step in range(20):
        for w in (o, one_shot):
            w.t = T0 + 4.2 * step
            w.step(step)
        for _ in range(4):
            o.second(cpu=100.0, reads=4096.0)
    saved = T0 + 4.2 * 20 + 1
    for w in (o, one_shot):
        w.feed(w.obs.at(saved).ckpt("save_finished", f"{CKPT}/0", bytes=9, complete=True))
    o.t = saved
    while o.t < saved + 41:
        o.second(cpu=100.0)
    one_shot.t = o.t - 3
    for _ in range(3):
        one_shot.second(cpu=100.0)
    assert one_shot.t == o.t
    monitor, summary = o.verdict(), one_shot.verdict()
    assert monitor.health == summary.health == Health.RUNNING, (monitor, summary)
    for d in (monitor, summary):
        assert "checkpoints are being written" not in d.reason, d.reason


def test_a_handler_that_fails_while_training_goes_on_is_silent_past_its_longest_pause() -> None:
    """Steps with a 60 s pause at an epoch's end (its validation), later no metric while
    the trainer reads on: not silent before 1.5 x 60 s, silent after, and every sign it
    names is current."""
    o = Watched(handler="tensorboard", metrics_file=EVENTS)
    step = _trained(o, 10, 2.0)
    for _ in range(60):
        o.second(cpu=100.0)
    for later in range(step, step + 40):
        o.step(later)
        o.second(cpu=100.0, reads=4096.0)
        o.second(cpu=100.0, reads=4096.0)
    quiet_from = o.t
    seen = []
    while o.t < quiet_from + 120:
        o.second(cpu=100.0, reads=4096.0)
        seen.append((o.t - quiet_from, o.verdict()))
    assert all(d.health != Health.SILENT for dt, d in seen if dt <= 90), seen
    last = seen[-1][1]
    assert last.health == Health.SILENT, last
    assert "has written none since" in last.reason and "its dataloader workers read" in last.reason
    # the quiet and the pause allowed, said as they are ("No metric for 2 min … longer
    # than the 2 min a pause may take" after 93 s of a 90 s allowance)
    first = next(d for dt, d in seen if d.health == Health.SILENT)
    allowed = re.search(r"longer than the (\d+) s a pause may take", first.reason)
    quiet = re.search(r"No metric for (\d+) s", first.reason)
    assert allowed and quiet and int(quiet.group(1)) > int(allowed.group(1)), first.reason


def test_a_trainer_held_stopped_is_said_so_with_how_long_and_the_remedy() -> None:
    """SIGSTOP (ps STAT T): "alive and checkpoints are being written, epochs complete in
    its output and its log is growing" for 20 s, then "stalled … for 30 s" that never
    grew, the stop never named. Said at once: held stopped, for at least how long, and
    kill -CONT."""
    o = Watched()
    for epoch in range(3):
        for _ in range(10):
            o.second(cpu=100.0, reads=4096.0, log_grew=200.0)
        o.feed(o.log.at(o.t).bar(epoch, 10, 10, elapsed_s=10.0))
        o.feed(o.obs.at(o.t).ckpt("save_finished", f"{CKPT}/{epoch}", bytes=9))
    stopped = o.t
    said = []
    while o.t < stopped + 50:
        o.second(cpu=0.0, states="TT", held_since=stopped)
        said.append((o.t - stopped, o.verdict()))
    for dt, d in said:
        assert d.health == Health.STALLED, (dt, d)
        assert "held stopped" in d.reason and "kill -CONT 4242 4243" in d.reason, d.reason
        assert "the trainer (pid 4242) and a dataloader worker (pid 4243)" in d.reason.lower()
        assert f"for at least {dt:.0f} s" in d.reason or dt < 10, (dt, d.reason)
        for stale in ("being written", "epochs complete", "log is growing"):
            assert stale not in d.reason, d.reason


def test_a_hung_trainer_is_idle_for_as_long_as_nothing_moved() -> None:
    """ "for 30 s" was the threshold, said at every look: the idle time is the real one."""
    o = Watched()
    for _ in range(20):
        o.second(cpu=100.0, reads=4096.0)
    o.feed(o.log.at(o.t).bar(0, 20, 20, elapsed_s=20.0))
    hung = o.t
    reasons = {}
    while o.t < hung + 70:
        o.second(cpu=0.0)
        d = o.verdict()
        if d.health == Health.STALLED:
            reasons[round(o.t - hung)] = d.reason
    assert 40 in reasons and 69 in reasons, sorted(reasons)
    for dt in (40, 69):
        said = re.search(r"for (\d+) s", reasons[dt])
        assert said is not None and abs(int(said.group(1)) - dt) <= 1, (dt, reasons[dt])


def test_signs_of_work_are_said_only_when_recent() -> None:
    """Silent (the workers read, no metric ever): a checkpoint 25 s ago and an epoch bar
    25 s ago are said as such, never "being written" or "epochs complete"."""
    o = Watched()
    for _ in range(40):
        o.second(cpu=100.0, reads=4096.0)
    o.feed(o.log.at(o.t).bar(0, 40, 40, elapsed_s=40.0))
    o.feed(o.obs.at(o.t).ckpt("save_finished", f"{CKPT}/0", bytes=9))
    then = o.t
    while o.t < then + 25:
        o.second(cpu=100.0, reads=4096.0)
    d = o.verdict()
    assert d.health == Health.SILENT, d
    assert "checkpoints are being written" not in d.reason, d.reason
    assert "epochs complete" not in d.reason and "log is growing" not in d.reason, d.reason
    assert "a checkpoint was written 25 s ago" in d.reason, d.reason
    assert "an epoch ended in its output 25 s ago" in d.reason, d.reason


def test_a_save_read_from_an_old_log_line_keeps_the_line_s_time() -> None:
    """A first look reads the log's last lines (stamped with its mtime); the checkpoint
    watcher's records of a "Saving checkpoint to" / "Checkpoint saved to" among them
    were stamped with the look's time: a save of minutes ago said "being written"."""
    import json

    from eagle3_tui.agent.observe import FrameSink, Observer, _WithoutInventory
    from eagle3_tui.telemetry.samplers import CheckpointWatcher

    out: list[bytes] = []
    obs = Observer.__new__(Observer)
    obs.ckpt_sink = _WithoutInventory(FrameSink("obs", out))
    obs.watcher = CheckpointWatcher(obs.ckpt_sink, None)
    obs._on_message(f"Saving checkpoint to {CKPT}/3", T0)
    obs._on_message(f"Checkpoint saved to {CKPT}/3", T0 + 2)
    records = [json.loads(line) for line in out]
    assert [(r["event"], r["ts"]) for r in records] == [
        ("save_started", T0),
        ("save_finished", T0 + 2),
    ]
