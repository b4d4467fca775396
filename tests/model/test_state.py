"""RunState: series, resume segments, sequence tracking, samplers — and that the
catch-up column path and the one-record-at-a-time path agree."""

from __future__ import annotations

import json
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from eagle3_tui.model.run import Run
from eagle3_tui.model.state import RunState
from tests.records import Lines


def run_of(*chunks: bytes) -> Run:
    run = Run()
    offset = 0
    for chunk in chunks:
        run.feed(offset, chunk)
        offset += len(chunk)
    return run


def column(state: RunState, key: str) -> list[float]:
    values = state.table.floats(key)
    assert values is not None, f"no column {key!r}"
    return [float(v) for v in values]


def steps(state: RunState) -> list[int]:
    return list(state.table.steps)


def test_a_big_catch_up_fills_every_column() -> None:
    lines = Lines()
    data = b"".join(lines.train(s, 5.0 - s / 100, epoch=s // 50) for s in range(200))
    state = run_of(data).state
    assert steps(state) == list(range(200))
    assert state.global_step == 199 and state.epoch == 3
    assert state.ttt_steps == 3
    assert column(state, "train/loss")[10] == np.float32(4.9)
    assert state.latest("train/loss") == 5.0 - 199 / 100  # latest kept at full precision
    assert state.latest("profile/step_ms") == 100.0
    assert state.latest("lr") == 0.001
    assert column(state, "epoch")[-1] == 3.0
    assert state.records == 200 and state.lost_records == 0


def test_a_resumed_run_replaces_the_redone_steps_and_records_the_range() -> None:
    first = Lines(writer="run1")
    second = Lines(writer="run2")
    data = b"".join(first.train(s, 3.0, epoch=s // 50) for s in range(100))
    data += second.event("resume", step=50)
    data += b"".join(second.train(s, 1.0, epoch=s // 50) for s in range(50, 120))
    state = run_of(data).state
    assert steps(state) == list(range(120))
    loss = column(state, "train/loss")
    assert loss[:50] == [3.0] * 50 and loss[50:] == [1.0] * 70
    assert [(r.first, r.last) for r in state.redos] == [(50, 99)]
    assert state.lost_records == 0 and state.duplicate_records == 0


def test_sequence_gaps_count_lost_records_and_repeats_are_dropped() -> None:
    lines = Lines()
    recs = [lines.train(s, 1.0 + s) for s in range(30)]
    data = b"".join(recs[:10] + recs[13:] + recs[20:25])  # 3 lost, then 5 repeated
    state = run_of(data).state
    assert state.lost_records == 3
    assert state.duplicate_records == 5
    assert state.records == 27
    assert steps(state) == list(range(10)) + list(range(13, 30))


def test_a_repeated_sample_is_one_duplicate_in_every_read() -> None:
    """A sidecar's record repeated (its sequence number again) is one duplicate, read
    with the steps (a catch-up batch) or a line at a time: it counted twice where a
    sampler's line was checked by its envelope and then again as the whole record."""
    trainer, side = Lines(writer="rank0"), Lines(writer="side")
    parts = []
    for s in range(40):
        parts.append(trainer.train(s, 1.0))
        parts.append(side.gpu(50.0) if s % 2 else side.heartbeat())
        if s in (10, 30):
            side.seq -= 1  # the next one says the last one's number again
    data = b"".join(parts)
    caught_up = run_of(data).state
    one_by_one = run_of(*data.splitlines(keepends=True)).state
    for state in (caught_up, one_by_one):
        assert state.writers["side"].duplicates == 2
        assert state.duplicate_records == 2 and state.records == 78
        assert state.malformed_count == 0


def test_other_writers_lines_interleave_without_loss() -> None:
    a, b = Lines(writer="rank0"), Lines(writer="sampler")
    parts = []
    for s in range(40):
        parts.append(a.train(s, 1.0))
        if s % 3 == 0:
            parts.append(b.gpu(95.0))
    state = run_of(b"".join(parts)).state
    assert state.lost_records == 0 and state.train_steps == 40
    assert (
        len(state.samplers.gpu_utils(("", 0))) == 14
        and state.samplers.gpu_devices[("", 1)].util == 95.0
    )


def test_non_finite_values_in_every_spelling() -> None:
    raw = [
        b'{"kind":"train","step":0,"train":{"loss":"NaN","full_acc_0":0.5}}',
        b'{"kind":"train","step":1,"train":{"loss":"Infinity","full_acc_0":0.5}}',
        b'{"kind":"train","step":2,"train":{"loss":NaN,"full_acc_0":0.5}}',
        b'{"kind":"train","step":3,"train":{"loss":-Infinity,"full_acc_0":0.5}}',
        b'{"kind":"train","step":4,"train":{"loss":null,"full_acc_0":0.5}}',
    ]
    state = run_of(b"\n".join(raw) + b"\n").state
    loss = column(state, "train/loss")
    assert math.isnan(loss[0]) and loss[1] == math.inf and math.isnan(loss[2])
    assert loss[3] == -math.inf and math.isnan(loss[4])
    assert state.malformed_count == 0
    assert state.table.has_nonfinite("train/loss")


def test_plain_speculators_dicts_without_envelope_are_read() -> None:
    """What a user's own JSON handler would write: the trainer's dict as is."""
    rec = {
        "train": {"loss": 2.5, "full_acc_0": 0.4, "cond_acc_0": 0.4},
        "epoch": 0,
        "lr": 0.001,
        "global_step": 7,
        "profile": {"step_ms": 50.0},
    }
    state = run_of((json.dumps(rec) + "\n").encode()).state
    assert state.global_step == 7 and state.latest("train/loss") == 2.5


def test_muon_lr_dict_more_ttt_steps_and_weighted_losses() -> None:
    lines = Lines()
    train = {"loss": 2.0}
    for k, a in enumerate((0.8, 0.7, 0.6, 0.5, 0.4)):
        train |= {f"full_acc_{k}": 0.5, f"cond_acc_{k}": a, f"ce_loss_{k}": 0.1}
    data = b"".join(
        lines.make("train", step=s, epoch=0, lr={"Muon": 0.02, "AdamW": 0.001}, train=train)
        for s in range(40)
    )
    state = run_of(data).state
    assert state.ttt_steps == 5
    assert state.latest("lr/Muon") == 0.02 and state.latest("lr/AdamW") == 0.001
    assert state.latest("train/ce_loss_4") == 0.1


def test_a_metric_that_appears_later_is_backfilled_with_nan() -> None:
    lines = Lines()
    data = b"".join(lines.train(s, 1.0) for s in range(20))
    data += b"".join(
        lines.make("train", step=s, lr=0.001, epoch=0, train={"loss": 1.0, "extra": 5.0})
        for s in range(20, 40)
    )
    state = run_of(data).state
    extra = column(state, "train/extra")
    assert len(extra) == 40 and all(math.isnan(v) for v in extra[:20]) and extra[20:] == [5.0] * 20
    acc = column(state, "train/full_acc_0")
    assert len(acc) == 40 and all(math.isnan(v) for v in acc[20:])


def test_validation_table_per_epoch() -> None:
    lines = Lines()
    data = b"".join(lines.train(s, 1.0, epoch=s // 10) for s in range(30))
    data += lines.val(10, 0, 0.9) + lines.val(20, 1, 0.8) + lines.val(20, 1, 0.7)
    state = run_of(data).state
    assert state.val_by_epoch[0]["loss_epoch"] == 0.9
    assert state.val_by_epoch[1]["loss_epoch"] == 0.7  # a re-validated epoch: the later one
    assert state.val_steps == {0: 10, 1: 20}


def test_sampler_records_and_a_bad_payload() -> None:
    lines = Lines()
    data = lines.gpu(97.0) + lines.io(1e6, ("a.safetensors", "b.safetensors"))
    data += lines.ckpt("save_started", "/ckpt/0") + lines.ckpt(
        "save_finished", "/ckpt/0", bytes=1e9, duration_s=3.0
    )
    data += lines.heartbeat(written=10, dropped=2)
    data += lines.make("gpu", status="ok", devices=[{"index": "zero"}])
    state = run_of(data).state
    assert state.samplers.gpu_devices[("", 0)].util == 97.0 and state.samplers.gpu_status == "ok"
    assert [f for _, _, f in state.samplers.recent_files] == ["a.safetensors", "b.safetensors"]
    assert [e.event for e in state.ckpt_events] == ["save_started", "save_finished"]
    assert state.activity is None
    assert state.samplers.heartbeat is not None and state.samplers.heartbeat.dropped == 2
    assert state.malformed_count == 1 and "gpu devices" in state.malformed[-1].reason


def test_saving_and_validating_are_activities_until_they_end() -> None:
    lines = Lines()
    state = run_of(lines.train(0, 1.0) + lines.log("Saving checkpoint to /c/0")).state
    assert state.activity is not None and state.activity.what == "saving"
    state = run_of(
        lines.train(1, 1.0)
        + lines.log("Saving checkpoint to /c/0")
        + lines.log("Checkpoint saved to /c/0")
    ).state
    assert state.activity is None
    state = run_of(lines.log("Validation epoch 1/3 started")).state
    assert state.activity is not None and state.activity.what == "validating"
    assert state.epochs_total == 3


def test_each_batch_shape_of_a_catch_up_reads_every_step() -> None:
    """Training steps among other kinds, in the first batch (decoded before the run's
    keys are learned) and in later ones (lean steps and deferred others), with a
    torn line at every slice boundary: all steps, all sequence numbers, in order."""
    a = Lines()
    parts: list[bytes] = []
    for step in range(3000):
        if step % 89 == 0:  # the first line too: not a training step
            parts.append(a.log(f"Training epoch {step // 1000 + 1}/3 started"))
        parts.append(a.train(step, 2.0 - step / 3000))
        if step % 97 == 0:
            parts.append(a.val(step, step // 1000, 1.5))
    data = b"".join(parts)
    for chunk in (len(data), 1 << 16, 7777):
        run = run_of(*(data[i : i + chunk] for i in range(0, len(data), chunk)))
        assert steps(run.state) == list(range(3000))
        assert column(run.state, "train/loss")[-1] == np.float32(2.0 - 2999 / 3000)
        assert run.state.lost_records == 0 and run.state.malformed_count == 0
        assert run.state.records == len(parts)


# ---- the two ingest paths agree --------------------------------------------------


def mixed_stream(n: int, seed: int) -> bytes:
    import random

    rng = random.Random(seed)
    a, s = Lines(writer="rank0"), Lines(writer="sampler")
    parts = []
    step = 0
    while step < n:
        r = rng.random()
        if r < 0.08:
            parts.append(s.gpu(rng.uniform(0, 100)))
        elif r < 0.1:
            parts.append(a.log("Training epoch 1/2 started"))
        elif r < 0.11:
            parts.append(b"{broken\n")
        elif r < 0.12 and step > 5:
            step -= rng.randint(1, 5)  # a resume that redoes steps
            parts.append(a.train(step, rng.uniform(0, 3)))
            step += 1
        else:
            parts.append(a.train(step, rng.uniform(0, 3), epoch=step // 100))
            step += 1
    return b"".join(parts)


def state_digest(state: RunState) -> tuple[object, ...]:
    cols = {
        k: [round(v, 5) if not math.isnan(v) else "nan" for v in column(state, k)]
        for k in sorted(state.table.columns)
    }
    return (
        steps(state),
        cols,
        state.records,
        state.malformed_count,
        state.lost_records,
        state.duplicate_records,
        [(r.first, r.last) for r in state.redos],
        len(state.logs),
        sorted(state.samplers.gpu_devices),
        len(state.samplers.gpu_samples),
        state.epoch,
    )


def assert_chunked_equals_line_by_line(data: bytes, cuts: list[int]) -> Run:
    """Feed ``data`` cut at ``cuts`` (mid-line too) and line by line: equal states."""
    points = sorted({c % (len(data) + 1) for c in cuts})
    chunked = Run()
    prev = 0
    for p in [*points, len(data)]:
        chunked.feed(prev, data[prev:p])
        prev = p
    one_by_one = Run()
    offset = 0
    for line in data.splitlines(keepends=True):
        one_by_one.feed(offset, line)
        offset += len(line)
    assert state_digest(chunked.state) == state_digest(one_by_one.state)
    return chunked


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=0, max_value=10_000), st.lists(st.integers(0, 10**6), max_size=12))
def test_chunked_catch_up_equals_line_by_line(seed: int, cuts: list[int]) -> None:
    data = mixed_stream(300, seed)
    assert_chunked_equals_line_by_line(data, cuts)


def optimizer_stream(n: int, seed: int) -> bytes:
    """Steps whose ``lr`` is a float, then one per optimizer (Muon), then a float
    again, and other optimizer sets: the column path must follow each change."""
    import random

    rng = random.Random(seed)
    a, s = Lines(writer="rank0"), Lines(writer="sampler")
    shapes = [0.001, {"Muon": 0.02, "AdamW": 0.001}, {"AdamW": 0.002}, {"Muon": 0.01}]
    parts = []
    shape = rng.choice(shapes)
    for step in range(n):
        if rng.random() < 0.02:
            shape = rng.choice(shapes)
        if rng.random() < 0.05:
            parts.append(s.gpu(50.0))
        lr = {k: v * (1 + step / n) for k, v in shape.items()} if isinstance(shape, dict) else shape
        parts.append(a.train(step, rng.uniform(0, 3), lr=lr))
    return b"".join(parts)


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=0, max_value=10_000), st.lists(st.integers(0, 10**6), max_size=8))
def test_lr_per_optimizer_chunked_equals_line_by_line(seed: int, cuts: list[int]) -> None:
    data = optimizer_stream(400, seed)
    chunked = assert_chunked_equals_line_by_line(data, cuts)
    assert steps(chunked.state) == list(range(400))


def test_each_devices_utilization_is_what_the_kept_samples_say() -> None:
    """``gpu_utils`` (kept as samples come) hands out exactly the readings of the
    samples the bounded history still holds: two hosts' samplers interleaving, devices
    coming and going, readings without a utilization, past the history's length."""
    from eagle3_tui.model.samples import GPU_HISTORY

    hosts = {"node0": Lines("s0"), "node1": Lines("s1")}
    parts: list[bytes] = []
    n = GPU_HISTORY + 250
    for i in range(n):
        host = "node0" if i % 3 else "node1"
        devs = [
            {"index": d, "name": "H100", "util": None if (i + d) % 7 == 0 else float(i % 100)}
            for d in range(1 + (i // 50) % 3)
        ]
        parts.append(hosts[host].make("gpu", status="ok", host=host, devices=devs))
    run, offset = Run(), 0
    for i in range(0, n, 40):  # as a followed run's come: applied a few at a time
        chunk = b"".join(parts[i : i + 40])
        run.feed(offset, chunk)
        offset += len(chunk)
        assert run.state.samplers.gpu_samples  # settled: the samples applied
    samplers = run.state.samplers
    assert len(samplers.gpu_samples) == GPU_HISTORY
    for key in [*samplers.gpu_devices, ("node9", 0)]:
        expected = [
            d.util
            for _, devs in samplers.gpu_samples
            for d in devs
            if (d.host, d.index) == key and d.util is not None
        ]
        assert samplers.gpu_utils(key) == expected, key
        assert samplers.gpu_utils(key) == expected, key  # asked again: the same
    assert samplers.gpu_utils(("node0", 2)) != []
