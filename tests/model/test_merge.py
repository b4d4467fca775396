"""Reading a file in two parts and merging equals reading it serially; and the
two-core catch-up that relies on it."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from eagle3_tui.model import parallel
from eagle3_tui.model.run import Run
from eagle3_tui.model.state import RunState
from tests.model.test_state import mixed_stream, state_digest
from tests.records import Lines


def serial(data: bytes) -> RunState:
    run = Run(parallel=False)
    run.feed(0, data)
    return run.state


def in_two_parts(data: bytes, split: int) -> RunState:
    first = Run(parallel=False)
    first.feed(0, data[:split])
    line_no = data.count(b"\n", 0, split)
    state, _tail = parallel.read_part(data[split:], split, line_no)
    merged = first.state
    assert merged.merge(state)
    return merged


def full_digest(state: RunState) -> tuple[object, ...]:
    return (
        state_digest(state),
        state.lost_records,
        [(m.line_no, m.offset, m.reason) for m in state.malformed],
        state.activity,
        [e.event for e in state.events],
        sorted(state.val_by_epoch),
        state.heartbeat is not None,
        [round(p.bytes, 3) for p in state.io_history],
    )


def activity_stream() -> bytes:
    a, s = Lines(writer="rank0"), Lines(writer="sampler")
    parts = [a.train(i, 1.0) for i in range(40)]
    parts += [a.log("Saving checkpoint to /c/0"), s.gpu(0.0), s.heartbeat()]
    parts += [s.io(0.0) for _ in range(30)]
    parts += [a.log("Checkpoint saved to /c/0"), a.log("Validation epoch 1/2 started")]
    parts += [s.gpu(80.0) for _ in range(30)]
    parts += [a.val(40, 0, 0.9), a.log("Validation epoch 1/2 completed")]
    parts += [a.train(i, 1.0) for i in range(40, 60)]
    parts += [a.log("Saving checkpoint to /c/1")] + [s.io(1.0) for _ in range(5)]
    return b"".join(parts)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.0, 1.0), st.booleans())
def test_merging_two_parts_equals_reading_serially(
    seed: int, where: float, activities: bool
) -> None:
    data = activity_stream() if activities else mixed_stream(300, seed)
    split = data.rfind(b"\n", 0, int(len(data) * where)) + 1
    assert full_digest(in_two_parts(data, split)) == full_digest(serial(data))


def test_a_resume_across_the_boundary_is_a_redo() -> None:
    a, b = Lines(writer="run1"), Lines(writer="run2")
    data = b"".join(a.train(s, 3.0) for s in range(100)) + b"".join(
        b.train(s, 1.0) for s in range(60, 120)
    )
    split = data.index(b'"w": "run2"')
    split = data.rfind(b"\n", 0, split) + 1
    merged = in_two_parts(data, split)
    assert [(r.first, r.last) for r in merged.redos] == [(60, 99)]
    assert full_digest(merged) == full_digest(serial(data))


def test_an_overlapping_writer_is_refused_and_nothing_changes() -> None:
    lines = Lines()
    recs = [lines.train(s, 1.0) for s in range(40)]
    first, second = serial(b"".join(recs[:30])), serial(b"".join(recs[20:]))
    before = full_digest(first)
    assert not first.merge(second)
    assert full_digest(first) == before


def test_the_state_pickles() -> None:
    import pickle

    state = serial(mixed_stream(200, 1))
    again = pickle.loads(pickle.dumps(state))
    assert full_digest(again) == full_digest(state)


def test_a_big_catch_up_on_two_cores_equals_serial() -> None:
    if not parallel.enabled():
        return  # one core: the serial path is the only path (tested above)
    lines_a, lines_s = Lines(writer="rank0"), Lines(writer="sampler")
    parts = []
    for step in range(30_000):
        parts.append(lines_a.train(step, 2.0 + math.sin(step / 100), epoch=step // 10_000))
        if step % 2 == 0:
            parts.append(lines_s.gpu(90.0))
    data = b"".join(parts) + b'{"kind": "log", "msg": "torn'  # and a torn last line
    assert len(data) >= parallel.PARALLEL_MIN
    fast = Run()
    fast.feed(0, data)
    slow = Run(parallel=False)
    slow.feed(0, data)
    assert full_digest(fast.state) == full_digest(slow.state)
    assert np.array_equal(np.frombuffer(fast.state.table.steps, dtype=np.int64), np.arange(30_000))
    # the torn line completes on the next chunk, as it would serially
    fast.feed(len(data), b' line"}\n')
    assert fast.state.logs[-1].msg == "torn line"
