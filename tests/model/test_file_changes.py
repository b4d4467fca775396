"""metrics.jsonl changing under the monitor (deleted, replaced, truncated), and a full
disk: recorded streams through the real ``Run``, what the monitor then shows and says.

Never two files' histories in one state; every sentence only what the stream and the
records said; a full disk is DISK FULL, not a hang; the lost count is the sequence gaps,
once."""

from __future__ import annotations

import asyncio
import json

import pytest

from eagle3_tui.app.pipeline import Pipeline
from eagle3_tui.app.widgets.log import counts
from eagle3_tui.exits import BY_HEALTH as EXIT_BY_HEALTH
from eagle3_tui.model.files import DiskSpace, FileChanged
from eagle3_tui.model.health import diagnose
from eagle3_tui.model.run import HOLD_ITEMS, Run
from eagle3_tui.model.snapshot import build_snapshot
from eagle3_tui.model.summary import format_text, summarize
from eagle3_tui.model.units import clock
from eagle3_tui.model.verdict import Health
from eagle3_tui.transport.replay import ReplayTransport
from eagle3_tui.transport.replies import Status
from tests.records import Lines

T0 = 1_800_000_000.0
RUN_ID = "run-A"
GIB = 1 << 30


class RunPath:
    """The run's metrics.jsonl as a stream delivers it to the monitor's ``Run``."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.offset = 0
        self.data = bytearray()
        """The file there now, as written."""

    def write(self, *lines: bytes) -> None:
        data = b"".join(lines)
        self.run.feed(self.offset, data)
        self.offset += len(data)
        self.data += data

    def changed(self, change: str, at: float, size: int | None = 0) -> None:
        """The stream says the file changed (and reads the file there from 0)."""
        self.run.file_changed(FileChanged(change, at, self.offset, size))
        self.offset = 0
        self.data = bytearray()

    def restarted(self) -> None:
        """The file there is read from 0 again, and nothing said why."""
        self.offset = 0
        self.data = bytearray()


class Training:
    """A live run: the trainer's steps (one a second) and its sidecar's heartbeats."""

    def __init__(self, path: RunPath, t: float = T0) -> None:
        self.path = path
        self.trainer = Lines("trainer-1", t, 0.0)
        self.sidecar = Lines("sidecar-1", t, 0.0)
        self.t = t
        self.step = 0
        self.dropped = 0
        """The trainer's writer's count of records it could not write (its heartbeats')."""

    def start(self) -> None:
        self.path.write(
            self.trainer.at(self.t).event("start", pid=11, global_step=0, run_id=RUN_ID)
        )

    def steps(self, n: int) -> None:
        for _ in range(n):
            self.path.write(
                self.trainer.at(self.t).train(
                    self.step, 2.0 - self.step * 1e-3, epoch=self.step // 10
                ),
                self.sidecar.at(self.t).heartbeat(self.trainer.seq, self.dropped),
            )
            self.step += 1
            self.t += 1.0

    def file_event(self, change: str, noticed: float, **fields: object) -> bytes:
        """The trainer's first line in the file it recreated (the writer's schema)."""
        return self.trainer.at(self.t).event(
            "file",
            change=change,
            run_id=RUN_ID,
            file="metrics.jsonl",
            noticed=noticed,
            previous={"identity": "2049:1234", "size": 50_000},
            written_before=self.trainer.seq,
            **fields,
        )


def another_run(steps: int = 72) -> list[bytes]:
    """Another run's whole metrics.jsonl: finished after ``steps`` steps."""
    other = Lines("trainer-9", T0 - 90_000, 1.0)
    return [
        other.event("start", pid=99, global_step=0, run_id="run-B"),
        *(other.train(s, 5.0, epoch=s // 9) for s in range(steps)),
        other.log("Training epoch 8/8 completed"),
        other.event("finish", step=steps),
    ]


def own_history_only(run: Run, steps: int) -> None:
    """The state shown is this run's, whole and alone: its steps, its events, nothing
    of the other run's (no step redone by a foreign one, no foreign event or message)."""
    state = run.state
    assert not state.foreign
    assert state.table.step_view().tolist() == list(range(steps))
    assert state.redos == [], "a foreign step went into the run's table"
    assert [e.event for e in state.events] == ["start"]
    assert [e.pid for e in state.events] == [11]
    assert not any("epoch 8/8" in line.msg for line in state.logs)
    assert set(state.writers) == {"trainer-1", "sidecar-1"}
    assert state.lost_records == 0, "a record of the run was lost"


# ---- replaced -------------------------------------------------------------------------


def test_a_foreign_file_moved_in_and_then_aside_by_the_trainer_is_never_mixed() -> None:
    run = Run()
    path = RunPath(run)
    live = Training(path)
    live.start()
    live.steps(80)
    # another run's finished file is moved into place at epoch 8
    t1 = live.t + 1
    path.changed("replaced", t1, size=None)
    path.write(*another_run())
    shown = run.state
    assert shown.foreign and shown.global_step == 71
    snap = build_snapshot(shown, t1 + 1)
    assert snap.other_file == (
        f"metrics.jsonl replaced at {clock(t1)}: now showing the file there (another run: "
        "run id run-B); the earlier history is not this file's"
    )
    assert snap.health is Health.FINISHED  # what that file says, said to be that file's
    assert run.shelved[-1].global_step == 79  # the run's history: kept, not shown
    # the trainer notices, moves it aside and recreates its own file, going on
    t2 = t1 + 4
    path.changed("replaced", t2)
    path.write(live.file_event("replaced", t2 - 1, moved_to="metrics.jsonl.replaced-1733"))
    live.steps(10)
    own_history_only(run, 90)
    back = build_snapshot(run.state, live.t)
    assert back.other_file is None and back.health is Health.RUNNING
    assert run.shelved[-1].global_step == 71  # the other file's, set aside in turn
    assert [n.text for n in back.files] == [
        f"metrics.jsonl replaced at {clock(t1)} by another file (another run: run id run-B), "
        f"shown until {clock(t2)}",
        f"metrics.jsonl replaced at {clock(t2 - 1)} by another file (moved aside to "
        "metrics.jsonl.replaced-1733 by the trainer); this run's history continues (nothing "
        "lost); the other file's history is set aside",
    ]
    assert [(n.outcome, n.moved_to, n.lost) for n in back.files] == [
        ("other", None, None),
        ("back", "metrics.jsonl.replaced-1733", 0),
    ]


@pytest.mark.parametrize("said", [True, False], ids=["stream-said", "reader-alone"])
def test_a_foreign_file_alone_is_shown_as_what_the_path_holds_with_a_notice(said: bool) -> None:
    run = Run()
    path = RunPath(run)
    live = Training(path)
    live.start()
    live.steps(80)
    t1 = live.t + 1
    if said:
        path.changed("replaced", t1, size=9000)
    else:  # an older transport: the reader sees the file start over, no more
        path.restarted()
    path.write(*another_run())
    state = run.state
    # the path's file now: another run's 72 steps, finished; nothing of the live run in it
    assert set(state.writers) == {"trainer-9"} and state.redos == []
    assert [e.event for e in state.events] == ["start", "finish"]
    assert state.foreign and state.table.step_view().tolist() == list(range(72))
    mine = run.shelved[-1]  # and the live run's own history is intact beside it
    assert mine.table.step_view().tolist() == list(range(80))
    assert [e.event for e in mine.events] == ["start"] and mine.lost_records == 0
    at = f" at {clock(t1)}" if said else ""
    verb = "replaced" if said else "started over"
    said_it = (
        f"metrics.jsonl {verb}{at}: now showing the file there (another run: run id run-B); "
        "the earlier history is not this file's"
    )
    summary = summarize(state, t1 + 60)
    assert summary["other_file"] == said_it
    assert summary["file_changes"][-1]["said"] == said_it
    assert f"file     {said_it}" in format_text(summary).splitlines()
    assert summary["health"] == "finished" and summary["global_step"] == 71


def test_a_new_file_with_no_record_of_our_schema_in_its_first_items_is_another_file() -> None:
    run = Run()
    path = RunPath(run)
    live = Training(path)
    live.start()
    live.steps(5)
    path.changed("replaced", live.t)
    path.write(b"not json\n" * (HOLD_ITEMS - 1))
    assert not run.state.foreign, "held until it is known whose it is"
    assert "has not said yet whose it is" in build_snapshot(run.state, live.t).files[-1].text
    path.write(b"still not json\n")
    assert run.state.foreign and run.state.records == 0
    snap = build_snapshot(run.state, live.t)
    assert snap.health is Health.UNREADABLE
    assert snap.other_file == (
        f"metrics.jsonl replaced at {clock(live.t)}: now showing the file there (no writer or "
        "run id of this run in it); the earlier history is not this file's"
    )
    assert run.shelved[-1].train_steps == 5


# ---- deleted, truncated -----------------------------------------------------------------


@pytest.mark.parametrize("lost", [0, 3])
def test_deleted_then_recreated_by_the_trainer_continues_the_same_history(lost: int) -> None:
    run = Run()
    path = RunPath(run)
    live = Training(path)
    live.start()
    live.steps(30)
    t1 = live.t
    path.changed("deleted", t1, size=None)  # gone: no file there yet
    assert build_snapshot(run.state, t1).files[-1].text == (
        f"metrics.jsonl deleted at {clock(t1)}; no file there yet (the history read before "
        "is shown)"
    )
    live.trainer.seq += lost  # records written into the deleted file after it was read
    path.changed("deleted", t1 + 2)  # the file there again, new
    path.write(
        live.file_event("deleted", t1 + 1),
        # its sibling writer adopts the file the trainer made, and says so in its turn
        live.sidecar.at(live.t).event("file", change="deleted", run_id=RUN_ID, noticed=t1 + 1.5),
    )
    live.steps(10)
    state = run.state
    assert not state.foreign and state.table.step_view().tolist() == list(range(40))
    assert state.lost_records == lost
    loss = "nothing lost" if not lost else f"{lost} records lost across it"
    assert [n.text for n in build_snapshot(state, live.t).files] == [
        f"metrics.jsonl deleted at {clock(t1)}; the trainer recreated it ({loss})"
    ]
    assert diagnose(state, live.t).health is Health.RUNNING


@pytest.mark.parametrize("said", [True, False], ids=["stream-said", "reader-alone"])
def test_a_truncated_file_keeps_the_history_read_and_says_so(said: bool) -> None:
    run = Run()
    path = RunPath(run)
    live = Training(path)
    live.start()
    live.steps(50)
    read = path.offset
    t1 = live.t
    if said:
        path.changed("truncated", t1, size=0)
    else:
        path.restarted()
    path.write(live.file_event("truncated", t1 + 0.5))
    live.steps(5)
    state = run.state
    assert state.table.step_view().tolist() == list(range(55)) and state.lost_records == 0
    text = build_snapshot(state, live.t).files[-1].text
    if said:
        assert text == (
            f"metrics.jsonl truncated at {clock(t1)} ({read:,} bytes gone from the host; the "
            "history read before is kept); nothing lost"
        )
    else:  # the writer's word (50,000 bytes then) and the reader's restart
        assert text == (
            f"metrics.jsonl truncated at {clock(t1 + 0.5)} (50,000 bytes gone from the host; "
            "the history read before is kept); nothing lost"
        )


def test_a_file_read_after_it_was_recreated_says_what_it_does_not_hold() -> None:
    """``summary`` reads the file once: the writer's event at its head is all there is."""
    run = Run()
    path = RunPath(run)
    trainer = Lines("trainer-1", T0, 1.0)
    trainer.seq = 812
    path.write(
        trainer.event("file", change="deleted", run_id=RUN_ID, noticed=T0 - 1, written_before=812),
        *(trainer.train(s, 1.0) for s in range(300, 305)),
    )
    summary = summarize(run.state, T0 + 6)
    assert summary["file_changes"] == [
        {
            "change": "deleted",
            "outcome": "here",
            "at": T0 - 1,
            "moved_to": None,
            "records_lost": None,
            "said": f"metrics.jsonl was deleted at {clock(T0 - 1)} and recreated by the "
            "trainer: the 812 records it wrote before are not in this file",
        }
    ]
    assert summary["lost_records"] == 0 and summary["health"] == "running"


def test_a_file_recreated_with_no_step_yet_is_no_start() -> None:
    """Read once right after the trainer made its file again (the one before deleted,
    mid-run: a validation under way), the file holds no step and no start: the run is
    not "No training step logged yet (0.2 s since start)", nor, later, silent "since
    start" with its logger lacking a handler."""
    run = Run()
    path = RunPath(run)
    trainer = Lines("trainer-1", T0, 1.0)
    trainer.seq = 812
    path.write(
        trainer.event("file", change="deleted", run_id=RUN_ID, noticed=T0 - 1, written_before=812),
        trainer.heartbeat(),
    )
    d = diagnose(run.state, T0 + 6)
    assert d.health == Health.RUNNING, d
    assert d.reason == (
        f"No step logged in this file yet: metrics.jsonl was deleted at {clock(T0 - 1)} and "
        "recreated by a writer of this run: the 812 records it wrote before are not in "
        "this file (7.0 s ago)."
    ), d.reason
    late = diagnose(run.state, T0 + 3600)  # its heartbeats stopped an hour ago: dead
    assert late.health == Health.DEAD and "first step" not in late.reason, late
    assert "with no step in this file (its steps before went with the one before)" in late.reason


def test_a_symbolic_link_the_trainer_refused_at_start_is_said() -> None:
    run = Run()
    trainer = Lines("trainer-1", T0, 1.0)
    run.feed(
        0,
        trainer.event(
            "file",
            change="refused",
            run_id=RUN_ID,
            noticed=T0,
            found="a symbolic link to /etc/shadow",
            moved_to="metrics.jsonl.refused-1",
            written_before=0,
        )
        + trainer.train(0, 1.0),
    )
    assert build_snapshot(run.state, T0 + 2).files[-1].text == (
        "metrics.jsonl: the trainer refused a symbolic link to /etc/shadow at start; moved "
        "aside to metrics.jsonl.refused-1; it writes its own file there"
    )


def test_a_nodes_file_replaced_by_another_is_left_out_of_the_multi_node_run() -> None:
    run = Run()
    node0, node1 = Lines("rank0", T0, 1.0), Lines("rank1", T0, 1.0)
    run.feed(0, b"".join(node0.train(s, 1.0) for s in range(20)), stream=0)
    head = node1.heartbeat()
    run.feed(0, head, stream=1)
    run.file_changed(FileChanged("replaced", T0 + 30, len(head), 0, stream=1))
    run.feed(0, b"".join(another_run(10)), stream=1)
    state = run.state
    assert state.table.step_view().tolist() == list(range(20)) and "trainer-9" not in state.writers
    assert build_snapshot(state, T0 + 31).files[-1].text == (
        f"metrics.jsonl of node 1 replaced at {clock(T0 + 30)} by another file: its records "
        "are not shown (the node's history read before is kept)"
    )


# ---- a full disk ------------------------------------------------------------------------


def full(at: float, room: int = 0) -> DiskSpace:
    return DiskSpace(avail=room, free=room, total=100 * GIB, room=room, at=at)


def test_a_full_disk_is_disk_full_not_a_hang_and_its_lost_records_are_counted_once() -> None:
    run = Run()
    path = RunPath(run)
    live = Training(path)
    live.start()
    live.steps(60)
    run.set_disk(full(live.t, room=5 * GIB))
    written = bytes(path.data)
    # the disk fills: every write fails; each record still takes its sequence number
    since = live.t
    for k in range(0, 300, 10):  # the agent's reports while the file does not grow
        run.set_disk(full(since + k))
    quiet = run.state
    verdict = diagnose(quiet, since + 295)
    assert verdict.health is Health.DISK_FULL and verdict.label == "DISK FULL"
    assert verdict.reason == (
        "Disk full on the host (0 B free on the run's filesystem): metrics cannot be "
        "written; how many records were not written is not known until space returns."
    )
    assert "hung" not in verdict.reason
    summary = summarize(quiet, since + 295)
    assert EXIT_BY_HEALTH[summary["health"]] == 11
    assert summary["disk"] == {
        "avail": 0,
        "free": 0,
        "total": 100 * GIB,
        "room": 0,
        "read_only": False,
        "at": since + 290,
    }
    quiet.liveness.set_process(True, since + 290)  # the app's probe: the trainer lives (and trains)
    assert diagnose(quiet, since + 295).health is Health.DISK_FULL
    # the same silence without the host's word on the disk: what was said before
    blind = Run()
    blind.feed(0, written)
    assert diagnose(blind.state, since + 295).health is Health.DEAD  # its heartbeats stopped
    blind.state.liveness.set_process(True, since + 290)
    hung = diagnose(blind.state, since + 295)
    assert hung.health is Health.STALLED and "looks hung" in hung.reason
    # space returns: each writer writes first how many records it could not write
    until = since + 300
    gaps = []
    for writer in (live.trainer, live.sidecar):
        first = writer.seq
        writer.seq += 300
        gaps.append(
            writer.at(until).event(
                "write_gap",
                reason="ENOSPC",
                records=300,
                first_seq=first,
                last_seq=first + 299,
                since=since,
                until=until,
            )
        )
    path.write(*gaps)
    live.t, live.step = until, 360
    live.steps(10)
    run.set_disk(full(live.t, room=2 * GIB))
    state = run.state
    assert diagnose(state, live.t).health is Health.RUNNING
    assert state.lost_records == 600  # the gaps: each not-written record once
    snap = build_snapshot(state, live.t)
    gap = f"300 records not written (disk full) between {clock(since)} and {clock(until)}"
    assert [g.sentence() for g in snap.write_gaps] == [gap, gap]
    assert "600 lost" in counts(snap).plain
    text = format_text(summarize(state, live.t))
    assert f"gap      {gap}" in text.splitlines()
    assert "lost records 600" in text


def test_a_full_disk_counts_what_the_writers_said_they_could_not_write() -> None:
    run = Run()
    path = RunPath(run)
    live = Training(path)
    live.start()
    live.steps(20)
    t = live.t
    path.write(
        live.sidecar.at(t).make(
            "heartbeat",
            written=40,
            dropped=37,
            bytes=0,
            errors={"ENOSPC": 3},
            sidecar={"dropped": 5, "errors": {"ENOSPC": 1}},
        )
    )
    run.set_disk(full(t + 100, room=4096))
    verdict = diagnose(run.state, t + 100)
    assert verdict.health is Health.DISK_FULL
    assert verdict.reason == (
        "Disk full on the host (4.0 KiB free on the run's filesystem): metrics cannot be "
        f"written; 42 records not written so far (the writers' count at {clock(t)})."
    )
    # a probe that says the trainer is gone is evidence of more than a full disk
    run.state.liveness.set_process(False, t + 100)
    assert diagnose(run.state, t + 100).health is Health.DEAD
    # a report older than the evidence it would explain says nothing
    stale = Run()
    stale.feed(0, bytes(path.data))
    stale.set_disk(full(t - 60))
    assert diagnose(stale.state, t + 100).health is Health.DEAD


def test_a_heartbeat_that_still_fits_on_a_full_disk_does_not_make_it_a_hang() -> None:
    """A small record may still fit in the slack of the file's last block while no
    step's record does: the disk is still why no metric comes (it was called hung)."""
    run = Run()
    path = RunPath(run)
    live = Training(path)
    live.start()
    live.steps(20)
    t = live.t
    path.write(live.sidecar.at(t + 40).make("heartbeat", written=40, dropped=9, bytes=0))
    run.set_disk(full(t + 45, room=4096))
    run.state.liveness.set_process(True, t + 45)
    verdict = diagnose(run.state, t + 45)
    assert verdict.health is Health.DISK_FULL, verdict.reason
    # with room, the same silence is a hang
    run.set_disk(full(t + 45, room=2 * GIB))
    assert diagnose(run.state, t + 45).health is Health.STALLED


def test_the_lost_count_is_the_sequence_gaps_once_everywhere() -> None:
    """The writer's ``dropped`` records consumed their sequence numbers: the gaps count
    them; adding the heartbeat's figure counted each twice (1,554 for 777)."""
    run = Run()
    path = RunPath(run)
    live = Training(path)
    live.start()
    live.steps(10)
    live.trainer.seq += 777  # dropped by the writer (a full queue, a full disk)
    live.dropped = 777  # and counted by it: its heartbeats say so from now on
    live.steps(10)
    snap = build_snapshot(run.state, live.t)
    summary = summarize(run.state, live.t)
    assert snap.lost == summary["lost_records"] == 777
    assert "777 lost" in counts(snap).plain
    assert "lost records 777" in format_text(summary)


# ---- through the app's pipeline -------------------------------------------------------


async def test_the_pipeline_keeps_order_and_gives_the_runs_manifest_to_its_own_history() -> None:
    own = Lines("trainer-1", T0, 1.0)
    first = own.event("start", pid=11, global_step=0, run_id=RUN_ID) + b"".join(
        own.train(s, 1.0) for s in range(30)
    )
    source = ReplayTransport([first])
    pipe = Pipeline(clock=lambda: T0 + 40)
    tasks = [
        asyncio.create_task(pipe.pump(source, lambda _: None)),
        asyncio.create_task(pipe.ingest()),
    ]
    try:
        source.push(FileChanged("replaced", T0 + 35, len(first), 1000))
        source.push(b"".join(another_run(12)))  # read from 0: the new file
        source.push(DiskSpace(avail=GIB, free=GIB, total=10 * GIB, room=GIB, at=T0 + 36))
        for _ in range(100):
            await asyncio.sleep(0.01)
            if pipe.run.state.foreign and pipe.run.state.disk:
                break
        assert pipe.run.state.global_step == 11 and pipe.run.state.foreign
        manifest = {"run_id": RUN_ID, "pid": 11, "epochs": 3}
        await pipe.set_status(Status(alive=True, manifest=manifest, now=T0 + 41), T0 + 40)
        assert pipe.run.shelved[-1].manifest == manifest  # the run's, not the other file's
        assert pipe.run.state.manifest == {} and pipe.run.shelved[-1].liveness.process_alive is True
        assert pipe.run.state.disk[0].room == GIB
    finally:
        for t in tasks:
            t.cancel()
    assert json.dumps(summarize(pipe.run.state, T0 + 40))  # JSON-ready


def test_a_file_replaced_again_before_it_said_whose_it_is_is_not_mixed_in() -> None:
    run = Run()
    path = RunPath(run)
    live = Training(path)
    live.start()
    live.steps(10)
    t1 = live.t
    path.changed("replaced", t1)
    path.write(b"some other program's output\n" * 3)  # no record of ours yet
    path.changed("replaced", t1 + 1)
    path.write(live.file_event("replaced", t1 + 0.5, moved_to="metrics.jsonl.replaced-1"))
    live.steps(5)
    state = run.state
    assert not state.foreign and state.malformed_count == 0  # none of the other file's lines
    assert state.table.step_view().tolist() == list(range(15)) and state.lost_records == 0
    assert run.shelved[-1].malformed_count == 3
    assert [n.outcome.value for n in state.file_notices] == ["other", "back"]


def test_another_runs_file_read_afresh_is_not_judged_as_this_run() -> None:
    """Another run's metrics.jsonl moved over this run's, then read afresh (``summary``,
    a monitor opened then): its "stopped after step 105" was said of this live run at
    step 50 (exit 7), its step over this run's total. Not this run's: unreadable."""
    other = Lines("w-other", T0, 1.0)
    run = Run()
    RunPath(run).write(
        other.event("start", run_id="other-run"),
        *(other.train(s, 1.0) for s in range(105)),
        other.event("interrupt", step=105, run_id="other-run"),
    )
    run.state.set_manifest({"run_id": RUN_ID, "pid": 4242, "total_steps": 240})
    d = diagnose(run.state, other.ts + 5)
    assert d.health == Health.UNREADABLE, d
    assert d.reason.startswith(
        f"metrics.jsonl holds another run's records (run other-run), not this directory's "
        f"(its run.json names run {RUN_ID})"
    ), d.reason
    assert EXIT_BY_HEALTH[d.health.value] == 10
    # its own file back (the trainer moved the other aside): judged as itself
    own = Run()
    mine = Lines("trainer-1", T0, 1.0)
    RunPath(own).write(mine.event("start", run_id=RUN_ID), mine.train(0, 1.0))
    own.state.set_manifest({"run_id": RUN_ID, "pid": 4242})
    assert diagnose(own.state, mine.ts + 1).health == Health.RUNNING
