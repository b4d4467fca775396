"""A torchrun run in the model: several ranks, several nodes (hosts), several files.

Pure and fast: the lines are the shapes the telemetry writes under torchrun
(tests/test_torchrun.py and tests/transport/test_multinode.py produce them for real).
"""

from __future__ import annotations

from typing import Any

from eagle3_tui.app.pipeline import coalesce
from eagle3_tui.model.health import diagnose
from eagle3_tui.model.run import Run
from eagle3_tui.model.snapshot import build_snapshot
from eagle3_tui.model.verdict import Health
from eagle3_tui.transport.base import Chunk
from tests.records import Lines

T0 = 1_000_000.0
MANIFEST: dict[str, Any] = {"pid": 100, "world_size": 2, "host": "node0"}


def heartbeat(lines: Lines, rank: int, host: str, last_step: int, where: dict[str, Any]) -> bytes:
    return lines.make(
        "heartbeat", rank=rank, host=host, last_step=last_step, where=where, written=0, bytes=0
    )


def two_ranks(steps: int = 20) -> tuple[Lines, Lines, Lines, list[bytes]]:
    """Rank 0's trainer (metrics), its sidecar (GPUs, heartbeat) and rank 1's sidecar."""
    t, s0, s1 = Lines("t0", T0, 0.5), Lines("s0", T0, 0.5), Lines("s1", T0, 0.5)
    out = [t.event("start", pid=100, global_step=0)]
    for step in range(steps):
        out.append(t.train(step, 2.0 - step / 100))
        if step % 2 == 0:
            out.append(s0.gpu(98.0))  # the fixture's busy GPUs: NCCL waits spin at 100 % too
            where = {"frame": "trainer.py:540 train_epoch", "collective": None, "for_s": 0.0}
            out.append(heartbeat(s0, 0, "node0", step, where))
            out.append(heartbeat(s1, 1, "node0", step, where))
    return t, s0, s1, out


def run_of(parts: list[bytes]) -> Run:
    run = Run()
    data = b"".join(parts)
    run.feed(0, data)
    run.state.set_manifest(MANIFEST)
    return run


def test_a_hung_rank_is_stalled_naming_it_and_the_rank_that_waits() -> None:
    _, s0, s1, out = two_ranks()
    last = T0 + 20
    for k in range(40):  # 20 s more of heartbeats, no metric: rank 1 blocked, rank 0 waits
        ts = last + k * 0.5
        waits = {"frame": "distributed_c10d.py:4394 all_gather_single"}
        out.append(
            heartbeat(s0.at(ts), 0, "node0", 19, {**waits, "collective": "all_gather_single"})
        )
        out.append(
            heartbeat(s1.at(ts), 1, "node0", 19, {"frame": "loader.py:12 fetch", "for_s": k / 2})
        )
        out.append(s0.at(ts).gpu(99.0))
    run = run_of(out)
    d = diagnose(run.state, last + 40)
    # before: "silent" (the GPU looked busy) — a distributed hang is told by its ranks
    assert d.health is Health.STALLED, d
    assert "rank 1 stopped at step 20 (in loader.py:12 fetch for 20 s)" in d.reason, d.reason
    assert "rank 0 waits for it in a collective (all_gather_single) at step 20" in d.reason


def test_a_dead_rank_is_named_not_the_rank_that_raised_because_of_it() -> None:
    t, _s0, s1, out = two_ranks()
    at = T0 + 30
    peer = "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]"
    out.append(t.at(at).event("crash", step=20, error=peer))
    gone = "the trainer process 101 exited without a finish event (killed by SIGKILL: ...)"
    out.append(
        s1.at(at + 0.4).make(
            "lifecycle",
            event="crash",
            rank=1,
            pid=101,
            host="node1",
            step=19,
            exit_status=-9,
            error=gone,
        )
    )
    out.append(t.at(at + 1).event("interrupt", step=20))
    d = diagnose(run_of(out).state, at + 5)
    assert d.health is Health.DEAD, d
    # its sidecar's crash names the last step's 0-based index (19): 20 steps done, as the
    # other rank's own crash and every view count them
    assert d.reason.startswith("Rank 1 (pid 101 on node1) died after step 20: killed by SIGKILL")


def test_a_kill_that_stopped_every_rank_is_stopped_even_if_a_rank_was_escalated() -> None:
    t, _s0, s1, out = two_ranks()
    out.append(t.at(T0 + 30).event("interrupt", step=20))
    out.append(s1.at(T0 + 40).make("lifecycle", event="crash", rank=1, pid=101, exit_status=-9))
    assert diagnose(run_of(out).state, T0 + 45).health is Health.STOPPED


def test_a_crash_before_a_resume_is_history() -> None:
    t, _s0, s1, out = two_ranks()
    out.append(s1.at(T0 + 30).make("lifecycle", event="crash", rank=1, pid=101, exit_status=-9))
    out.append(t.at(T0 + 60).event("resume", pid=200, global_step=12))
    out.append(t.train(12, 1.5))
    out.append(heartbeat(s1.at(T0 + 60.5), 1, "node0", 12, {"frame": "trainer.py:1 x"}))
    d = diagnose(run_of(out).state, T0 + 61)
    assert d.health is Health.RUNNING, d


def test_gpus_of_two_nodes_are_two_sets_and_reads_add_up_per_rank() -> None:
    a, b = Lines("a", T0, 1.0), Lines("b", T0 + 0.01, 1.0)  # one record a second each
    ga, gb = Lines("ga", T0, 1.0), Lines("gb", T0, 1.0)
    parts = []
    for _ in range(6):
        parts.append(ga.make("gpu", status="ok", host="node0", devices=[{"index": 0, "util": 90}]))
        parts.append(gb.make("gpu", status="ok", host="node1", devices=[{"index": 0, "util": 10}]))
        for lines, rank, host in ((a, 0, "node0"), (b, 1, "node1")):
            workers = [{"pid": 200, "role": "main", "read_bytes": 1e6, "files": []}]
            parts.append(
                lines.make("io", rank=rank, host=host, interval_s=1.0, workers=workers, bytes=1e6)
            )
    state = run_of(parts).state
    assert sorted(state.samplers.gpu_devices) == [("node0", 0), ("node1", 0)]
    assert state.samplers.gpu_utils(("node1", 0)) != []
    snap = build_snapshot(state, T0 + 30)
    assert [(g.host, g.index, g.util) for g in snap.gpus] == [("node0", 0, 90), ("node1", 0, 10)]
    assert snap.io is not None and snap.io.ranks == 2
    # each rank reads 1 MB/s: 2 MB/s in all (interleaved records read as one sampler: ~1)
    assert snap.io.bytes_per_s is not None and 1.9e6 < snap.io.bytes_per_s < 2.1e6
    assert sorted((w.rank, w.pid) for w in snap.io.workers) == [(0, 200), (1, 200)]


def test_two_files_feed_one_run_each_with_its_own_torn_lines() -> None:
    t, s1 = Lines("t0", T0, 0.5), Lines("s1", T0, 0.5)
    node0 = b"".join(t.train(i, 1.0) for i in range(10))
    node1 = b"".join(heartbeat(s1, 1, "node1", i, {"frame": "x"}) for i in range(10))
    run = Run()
    cut0, cut1 = len(node0) // 2 + 3, len(node1) // 3 + 5  # both cut mid-line
    chunks = [
        Chunk(0, node0[:cut0], 0),
        Chunk(0, node1[:cut1], 1),
        Chunk(cut0, node0[cut0:], 0),
        Chunk(cut1, node1[cut1:], 1),
    ]
    assert [c.stream for c in coalesce(chunks)] == [0, 1, 0, 1]
    for c in coalesce(chunks):
        run.feed(c.offset, c.data, c.stream)
    state = run.state
    assert state.train_steps == 10 and state.malformed_count == 0 and state.lost_records == 0
    assert (
        state.samplers.rank_heartbeats[1].last_step == 9
        and state.samplers.rank_heartbeats[1].host == "node1"
    )


def test_a_crash_its_sidecar_saw_late_counts_the_steps_logged_before_it() -> None:
    """The sidecar's crash record carried the last step it had heard of (10, 0-based),
    older than the last one logged (11): the log panel said "crash after step 11" beside
    the banner's 12."""
    lines = Lines("4242-a1b2c3", T0, 0.5)
    side = Lines("4243-sidecar", T0, 0.5)
    out = [lines.event("start", pid=4242)]
    out += [lines.train(s, 1.0) for s in range(12)]
    gone = "the trainer process 4242 exited without a finish event (killed by SIGKILL: ...)"
    out.append(side.at(lines.ts).make("lifecycle", event="crash", pid=4242, step=10, error=gone))
    state = run_of(out).state
    crash = state.events[-1]
    assert crash.event == "crash" and crash.shown_step == 12, crash  # the log panel's
    assert "after step 12" in diagnose(state, lines.ts + 5).reason


def test_a_step_whose_line_came_after_its_sidecars_crash_still_counts() -> None:
    """Two writers: the trainer's last step (ts before the crash) reached the file after
    the sidecar's crash line; read afresh, the log panel said "crash after step 80"
    where the live monitor had said 81."""
    lines = Lines("4242-a1b2c3", T0, 0.5)
    side = Lines("4243-sidecar", T0, 0.5)
    out = [lines.event("start", pid=4242)]
    out += [lines.train(s, 1.0) for s in range(11)]
    last = lines.train(11, 1.0)  # logged at lines.ts - 0.5, written after the crash
    gone = "the trainer process 4242 exited without a finish event (killed by SIGKILL: ...)"
    out.append(side.at(lines.ts).make("lifecycle", event="crash", pid=4242, step=10, error=gone))
    out.append(last)
    state = run_of(out).state
    crash = next(e for e in state.events if e.event == "crash")
    assert crash.shown_step == 12, crash
    assert "after step 12" in diagnose(state, lines.ts + 5).reason


def test_a_rank_held_stopped_in_a_validation_is_stalled_naming_the_rank() -> None:
    """torchrun, ``kill -STOP`` of rank 1's trainer during a validation: its sidecar
    found it in state T, rank 0 waited in a collective, and the verdict stayed "RUNNING:
    Validating (epoch 9/10) for 65 s; metrics resume after it" (exit 0) for minutes: only
    rank 0's trainer's stop was looked at."""
    t, s0, s1, out = two_ranks()
    out.append(t.at(T0 + 10.5).log("Validation epoch 1/10 started"))
    where = {"frame": "distributed_c10d.py:4394 all_gather_single", "for_s": 0.0}

    def beat(lines: Lines, rank: int, pid: int, state: str, at: float) -> bytes:
        trainer = {"pid": pid, "alive": True, "state": state, "cpu_s": 5.0}
        return lines.at(at).make(
            "heartbeat", rank=rank, host="node0", last_step=19, where=where, written=0,
            bytes=0, trainer=trainer,
        )  # fmt: skip

    for k in range(50):
        at = T0 + 11 + k
        out.append(beat(s0, 0, 100, "S", at))
        out.append(beat(s1, 1, 101, "T", at))
    run = run_of(out)
    d = diagnose(run.state, T0 + 61)
    assert d.health is Health.STALLED, d
    assert "Rank 1's trainer (pid 101) has been held stopped for 50 s" in d.reason, d.reason
    assert "kill -CONT 101" in d.reason, d.reason
    # an earlier process's rank, its sidecar long silent: not this run's now
    assert diagnose(run.state, T0 + 61 + 600).reason.find("pid 101") == -1


def test_a_stopped_ranks_frame_seen_for_no_time_says_no_duration() -> None:
    """ "rank 1 stopped at step 23 (in tiny.py:212 <lambda> for 0.0 s)" 40 s into the stall."""
    _, s0, s1, out = two_ranks()
    last = T0 + 20
    for k in range(40):
        ts = last + k * 0.5
        waits = {"frame": "distributed_c10d.py:4394 all_gather_single"}
        out.append(
            heartbeat(s0.at(ts), 0, "node0", 19, {**waits, "collective": "all_gather_single"})
        )
        out.append(heartbeat(s1.at(ts), 1, "node0", 19, {"frame": "tiny.py:212", "for_s": 0.0}))
    d = diagnose(run_of(out).state, last + 40)
    assert d.health is Health.STALLED, d
    assert "rank 1 stopped at step 20 (in tiny.py:212)" in d.reason, d.reason
