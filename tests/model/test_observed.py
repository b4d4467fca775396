"""A run observed without telemetry: its records, its progress and its health, on
recorded scenarios with a frozen clock."""

from __future__ import annotations

import json
from typing import Any

import pytest

from eagle3_tui.model.health import diagnose
from eagle3_tui.model.run import Run
from eagle3_tui.model.snapshot import build_snapshot
from eagle3_tui.model.summary import format_text, summarize
from eagle3_tui.model.verdict import Health
from tests.records import Lines

T0 = 1_800_000_000.0
HANDLER = "the speculators.metrics logger has no handler, or its level is above INFO"


class Observed:
    """What the agent writes, second by second, about a training without telemetry."""

    def __init__(self, started: float = T0) -> None:
        self.obs = Lines(writer="obs", t0=started, dt=0.0)
        self.log = Lines(writer="log", t0=started, dt=0.0)
        self.started = started
        self.t = started
        self.run = Run()
        self.offset = 0

    def feed(self, data: bytes) -> None:
        self.run.feed(self.offset, data)
        self.offset += len(data)

    def second(self, cpu: float = 100.0, reads: float = 0.0, log_grew: float = 0.0) -> None:
        self.feed(self.obs.at(self.t).proc(cpu_pct=cpu, log_grew=log_grew, started=self.started))
        if reads:
            self.feed(self.obs.at(self.t).io(reads))
        self.t += 1.0

    def bar(self, epoch: int, n: int, total: int, elapsed_s: float) -> None:
        self.feed(self.log.at(self.t).bar(epoch, n, total, elapsed_s))

    def health(self) -> Health:
        return diagnose(self.run.state, self.t).health


def test_startup_then_worker_reads_is_silent_within_30_s_of_the_evidence() -> None:
    o = Observed()
    for _ in range(20):  # imports, data: busy CPU, nothing else
        o.second(cpu=100.0)
        assert o.health() == Health.WAITING
    evidence = o.t
    verdicts = []
    while o.t < evidence + 40:
        o.second(cpu=100.0, reads=4096.0)  # dataloader workers read: the loop runs
        verdicts.append((o.t - evidence, o.health()))
    assert all(h in (Health.WAITING, Health.SILENT) for _, h in verdicts)
    first = next(dt for dt, h in verdicts if h == Health.SILENT)
    assert first <= 30.0  # max(30 s, 5 x step time): no bar yet, so 30 s
    assert all(h == Health.SILENT for dt, h in verdicts if dt >= first)  # it stays so
    reason = diagnose(o.run.state, o.t).reason
    assert HANDLER in reason and "pid 4242" in reason and "dataloader workers read" in reason
    assert "Attach live" in reason and "restart it with telemetry" in reason


@pytest.mark.parametrize("step_s", [2.0, 10.0, 20.0])
def test_the_bound_grows_with_the_step_time_the_bars_give(step_s: float) -> None:
    """Evidence at an epoch's end (a bar and the reads); flagged within max(30, 5 x step)."""
    o = Observed()
    bound = max(30.0, 5.0 * step_s)
    o.second(cpu=100.0)
    o.bar(0, 10, 10, elapsed_s=10 * step_s)
    evidence = o.t
    first = None
    while o.t < evidence + bound + 10:
        o.second(cpu=100.0, reads=2048.0)
        h = o.health()
        if h == Health.SILENT and first is None:
            first = o.t - evidence
        assert h in (Health.WAITING, Health.SILENT)
        if o.t - o.started < bound:
            assert h == Health.WAITING, (o.t - o.started, bound)  # no alarm before the bound
    assert first is not None and first <= bound


def test_a_busy_cpu_alone_is_silent_only_after_the_start_up_allowance() -> None:
    o = Observed()
    while o.t < T0 + 89:
        o.second(cpu=150.0, log_grew=100.0)
        assert o.health() == Health.WAITING
    o.second(cpu=150.0)
    o.second(cpu=150.0)
    assert o.health() == Health.SILENT
    assert "its CPU is busy" in diagnose(o.run.state, o.t).reason


def test_silent_then_hung_early_goes_to_stalled_never_back_to_waiting() -> None:
    """Seen by ``watch`` (issue 30): a run called silent 48 s in (an epoch done, reads),
    that then hangs while still inside the 90 s start-up allowance, was called WAITING
    ("has logged no metric yet") for ~20 s — a verdict that said it recovered. Once its
    loop was seen running, start-up is over: the verdict goes silent, then stalled."""
    o = Observed()
    for _ in range(20):
        o.second(cpu=100.0)
    o.bar(0, 10, 10, elapsed_s=10.0)
    for _ in range(30):
        o.second(cpu=100.0, reads=4096.0, log_grew=80.0)
    assert o.health() == Health.SILENT
    o.second(cpu=5.0, log_grew=60.0)  # "blocks forever now": its last words, then nothing
    verdicts = []
    while o.t < T0 + 140:
        o.second(cpu=0.0)
        verdicts.append(o.health())
    assert Health.WAITING not in verdicts, verdicts
    assert verdicts[-1] == Health.STALLED
    first_stalled = verdicts.index(Health.STALLED)
    assert set(verdicts[:first_stalled]) <= {Health.SILENT}
    assert set(verdicts[first_stalled:]) == {Health.STALLED}


def test_nothing_moving_is_stalled_and_a_gone_trainer_is_dead() -> None:
    o = Observed(started=T0 - 600)
    for _ in range(40):
        o.second(cpu=0.0)
    d = diagnose(o.run.state, o.t)
    assert d.health == Health.STALLED and "no CPU" in d.reason
    o.feed(o.obs.at(o.t).proc(alive=False, cpu_pct=None, started=o.started))
    d = diagnose(o.run.state, o.t)
    assert d.health == Health.DEAD and "exit status is unknown" in d.reason


def test_how_an_observed_trainer_ended() -> None:
    o = Observed()
    o.second()
    o.feed(o.log.at(o.t).log("RuntimeError: CUDA out of memory", level="ERROR", logger="stdout"))
    o.feed(o.obs.at(o.t).proc(alive=False, started=o.started))
    d = diagnose(o.run.state, o.t)
    assert d.health == Health.DEAD and "RuntimeError: CUDA out of memory" in d.reason
    o = Observed()
    o.second()
    o.feed(o.obs.at(o.t + 1).ckpt("save_finished", "/work/exp7/checkpoints/interrupted"))
    o.feed(o.obs.at(o.t + 2).proc(alive=False, started=o.started))
    d = diagnose(o.run.state, o.t + 2)
    assert d.health == Health.STOPPED and "interrupted" in d.reason
    # a kill's stop sends no signal (it asks at a step boundary): no "a SIGTERM" alone
    assert "(a stop: a SIGTERM, Ctrl+C, or a kill's request" in d.reason, d.reason
    o = Observed()
    o.feed(o.obs.at(o.t).proc(started=o.started, epochs=2))
    o.bar(1, 10, 10, 5.0)
    o.feed(o.obs.at(o.t + 1).proc(alive=False, started=o.started, epochs=2))
    assert diagnose(o.run.state, o.t + 1).health == Health.FINISHED


def test_metric_dicts_in_its_output_are_a_running_run() -> None:
    o = Observed()
    for step in range(10):
        o.second(cpu=100.0, reads=1024.0)
        o.feed(o.log.at(o.t).train(step, 2.0 - 0.1 * step))
    assert o.health() == Health.RUNNING
    snap = build_snapshot(o.run.state, o.t)
    assert snap.global_step == 9 and snap.observed is not None


def test_progress_and_summary_of_an_observed_run() -> None:
    o = Observed()
    o.feed(o.obs.at(o.t).proc(started=o.started, epochs=5))
    o.bar(0, 24, 24, elapsed_s=12.0)
    o.feed(o.log.at(o.t).bar(0, 6, 6, elapsed_s=3.0, phase="val"))
    o.bar(1, 24, 24, elapsed_s=6.0)
    # the ETA counts down from the bar it rests on (it froze at 18 s through a hang)
    assert summarize(o.run.state, o.t + 5)["eta_run_s"] == pytest.approx(72 / 4.0 - 5)
    o.t += 60
    o.second()
    s = summarize(o.run.state, o.t)
    assert s["global_step"] == 47  # two epochs of 24 steps, 0-based
    assert s["step"] == 48  # steps done: the 1-based number every view shows
    assert s["epoch"] == 3 and s["epochs"] == 5 and s["total_steps"] == 120  # the third runs
    assert s["steps_per_s"] == pytest.approx(4.0)  # 24 steps in 6 s
    assert s["eta_run_s"] is None  # its end by that bar is long past, no newer bar: unknown
    assert s["telemetry"] is False and s["loss"] is None
    assert s["observed"]["pid"] == 4242 and s["observed"]["log_file"] == "/work/exp7/train.log"
    assert [p["role"] for p in s["observed"]["processes"]] == ["trainer", "worker"]
    json.dumps(s)  # JSON-ready


def test_a_mid_epoch_checkpoint_moves_the_progress_between_epoch_bars() -> None:
    """Without telemetry, progress moved only at epoch ends ("step 20/80" for 33 s while
    the trainer did steps 21-40); a checkpoint saved mid-epoch says where the run is (its
    training_state.json), never beyond the run's own totals, and an earlier run's
    checkpoint in the same directory says nothing."""
    o = Observed()
    o.feed(o.obs.at(o.t).proc(started=o.started, epochs=5))
    o.bar(0, 24, 24, elapsed_s=6.0)
    o.t += 5

    def saved(at: float, epoch: int, local: int, done: int) -> bytes:
        state = {"epoch": epoch, "local_step": local, "global_step": done}
        path = f"/work/exp7/checkpoints/{done}"
        return o.obs.at(at).ckpt("save_finished", path, bytes=9, training_state=state)

    o.feed(saved(o.started - 3600, 3, 10, 82))  # the directory's earlier run: before it began
    p = build_snapshot(o.run.state, o.t).progress
    assert (p.step, p.epoch) == (24, 2)  # the bar's: its end, the second epoch under way
    o.feed(saved(o.t, 1, 12, 36))  # 12 steps into the second epoch
    p = build_snapshot(o.run.state, o.t + 1).progress
    assert (p.step, p.global_step, p.epoch, p.total_steps) == (36, 35, 2, 120)
    assert p.eta_run_s == pytest.approx((120 - 36) / 4.0 - 1)  # from the save's time
    o.feed(saved(o.t + 2, 1, 0, 48))  # the second epoch's end: the third is under way
    assert build_snapshot(o.run.state, o.t + 3).progress.epoch == 3
    o.feed(saved(o.t + 3, 9, 3, 999))  # more than its totals: shown at its end, no further
    p = build_snapshot(o.run.state, o.t + 4).progress
    assert (p.step, p.epoch) == (120, 5)
    bad = {"epoch": "1", "local_step": -1, "global_step": 2**50}
    o.feed(o.obs.at(o.t + 5).ckpt("save_finished", "/c/7", training_state=bad))
    assert o.run.state.saved_progress is not None
    assert o.run.state.saved_progress.steps_done == 999


def test_malformed_observed_records_are_counted_and_move_nothing() -> None:
    o = Observed()
    bad = [
        {"kind": "proc", "v": 1, "seq": 0, "w": "x", "ts": T0, "process": {"pid": 1}},
        {"kind": "proc", "v": 1, "seq": 1, "w": "x", "ts": T0, "alive": True, "process": {}},
        {"kind": "proc", "v": 1, "seq": 2, "w": "x", "ts": T0, "alive": True,
         "process": {"pid": 1}, "processes": [{"role": "worker"}]},
        {"kind": "progress", "v": 1, "seq": 3, "w": "x", "ts": T0, "bar": {"epoch": 0}},
        {"kind": "progress", "v": 1, "seq": 4, "w": "x", "ts": T0,
         "bar": {"epoch": 0, "n": -1, "total": 3}},
    ]  # fmt: skip
    o.feed(b"".join(json.dumps(x).encode() + b"\n" for x in bad))
    state = o.run.state
    assert state.malformed_count == len(bad)
    assert state.observed is None and not state.bars and state.liveness.process_alive is None


def test_a_backend_that_stops_writing_is_silent_and_named() -> None:
    """speculators' TensorBoard backend wrote steps 0-9, then nothing while the trainer
    kept reading data: silent, its backend named, never "no handler"."""
    o = Observed()
    events = "/work/exp7/logs/run/events.out.tfevents.1.host.4242.0"
    train = Lines(writer="own", t0=T0, dt=0.0)
    for step in range(10):
        o.feed(o.obs.at(o.t).proc(handler="tensorboard", metrics_file=events, started=T0))
        o.feed(train.at(o.t).train(step, loss=2.0 - 0.1 * step))
        o.feed(o.obs.at(o.t).io(4096.0))
        o.t += 1.0
    assert o.health() == Health.RUNNING
    while o.t < T0 + 10 + 120 and o.health() != Health.SILENT:
        o.feed(o.obs.at(o.t).proc(handler="tensorboard", metrics_file=events, started=T0))
        o.feed(o.obs.at(o.t).io(4096.0))
        o.t += 1.0
    d = diagnose(o.run.state, o.t)
    assert d.health == Health.SILENT, d.reason
    assert "speculators' TensorBoard backend (its event files) has written none since" in d.reason
    assert HANDLER not in d.reason and "no handler" not in d.reason


def test_an_event_file_that_cannot_be_read_further_is_said_so() -> None:
    """Its framing broken (the agent reads nothing past it): silent, and why, never
    "has written none" (it may well write)."""
    o = Observed()
    events = "/work/exp7/logs/run/events.out.tfevents.1.host.4242.0"
    broken: dict[str, Any] = {
        "handler": "tensorboard",
        "metrics_file": events,
        "metrics_problem": "its framing is broken at byte 4,096: nothing after it is read",
        "metrics_stuck": True,
        "started": T0,
    }
    train = Lines(writer="own", t0=T0, dt=0.0)
    for step in range(5):
        o.feed(o.obs.at(o.t).proc(**broken))
        o.feed(train.at(o.t).train(step, loss=1.0))
        o.t += 1.0
    while o.t < T0 + 5 + 120 and o.health() != Health.SILENT:
        o.feed(o.obs.at(o.t).proc(**broken))
        o.feed(o.obs.at(o.t).io(4096.0))
        o.t += 1.0
    d = diagnose(o.run.state, o.t)
    assert d.health == Health.SILENT, d.reason
    assert "cannot all be read (its framing is broken at byte 4,096" in d.reason
    assert "has written none" not in d.reason and "no handler" not in d.reason
    s = summarize(o.run.state, o.t)
    assert s["observed"]["metrics_problem"] == broken["metrics_problem"]
    assert "not read: its framing is broken at byte 4,096" in format_text(s)


def test_a_silent_slurm_batch_job_is_not_promised_a_restart_with_telemetry() -> None:
    """A batch job's training comes back, requeued, as its script was: the remedy says
    so, and offers what does add telemetry (attach)."""
    o = Observed()
    for _ in range(60):
        o.feed(o.obs.at(o.t).proc(cpu_pct=100.0, started=o.started, slurm_job="4242"))
        o.feed(o.obs.at(o.t).io(4096.0))
        o.t += 1.0
    d = diagnose(o.run.state, o.t)
    assert d.health == Health.SILENT, d
    assert HANDLER in d.reason and "Attach live" in d.reason, d.reason
    assert "restart it with telemetry" not in d.reason, d.reason
    assert "a stop and a requeue (k, then r) bring its script back as it was" in d.reason


def test_a_training_found_gone_by_a_later_look_ended_between_the_two() -> None:
    """Looked at alive at T0+30, found gone at T0+300 (its record, read after it ended):
    it ended somewhere between, the later of that look and a checkpoint it finished
    saving since (T0+110). "ended 00:00:30, ran 30 s" said the first bound as the end;
    the summary says the span and the least it ran, as the verdict says the span."""
    o = Observed()
    o.feed(o.obs.at(o.t).proc(started=o.started, epochs=2))
    o.bar(0, 24, 24, elapsed_s=6.0)
    o.feed(o.obs.at(T0 + 110).ckpt("save_finished", "/work/exp7/checkpoints/1", bytes=9))
    o.feed(o.obs.at(T0 + 300).ckpt("best", "/work/exp7/checkpoints/1"))  # (a look's time)
    gone: dict[str, Any] = {"ended_at": T0 + 300, "last_alive": T0 + 30}
    o.feed(o.obs.at(T0 + 300).proc(alive=False, started=o.started, epochs=2, **gone))
    d = diagnose(o.run.state, T0 + 400)
    s = summarize(o.run.state, T0 + 400)
    assert (s["ended_at"], s["ended_by"], s["elapsed_s"]) == (T0 + 110, T0 + 300, 110.0)
    text = format_text(s)
    assert "ended between 08:01:50 and 08:05:00, ran at least 1m50s" in text, text
    assert "between 08:01:50 and 08:05:00" in d.reason, d.reason
    # watched as it went: its end is known, said as one time
    o = Observed()
    o.feed(o.obs.at(o.t).proc(started=o.started))
    o.feed(o.obs.at(T0 + 60).proc(alive=False, started=o.started, ended_at=T0 + 60))
    s = summarize(o.run.state, T0 + 100)
    assert (s["ended_at"], s["ended_by"]) == (T0 + 60, None)
    assert "ended 08:01:00, ran 1m" in format_text(s)
