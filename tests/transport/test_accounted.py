"""A companion that accounts for every byte (telemetry/columns.py's sample blocks,
agent/column_plan.py's ``Listing``): the writers list their samples as well as their
steps and events, and a range whose rows, samples and events add up to its every
byte is read from the companion alone (its events, and the lines at its rows' ends,
read and checked); anything else is read as before. Either way the model ends where
the lines themselves take it."""

from __future__ import annotations

import json
import os
import random
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eagle3_tui.agent import column_plan
from eagle3_tui.agent.glance import _unpack
from eagle3_tui.agent.names import SUMMARY_HISTORY
from eagle3_tui.model.run import Run
from eagle3_tui.model.summary import summarize
from eagle3_tui.telemetry.column_log import index_file
from eagle3_tui.telemetry.columns import (
    COLUMNS_FILE,
    HEAD,
    MAGIC,
    MARK_MAGIC,
    SAMPLE_MAGIC,
    SAMPLED_KINDS,
    encode_samples,
    walk_blocks,
)
from eagle3_tui.telemetry.writer import JsonlWriter
from eagle3_tui.transport.base import Chunk
from eagle3_tui.transport.channel import DataFrame
from eagle3_tui.transport.local import LocalTransport, iter_chunks, iter_frames
from tests.records import Lines
from tests.transport.test_columnar import COLUMNS, messy_run, state_of
from tests.transport.test_compressed import agent_output, parse, payload_blocks

GPU = {"status": "ok", "devices": [{"index": i, "util": 90.0 + i} for i in range(8)]}


def write_run(path: Path, steps: int, foreign: int = 0, seed: int = 1, every: int = 2) -> None:
    """A trainer's writer (its steps, events and its own heartbeats) and a sidecar's
    (GPU, read and heartbeat samples, after every ``every`` steps) writing into one
    file, as a run does; ``foreign``: that many lines appended meanwhile by no writer."""
    rng = random.Random(seed)
    trainer = JsonlWriter(path, writer_id="rank0")
    sidecar = JsonlWriter(path, writer_id="sidecar", columns=False, background=False)
    foreign_at = set(rng.sample(range(steps), foreign))
    for i in range(steps):
        trainer.write_deferred(
            "train",
            {
                "train": {"loss": 3.0 - i * 1e-4 + rng.random() * 0.1},
                "epoch": i // 2000,
                "lr": 1e-4,
            },
            step=i,
        )
        if i % every == 0:
            sidecar.write("gpu", GPU)
            sidecar.write("io", {"interval_s": 1.0, "bytes": 1e6, "files_read": 2, "workers": []})
            sidecar.write("heartbeat", {"written": i, "dropped": 0, "bytes": 0})
        if i % 7 == 0:
            trainer.write("heartbeat", {"written": i, "dropped": 0, "bytes": 0})
        if i % 1500 == 0:
            trainer.write("ckpt", {"event": "saved", "path": f"/ckpt/{i}", "complete": True})
            trainer.write("log", {"level": "INFO", "logger": "speculators", "msg": f"at {i}"})
        if i in foreign_at:
            trainer.flush()
            with open(path, "ab") as f:
                f.write(b'{"logger": "mine", "msg": "a line of no writer"}\n')
    trainer.close()
    sidecar.close()


def companion(path: Path) -> list[tuple[bytes, dict[str, Any], memoryview]]:
    blocks = walk_blocks(path.with_name(COLUMNS_FILE).read_bytes())
    return [(magic, json.loads(head), body) for magic, head, body in blocks]


def frames_read(monkeypatch: pytest.MonkeyPatch, path: Path) -> tuple[list[DataFrame], int]:
    """This machine's columnar read of ``path``, and the bytes of it that were read."""
    read = 0
    real = os.pread

    def counting(fd: int, n: int, offset: int) -> bytes:
        nonlocal read
        data = real(fd, n, offset)
        if os.fstat(fd).st_ino == path.stat().st_ino:
            read += len(data)
        return data

    with monkeypatch.context() as patched:
        patched.setattr(os, "pread", counting)
        frames = list(iter_frames(path))
    return frames, read


def plain_frames(path: Path) -> list[DataFrame]:
    return [DataFrame(c.offset, c.data) for c in iter_chunks(path)]


def listed_lines(h: dict[str, Any], body: memoryview) -> list[tuple[Any, ...]]:
    """A sample block's lines: (offset, length, kind, writer, seq, ts) each."""
    cols: dict[str, list[Any]] = {}
    at = 0
    for name, kind, size in h["cols"]:
        cols[name] = _unpack(kind, bytes(body[at : at + size]), h["n"])
        at += size
    kinds = [h["kinds"][k] for k in cols["kind"]]
    writers = [h["writers"][w] for w in cols["w"]]
    return list(
        zip(cols["@off"], cols["@len"], kinds, writers, cols["seq"], cols["ts"], strict=True)
    )


def test_the_writers_account_for_every_byte(tmp_path: Path) -> None:
    """Rows, samples and events, each writer's own, add up to the whole file, and each
    sample block names exactly the sampler lines of its writer: where each is, its
    kind, writer, sequence number and time."""
    path = tmp_path / "metrics.jsonl"
    write_run(path, 5000)
    data = path.read_bytes()
    rows = samples = marks = 0
    listed: dict[int, tuple[Any, ...]] = {}
    for magic, h, body in companion(path):
        if magic == MAGIC:
            rows += h["bytes"]
        elif magic == MARK_MAGIC:
            marks += sum(n for _, n, _ in h["marks"])
        elif magic == SAMPLE_MAGIC:
            lines = listed_lines(h, body)
            assert sum(x[1] for x in lines) == h["bytes"]
            samples += h["bytes"]
            listed.update((x[0], x[1:]) for x in lines)
    assert rows + samples + marks == len(data), "every byte is a listed line"
    found = 0
    at = 0
    for line in data.splitlines(keepends=True):
        rec = json.loads(line)
        if rec["kind"] in SAMPLED_KINDS:
            want = (len(line), rec["kind"], rec["w"], rec["seq"], rec["ts"])
            assert listed[at] == want
            found += 1
        at += len(line)
    assert found == len(listed) > 7000, "the trainer's heartbeats and the sidecar's samples"


def test_an_accounted_read_reads_only_the_events_and_ends_in_the_plain_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This machine's read (the summary's) and the agent's (over SSH): the same state
    as reading every line, while of the file only its end, its events and the lines
    at its blocks' edges are read; a sample block the sidecar wrote once serves the
    frames of several of the trainer's blocks."""
    path = tmp_path / "metrics.jsonl"
    write_run(path, 20_000, every=1)
    size = path.stat().st_size
    monkeypatch.setattr(column_plan, "CHUNK", 256 << 10)  # the newest samples found so
    frames, read = frames_read(monkeypatch, path)
    blocks = [len(payload_blocks(f.data)) for f in frames if f.span >= 0]
    assert sum(blocks) == 19, "every block but the last, as columns"
    assert max(blocks) > 1, "consecutive blocks alike share a frame"
    accounted = [f for f in frames if f.span >= 0 and b'"listed"' in f.data[:200_000]]
    assert sum(len(payload_blocks(f.data)) for f in accounted) >= 17, (
        "all but the blocks among the newest samples (read whole)"
    )
    # read: the blocks among the newest samples and the last block, whole; looking back
    # for the newest samples; the events; a line at each accounted block's edges
    assert read < size * 0.2, f"{read} of {size} bytes read"
    want = state_of(plain_frames(path))
    assert state_of(frames) == want
    cols = parse(agent_output(tmp_path, **COLUMNS), [5000, 120_000, 300_001])
    assert state_of(cols) == want
    heads = [f.data[4 : 4 + int.from_bytes(f.data[:4], "little")] for f in cols if f.span >= 0]
    listed = [h for h in map(json.loads, heads) if "listed" in h]
    assert sum(len(h.get("pieces", [h])) for h in listed) >= 16, "blocks, in fewer frames"
    assert not any("stubs" in h for h in listed)
    sent = sum(len(h.get("listings", ())) for h in listed)
    named = {i for h in listed for i, _, _ in h["listed"]}
    assert sent == len(named) < sum(len(h["listed"]) for h in listed), "sent once, used again"


def test_a_line_no_writer_listed_is_read_and_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lines appended by no writer: the ranges that hold them do not add up, so they are
    read whole (the plain state, the foreign lines counted as the plain read counts them)."""
    path = tmp_path / "metrics.jsonl"
    write_run(path, 9000, foreign=2, seed=4)
    frames, read = frames_read(monkeypatch, path)
    run = Run()
    for f in frames:
        run.feed_frame(f)
    assert run.state.plain_records == 2
    assert read > path.stat().st_size * 0.2, "the ranges with them were read"
    assert state_of(frames) == state_of(plain_frames(path))


def forge(lines: list[tuple[Any, ...]], ident: tuple[int, int], shift: int) -> bytes:
    """A sample block listing ``lines`` (each ``shift`` bytes off) as of file ``ident``."""
    offs, lens, kinds, writers, seqs, times = (list(c) for c in zip(*lines, strict=True))
    return encode_samples(
        ident,
        [o + shift for o in offs],
        lens,
        [k.encode() for k in kinds],
        [w.encode() for w in writers],
        seqs,
        times,
    )


@pytest.mark.parametrize("how", ["twice", "another_file", "shifted"])
def test_a_listing_that_does_not_add_up_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A sample block appended twice (its lines listed twice), one naming another file,
    one whose lines are not where it says (in its place): the plain read's state."""
    path = tmp_path / "metrics.jsonl"
    write_run(path, 6000)
    comp = path.with_name(COLUMNS_FILE)
    blocks = walk_blocks(comp.read_bytes())
    k = next(i for i, b in enumerate(blocks) if b[0] == SAMPLE_MAGIC)
    h = json.loads(blocks[k][1])
    lines = listed_lines(h, blocks[k][2])
    raw = [
        HEAD.pack(m, len(hd), len(b), zlib.crc32(b, zlib.crc32(hd))) + hd + b for m, hd, b in blocks
    ]
    ident = (h["dev"], h["ino"] + (how == "another_file"))
    if how == "shifted":
        raw[k] = forge(lines, ident, 3)
    else:
        raw.append(forge(lines, ident, 0))
    comp.write_bytes(b"".join(raw))
    frames, _ = frames_read(monkeypatch, path)
    plain = state_of(plain_frames(path))
    assert state_of(frames) == plain
    assert state_of(parse(agent_output(tmp_path, **COLUMNS), [])) == plain


def summary_of(frames: list[DataFrame]) -> str:
    run = Run()
    for f in frames:
        run.feed_frame(f)
    summary = summarize(run.state, 2_000_000.0)
    if isinstance(summary["tokens_per_s"], float):  # old blocks' tokens are summed on the
        # host (agent/column_plan.py's pace_summed): the same to its last bits or so
        summary["tokens_per_s"] = float(f"{summary['tokens_per_s']:.12g}")
    out = json.dumps(summary, sort_keys=True, default=str)
    # (a metric the last step lacks: null or NaN by how that step was decoded, as in
    # test_columnar's state_of)
    return out.replace('"NaN"', "null")


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(seed=st.integers(0, 10_000), steps=st.integers(3000, 8000), block=st.sampled_from([50, 300]))
def test_a_summary_reads_of_the_older_steps_only_what_it_says_and_says_the_same(
    tmp_path_factory: pytest.TempPathFactory, seed: int, steps: int, block: int
) -> None:
    """``summary``'s read (SUMMARY_HISTORY: of the steps before the newest 2048 only the
    loss, the envelope and the pace's timings; a metric the run stopped logging whole):
    on messy runs (lost and repeated records, resumes, NaN losses, a metric that comes
    and goes, samples), over the agent and on this machine, its summary is every line's."""
    run_dir = tmp_path_factory.mktemp("history")
    path = run_dir / "metrics.jsonl"
    path.write_bytes(messy_run(steps, seed, samples=0.5))
    index_file(str(path), block_rows=block)
    want = summary_of(plain_frames(path))
    narrow = agent_output(run_dir, **COLUMNS, history=SUMMARY_HISTORY)
    frames = parse(narrow, [])
    assert summary_of(frames) == want
    assert summary_of(list(iter_frames(path, SUMMARY_HISTORY))) == want
    full = parse(agent_output(run_dir, **COLUMNS), [])
    assert sum(len(f.data) for f in frames) < sum(len(f.data) for f in full), "fewer bytes"


async def test_the_monitor_catches_up_on_a_local_run_as_the_agent_would(tmp_path: Path) -> None:
    """A local run's stream (the monitor's): a long catch-up takes what the companion
    stands for as columns frames, the model ends in the plain state, and lines appended
    after it come as bytes."""
    path = tmp_path / "metrics.jsonl"
    write_run(path, 6000)
    size = path.stat().st_size
    transport = LocalTransport(tmp_path, columnar_min=1 << 20)
    chunks: list[Chunk] = []
    stream = transport.stream()
    try:
        async for ev in stream:
            if isinstance(ev, Chunk):
                chunks.append(ev)
                if ev.end == size:
                    with path.open("ab") as f:  # a step appended after the catch-up
                        f.write(Lines("late").train(9999, 1.0))
                elif ev.end > size:
                    break
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    blocks = sum(len(payload_blocks(c.data)) for c in chunks if c.span >= 0)
    assert blocks == 5, "every block but the last, as columns"
    assert chunks[-1].span < 0 and chunks[-1].end > size, "then the appended line, as bytes"
    frames = [DataFrame(c.offset, c.data, c.span) for c in chunks]
    assert state_of(frames) == state_of(plain_frames(path))


def test_a_plan_holds_its_sample_blocks_places_in_arrays_not_objects(tmp_path: Path) -> None:
    """While a read is planned, every sample block's places are held (a 1M-step run's:
    3M of them): as lists they were an int object each, ~120 MB of small-object memory
    the process kept after the read. Now the plan holds a few objects a block."""
    import gc
    import sys

    path = tmp_path / "metrics.jsonl"
    write_run(path, 12_000, every=1)  # 36,000 samples
    samples = sum(h["n"] for m, h, _ in companion(path) if m == SAMPLE_MAGIC)
    assert samples >= 36_000
    fd = os.open(path, os.O_RDONLY)
    try:
        gc.collect()
        before = sys.getallocatedblocks()
        plan = column_plan.column_plan(fd, str(path), 0, os.fstat(fd).st_size)
        held = sys.getallocatedblocks() - before
    finally:
        os.close(fd)
    assert len(plan) > 5 and any(seg.samples for seg in plan)
    assert held < samples / 2, f"{held} objects held for {samples} samples' places"


def test_a_plan_gives_its_first_segments_before_it_reads_the_later_sample_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sample block is read (its places unpacked and checked) when a range first
    reaches it, not all before the first segment (a 1M-step run's 977 blocks took the
    agent ~0.25 s before its first frame): the first frames travel while later ones
    are planned, and the plan is the same."""
    from eagle3_tui.agent import listing

    path = tmp_path / "metrics.jsonl"
    write_run(path, 12_000, every=1)
    blocks = sum(1 for m, _, _ in companion(path) if m == SAMPLE_MAGIC)
    reads: list[int] = []
    real = listing._read

    def read(unread: listing.Unread) -> object:
        reads.append(unread[0])
        return real(unread)

    monkeypatch.setattr(listing, "_read", read)
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        segments = column_plan.planned(fd, str(path), 0, size)
        first = next(segments)
        early = len(reads)
        planned = [first, *segments]
        in_plan = reads[:]
        whole = column_plan.column_plan(fd, str(path), 0, size)
    finally:
        os.close(fd)
    assert blocks >= 4 and first.samples
    assert early <= 2, f"{early} of {blocks} sample blocks read before the first segment"
    assert len(set(in_plan)) == len(in_plan) > early, "each read once, as the ranges reach it"
    assert [(s.start, s.end, len(s.samples)) for s in planned] == [
        (s.start, s.end, len(s.samples)) for s in whole
    ]


@pytest.fixture
def summed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of each block whose pace timings the agent sends as their sum."""
    out: list[int] = []
    real = column_plan.pace_summed

    def counted(kept: Any, n: int, tokens: float) -> Any:
        out.append(n)
        return real(kept, n, tokens)

    monkeypatch.setattr(column_plan, "pace_summed", counted)
    return out


def test_old_blocks_pace_timings_go_as_their_sums_and_the_pace_is_the_same(
    tmp_path: Path, summed: list[int]
) -> None:
    """Of a summary's old blocks (all rows over ``pace_sums_s`` before the newest, no
    process starting among their lines), the two timing columns go as one sum on the
    last row: the pace (current process's tokens over its time) is every line's, a
    block where a process starts is sent whole (benchmarks/bench_open.py: a 1M-step
    run's read 15.4 -> 9.1 MB)."""
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(messy_run(6000, 7, samples=0.5))
    index_file(str(path), block_rows=300)
    want = json.loads(summary_of(plain_frames(path)))
    frames = list(iter_frames(path, SUMMARY_HISTORY))
    got = json.loads(summary_of(frames))
    assert len(summed) >= 5, summed
    assert got["tokens_per_s"] == want["tokens_per_s"] and got["pace_over"] == want["pace_over"]


def test_a_block_where_a_process_resumes_keeps_its_timings(
    tmp_path: Path, summed: list[int]
) -> None:
    """A resume in the middle of a block: that block's rows are two processes', and the
    pace counts only the current one's; its timings go row by row, as every line's."""
    lines = Lines(t0=1_000_000.0, dt=0.5)
    out = [lines.event("start")]
    for s in range(3150):
        out.append(lines.train(s, 1.0))
    out.append(lines.event("resume", step=3100))
    for s in range(3100, 6000):
        row = lines.train(s, 1.0)
        out.append(row.replace(b'"tokens_per_s": 1000.0', b'"tokens_per_s": %d.5' % (2000 + s % 7)))
    out.append(lines.event("finish", step=6000))
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"".join(out))
    index_file(str(path), block_rows=300)
    want = json.loads(summary_of(plain_frames(path)))
    got = json.loads(summary_of(list(iter_frames(path, SUMMARY_HISTORY))))
    # its steps took 200 tokens each (the process before: 100)
    assert want["pace_over"] == "run" and want["tokens_per_s"] / want["steps_per_s"] > 190
    assert len(summed) >= 5 and got["tokens_per_s"] == want["tokens_per_s"], (got, want)
