"""Lines that are not the records they claim to be: anyone who can append to a run's
metrics.jsonl may write a line naming a real writer, another run, any number. Such a
line must not move the state (model/sequences.py, model/state.py, model/records.py),
on the path a line at a time, a catch-up's batch, or a columns frame alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.agent.names import COLUMNS_WANTED, COMPRESS_ZLIB
from eagle3_tui.model.derived import tau_of
from eagle3_tui.model.health import diagnose
from eagle3_tui.model.run import Run
from eagle3_tui.model.samples import SAMPLES_KEPT
from eagle3_tui.model.state import RunState
from eagle3_tui.model.summary import format_text, summarize
from eagle3_tui.model.verdict import Health
from eagle3_tui.telemetry.column_log import index_file
from tests.records import Lines
from tests.transport.test_compressed import agent_output, frame_kinds, parse

T0 = 1_000_000.0
RUN_ID = "run-A"
COLUMNS = {"compress": COMPRESS_ZLIB, "columns": COLUMNS_WANTED, "samples": SAMPLES_KEPT}


def forged(template: bytes, **fields: Any) -> bytes:
    """A line like ``template`` (a real writer's) with these fields changed."""
    rec = json.loads(template)
    rec.update(fields)
    return (json.dumps(rec) + "\n").encode()


def whole(data: bytes) -> RunState:
    """Read in one feed (a catch-up: the batch path where it can)."""
    run = Run()
    run.feed(0, data)
    return run.state


def by_line(data: bytes) -> RunState:
    """Read a line at a time (a live follow: the record path)."""
    run = Run()
    offset = 0
    for line in data.splitlines(keepends=True):
        run.feed(offset, line)
        offset += len(line)
    return run.state


READS = [whole, by_line]


def by_columns(tmp_path: Path, data: bytes) -> RunState:
    """Read through the agent's columnar catch-up (metrics.cols kept beside the file)."""
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(data)
    index_file(str(path), block_rows=200)
    output = agent_output(tmp_path, **COLUMNS)
    assert "C" in frame_kinds(output), "steps sent as columns"
    run = Run()
    for frame in parse(output, []):
        run.feed_frame(frame)
    return run.state


def steps_of(state: RunState) -> list[int]:
    return [int(s) for s in state.table.step_view().tolist()]


# ---- 1. a number far ahead of a real writer's ------------------------------------------


@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize("ahead", [2**63 - 40, 100_000])
def test_a_line_far_ahead_of_a_writers_number_does_not_drop_its_later_records(
    read: Any, ahead: int
) -> None:
    """A line naming the trainer with its number far ahead made every later record of
    the trainer a duplicate (dropped) and counted "lost records 9223372036854775783":
    it is not the trainer's (its next record goes on from its own numbers), malformed."""
    t = Lines("trainer-1", T0)
    parts = [t.event("start", pid=11, run_id=RUN_ID)]
    parts += [t.train(s, 2.0) for s in range(40)]
    seq = t.seq + ahead if ahead < 2**62 else ahead
    parts.append(forged(t.log("x"), seq=seq, msg="forged"))
    t.seq -= 1  # (the forged line took none of the trainer's numbers)
    parts += [t.train(s, 1.5) for s in range(40, 80)]
    state = read(b"".join(parts))
    assert steps_of(state) == list(range(80))
    assert state.duplicate_records == 0 and state.lost_records == 0
    assert state.writers["trainer-1"].next_seq == 81
    assert state.malformed_count == 1 and "not that writer's line" in state.malformed[-1].reason
    assert state.records == 81 and [g.msg for g in state.logs] == []
    assert "lost records 0" in format_text(summarize(state, t.ts))


@pytest.mark.parametrize("read", READS)
def test_a_forged_end_far_ahead_as_the_last_line_moves_nothing(read: Any) -> None:
    """A crash naming the trainer and a number far ahead, the file's last line: held
    until the trainer's next record says whose it is; never applied, nothing lost."""
    t = Lines("trainer-1", T0)
    parts = [t.event("start", pid=11, run_id=RUN_ID)] + [t.train(s, 2.0) for s in range(30)]
    parts.append(forged(t.event("crash", error="forged"), seq=2**63))
    state = read(b"".join(parts))
    assert [e.event for e in state.events] == ["start"]
    assert state.lost_records == 0 and state.records == 31
    assert diagnose(state, t.ts).health is Health.RUNNING


@pytest.mark.parametrize("read", READS)
def test_records_really_lost_are_counted_once_the_writer_goes_on(read: Any) -> None:
    """A real gap (records the writer numbered and never wrote: a full queue, a deleted
    file's last lines) far bigger than a few: still counted lost, every record read
    applied, on every path."""
    t, side = Lines("trainer-1", T0), Lines("sidecar-1", T0)
    parts = [t.event("start", pid=11, run_id=RUN_ID)]
    for s in range(30):
        parts += [t.train(s, 2.0), side.heartbeat(written=s)]
    t.seq += 5000
    side.seq += 70_000
    for s in range(30, 60):
        parts += [t.train(s, 1.5), side.heartbeat(written=s)]
    state = read(b"".join(parts))
    state.settle()
    assert steps_of(state) == list(range(60))
    assert state.lost_records == 75_000 and state.duplicate_records == 0
    assert state.malformed_count == 0 and state.records == 121


@pytest.mark.parametrize("read", READS)
def test_a_line_a_few_ahead_is_taken_and_taken_back_when_the_writer_goes_on(
    read: Any,
) -> None:
    """A crash a few numbers ahead of the trainer's is taken at once (a process's last
    record after a queue's drops: nothing of it follows to confirm it); the trainer's
    next record going on from its own numbers takes it back: no crash, nothing lost,
    no record dropped, one malformed line."""
    t = Lines("trainer-1", T0)
    parts = [t.event("start", pid=11, run_id=RUN_ID)] + [t.train(s, 2.0) for s in range(30)]
    # (a few: within model/sequences.py's FEW_LOST)
    parts.append(forged(t.event("crash", error="forged"), seq=t.seq + 500))
    t.seq -= 1
    parts += [t.train(s, 1.5) for s in range(30, 60)]
    state = read(b"".join(parts))
    assert [e.event for e in state.events] == ["start"]
    assert steps_of(state) == list(range(60))
    assert state.lost_records == 0 and state.duplicate_records == 0
    assert state.malformed_count == 1 and state.records == 61
    assert diagnose(state, t.ts).health is Health.RUNNING


def test_a_line_far_ahead_read_as_columns_reads_as_its_lines(tmp_path: Path) -> None:
    """The columnar catch-up agrees with the lines: the steps after the forged line are
    the trainer's, nothing lost, one malformed line."""
    t = Lines("trainer-1", T0)
    parts = [t.event("start", pid=11, run_id=RUN_ID)]
    parts += [t.train(s, 2.0) for s in range(600)]
    parts.append(forged(t.train(600, 9.0), seq=t.seq + 100_000))
    t.seq -= 1
    parts += [t.train(s, 1.5) for s in range(600, 1200)]
    data = b"".join(parts)
    for state in (by_columns(tmp_path, data), whole(data)):
        assert steps_of(state) == list(range(1200))
        assert state.lost_records == 0 and state.duplicate_records == 0
        assert state.malformed_count == 1 and state.records == 1201
        assert state.writers["trainer-1"].next_seq == 1201


# ---- 2. another writer's, another run's records -------------------------------------


@pytest.mark.parametrize("read", READS)
def test_another_runs_start_after_the_finish_is_not_this_runs(read: Any) -> None:
    """A start naming another run, appended after this run's finish, made the run DEAD
    (pid 1): not this run's record (a resume keeps the run's id)."""
    t = Lines("trainer-1", T0)
    parts = [t.event("start", pid=11, run_id=RUN_ID)] + [t.train(s, 2.0) for s in range(20)]
    parts.append(t.event("finish", step=20))
    evil = Lines("1-evil", t.ts)
    parts.append(evil.event("start", pid=1, global_step=0, run_id="run-B"))
    state = read(b"".join(parts))
    assert [e.event for e in state.events] == ["start", "finish"]
    assert state.malformed_count == 1 and "another run's" in state.malformed[-1].reason
    assert diagnose(state, evil.ts + 60).health is Health.FINISHED
    assert state.file_run_ids == [RUN_ID]


@pytest.mark.parametrize("read", READS)
def test_a_crash_of_a_writer_never_heard_of_is_no_processs_end(read: Any) -> None:
    """A crash from a writer that wrote nothing before and names no process of the run
    was applied (the run DEAD): it is not the run's."""
    t = Lines("trainer-1", T0)
    parts = [t.event("start", pid=11, run_id=RUN_ID)]
    parts += [t.train(s, 2.0) for s in range(20)]
    parts.append(Lines("666-evil", t.ts).event("crash", error="RuntimeError: forged"))
    parts += [t.train(s, 2.0) for s in range(20, 40)]
    state = read(b"".join(parts))
    assert [e.event for e in state.events] == ["start"]
    assert state.malformed_count == 1 and "no process's end" in state.malformed[-1].reason
    assert diagnose(state, t.ts).health is Health.RUNNING


@pytest.mark.parametrize("read", READS)
def test_resumes_sidecars_and_other_ranks_are_still_the_runs(read: Any) -> None:
    """What the real telemetry writes stays the run's: a resume after a stop (a new
    writer, the run's id), a sidecar's crash naming the trainer it saw die (its first
    record), another rank's own crash (ranks other than 0 write no start)."""
    t = Lines("11-a", T0)
    parts = [t.event("start", pid=11, global_step=0, run_id=RUN_ID)]
    parts += [t.train(s, 2.0) for s in range(20)]
    parts.append(t.event("interrupt", step=20))
    r = Lines("12-b", t.ts + 10)
    parts.append(r.event("resume", pid=12, global_step=20, run_id=RUN_ID))
    parts += [r.train(s, 1.5) for s in range(20, 40)]
    rank1 = Lines("13-c", r.ts)
    parts.append(rank1.make("lifecycle", event="crash", rank=1, error="RuntimeError: NCCL"))
    side = Lines("14-side", rank1.ts)
    gone = "the trainer process 12 exited without a finish event (killed by SIGKILL)"
    parts.append(side.event("crash", pid=12, step=39, error=gone))
    state = read(b"".join(parts))
    assert [e.event for e in state.events] == ["start", "interrupt", "resume", "crash", "crash"]
    assert state.malformed_count == 0
    assert diagnose(state, side.ts).health is Health.DEAD


# ---- 3. accuracies outside [0, 1] --------------------------------------------------------


def _bad_acc(lines: Lines, step: int, key: str, value: float) -> bytes:
    rec = json.loads(lines.train(step, 2.0))
    rec["train"][key] = value
    return (json.dumps(rec) + "\n").encode()


@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize(("key", "value"), [("full_acc_0", 50.0), ("cond_acc_1", -0.2)])
def test_an_accuracy_outside_0_1_makes_the_line_malformed(
    read: Any, key: str, value: float
) -> None:
    """``full_acc_0: 50`` was read as given (τ 51): an accuracy is a probability."""
    t = Lines("trainer-1", T0)
    parts = [t.train(s, 2.0) for s in range(30)]
    parts.append(_bad_acc(t, 30, key, value))
    parts += [t.train(s, 2.0) for s in range(31, 33)]
    state = read(b"".join(parts))
    assert steps_of(state) == [*range(30), 31, 32]
    assert state.malformed_count == 1 and "outside [0, 1]" in state.malformed[-1].reason
    assert state.records == 32
    latest = dict(state.table.latest)
    assert 0.0 <= latest["train/full_acc_0"] <= 1.0 and latest["train/cond_acc_1"] >= 0.0
    tau = tau_of(latest, state.ttt_steps)
    assert tau is not None and tau < 2.0


@pytest.mark.parametrize("read", READS)
def test_a_nan_accuracy_is_a_value_and_a_validation_accuracy_is_checked_too(read: Any) -> None:
    """NaN is what a diverged step logs (as its loss): a value, not a malformed line;
    a validation's ``full_acc_0_epoch`` outside [0, 1] is malformed as a step's is."""
    t = Lines("trainer-1", T0)
    parts = [t.train(s, 2.0) for s in range(20)]
    parts.append(_bad_acc(t, 20, "full_acc_0", float("nan")))
    parts.append(forged(t.val(21, 0, 1.5), val={"loss_epoch": 1.5, "full_acc_0_epoch": 3.0}))
    state = read(b"".join(parts))
    assert steps_of(state) == list(range(21))
    assert state.malformed_count == 1 and "val.full_acc_0_epoch" in state.malformed[-1].reason
    assert state.val_by_epoch == {}


def test_an_accuracy_outside_0_1_read_as_columns_reads_as_its_lines(tmp_path: Path) -> None:
    """A block's rows with one accuracy outside [0, 1]: the columnar catch-up reads them
    line by line, the bad one malformed, as the lines themselves read."""
    t = Lines("trainer-1", T0)
    parts = [
        _bad_acc(t, s, "full_acc_0", 50.0) if s == 300 else t.train(s, 2.0) for s in range(1200)
    ]
    data = b"".join(parts)
    for state in (by_columns(tmp_path, data), whole(data)):
        assert steps_of(state) == [s for s in range(1200) if s != 300]
        assert state.malformed_count == 1 and "outside [0, 1]" in state.malformed[-1].reason
        assert state.records == 1199


# ---- 4. a sample whose payload is bad ----------------------------------------------------


@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize(
    "bad",
    [
        {"kind": "gpu", "status": "ok", "devices": [{"index": "zero", "util": "busy"}]},
        {"kind": "io", "interval_s": 1.0, "workers": [{"pid": "x", "files": 3}]},
        {"kind": "gpu", "status": "ok", "devices": 5},
    ],
)
def test_a_sample_with_a_bad_payload_is_one_malformed_line_not_also_a_record(
    read: Any, bad: dict[str, Any]
) -> None:
    t, side = Lines("trainer-1", T0), Lines("sidecar-1", T0)
    parts = [t.train(s, 2.0) for s in range(20)]
    parts.append(side.make("heartbeat", written=20))
    parts.append(forged(side.make("heartbeat"), **bad))
    state = read(b"".join(parts))
    state.settle()
    assert state.malformed_count == 1
    assert state.records == 21
    assert state.samplers.last_io_ts is None and len(state.samplers.gpu_samples) == 0


def test_another_writers_records_read_as_columns_read_as_their_lines(tmp_path: Path) -> None:
    """Among a columns frame's steps, a crash of a writer never heard of, and after the
    finish another run's start: neither applied, as the lines themselves read."""
    t = Lines("trainer-1", T0)
    parts = [t.event("start", pid=11, run_id=RUN_ID)]
    parts += [t.train(s, 2.0) for s in range(600)]
    parts.append(Lines("666-evil", t.ts).event("crash", error="RuntimeError: forged"))
    parts += [t.train(s, 1.5) for s in range(600, 1200)]
    parts.append(t.event("finish", step=1200))
    parts.append(Lines("1-evil", t.ts).event("start", pid=1, global_step=0, run_id="run-B"))
    data = b"".join(parts)
    for state in (by_columns(tmp_path, data), whole(data), by_line(data)):
        assert [e.event for e in state.events] == ["start", "finish"]
        assert steps_of(state) == list(range(1200))
        assert state.malformed_count == 2 and state.records == 1202
        assert diagnose(state, t.ts + 60).health is Health.FINISHED


@pytest.mark.parametrize("read", READS)
def test_a_write_gap_that_says_its_own_jump_is_taken_as_the_last_line(read: Any) -> None:
    """The full disk's ``write_gap`` numbers on from the records it never wrote: as the
    writer's last line (the disk stayed full, the process ended) nothing follows it to
    say it is the writer's, and it waited for ever; its own first and last numbers say
    the jump, so it is taken at once."""
    t = Lines("trainer-1", T0)
    parts = [t.event("start", pid=11, run_id=RUN_ID)] + [t.train(s, 2.0) for s in range(30)]
    first = t.seq
    t.seq += 5000  # written to no file
    parts.append(
        t.event(
            "write_gap",
            reason="ENOSPC",
            records=5000,
            first_seq=first,
            last_seq=t.seq - 1,
            since=T0,
            until=T0 + 60,
        )
    )
    state = read(b"".join(parts))
    assert state.malformed_count == 0, [m.reason for m in state.malformed]
    assert len(state.write_gaps) == 1 and state.lost_records == 5000
