"""Health decided from evidence, on recorded scenarios, with a frozen clock."""

from __future__ import annotations

from eagle3_tui.model.health import diagnose
from eagle3_tui.model.liveness import Leftover
from eagle3_tui.model.run import Run
from eagle3_tui.model.state import RunState
from eagle3_tui.model.verdict import Diagnosis, Health
from tests.records import Lines

T0 = 1_800_000_000.0


def state_of(data: bytes) -> RunState:
    run = Run()
    run.feed(0, data)
    return run.state


class Scenario:
    """A run written second by second: steps, samplers, logs, all with timestamps."""

    def __init__(self, step_s: float = 2.0) -> None:
        self.rank0 = Lines(writer="rank0", t0=T0, dt=0.0)
        self.sampler = Lines(writer="sampler", t0=T0, dt=0.0)
        self.parts: list[bytes] = []
        self.step = 0
        self.t = T0
        self.step_s = step_s

    def train(
        self, seconds: float, loss: float = 2.0, util: float = 97.0, reads: float = 5e6
    ) -> None:
        """Train for ``seconds``: a step every step_s, GPU and IO samples every second."""
        end = self.t + seconds
        next_step = self.t
        while self.t < end:
            while next_step <= self.t:
                self.parts.append(self.rank0.at(next_step).train(self.step, loss))
                self.step += 1
                next_step += self.step_s
            self.tick(util, reads)

    def tick(self, util: float, reads: float) -> None:
        self.parts.append(self.sampler.at(self.t).gpu(util))
        self.parts.append(self.sampler.at(self.t).io(reads))
        self.parts.append(self.sampler.at(self.t).heartbeat())
        self.t += 1.0

    def idle(self, seconds: float, util: float, reads: float) -> None:
        """No metric record, only samplers (and the heartbeat)."""
        end = self.t + seconds
        while self.t < end:
            self.tick(util, reads)

    def log(self, msg: str) -> None:
        self.parts.append(self.rank0.at(self.t).log(msg))

    def ckpt(self, event: str, **fields: object) -> None:
        self.parts.append(self.sampler.at(self.t).ckpt(event, "/ckpt/0", **fields))

    def state(self) -> RunState:
        return state_of(b"".join(self.parts))


def test_a_healthy_run_with_saves_and_validation_raises_no_alarm() -> None:
    sc = Scenario(step_s=2.0)
    sc.train(120)
    assert diagnose(sc.state(), sc.t).health == Health.RUNNING
    # a 3-minute checkpoint save: no metric, GPU quiet, but it is a save
    sc.log("Saving checkpoint to /ckpt/0")
    sc.ckpt("save_started")
    sc.idle(90, util=0.0, reads=0.0)
    mid = diagnose(sc.state(), sc.t)
    assert mid.health == Health.RUNNING and "Saving a checkpoint" in mid.reason
    sc.idle(90, util=0.0, reads=0.0)
    sc.ckpt("save_finished", bytes=5e9, duration_s=180.0)
    sc.log("Checkpoint saved to /ckpt/0")
    # a 4-minute validation epoch: no training metric
    sc.log("Validation epoch 1/3 started")
    sc.idle(240, util=90.0, reads=1e6)
    during_val = diagnose(sc.state(), sc.t)
    assert during_val.health == Health.RUNNING and "Validating" in during_val.reason
    sc.parts.append(sc.rank0.at(sc.t).val(sc.step, 0, 1.9))
    sc.log("Validation epoch 1/3 completed")
    sc.train(60)
    assert diagnose(sc.state(), sc.t).health == Health.RUNNING
    # and a little late step (under 5 x the median step time) is no alarm either
    assert diagnose(sc.state(), sc.t + 9).health == Health.RUNNING


def test_the_silent_run_of_the_story() -> None:
    """GPU at 98 %, data read, checkpoints appearing, not one metric."""
    sc = Scenario()
    sc.log("Training epoch 1/3 started")
    sc.idle(600, util=98.0, reads=4e7)
    sc.ckpt("save_started")
    sc.idle(10, util=98.0, reads=4e7)
    sc.ckpt("save_finished", bytes=5e9, duration_s=10.0)
    sc.idle(120, util=98.0, reads=4e7)
    d = diagnose(sc.state(), sc.t)
    assert d.health == Health.SILENT
    assert "No metric has ever been logged" in d.reason
    assert "GPU is busy (98%)" in d.reason and "no handler" in d.reason and "INFO" in d.reason


def test_metrics_that_stop_while_the_gpu_works_are_silent() -> None:
    sc = Scenario(step_s=1.0)
    sc.train(60)
    sc.idle(20, util=96.0, reads=2e7)
    assert diagnose(sc.state(), sc.t).health == Health.RUNNING  # not yet 30 s
    sc.idle(40, util=96.0, reads=2e7)
    d = diagnose(sc.state(), sc.t)
    assert d.health == Health.SILENT and "No metric for 61 s" in d.reason
    assert "data files are being read (19.1 MiB/s)" in d.reason


def test_a_dataloader_stall_is_stalled_with_the_likely_cause() -> None:
    sc = Scenario(step_s=1.0)
    for s in range(60):  # fetch time grows: the workers fall behind, then stop
        frac = min(0.95, s / 40)
        profile = {"step_ms": 1000.0, "fetch_ms": 1000 * frac, "fetch_frac": frac}
        sc.parts.append(
            sc.rank0.at(sc.t).make(
                "train", step=sc.step, epoch=0, lr=1e-3, train={"loss": 2.0}, profile=profile
            )
        )
        sc.step += 1
        sc.tick(util=90.0 * (1 - frac), reads=1e6 * (1 - frac))
    sc.idle(120, util=0.0, reads=0.0)
    d = diagnose(sc.state(), sc.t)
    assert d.health == Health.STALLED
    assert "GPUs idle (0%)" in d.reason and "no data read" in d.reason
    assert "waited on data" in d.reason and "dataloader" in d.reason


def test_a_hung_loop_without_data_starvation_is_stalled() -> None:
    sc = Scenario(step_s=1.0)
    sc.train(60)
    sc.idle(90, util=0.0, reads=0.0)
    d = diagnose(sc.state(), sc.t)
    assert d.health == Health.STALLED and "hung" in d.reason


def test_a_dead_process_by_probe_and_by_missing_heartbeat() -> None:
    sc = Scenario(step_s=1.0)
    sc.train(30)
    state = sc.state()
    state.set_manifest({"pid": 4242})
    state.liveness.set_process(False, sc.t + 5)
    d = diagnose(state, sc.t + 5)
    assert d.health == Health.DEAD and "pid 4242" in d.reason and "is gone" in d.reason
    # no probe: heartbeats stopped 2 minutes ago
    state.liveness.set_process(None, sc.t)
    d = diagnose(state, sc.t + 120)
    assert d.health == Health.DEAD and "stopped writing heartbeats" in d.reason


def test_a_live_probe_keeps_a_heartbeatless_run_alive() -> None:
    lines = Lines(t0=T0, dt=1.0)
    state = state_of(b"".join(lines.train(s, 1.0) for s in range(30)))
    state.liveness.set_process(True, T0 + 40)
    assert diagnose(state, T0 + 40).health == Health.RUNNING
    d = diagnose(state, T0 + 200)
    assert d.health == Health.STALLED  # alive, quiet, and nothing shows work


def test_nan_and_an_exploding_loss_are_diverged() -> None:
    lines = Lines(t0=T0)
    data = b"".join(lines.train(s, 2.0) for s in range(100))
    nan = state_of(data + lines.make("train", step=100, lr=1e-3, epoch=0, train={"loss": "NaN"}))
    d = diagnose(nan, lines.ts)
    assert d.health == Health.DIVERGED and "nan" in d.reason.lower()
    spike = state_of(data + b"".join(lines.train(s, 40.0) for s in range(100, 106)))
    d = diagnose(spike, lines.ts)
    assert d.health == Health.DIVERGED and "20.0×" in d.reason
    blip = state_of(
        data + lines.train(100, 40.0) + b"".join(lines.train(s, 2.0) for s in range(101, 105))
    )
    assert diagnose(blip, lines.ts).health == Health.RUNNING  # one bad step is no divergence


def test_lifecycle_ends() -> None:
    lines = Lines(t0=T0)
    base = b"".join(lines.train(s, 1.0) for s in range(10))
    finished = state_of(base + lines.event("finish", step=10))
    assert diagnose(finished, T0) == Diagnosis(Health.FINISHED, "Training finished after 10 steps.")
    # a helper that outlives it (a dataloader worker) is said while a probe finds it
    finished.liveness.set_process(False, T0, [Leftover(4242, "pt_data_worker", 2**30, None)])
    assert diagnose(finished, T0).reason == (
        "Training finished after 10 steps. Left behind, still alive: "
        "pid 4242 pt_data_worker (1.0 GiB RAM) (k ends them)."
    )
    finished.liveness.set_process(False, T0 + 1)  # gone at the next look
    assert diagnose(finished, T0).reason == "Training finished after 10 steps."
    stopped = diagnose(state_of(base + lines.event("interrupt", step=10)), T0)
    assert stopped.health == Health.STOPPED and "interrupted" in stopped.reason
    crash = diagnose(state_of(base + lines.event("crash", error="RuntimeError: CUDA OOM\n...")), T0)
    assert crash.health == Health.DEAD and "CUDA OOM" in crash.reason
    resumed = state_of(
        base + lines.event("interrupt") + lines.event("resume") + lines.train(10, 1.0)
    )
    assert diagnose(resumed, lines.ts).health == Health.RUNNING


def test_waiting_before_anything_and_before_the_first_step() -> None:
    assert diagnose(RunState(), T0).health == Health.WAITING
    lines = Lines(t0=T0)
    d = diagnose(state_of(lines.event("start")), T0 + 20)
    assert d.health == Health.WAITING and "since start" in d.reason


def test_the_sidecar_seeing_the_trainer_gone_is_dead() -> None:
    lines = Lines(t0=T0, dt=1.0)
    data = b"".join(lines.train(s, 1.0) for s in range(20))
    data += lines.make("heartbeat", written=20, dropped=0, trainer={"pid": 777, "alive": False})
    d = diagnose(state_of(data), lines.ts + 1)
    assert d.health == Health.DEAD and "pid 777" in d.reason and "is gone" in d.reason


def test_a_trainer_stuck_holding_the_gil_is_named() -> None:
    sc = Scenario(step_s=1.0)
    sc.train(60)
    for _ in range(90):  # the sidecar keeps beating; the trainer's figures age
        sc.parts.append(
            sc.sampler.at(sc.t).make(
                "heartbeat",
                written=60,
                trainer={"pid": 1, "alive": True, "state": "R"},
                stats_age_s=sc.t - (T0 + 60),
            )
        )
        sc.parts.append(sc.sampler.at(sc.t).gpu(0.0))
        sc.t += 1.0
    d = diagnose(sc.state(), sc.t)
    assert d.health == Health.STALLED and "holding the GIL" in d.reason


def test_a_file_of_garbage_says_so() -> None:
    d = diagnose(state_of(b"\x00\xffnot json\n{also not\n"), T0)
    assert d.health == Health.UNREADABLE and "2 malformed lines" in d.reason
    assert "not an eagle3-tui metrics file" in d.reason
