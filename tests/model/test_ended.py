"""A run that ended stops ticking: its uptime is its own span, its pace the average it
ran at, its read rates and ETA no longer shown as current (issue 28, item 3)."""

from __future__ import annotations

import json
import math

from eagle3_tui.model.run import Run
from eagle3_tui.model.snapshot import ViewParams, build_snapshot
from eagle3_tui.model.summary import format_text, summarize
from tests.records import Lines

T0 = 1_800_000_000.0
LATER = 13 * 60.0
"""Looked at this long after the run ended, as the report's user did."""


def run_of(*parts: bytes) -> Run:
    run = Run()
    run.feed(0, b"".join(parts))
    return run


def finished_run() -> tuple[Run, float]:
    """An 8 s run: start, 16 steps every 0.5 s, finish; the finish's time is returned."""
    lines = Lines(t0=T0, dt=0.5)
    data = lines.event("start", pid=4242)
    data += b"".join(lines.train(s, 2.0 - s / 100) for s in range(16))
    end = lines.ts
    data += lines.event("finish", step=16)
    return run_of(data), end


def test_a_finished_run_is_up_for_its_own_span_not_until_now() -> None:
    run, end = finished_run()
    snap = build_snapshot(run.state, end + LATER, ViewParams())
    p = snap.progress
    assert snap.health.value == "finished"
    assert p.ended_at == end
    assert p.elapsed_s is not None and math.isclose(p.elapsed_s, 8.5)  # not 13 min
    assert p.pace_over == "run"  # the run's average: 15 step intervals in 7.5 s
    assert p.steps_per_s is not None and math.isclose(p.steps_per_s, 2.0)


def test_the_summary_says_when_it_ended_and_how_long_it_ran() -> None:
    run, end = finished_run()
    summary = summarize(run.state, end + LATER)
    json.dumps(summary, allow_nan=False)
    assert summary["ended_at"] == end and math.isclose(summary["elapsed_s"], 8.5)
    assert summary["pace_over"] == "run"
    text = format_text(summary)
    assert "13m" not in text and "ran 8 s" in text and "average" in text, text


def test_a_running_run_is_up_until_now_at_its_recent_pace() -> None:
    lines = Lines(t0=T0, dt=0.5)
    data = lines.event("start", pid=4242) + b"".join(lines.train(s, 2.0) for s in range(16))
    snap = build_snapshot(run_of(data).state, lines.ts + 1.0, ViewParams())
    p = snap.progress
    assert snap.health.value == "running" and p.ended_at is None and p.pace_over == "recent"
    assert p.elapsed_s is not None and math.isclose(p.elapsed_s, 9.5)


def test_a_dead_trainer_ran_until_its_last_record() -> None:
    """No end event: heartbeats stopped (dead after 30 s); the run's span ends at the last
    record it wrote, and its reads are not shown as current."""
    lines = Lines(t0=T0, dt=0.5)
    data = lines.event("start", pid=4242)
    for s in range(10):
        data += lines.train(s, 2.0) + lines.io(3e6) + lines.heartbeat()
    last = lines.ts - 0.5
    snap = build_snapshot(run_of(data).state, last + LATER, ViewParams())
    assert snap.health.value == "dead"
    assert snap.progress.ended_at == last
    assert snap.progress.elapsed_s is not None and math.isclose(snap.progress.elapsed_s, last - T0)
    assert snap.io is not None and snap.io.bytes_per_s is None


def observed_run(ended: bool) -> tuple[Run, float]:
    """A handler-less training watched from outside, reading 164 MiB/s, until it exits
    (``ended``) at T0 + 30; the time of its last look is returned."""
    obs = Lines(writer="obs", t0=T0, dt=0.0)
    parts = []
    for i in range(20):  # a look each second
        parts += [obs.at(T0 + i).proc(started=T0 - 10), obs.io(164 * 2**20)]
    if ended:
        parts.append(obs.at(T0 + 45).proc(alive=False, started=T0 - 10, ended_at=T0 + 45.0,
                                           last_alive=T0 + 39.0, exit_status=0))  # fmt: skip
    return run_of(*parts), obs.ts + 1.0


def test_reads_of_a_handlerless_run_stop_when_it_exits() -> None:
    run, at = observed_run(ended=False)
    live = build_snapshot(run.state, at, ViewParams())
    assert live.io is not None and live.io.bytes_per_s is not None
    assert math.isclose(live.io.bytes_per_s, 164 * 2**20)  # the test's premise
    run, at = observed_run(ended=True)
    snap = build_snapshot(run.state, at + LATER, ViewParams())
    assert snap.observed is not None and not snap.observed.alive
    assert snap.io is not None and snap.io.bytes_per_s is None and snap.io.files_per_s is None
    assert all(w.bytes_per_s is None for w in snap.io.workers)
    # it was last seen alive at T0 + 39 (a look found it gone at T0 + 45): it ran 49 s
    assert snap.progress.ended_at == T0 + 39.0
    assert snap.progress.elapsed_s is not None and math.isclose(snap.progress.elapsed_s, 49.0)


def test_one_step_numbering_in_the_summary_and_its_json() -> None:
    """Issue 28, item 4: ``summary --json``'s top-level ``global_step`` was 0-based and
    its validation's 1-based (speculators logs a validation with the steps done). Each
    now has ``step`` as shown (1-based) and ``global_step`` (speculators' counter of the
    last step done), the same numbers at the same point."""
    lines = Lines(t0=T0, dt=0.5)
    data = lines.event("start", pid=4242)
    data += b"".join(lines.train(s, 2.0 - s / 100) for s in range(72))
    data += lines.val(72, 0, 1.5)  # after the epoch: 72 steps done
    data += lines.event("finish", step=72)
    summary = summarize(run_of(data).state, lines.ts + 1)
    assert (summary["step"], summary["global_step"]) == (72, 71)
    (val,) = summary["validation"]
    assert (val["epoch"], val["step"], val["global_step"]) == (1, 72, 71)


def test_a_save_seen_by_polling_is_timed_by_its_files_and_not_under_way_after_the_end() -> None:
    """A training without telemetry: a save seen by polling read "in 2.0 s" (two looks)
    for a 15 ms save, at the look's time; and a save seen starting just before the run
    ended stayed "⟳ saving" on the ended run's screen."""
    from eagle3_tui.app.text import clock_time
    from eagle3_tui.app.widgets.panels import checkpoint_rows

    lines = Lines(t0=T0, dt=0.5)
    data = lines.event("start", pid=4242)
    data += b"".join(lines.train(s, 2.0 - s / 100) for s in range(16))
    written = lines.ts - 2.5  # its files' time: before the looks that saw it
    data += lines.ckpt("save_started", "/r/checkpoints/0", inferred=True)
    data += lines.ckpt(
        "save_finished", "/r/checkpoints/0", bytes=1000, duration_s=None, complete=True,
        inferred=True, written_at=written,
    )  # fmt: skip
    data += lines.ckpt("save_started", "/r/checkpoints/1", inferred=True)
    live = run_of(data)
    assert build_snapshot(live.state, lines.ts, ViewParams()).saving == "/r/checkpoints/1"
    data += lines.event("finish", step=16)
    ended = build_snapshot(run_of(data).state, lines.ts + LATER, ViewParams())
    assert ended.saving is None
    (row,) = [r.plain for r in checkpoint_rows(ended.checkpoints)]
    assert row.startswith(clock_time(written)) and " in " not in row, row
    # a file time after its record, or from long before, is not the save's
    late = lines.ckpt("save_finished", "/r/checkpoints/2", bytes=1, written_at=lines.ts + 60)
    old = lines.ckpt("save_finished", "/r/checkpoints/3", bytes=1, written_at=T0 - 86_400)
    state = run_of(data + late + old).state
    assert [e.when == e.ts for e in list(state.ckpt_events)[-2:]] == [True, True]


def test_only_the_checkpoint_best_points_at_is_marked_best() -> None:
    """Issue 28, item 7: ★ best was on every checkpoint that had ever been the best."""
    from eagle3_tui.app.widgets.panels import checkpoint_rows

    lines = Lines(t0=T0, dt=1.0)
    data = b"".join(lines.train(s, 2.0) for s in range(4))
    for e in range(3):
        data += lines.ckpt("save_finished", f"/r/checkpoints/{e}", bytes=9, complete=True)
        if e < 2:  # the third epoch did not beat the second
            data += lines.ckpt("best", f"/r/checkpoints/{e}")
    snap = build_snapshot(run_of(data).state, lines.ts, ViewParams())
    rows = {r.plain.split()[1]: r.plain for r in checkpoint_rows(snap.checkpoints)}
    assert ["★ best" in rows[f"checkpoints/{e}"] for e in range(3)] == [False, True, False]


def test_checkpoints_saved_before_telemetry_began_are_listed_at_their_times() -> None:
    """Telemetry attached to a training mid-way: its sampler's ``inventory`` names the
    checkpoints already saved (``checkpoints/0``, ``/1``, the best one), which the panel
    and ``summary`` left out ("none saved yet"). Each is listed at its files' time; an
    entry without that time, or one from after the record, is not."""
    from eagle3_tui.app.text import clock_time
    from eagle3_tui.app.widgets.panels import checkpoint_rows
    from eagle3_tui.model.summary import summarize
    from eagle3_tui.model.verdict import evidence

    lines = Lines(t0=T0, dt=0.5)
    found = [
        {"name": "0", "epoch": 0, "bytes": 2048, "complete": True, "written_at": T0 - 300},
        {"name": "1", "epoch": 1, "bytes": 2048, "complete": True, "written_at": T0 - 100},
        {"name": "2", "epoch": 2, "bytes": 2048, "complete": False},  # no time: left out
        {"name": "3", "epoch": 3, "bytes": 1, "written_at": T0 + 3600},  # after it: left out
    ]
    data = lines.event("attach", pid=4242)
    data += lines.ckpt("inventory", "/r/checkpoints", checkpoints=found, best="0")
    data += b"".join(lines.train(s, 1.0) for s in range(200, 204))
    snap = build_snapshot(run_of(data).state, lines.ts, ViewParams())
    rows = [r.plain for r in checkpoint_rows(snap.checkpoints)]
    assert len(rows) == 2, rows
    assert rows[0].startswith(clock_time(T0 - 100)) and "checkpoints/1" in rows[0], rows
    assert rows[1].startswith(clock_time(T0 - 300)) and rows[1].endswith("★ best"), rows
    said = summarize(run_of(data).state, lines.ts)["checkpoint"]
    assert said is not None and said["path"] == "/r/checkpoints/1", said
    # what the look found is no write now: no "checkpoints are being written"
    assert not evidence(run_of(data).state, lines.ts, 60.0).saving
    # a resume's look finds the saves its records hold: listed as they were, with times
    again = data + lines.event("resume", pid=4243)
    again += lines.ckpt("inventory", "/r/checkpoints", checkpoints=found[:2], best="0")
    snap = build_snapshot(run_of(again).state, lines.ts, ViewParams())
    assert [r.plain for r in checkpoint_rows(snap.checkpoints)] == rows
    timed = lines.ckpt("save_finished", "/r/checkpoints/4", bytes=8, duration_s=2.5)
    again += timed + lines.ckpt("inventory", "/r/checkpoints", checkpoints=[
        {"name": "4", "epoch": 4, "bytes": 8, "complete": True, "written_at": lines.ts - 1}
    ])  # fmt: skip
    snap = build_snapshot(run_of(again).state, lines.ts, ViewParams())
    assert " in 2.5 s" in checkpoint_rows(snap.checkpoints)[0].plain
