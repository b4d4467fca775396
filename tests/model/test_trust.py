"""Health you can trust (issue 13): no false alarm, no wrong label, one figure everywhere.

Each test is one case of the issue, on recorded streams with a frozen clock; each
failed on the code before the fix.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re

import pytest

from eagle3_tui.app.pipeline import Pipeline
from eagle3_tui.exits import BY_HEALTH as EXIT_BY_HEALTH
from eagle3_tui.model.health import diagnose
from eagle3_tui.model.reader import MAX_LINE
from eagle3_tui.model.run import Run
from eagle3_tui.model.snapshot import ViewParams, build_snapshot
from eagle3_tui.model.summary import format_text, summarize
from eagle3_tui.model.verdict import Health
from eagle3_tui.transport.base import Link, LinkChanged
from eagle3_tui.transport.replay import ReplayTransport
from tests.model.test_health import T0, Scenario, state_of
from tests.records import Lines

ALARMS = {Health.SILENT, Health.STALLED, Health.DEAD, Health.DIVERGED}


# ---- 1. a broken link is not a hung trainer ----------------------------------------------


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


async def _settled(pipeline: Pipeline) -> None:
    """Let the pump and ingest tasks move what was pushed into the model."""
    for _ in range(50):
        await asyncio.sleep(0.01)


async def test_a_link_outage_is_not_a_hung_trainer() -> None:
    """sshd gone for 45 s while the run trains on: no STALLED; link down since T, the last
    known health and step; once the link is back and what was written meanwhile is read,
    running again."""
    clock = Clock(T0)
    sc = Scenario(step_s=1.0)
    sc.train(60)
    replay = ReplayTransport([b"".join(sc.parts)])
    sent = len(b"".join(sc.parts))
    pipeline = Pipeline(clock)
    pump = asyncio.ensure_future(pipeline.pump(replay, lambda _e: None))
    ingest = asyncio.ensure_future(pipeline.ingest())
    try:
        await _settled(pipeline)
        clock.t = sc.t
        snap, _ = await pipeline.snapshot(clock(), ViewParams())
        assert snap.health == Health.RUNNING
        down_at = clock.t
        replay.push(LinkChanged(Link.RECONNECTING, "gpu-box: connection lost", retry_in=1.0))
        await _settled(pipeline)
        sc.parts.clear()
        sc.train(45)  # the run trains on; nothing reaches the client
        for wait in (10.0, 31.0, 45.0):
            clock.t = down_at + wait
            snap, _ = await pipeline.snapshot(clock(), ViewParams())
            d = snap.diagnosis
            assert d.health not in ALARMS, (wait, d)
            assert d.label == "LINK DOWN" and d.link_down_since == down_at
            assert "link to the host is down" in d.reason and "connection lost" in d.reason
            assert "Last known: running at step 60" in d.reason
        # back: the agent reopens the file (its size then) and sends what was written
        written = b"".join(sc.parts)
        replay.push(LinkChanged(Link.CONNECTED, "gpu-box", size=sent + len(written)))
        await _settled(pipeline)
        snap, _ = await pipeline.snapshot(clock(), ViewParams())
        assert snap.diagnosis.label == "LINK DOWN"  # not read yet: not judged on the clock
        replay.push(written)
        await _settled(pipeline)
        snap, _ = await pipeline.snapshot(clock(), ViewParams())
        assert snap.health == Health.RUNNING and snap.diagnosis.link_down_since is None
        assert snap.progress.step == 105
    finally:
        pump.cancel()
        ingest.cancel()


async def test_a_trainer_that_hung_during_the_outage_is_stalled_once_the_link_is_back() -> None:
    clock = Clock(T0)
    sc = Scenario(step_s=1.0)
    sc.train(60)
    data = b"".join(sc.parts)
    replay = ReplayTransport([data])
    pipeline = Pipeline(clock)
    tasks = [
        asyncio.ensure_future(pipeline.pump(replay, lambda _e: None)),
        asyncio.ensure_future(pipeline.ingest()),
    ]
    try:
        await _settled(pipeline)
        replay.push(LinkChanged(Link.RECONNECTING, "lost", retry_in=1.0))
        await _settled(pipeline)
        sc.parts.clear()
        sc.idle(60, util=0.0, reads=0.0)  # hung: only the samplers write
        clock.t = sc.t
        written = b"".join(sc.parts)
        replay.push(LinkChanged(Link.CONNECTED, "gpu-box", size=len(data) + len(written)))
        replay.push(written)
        await _settled(pipeline)
        snap, _ = await pipeline.snapshot(clock(), ViewParams())
        assert snap.health == Health.STALLED and snap.diagnosis.link_down_since is None
    finally:
        for t in tasks:
            t.cancel()


def test_the_quiet_clock_runs_on_the_hosts_clock() -> None:
    """The client's clock 2 minutes ahead of the host's: no false alarm, once the host
    has said its time (status ``now``, the stream's ``opened``)."""
    sc = Scenario(step_s=1.0)
    sc.train(60)
    state = sc.state()
    client_now = sc.t + 120.0
    state.liveness.set_host_clock(sc.t, client_now)
    assert diagnose(state, client_now).health == Health.RUNNING
    assert diagnose(state, client_now + 90).health in ALARMS  # a real stop still is one


# ---- 2. a resume's start-up is not silence ---------------------------------------------


def _resumed(startup_s: float = 12.0) -> Scenario:
    """A run that started (taking ``startup_s`` to its first step), trained, was
    interrupted, and was resumed: the new process is loading and reading data."""
    sc = Scenario(step_s=1.0)
    sc.parts.append(sc.rank0.at(sc.t).event("start", pid=1, global_step=0))
    sc.idle(startup_s, util=0.0, reads=2e6)
    sc.train(60)
    sc.parts.append(sc.rank0.at(sc.t).event("interrupt", step=60))
    sc.idle(5, util=0.0, reads=0.0)
    sc.parts.append(sc.rank0.at(sc.t).event("resume", pid=2, global_step=50))
    return sc


def test_a_resume_still_starting_is_not_silent() -> None:
    sc = _resumed()
    sc.idle(18, util=0.0, reads=5e6)  # the new process loads its checkpoint, reads data
    d = diagnose(sc.state(), sc.t)
    assert d.health == Health.WAITING, d
    assert "since the resume" in d.reason and "earlier starts took up to 12 s" in d.reason


def test_the_start_up_allowance_is_learned_from_the_runs_own_starts() -> None:
    sc = _resumed(startup_s=100.0)  # a slow starter: 100 s to its first step
    sc.idle(200, util=0.0, reads=5e6)
    assert diagnose(sc.state(), sc.t).health == Health.WAITING  # within 3 x 100 s
    sc.idle(110, util=0.0, reads=5e6)
    d = diagnose(sc.state(), sc.t)
    assert d.health == Health.SILENT and "although data files are being read" in d.reason


def test_an_attach_is_no_start_up_to_learn_from() -> None:
    """Telemetry attached to a training long running writes ``start`` then ``attach``;
    its next step 0.1 s later was learned as a start-up, and the resume's wait said "its
    earlier starts took up to 0.1 s" (the real start took a minute)."""
    lines = Lines(t0=T0, dt=0.1)
    data = lines.event("start", pid=4242) + lines.event("attach", pid=4242)
    data += b"".join(lines.train(s, 1.0) for s in range(185, 190))
    data += lines.event("interrupt", step=190) + lines.event("resume", pid=4343)
    state = state_of(data)
    assert state.startups == [], state.startups
    d = diagnose(state, lines.ts + 2)
    assert d.health == Health.WAITING and "earlier starts took" not in d.reason, d.reason


def test_the_quiet_clock_restarts_at_the_resumed_process_first_step() -> None:
    sc = _resumed()
    sc.idle(20, util=0.0, reads=5e6)
    sc.train(10)
    state = sc.state()
    assert diagnose(state, sc.t).health == Health.RUNNING
    assert state.startups == [pytest.approx(12.0), pytest.approx(20.0)]
    # the pace is the resumed process's, not one spanning the downtime
    sps = build_snapshot(state, sc.t, ViewParams()).progress.steps_per_s
    assert sps is not None and sps == pytest.approx(1.0, rel=0.05)


# ---- 3. an interrupt is never overwritten by finish -----------------------------------------


def test_finish_after_the_signal_stays_an_interrupt() -> None:
    lines = Lines(t0=T0)
    base = lines.event("start", pid=1, global_step=0)
    base += b"".join(lines.train(s, 1.0) for s in range(10))
    signal = lines.log(
        "Received SIGTERM — interrupting training to save checkpoint. "
        "Send again to force immediate exit.",
        level="WARNING",
    )
    # the README's one-liner on the old telemetry: finish() after run_training() returned
    d = diagnose(state_of(base + signal + lines.event("finish", step=10)), lines.ts)
    assert d.health == Health.STOPPED and "Interrupted after step 10" in d.reason
    both = base + lines.event("interrupt", step=10) + lines.event("finish", step=10)
    assert diagnose(state_of(both), lines.ts).health == Health.STOPPED
    # a later process that finishes is finished
    again = both + lines.event("resume", pid=2) + lines.train(10, 1.0) + lines.event("finish")
    assert diagnose(state_of(again), lines.ts).health == Health.FINISHED


def test_a_stop_at_a_step_boundary_is_not_called_a_signal() -> None:
    """A kill's stop at a step boundary (its ``stop`` record, then ``interrupt``): no
    signal reached the trainer, and the kill renames its save from ``interrupted/`` to a
    numbered checkpoint; the reason said "(a signal); speculators saved
    checkpoints/interrupted/", both untrue. A process after it that is signalled is
    said so again."""
    lines = Lines(t0=T0)
    data = lines.event("start", pid=1, global_step=0)
    data += b"".join(lines.train(s, 1.0) for s in range(22))
    data += lines.event("stop", request="r1", pid=1, epoch=0, local_step=22, global_step=22)
    data += lines.event("interrupt", step=22)
    d = diagnose(state_of(data), lines.ts)
    assert d.health == Health.STOPPED, d.reason
    assert "(stopped at a step boundary, as a kill asked)" in d.reason, d.reason
    assert "signal" not in d.reason and "interrupted/" not in d.reason, d.reason
    assert "Resume continues from the last numbered checkpoint." in d.reason, d.reason
    data += lines.event("resume", pid=2, global_step=22)
    data += b"".join(lines.train(s, 1.0) for s in range(22, 30))
    data += lines.event("interrupt", step=30)
    d = diagnose(state_of(data), lines.ts)
    assert "(a signal)" in d.reason and "step boundary" not in d.reason, d.reason
    # a signal's interrupted/ is no checkpoint speculators resumes from: none numbered
    assert "No numbered checkpoint is in its records" in d.reason, d.reason
    saved = Lines(writer="side", t0=lines.ts).ckpt("completed", "/c/0", epoch=0, complete=True)
    d = diagnose(state_of(data + saved), lines.ts)  # a numbered save in its records
    assert "Resume continues from the last numbered checkpoint." in d.reason, d.reason


def test_a_probe_of_the_trainer_before_a_resume_says_nothing_of_the_resumed_one() -> None:
    """``watch --hold 2`` (or the monitor) between a resume's first record and its next
    probe: the last probe found the stopped trainer (pid 1) gone, the last heartbeats
    were its sidecar's, and the records now hold the resumed trainer's ``resume`` (pid
    2). It was called DEAD ("The trainer (pid 1) is gone without a finish event"), and
    the alert named pid 1. The resumed trainer is starting; a probe of it decides."""
    lines = Lines(t0=T0)
    data = lines.event("start", pid=1, global_step=0)
    data += b"".join(lines.train(s, 1.0) for s in range(22))
    data += lines.make(
        "heartbeat", written=1, dropped=0, bytes=0, trainer={"pid": 1, "alive": False}
    )
    data += lines.event("stop", request="r1", pid=1, epoch=0, local_step=22, global_step=22)
    data += lines.event("interrupt", step=22)
    state = state_of(data)
    state.set_manifest({"pid": 1})
    state.liveness.set_process(False, lines.ts)
    assert diagnose(state, lines.ts).health == Health.STOPPED
    run = Run()
    resumed = data + lines.event("resume", pid=2, global_step=22)
    run.feed(0, resumed)
    run.state.set_manifest({"pid": 1})  # the probe before the resume
    run.state.liveness.set_process(False, lines.ts)
    d = diagnose(run.state, lines.ts + 3)
    assert d.health != Health.DEAD and "pid 1" not in d.reason, d.reason
    # the next probe, of the resumed trainer, found it gone: dead, named as itself
    run.state.set_manifest({"pid": 2})
    run.state.liveness.set_process(False, lines.ts + 5)
    d = diagnose(run.state, lines.ts + 5)
    assert d.health == Health.DEAD and "pid 2" in d.reason, d.reason


# ---- 4. diverged stays visible after the end -------------------------------------------------


def test_a_run_that_diverged_and_ran_on_ends_diverged() -> None:
    lines = Lines(t0=T0)
    data = b"".join(lines.train(s, 2.0) for s in range(100))
    for s in range(100, 140):
        data += lines.make("train", step=s, global_step=s, epoch=0, lr=1e-3, train={"loss": "NaN"})
    data += lines.event("finish", step=140)
    state = state_of(data)
    d = diagnose(state, lines.ts)
    assert d.health == Health.DIVERGED
    assert "finished after 140 steps" in d.reason and "since step 101" in d.reason
    assert EXIT_BY_HEALTH[summarize(state, lines.ts)["health"]] == 6


# ---- 7. a line that is not a valid record never moves the state --------------------------------

BAD_TRAIN = b'{"kind": "train", "v": 1, "seq": "NaN", "train": {"loss": NaN}}\n'


@pytest.mark.parametrize("steps", [5, 200])  # record by record, and the column path
def test_an_invalid_train_line_is_malformed_and_moves_nothing(steps: int) -> None:
    lines = Lines(t0=T0)
    good = b"".join(lines.train(s, 1.5) for s in range(steps))
    after = lines.train(steps, 1.4)
    state = state_of(good + BAD_TRAIN + after)
    assert state.global_step == steps and state.latest("train/loss") == pytest.approx(1.4)
    assert state.latest("train/full_acc_0") is not None
    assert state.malformed_count == 1 and "seq" in state.malformed[-1].reason
    only_bad = state_of(good + BAD_TRAIN)
    assert only_bad.global_step == steps - 1 and only_bad.latest("train/loss") == pytest.approx(1.5)
    assert only_bad.latest("train/full_acc_0") is not None


@pytest.mark.parametrize("steps", [5, 200])  # record by record, and the column path
@pytest.mark.parametrize("field", ['"epoch": 1e30', '"step": 1180591620717411303424'])
def test_a_count_past_any_writers_is_malformed_among_good_steps(steps: int, field: str) -> None:
    """``"epoch": 10**30`` shown as "epoch 1000000000000000019884624838657/2"; ``"step":
    2**70`` crashed every command (int64 overflow) and made a finished run dead."""
    lines, side = Lines(t0=T0), Lines(writer="sidecar", t0=T0)
    good = b"".join(lines.train(s, 1.5) + side.heartbeat() for s in range(steps))
    bad = lines.train(steps, 9.0)
    if "epoch" in field:
        bad = bad.replace(b'"epoch": 0', field.encode())
    else:
        bad = re.sub(rb'"step": \d+', field.encode(), bad, count=1)
    assert field.encode() in bad
    after = b"".join(lines.train(s, 1.4) for s in range(steps + 1, steps + 40))
    state = state_of(good + bad + after + lines.event("finish", step=steps + 40))
    # the line malformed, or (a typed field of the wrong type) its epoch left out
    assert state.malformed_count == 1 or ("epoch" in field and not state.malformed_count)
    assert state.global_step == steps + 39 and state.epoch == 0
    assert summarize(state, lines.ts)["epoch"] == 1
    assert diagnose(state, lines.ts).health == Health.FINISHED


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b'{"kind":"train","v":1,"seq":7,"w":"w1","ts":5.0,"train":{"loss":1.0}}', "step"),
        (b'{"kind":"train","v":1,"w":"w1","ts":5.0,"step":3,"train":{"loss":1.0}}', "seq"),
        (b'{"kind":"train","v":1,"seq":7,"ts":5.0,"step":3,"train":{"loss":1.0}}', "'w'"),
        (b'{"kind":"train","v":1,"seq":7,"w":"w1","ts":"x","step":3,"train":{"loss":1.0}}', "ts"),
        (b'{"kind":"train","v":1,"seq":7,"w":"w1","ts":5.0,"step":2.5,"train":{"loss":1}}', "step"),
        (b'{"kind":"lifecycle","v":1,"seq":7,"w":"w1","ts":5.0}', "event"),
        (b'{"kind":"log","v":1,"seq":7,"w":"w1","ts":5.0}', "msg"),
        (b'{"kind":"val","v":1,"seq":7,"w":"w1","ts":5.0,"epoch":0}', "val"),
        (b'{"kind":"bogus","v":1,"seq":7,"w":"w1","ts":5.0}', "unknown kind"),
        (b'{"hello": "world", "n": 3}', "without 'kind'"),
        # a step past any count (an OverflowError in the step table), a time past 2100
        (
            b'{"kind":"train","v":1,"seq":7,"w":"w1","ts":5.0,"step":1180591620717411303424,'
            b'"train":{"loss":1.0}}',
            "'step'",
        ),
        (
            b'{"kind":"train","v":1,"seq":7,"w":"w1","ts":5.0,"step":1e20,"train":{"loss":1}}',
            "'step'",
        ),
        (
            b'{"kind":"train","v":1,"seq":7,"w":"w1","ts":5.0,"step":3,"epoch":-1,'
            b'"train":{"loss":1.0}}',
            "'epoch'",
        ),
        (
            b'{"kind":"train","v":1,"seq":7,"w":"w1","ts":4e10,"step":3,"train":{"loss":1.0}}',
            "'ts'",
        ),
        # a metric that is no number: not read as 1.0 or NaN
        (
            b'{"kind":"train","v":1,"seq":7,"w":"w1","ts":5.0,"step":3,"train":{"loss":true}}',
            "not a number",
        ),
        (
            b'{"kind":"train","v":1,"seq":7,"w":"w1","ts":5.0,"step":3,"train":{"loss":{"a":1}}}',
            "not a number",
        ),
        (
            b'{"kind":"val","v":1,"seq":7,"w":"w1","ts":5.0,"epoch":0,"val":{"loss_epoch":"x"}}',
            "not a number",
        ),
    ],
)
def test_each_kind_needs_its_fields(line: bytes, why: str) -> None:
    lines = Lines(t0=T0)
    good = b"".join(lines.train(s, 1.5) for s in range(3))
    state = state_of(good + line + b"\n")
    assert state.malformed_count == 1, state.malformed
    assert why in state.malformed[-1].reason
    assert state.global_step == 2 and state.records == 3
    assert not state.events and not state.logs and not state.val_by_epoch


@pytest.mark.parametrize("steps", [5, 200])  # record by record, and the column path
@pytest.mark.parametrize("name", ['loss"x', "loss\\x", "loss\x1b]52;c;ZXZpbA==\x07"])
def test_a_metric_name_msgspec_cannot_rename_is_read(steps: int, name: str) -> None:
    """A metric named with a quote, a backslash or a control character: every command
    crashed (msgspec refuses such a field name) and the monitor waited for a first
    record of a finished run."""
    lines = Lines(t0=T0)
    data = b"".join(
        lines.make("train", step=s, global_step=s, epoch=0, lr=1e-3, train={"loss": 2.0, name: 1.0})
        for s in range(steps)
    )
    state = state_of(data + lines.event("finish", step=steps))
    assert state.malformed_count == 0 and state.global_step == steps - 1
    assert state.latest("train/" + name) == pytest.approx(1.0)
    assert diagnose(state, lines.ts).health == Health.FINISHED


def test_a_line_dated_1970_is_no_start_of_the_run() -> None:
    """A log line with ``ts`` 1.0 after a run of a minute: "ran 20794d19h"."""
    lines = Lines(t0=1_800_000_000.0)
    data = b"".join(lines.train(s, 1.5) for s in range(60)) + lines.event("finish", step=60)
    other = Lines(writer="w2", t0=1.0)  # another writer's line (a handler's), dated 1970
    early = other.make("log", level="INFO", logger="x", msg="hello")
    for order in (data + early, early + data):
        summary = summarize(state_of(order), lines.ts)
        assert summary["elapsed_s"] == pytest.approx(60, abs=3), summary["elapsed_s"]


@pytest.mark.parametrize("steps", [3, 300])
def test_a_newer_schema_version_is_reported_never_misread(steps: int) -> None:
    lines = Lines(t0=T0)
    v1 = b"".join(lines.train(s, 1.5) for s in range(3))
    v2 = b"".join(lines.train(s, 9.0) for s in range(3, 3 + steps)).replace(b'"v": 1', b'"v": 2')
    state = state_of(v1 + v2)
    assert state.global_step == 2 and state.latest("train/loss") == pytest.approx(1.5)
    assert state.malformed_count == steps
    assert "schema version 2" in state.malformed[-1].reason
    assert "upgrade eagle3-tui" in state.malformed[-1].reason


# ---- 8. a file of a user's own JSON handler ------------------------------------------------


def _handler_line(t: float, msg: object, logger: str = "speculators.metrics") -> bytes:
    return (json.dumps({"t": t, "logger": logger, "level": "INFO", "msg": msg}) + "\n").encode()


def test_a_custom_handlers_file_is_read_as_speculators_dicts() -> None:
    out = [_handler_line(T0, "Training epoch 1/2 started", logger="speculators")]
    for s in range(80):
        train = {"loss": 2.0 - s / 100, "full_acc_0": 0.5, "cond_acc_0": 0.5, "loss_0": 2.0}
        profile = {"step_ms": 500.0, "tokens_per_s": 4000.0, "fetch_frac": 0.01}
        msg = {"train": train, "profile": profile, "epoch": 0, "lr": 1e-3, "global_step": s}
        out.append(_handler_line(T0 + 0.5 * s, msg))
    out.append(_handler_line(T0 + 40, {"val": {"loss_epoch": 1.7}, "epoch": 0}))
    state = state_of(b"".join(out))
    assert state.global_step == 79 and state.malformed_count == 0
    assert state.latest("train/loss") == pytest.approx(2.0 - 0.79)
    assert state.val_by_epoch[0]["loss_epoch"] == pytest.approx(1.7)
    assert state.epochs_total == 2 and state.last_train_ts == pytest.approx(T0 + 39.5)
    summary = summarize(state, T0 + 41)
    assert summary["health"] == "running" and summary["format"]["handler_lines"] == 82
    assert "not eagle3-tui's schema" in format_text(summary)


def test_json_objects_of_another_shape_say_what_they_look_like() -> None:
    data = b"".join(
        (json.dumps({"time": T0 + i, "event": "tick", "value": i}) + "\n").encode()
        for i in range(50)
    )
    state = state_of(data)
    assert state.records == 0 and state.malformed_count == 50
    d = diagnose(state, T0 + 60)
    assert d.health == Health.UNREADABLE
    assert "without 'kind' (keys: time, event, value)" in d.reason


# ---- 9. a file of garbage -----------------------------------------------------------------------


def test_a_file_of_random_bytes_is_unreadable() -> None:
    run = Run()
    run.feed(0, os.urandom(5 * 1024 * 1024))
    state = run.state
    assert state.records == 0 and state.malformed_count > 1000
    assert diagnose(state, T0).health == Health.UNREADABLE
    assert EXIT_BY_HEALTH["unreadable"] not in (0, 2)


def test_a_long_line_is_one_malformed_line() -> None:
    lines = Lines(t0=T0)
    run = Run()
    data = lines.train(0, 1.0) + b"x" * (MAX_LINE * 3 + 12345) + b"\n" + lines.train(1, 0.9)
    run.feed(0, data)
    state = run.state
    assert state.malformed_count == 1 and "longer than" in state.malformed[-1].reason
    assert state.global_step == 1 and state.records == 2


def test_a_long_line_split_over_many_reads_is_one_malformed_line() -> None:
    run = Run()
    offset = 0
    for chunk in [b"{" + b"y" * (1 << 20)] * 50 + [b"\n"]:
        run.feed(offset, chunk)
        offset += len(chunk)
    assert run.state.malformed_count == 1
    assert diagnose(run.state, T0).health == Health.UNREADABLE


# ---- 10. one definition per figure -------------------------------------------------------------


def _bursty() -> Scenario:
    """Data-bound steps: 4 quick steps (0.05 s apart), then a 1.85 s wait for data."""
    sc = Scenario()
    t = sc.t
    for s in range(240):
        sc.parts.append(sc.rank0.at(t).train(s, 1.0))
        t += 0.05 if s % 4 != 3 else 1.85
    sc.t = t
    return sc


def test_steps_per_second_is_one_figure_in_the_sentence_the_panel_and_json() -> None:
    sc = _bursty()
    state = sc.state()
    snap = build_snapshot(state, sc.t - 1.0, ViewParams())
    sps = snap.progress.steps_per_s
    assert sps is not None and sps == pytest.approx(2.0, rel=0.05)  # 4 steps per 2 s
    m = re.search(r"([\d.]+) steps/s", snap.diagnosis.reason)
    assert m is not None and float(m.group(1)) == pytest.approx(sps, abs=0.005)
    summary = summarize(state, sc.t - 1.0)
    assert summary["steps_per_s"] == pytest.approx(sps)
    assert f"{sps:.2f} steps/s" in format_text(summary)


def test_a_step_usually_takes_the_mean_step_time() -> None:
    sc = _bursty()
    sc.idle(120, util=0.0, reads=0.0)
    d = diagnose(sc.state(), sc.t)
    assert d.health == Health.STALLED and "a step usually takes 0.5 s" in d.reason


def test_files_per_second_counts_only_files_read() -> None:
    sc = Scenario(step_s=1.0)
    sc.train(30)
    for _ in range(10):  # hung: the worker holds its file open, reads nothing (as the
        # sampler writes it: files_read counts the files the worker has open or mapped)
        workers = [{"pid": 200, "role": "worker", "read_bytes": 0, "files": ["hs_7.safetensors"]}]
        sc.parts.append(
            sc.sampler.at(sc.t).make("io", interval_s=1.0, workers=workers, bytes=0, files_read=1)
        )
        sc.t += 1.0
    snap = build_snapshot(sc.state(), sc.t, ViewParams())
    assert snap.io is not None and snap.io.bytes_per_s == 0.0 and snap.io.files_per_s == 0.0


def test_steps_and_epochs_are_numbered_alike_everywhere() -> None:
    lines = Lines(t0=T0)
    data = lines.event("start", pid=1, global_step=0) + lines.log("Training epoch 1/6 started")
    data += b"".join(lines.train(s, 1.0, epoch=s // 24) for s in range(76))
    data += lines.ckpt("save_finished", "/c/2", epoch=2, bytes=100, complete=True)
    data += lines.event("interrupt", step=76)
    state = state_of(data)
    state.set_manifest({"pid": 1, "total_steps": 144, "epochs": 6})
    snap = build_snapshot(state, lines.ts, ViewParams())
    summary = summarize(state, lines.ts)
    assert snap.progress.step == 76 and summary["step"] == 76  # step 76/144: 76 steps done
    assert "Interrupted after step 76" in snap.diagnosis.reason
    assert snap.progress.epoch == 4 and summary["epoch"] == 4  # epoch 4/6 (speculators: 3)
    assert "step     76/144   epoch 4/6" in format_text(summary)
    assert summary["global_step"] == 75  # speculators' own 0-based counter
    assert summary["checkpoint"]["epoch"] == 3  # checkpoints/2: the third epoch's (was 2)


def test_the_pace_after_a_resume_is_the_resumed_process() -> None:
    sc = _resumed()
    sc.idle(20, util=0.0, reads=5e6)
    t = sc.t
    for s in range(50, 70):
        sc.parts.append(sc.rank0.at(t).train(s, 1.0))
        t += 0.5
    sc.t = t
    state = sc.state()
    state.set_manifest({"pid": 2, "total_steps": 1000})
    snap = build_snapshot(state, sc.t, ViewParams())
    p = snap.progress
    assert p.steps_per_s == pytest.approx(2.0, rel=0.05)
    assert p.eta_run_s == pytest.approx((1000 - 70) / 2.0, rel=0.05)
    m = re.search(r"([\d.]+) steps/s", snap.diagnosis.reason)
    assert m is not None and float(m.group(1)) == pytest.approx(p.steps_per_s, abs=0.005)
    assert not math.isnan(p.eta_run_s or math.nan)


@pytest.mark.parametrize("during", ["validation", "steps"])
def test_a_trainer_held_stopped_is_stalled_and_said_so(during: str) -> None:
    """``kill -STOP`` on the trainer (its sidecar goes on, finding it in state T): during
    a validation it stayed RUNNING ("Validating ... for 3 min; metrics resume after it")
    for as long as it was held; mid-epoch it was STALLED as "stuck in a C call, a
    collective, or holding the GIL". Held for 30 s or more: STALLED, saying it is held
    and how it continues; once continued, as before."""
    rank0 = Lines(writer="rank0", t0=T0, dt=0.0)
    side = Lines(writer="side", t0=T0, dt=0.0)
    data = rank0.event("start", pid=7, global_step=0)
    t = T0
    for s in range(20):
        t += 1.0
        data += rank0.at(t).train(s, 1.0)
        data += side.at(t).make(
            "heartbeat",
            written=1,
            dropped=0,
            bytes=0,
            trainer={"pid": 7, "alive": True, "state": "R", "cpu_s": t - T0},
        )
    if during == "validation":
        data += rank0.at(t).log("Validation epoch 1/30 started")
    held_from = t + 1.0

    def beat(at: float, state: str) -> bytes:
        return side.at(at).make(
            "heartbeat",
            written=1,
            dropped=0,
            bytes=0,
            trainer={"pid": 7, "alive": True, "state": state, "cpu_s": held_from - T0},
        )

    held = data + b"".join(beat(held_from + k, "T") for k in range(20))
    d = diagnose(state_of(held), held_from + 20)
    assert "held stopped" not in d.reason, d.reason  # 20 s: not yet
    held += b"".join(beat(held_from + k, "T") for k in range(20, 46))
    d = diagnose(state_of(held), held_from + 46)
    assert d.health == Health.STALLED, d.reason
    assert "(pid 7) has been held stopped for 46 s" in d.reason, d.reason
    assert "kill -CONT 7" in d.reason and "GIL" not in d.reason, d.reason
    going = held + beat(held_from + 46, "R")
    d = diagnose(state_of(going), held_from + 46.5)
    assert "held stopped" not in d.reason, d.reason


def test_a_sidecar_continued_after_a_job_wide_stop_says_held_not_silent() -> None:
    """Trainer and sidecar stopped together for a minute, then the sidecar alone
    continued: its first samples count reads made before the stop, and it finds the
    trainer held only from then. It read SILENT, "data files are being read: the
    speculators.metrics logger may have no handler", of a trainer that logged steps
    and was held stopped; held now, and quiet for 30 s or more, it is STALLED so."""
    rank0 = Lines(writer="rank0", t0=T0, dt=0.0)
    side = Lines(writer="side", t0=T0, dt=0.0)
    data = rank0.event("start", pid=7, global_step=0)
    t = T0
    for s in range(20):
        t += 1.0
        data += rank0.at(t).train(s, 1.0)
        data += side.at(t).io(4096.0)
    back = t + 70.0  # the sidecar, continued
    beat = {"pid": 7, "alive": True, "state": "T", "cpu_s": 20.0}
    data += side.at(back).io(3300.0)
    data += side.at(back).make("heartbeat", written=1, dropped=0, bytes=0, trainer=beat)
    d = diagnose(state_of(data), back + 2)
    assert d.health is Health.STALLED, d.reason
    assert "(pid 7) is held stopped (its sidecar finds it so since" in d.reason, d.reason
    assert "logged nothing for 72 s" in d.reason and "handler" not in d.reason, d.reason


def test_a_trainer_held_with_its_sidecar_is_stalled_by_the_probes_word() -> None:
    """``kill -STOP`` of the trainer and its sidecar (a job-wide stop): no record comes,
    and the probe finds the trainer alive. It read "Validating (epoch 1/30) for 65 s;
    metrics resume after it" for as long as both were held. The probe says the
    trainer's state (T): past 30 s without any record, STALLED, held stopped."""
    from eagle3_tui.api.reading import apply_status
    from eagle3_tui.transport.replies import Status, decode

    rank0 = Lines(writer="rank0", t0=T0, dt=0.0)
    data = rank0.event("start", pid=7, global_step=0)
    t = T0
    for s in range(20):
        t += 1.0
        data += rank0.at(t).train(s, 1.0)
    t += 0.5
    data += rank0.at(t).log("Validation epoch 1/30 started")
    state = state_of(data)

    def probed(process_state: str) -> None:
        reply = {"op": "status", "alive": True, "manifest": {"pid": 7}, "state": process_state}
        apply_status(state, decode(Status, reply), t + 40)

    probed("T")
    d = diagnose(state, t + 20)
    assert d.health is Health.RUNNING, d.reason  # 20 s without a record: not yet
    d = diagnose(state, t + 40)
    assert d.health is Health.STALLED, d.reason
    said = "(pid 7) is held stopped, as the host found it, and no record of any kind came for 40 s"
    assert said in d.reason, d.reason
    assert "kill -CONT 7" in d.reason, d.reason
    probed("S")  # continued: a validation, as before
    assert diagnose(state, t + 40).health is Health.RUNNING


def _validating(
    seconds: int,
    *,
    cpu_per_s: float = 0.01,
    reads: float | None = 0.0,
    util: float | None = None,
    earlier: float | None = None,
) -> tuple[bytes, float]:
    """A run that trained 20 steps (and, ``earlier``, validated once for that long and
    trained 20 more), then began a validation that went on ``seconds``: each second its
    sidecar's heartbeat (the trainer's CPU time growing ``cpu_per_s``), an io sample
    (``reads`` bytes; None: no io sampler) and, ``util``, a GPU sample. Returns the lines
    and the last second's time."""
    rank0 = Lines(writer="rank0", t0=T0, dt=0.0)
    side = Lines(writer="side", t0=T0, dt=0.0)
    data = rank0.event("start", pid=7, global_step=0)
    t, cpu = T0, 0.0

    def second(at: float, cpu: float) -> bytes:
        trainer = {"pid": 7, "alive": True, "state": "S", "cpu_s": round(cpu, 2)}
        out = side.at(at).make("heartbeat", written=1, dropped=0, bytes=0, trainer=trainer)
        if reads is not None:
            out += side.at(at).io(reads)
        if util is not None:
            out += side.at(at).gpu(util)
        return out

    def steps(first: int) -> bytes:
        nonlocal t, cpu
        out = b""
        for s in range(first, first + 20):
            t += 1.0
            cpu += 1.0
            out += rank0.at(t).train(s, 1.0) + second(t, cpu)
        return out

    data += steps(0)
    if earlier is not None:
        data += rank0.at(t + 0.5).log("Validation epoch 1/30 started")
        t += earlier
        data += rank0.at(t).log("Validation epoch 1/30 completed")
        data += steps(20)
    data += rank0.at(t + 0.5).log("Validation epoch 2/30 started")
    t += 0.5
    for _ in range(seconds):
        t += 1.0
        cpu += cpu_per_s
        data += second(t, cpu)
    return data, t


def test_a_validation_that_hangs_is_stalled_and_says_what_stood_still() -> None:
    """A validation that hangs (a deadlock: the trainer's CPU flat, nothing read, the
    GPUs idle) stayed RUNNING "Validating ... metrics resume after it" for as long as it
    hung. After 5 min, and 2 min of nothing moving, it is STALLED, saying each thing
    that stood still; a slow one (computing, reading, its GPU busy) is never so."""
    data, t = _validating(290, util=0.0)
    d = diagnose(state_of(data), t)
    assert d.health == Health.RUNNING and d.reason.startswith("Validating"), d.reason
    data, t = _validating(310, util=0.0)
    d = diagnose(state_of(data), t)
    assert d.health == Health.STALLED, d.reason
    assert d.reason.startswith("Validating (epoch 2/30) for 5 min"), d.reason
    assert "standing still for the last 2 min" in d.reason, d.reason
    m = re.search(r"the trainer \(pid 7\) used only ([\d.]+) s of CPU", d.reason)
    assert m is not None and float(m.group(1)) == pytest.approx(1.2, abs=0.05), d.reason
    assert "GPUs idle (0%)" in d.reason and "no data read" in d.reason, d.reason
    # a slow validation, each way it shows it works: never stalled
    for busy in (
        {"cpu_per_s": 0.9, "util": 0.0},  # it computes (on the CPU)
        {"reads": 4e6, "util": 0.0},  # it reads its data
        {"util": 95.0},  # its GPU works (or a collective spins it)
        {"reads": None},  # no io sampler: whether it reads is not known
    ):
        data, t = _validating(400, **busy)
        d = diagnose(state_of(data), t)
        assert d.health == Health.RUNNING, (busy, d.reason)
    # without GPU readings (a CPU run) the clause is left out, not made up
    data, t = _validating(310)
    d = diagnose(state_of(data), t)
    assert d.health == Health.STALLED and "GPU" not in d.reason, d.reason


def test_a_validation_is_hung_only_well_past_the_longest_before_it() -> None:
    """The run's earlier validation took 200 s: this one is not hung before 3x that,
    and then says what the longest before it took; stale heartbeats say nothing."""
    data, t = _validating(500, earlier=200.0)
    d = diagnose(state_of(data), t)
    assert d.health == Health.RUNNING, d.reason
    data, t = _validating(610, earlier=200.0)
    d = diagnose(state_of(data), t)
    assert d.health == Health.STALLED, d.reason
    assert "(the longest before it took 3 min 20 s)" in d.reason, d.reason
    # its sidecar's heartbeats stopped 40 s ago: nothing reached us of the last 40 s
    d = diagnose(state_of(data), t + 40)
    assert d.health != Health.STALLED or "Validating" not in d.reason, d.reason


def test_a_stops_save_is_named_as_the_kill_renamed_it() -> None:
    """A kill's stop at a step boundary: speculators saves ``interrupted/`` and the kill
    renames it to the numbered checkpoint it resumes from. ``summary`` and the progress
    panel named ``checkpoints/interrupted`` (gone since); the manifest's ``stop_saves``
    (which the kill writes) name it now. A note of a later stop, of another directory,
    or not a numbered one renames nothing."""
    rank0 = Lines(writer="rank0", t0=T0, dt=1.0)
    root = "/runs/r/checkpoints"
    data = rank0.event("start", pid=7, global_step=0)
    data += b"".join(rank0.train(s, 1.0) for s in range(10))
    data += rank0.ckpt("save_finished", f"{root}/interrupted", bytes=1e6, duration_s=1.0, epoch=0)
    saved_at = rank0.ts
    data += rank0.event("interrupt", step=10)

    def shown(notes: object) -> str | None:
        state = state_of(data)
        state.set_manifest({"pid": 7, "stop_saves": notes})
        path = summarize(state, saved_at + 60)["checkpoint"]["path"]
        assert isinstance(path, str)
        return path

    assert shown(None) == f"{root}/interrupted"
    note = {"from": f"{root}/interrupted", "path": f"{root}/0", "at": saved_at + 5}
    assert shown([note]) == f"{root}/0"
    for bad in (
        {**note, "at": saved_at - 100},  # an earlier stop's
        {**note, "path": "/elsewhere/0"},  # not beside it
        {**note, "path": f"{root}/best"},  # no numbered checkpoint
        {**note, "at": "soon"},
    ):
        assert shown([bad]) == f"{root}/interrupted", bad
    assert shown("garbage") == f"{root}/interrupted"


def test_a_quiet_trainer_found_stopped_is_not_said_to_hold_the_gil() -> None:
    """Its steps stopped, then it was SIGSTOPped: until it has been held 30 s (the held
    verdict), the stalled reason said "stuck in a C call, a collective, or holding the
    GIL" while its sidecar's heartbeats said it is stopped. It says that now."""
    rank0 = Lines(writer="rank0", t0=T0, dt=0.0)
    side = Lines(writer="side", t0=T0, dt=0.0)
    data = rank0.event("start", pid=7, global_step=0)
    t = T0
    for s in range(20):
        t += 1.0
        data += rank0.at(t).train(s, 1.0)

    def beat(at: float, state: str, age: float) -> bytes:
        trainer = {"pid": 7, "alive": True, "state": state, "cpu_s": 20.0}
        return side.at(at).make(
            "heartbeat", written=1, dropped=0, bytes=0, stats_age_s=age, trainer=trainer
        )

    last = t
    data += b"".join(beat(last + k, "S", float(k)) for k in range(1, 26))
    data += b"".join(beat(last + k, "T", float(k)) for k in range(26, 41))
    d = diagnose(state_of(data), last + 40.5)
    assert d.health == Health.STALLED, d.reason
    assert "GIL" not in d.reason and "(pid 7) is held stopped" in d.reason, d.reason


def test_a_pause_among_the_last_steps_is_not_how_long_a_step_usually_takes() -> None:
    """Steps of 0.25 s, one of them held for 30 s (a SIGSTOP) in the last minute, then the
    loop hung: "a step usually takes 0.5 s" (the last minute's mean); 0.25 s now."""
    sc = Scenario()
    t = sc.t
    for s in range(200):
        sc.parts.append(sc.rank0.at(t).train(s, 1.0))
        t += 30.0 if s == 120 else 0.25  # the pause 20 s before the last step
    sc.t = t
    sc.idle(120, util=0.0, reads=0.0)
    d = diagnose(sc.state(), sc.t)
    assert d.health == Health.STALLED and "a step usually takes 0.2" in d.reason, d.reason


def test_a_resumed_runs_elapsed_time_is_the_whole_runs() -> None:
    """Killed and resumed: ``ran``/``elapsed_s`` counted from the last process's start
    (its manifest's ``started_at``, rewritten at each resume): 4m43s of a 12-minute run.
    From the run's first start now (``first_started_at``)."""
    lines = Lines(t0=T0, dt=1.0)
    data = lines.event("start", pid=1, global_step=0)
    data += b"".join(lines.train(s, 1.0) for s in range(60))
    data += lines.event("interrupt", step=60)
    lines.at(T0 + 400)
    data += lines.event("resume", pid=2, global_step=60)
    data += b"".join(lines.train(s, 1.0) for s in range(60, 120))
    data += lines.event("finish")
    state = state_of(data)
    state.set_manifest({"pid": 2, "started_at": T0 + 400, "first_started_at": T0})
    out = summarize(state, lines.ts + 100)
    assert out["elapsed_s"] == pytest.approx(lines.ts - T0, abs=2), out["elapsed_s"]


def test_redone_steps_in_json_count_from_1_as_the_anomalies_say_them() -> None:
    """``redone_steps`` was 0-based (``{'first': 192, 'last': 203}``) beside the anomalies'
    1-based "steps 193 to 204 done again"."""
    lines = Lines(t0=T0, dt=1.0)
    data = lines.event("start", pid=1, global_step=0)
    data += b"".join(lines.train(s, 1.0) for s in range(30))
    data += lines.event("resume", pid=2, global_step=20)
    data += b"".join(lines.train(s, 1.0) for s in range(20, 40))
    out = summarize(state_of(data), lines.ts)
    assert out["redone_steps"] == [{"first": 21, "last": 30}], out["redone_steps"]
    [resume] = out["anomalies"]["resumes"]
    assert "steps 21 to 30 done again" in resume["said"], resume
