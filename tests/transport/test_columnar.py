"""The columnar catch-up (telemetry/columns.py, agent/column_plan.py, model/segments.py):
whatever the file and its companion hold, the model ends exactly where the lines
themselves take it, and a disconnect in the middle loses and repeats nothing."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eagle3_tui.agent.names import COLUMNS_WANTED, COMPRESS_ZLIB
from eagle3_tui.model.inflate import inflate_ahead
from eagle3_tui.model.run import Run
from eagle3_tui.model.samples import SAMPLES_KEPT
from eagle3_tui.model.summary import summarize
from eagle3_tui.telemetry.column_log import index_file
from eagle3_tui.telemetry.columns import COLUMNS_FILE, read_blocks
from eagle3_tui.telemetry.writer import JsonlWriter
from eagle3_tui.transport.base import Link
from eagle3_tui.transport.channel import DataFrame
from tests.records import Lines
from tests.transport.conftest import ssh_target
from tests.transport.sshd import Sshd
from tests.transport.test_compressed import (
    agent_output,
    frame_kinds,
    parse,
    payload_blocks,
    payload_header,
)
from tests.transport.test_ssh_stream import (
    Follower,
    client,
    drop_mid_catch_up,
    stream_host,
)

__all__ = ["client"]  # the fixture, used by name

COLUMNS = {"compress": COMPRESS_ZLIB, "columns": COLUMNS_WANTED, "samples": SAMPLES_KEPT}


def state_of(frames: list[DataFrame], ahead: bool = False) -> tuple[object, ...]:
    """Everything the model holds after these frames, exactly (floats unrounded).
    ``ahead``: each columns frame's columns inflated beforehand, as a long local read
    inflates them in a thread (every one of them used)."""
    run = Run()
    for f in frames:
        if ahead and f.span >= 0:
            inflated = inflate_ahead(f.data)
            run.feed(f.offset, f.data, 0, f.span, inflated)
            assert inflated == {} or inflated is None, "an inflated column left unused"
        else:
            run.feed_frame(f)
    s = run.state
    return (
        list(s.table.steps),
        list(s.table.ts),
        {k: bytes(v) for k, v in sorted(s.table.columns.items())},
        # the newest value of each metric at full precision; one of a metric the last step
        # lacks is None or NaN by how the plain read itself decoded that step (a learned
        # typed decoder fills a missing key with NaN; the general one leaves it out)
        {k: "-" if v is None or v != v else repr(v) for k, v in sorted(s.table.latest.items())},
        s.records,
        s.malformed_count,
        [m.reason for m in s.malformed],  # (where one is reported differs by decode path)
        {w: (x.next_seq, x.lost, x.duplicates) for w, x in sorted(s.writers.items())},
        [(r.first, r.last) for r in s.redos],
        [(e.event, e.ts) for e in s.events],
        list(s.startups),
        (s.epoch, s.ttt_steps, s.first_ts, s.last_ts, s.last_train_ts, s.plain_records),
        [(c.event, c.path) for c in s.ckpt_events],
        len(s.logs),
        sorted(s.samplers.gpu_devices),
        [(t, [(d.index, d.util) for d in devs]) for t, devs in s.samplers.gpu_samples],
        [(p.ts, p.bytes, p.files_read) for p in s.samplers.io_history],
        list(s.samplers.recent_files),
        (s.samplers.heartbeat.seq if s.samplers.heartbeat else None, s.samplers.last_heartbeat_ts),
        sorted((r, h.seq) for r, h in s.samplers.rank_heartbeats.items()),
        json.dumps(summarize(s, 2_000_000.0), sort_keys=True, default=str).replace('"NaN"', "null"),
        run.reader.complete_offset,
        run.reader.next_offset,
        run.reader.line_no,
    )


def messy_run(n: int, seed: int, samples: float = 0.0) -> bytes:
    """A run's file as runs write them: steps among logs, checkpoints and samples of
    other writers, lost and repeated records, a resume that redoes steps under a new
    writer, broken and blank lines, non-finite losses, a change of metrics.
    ``samples``: a sidecar's GPU, read and heartbeat records after that share of steps."""
    rng = random.Random(seed)
    trainer, sampler = Lines("rank0"), Lines("sampler")
    parts: list[bytes] = []
    step = 0
    extra = False
    while step < n:
        if rng.random() < samples:
            parts.append(sampler.gpu(rng.uniform(0, 100), devices=rng.choice([1, 2, 8])))
            if rng.random() < 0.5:
                parts.append(sampler.io(rng.uniform(0, 1e8), (f"hs_{step}.safetensors",)))
            if rng.random() < 0.3:
                parts.append(sampler.heartbeat(written=step))
            if rng.random() < 0.01:
                sampler.seq += 1  # a sample lost
        r = rng.random()
        if r < 0.06:
            parts.append(sampler.gpu(rng.uniform(0, 100)))
        elif r < 0.07:
            parts.append(sampler.heartbeat(written=step))
        elif r < 0.08:
            parts.append(trainer.log("Training epoch 1/2 started"))  # the steps' own writer
        elif r < 0.085:
            parts.append(trainer.ckpt("saved", f"/ckpt/{step}", complete=True))
        elif r < 0.088:
            parts.append(rng.choice([b"{broken\n", b"\n", b"[1, 2]\n", b'{"v": 1}\n']))
        elif r < 0.09:
            trainer.seq += rng.randint(1, 3)  # records lost
        elif r < 0.092 and trainer.seq > 2:
            trainer.seq -= 1  # one repeated
        elif r < 0.094 and step > 5:
            trainer = Lines(f"rank0-resumed-{step}", t0=trainer.ts)  # a resume, from a checkpoint
            parts.append(trainer.event("resume"))
            step -= rng.randint(1, 5)
        elif r < 0.096:
            parts.append(trainer.train(step, float("nan")))  # written as "NaN": not a row
            step += 1
        elif r < 0.097:
            extra = not extra  # the metrics change: a block of another shape
        else:
            line = trainer.train(step, rng.uniform(0, 3), epoch=step // 100)
            if extra:
                rec = json.loads(line)
                rec["train"]["extra_metric"] = rng.random()
                line = json.dumps(rec).encode() + b"\n"
            parts.append(line)
            step += 1
    return b"".join(parts)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cols")


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 10_000),
    steps=st.integers(1, 3000),
    block=st.integers(1, 400),
    tail=st.binary(max_size=120),
    cuts=st.lists(st.integers(0, 10**7), max_size=12),
)
def test_the_columnar_catch_up_gives_exactly_the_state_of_the_plain_one(
    run_dir: Path, seed: int, steps: int, block: int, tail: bytes, cuts: list[int]
) -> None:
    """Any file, any block size, a torn last line, the agent's output split anywhere:
    the columns read ends in the plain read's state (table, newest values at full
    precision, writers' sequence numbers, malformed lines and their numbers...)."""
    path = run_dir / "metrics.jsonl"
    data = messy_run(steps, seed) + tail
    path.write_bytes(data)
    blocks = index_file(str(path), block_rows=block)
    plain = agent_output(run_dir)
    cols = agent_output(run_dir, **COLUMNS)
    if blocks >= 3:
        assert "C" in frame_kinds(cols), "the blocks before the last travel as columns"
    frames = parse(cols, cuts)
    ends = [f.offset + (f.span if f.span >= 0 else len(f.data)) for f in frames]
    assert [f.offset for f in frames[1:]] == ends[:-1], "frames tile the file"
    assert (ends[-1] if ends else 0) == len(data)
    want = state_of(parse(plain, []))
    assert state_of(frames) == want
    assert state_of(frames, ahead=True) == want


@settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 10_000),
    steps=st.integers(2000, 5000),
    block=st.sampled_from([7, 100, 1024]),
    cuts=st.lists(st.integers(0, 10**7), max_size=6),
)
def test_old_samples_sent_as_envelopes_leave_exactly_the_plain_state(
    run_dir: Path, seed: int, steps: int, block: int, cuts: list[int]
) -> None:
    """A sidecar's samples, far more than the histories keep: the older ones travel as
    envelopes (a sequence number and a time), the newest as lines; the state (GPU and
    read histories, heartbeats, counts, lost records) is the plain read's."""
    path = run_dir / "metrics.jsonl"
    data = messy_run(steps, seed, samples=0.9)
    path.write_bytes(data)
    index_file(str(path), block_rows=block)
    plain = agent_output(run_dir)
    cols = agent_output(run_dir, **COLUMNS)
    frames = parse(cols, cuts)
    heads = [payload_header(f.data) for f in frames if f.span >= 0]
    assert any("stubs" in h or "listed" in h for h in heads), "envelopes sent"
    got, want = state_of(frames), state_of(parse(plain, []))
    assert got == want
    assert state_of(frames, ahead=True) == want
    enveloped = [
        f for f in frames if f.span >= 0 and {"stubs", "listings"} & set(payload_header(f.data))
    ]
    inflated = [inflate_ahead(f.data) for f in enveloped]
    assert block < 100 or any(inflated), "envelopes' columns inflated ahead too"
    run = Run()
    for f in frames:
        run.feed_frame(f)
    s = run.state
    assert len(s.samplers.gpu_samples) == SAMPLES_KEPT["gpu"], (
        "the GPU history is full of real samples"
    )
    assert all(devices for _, devices in s.samplers.gpu_samples)


def test_the_writer_keeps_the_companion_as_it_writes(tmp_path: Path) -> None:
    """The real writer, a sampler writing into the same file meanwhile, and a second
    writer (a resumed run) appending later: the blocks index exactly the steps' lines."""
    path = tmp_path / "metrics.jsonl"
    sampler = JsonlWriter(path, writer_id="sampler", background=False)
    first = JsonlWriter(path, writer_id="rank0")
    rng = random.Random(1)
    for i in range(2500):
        first.write_deferred(
            "train",
            {"train": {"loss": rng.random(), "full_acc_0": rng.random()}, "epoch": 0, "lr": 1e-4},
            step=i,
        )
        if i % 50 == 0:
            first.write("ckpt", {"event": "saved", "path": f"/c/{i}"})
            sampler.write("gpu", {"status": "ok", "devices": []})
    first.close()
    resumed = JsonlWriter(path, writer_id="rank0-resumed")
    for i in range(2400, 3000):
        resumed.write_deferred("train", {"train": {"loss": 1.0}, "epoch": 1, "lr": 1e-4}, step=i)
    resumed.close()
    sampler.close()
    blocks = read_blocks((tmp_path / COLUMNS_FILE).read_bytes())
    assert [b.n for b in blocks] == [1024, 1024, 452, 600]
    data = path.read_bytes()
    st_ = os.stat(path)
    for b in blocks:
        assert (b.header["dev"], b.header["ino"]) == (st_.st_dev, st_.st_ino)
        for off, n, seq in zip(b.ints("@off"), b.ints("@len"), b.ints("seq"), strict=True):
            rec = json.loads(data[off : off + n])
            assert data[off + n - 1 : off + n] == b"\n" and (off == 0 or data[off - 1] == 10)
            assert (rec["kind"], rec["seq"], rec["w"]) == ("train", seq, b.header["const"]["w"])
    cols = agent_output(tmp_path, **COLUMNS)
    sent = c_blocks(cols)
    assert [n for frame in sent for n in frame] == [1024, 1024, 452], "every block but the last"
    assert max(map(len, sent)) > 1, "consecutive blocks of one writer share a frame"
    assert state_of(parse(cols, [])) == state_of(parse(agent_output(tmp_path), []))


def test_a_file_indexed_as_written_has_the_blocks_its_writer_would_have_closed(
    tmp_path: Path,
) -> None:
    """``index_file(as_written=True)`` closes a block ``BLOCK_AGE_S`` (300 s) after its
    first row by the lines' own times, as the live writer does by its clock: at 2
    steps a second, 600 rows a block (benchmarks/bench_open.py's run is made so)."""
    path = tmp_path / "metrics.jsonl"
    lines = Lines(dt=0.5)
    path.write_bytes(b"".join(lines.train(i, float(i)) for i in range(1500)))
    assert index_file(str(path)) == 2
    assert [b.n for b in read_blocks((tmp_path / COLUMNS_FILE).read_bytes())] == [1024, 476]
    assert index_file(str(path), as_written=True) == 3
    blocks = read_blocks((tmp_path / COLUMNS_FILE).read_bytes())
    assert [b.n for b in blocks] == [601, 601, 298], "the row at 300 s closes its block"
    cols = agent_output(tmp_path, **COLUMNS)
    assert [n for frame in c_blocks(cols) for n in frame] == [601, 601]
    assert state_of(parse(cols, [])) == state_of(parse(agent_output(tmp_path), []))


def c_blocks(output: bytes) -> list[list[int]]:
    """Each C frame of the agent's output as the rows of each block it carries."""
    out: list[list[int]] = []
    pos = 0
    while pos < len(output):
        end = output.index(b"\n", pos)
        head = output[pos:end].split(b" ")
        n = int(head[2]) if head[0] == b"D" else int(head[3]) if head[0] in (b"Z", b"C") else 0
        pos = end + 1
        if head[0] == b"C":
            out.append(payload_blocks(output[pos : pos + n]))
        pos += n
    return out


def damage(path: Path, how: str, rng: random.Random) -> None:
    comp = path.with_name(COLUMNS_FILE)
    raw = bytearray(comp.read_bytes())
    if how == "flip":
        for _ in range(5):
            raw[rng.randrange(len(raw))] ^= 0xFF
    elif how == "torn":
        raw = raw[: rng.randrange(len(raw))]
    elif how == "rewritten":  # the file rewritten in place (same inode): rows point at other lines
        data = path.read_bytes()
        with open(path, "r+b") as f:
            f.write(data[100:] + data[:100])
        return
    elif how == "replaced":  # another file by the same name: the blocks name the old inode
        fresh = path.with_name("new.jsonl")
        fresh.write_bytes(path.read_bytes())  # made while the old one exists: another inode
        os.replace(fresh, path)
        return
    comp.write_bytes(bytes(raw))


@pytest.mark.parametrize("how", ["flip", "torn", "rewritten", "replaced"])
def test_a_damaged_or_stale_companion_changes_nothing(tmp_path: Path, how: str) -> None:
    """Blocks that fail their checksum, a torn last block, blocks of a file rewritten in
    place or replaced: those lines travel as lines, the state is the plain one's."""
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(messy_run(3000, 7))
    assert index_file(str(path), block_rows=200) > 5
    damage(path, how, random.Random(3))
    cols = agent_output(tmp_path, **COLUMNS)
    assert state_of(parse(cols, [])) == state_of(parse(agent_output(tmp_path), []))
    if how in ("rewritten", "replaced"):
        assert "C" not in frame_kinds(cols)


def fed(frames: list[DataFrame], ahead: bool) -> Run:
    """A run fed these frames (``ahead``: each payload's columns inflated beforehand, as
    a forked read's child inflates them)."""
    run = Run()
    for f in frames:
        pre = inflate_ahead(f.data) if ahead and f.span >= 0 else None
        run.feed(f.offset, f.data, 0, f.span, pre)
    return run


def test_a_garbled_columns_frame_is_one_malformed_line_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = Lines()
    path.write_bytes(b"".join(lines.train(i, 1.0) for i in range(900)))
    index_file(str(path), block_rows=300)
    frames = parse(agent_output(tmp_path, **COLUMNS), [])
    spans = [i for i, f in enumerate(frames) if f.span >= 0]
    assert spans
    i = spans[0]
    lost = sum(payload_blocks(frames[i].data))
    bad = frames[i].data[:40] + b"\x00" * 8 + frames[i].data[48:]
    frames[i] = DataFrame(frames[i].offset, bad, frames[i].span)
    for ahead in (False, True):  # its columns inflated ahead: the same
        run = fed(frames, ahead)
        s = run.state
        assert s.malformed_count == 1 and "unreadable columns frame" in s.malformed[0].reason
        assert lost in (300, 600), "a block, or two blocks alike in one frame"
        assert s.train_steps == 900 - lost, "the frame's steps are missing, nothing else"
        assert run.reader.complete_offset == len(path.read_bytes())


def _reheaded(payload: bytes, change: Callable[[dict[str, Any]], None]) -> bytes:
    hlen = int.from_bytes(payload[:4], "little")
    header = json.loads(payload[4 : 4 + hlen])
    change(header)
    head = json.dumps(header).encode()
    return len(head).to_bytes(4, "little") + head + payload[4 + hlen :]


def _rows_off(h: dict[str, Any]) -> None:
    h["pieces"][0][0] += 1


def _bad_type(h: dict[str, Any]) -> None:
    h["pieces"][1][1][0][0] = "x"


def _sizes_moved(h: dict[str, Any]) -> None:  # the column's total right, its pieces not
    h["pieces"][0][1][0][1] += 1
    h["pieces"][1][1][0][1] -= 1


def _a_piece_short(h: dict[str, Any]) -> None:
    h["pieces"][1][1].pop()


def _typed_column(h: dict[str, Any]) -> None:  # pieces with one type too many
    h["pieces"][0][1][2] = ["f", h["pieces"][0][1][2][1], "f"]


@pytest.mark.parametrize(
    "change", [_rows_off, _bad_type, _sizes_moved, _a_piece_short, _typed_column]
)
def test_a_frame_of_several_blocks_that_does_not_add_up_is_one_malformed_line(
    tmp_path: Path, change: Callable[[dict[str, Any]], None]
) -> None:
    """Consecutive blocks alike travel in one frame, each column in pieces (one a
    block); pieces that do not say the rows, types and sizes they hold lose that
    frame's steps as one malformed line, and nothing else."""
    path = tmp_path / "metrics.jsonl"
    lines = Lines()
    # an epoch ends in the second block: its epochs a column of values (q), the
    # other blocks' one value (a): one frame all the same
    path.write_bytes(b"".join(lines.train(i, float(i), epoch=i // 450) for i in range(1200)))
    index_file(str(path), block_rows=300)
    frames = parse(agent_output(tmp_path, **COLUMNS), [])
    grouped = [i for i, f in enumerate(frames) if f.span >= 0 and len(payload_blocks(f.data)) > 1]
    assert grouped, "the first three blocks in one frame"
    i = grouped[0]
    lost = sum(payload_blocks(frames[i].data))
    assert lost == 900
    hlen = int.from_bytes(frames[i].data[:4], "little")
    pieces = json.loads(frames[i].data[4 : 4 + hlen])["pieces"]
    assert len({tuple(t for t, _ in p[1]) for p in pieces}) > 1, "types that differ by block"
    whole = fed(frames, False)
    assert state_of(frames) == state_of(parse(agent_output(tmp_path), []))
    assert whole.state.train_steps == 1200 and whole.state.malformed_count == 0
    frames[i] = DataFrame(frames[i].offset, _reheaded(frames[i].data, change), frames[i].span)
    for ahead in (False, True):
        run = fed(frames, ahead)
        s = run.state
        assert s.malformed_count == 1 and "unreadable columns frame" in s.malformed[0].reason
        assert s.train_steps == 1200 - lost
        assert run.reader.complete_offset == len(path.read_bytes())


@pytest.mark.slow
async def test_a_disconnect_in_the_middle_of_a_columnar_catch_up_loses_and_repeats_nothing(
    sshd: Sshd, tmp_path: Path, client: str
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = run_dir / "metrics.jsonl"
    lines = Lines()
    n = 150_000
    path.write_bytes(b"".join(lines.train(i, 3.0 - i * 1e-5) for i in range(n)))
    size = path.stat().st_size
    assert index_file(str(path), block_rows=2000) == 75
    host = stream_host(client, ssh_target(sshd))
    f = Follower.ssh(host, run_dir)
    spans: list[int] = []
    real = f.reader.skip

    def skip(offset: int, span: int, count: int) -> None:
        spans.append(offset)
        real(offset, span, count)

    f.reader.skip = skip  # type: ignore[method-assign, assignment]
    try:
        await f.until(lambda: len(spans) >= 3, what="the first columns frames")
        seen = len(spans)  # (no await before the kill: nothing arrives in between)
        more = await drop_mid_catch_up(f, sshd, path, lines, n, size)
    finally:
        await f.close()
        await host.close()
    assert f.count(Link.RECONNECTING) >= 1
    assert len(spans) > seen, "columns frames before the kill and after it"
    assert len(spans) == len(set(spans)), "no range came twice"
    assert [r.seq for r in f.records] == list(range(n + 100)), "a record was lost or repeated"
    assert f.restarts == [] and f.malformed == []
    assert f.reader.complete_offset == size + len(more)


def test_an_agent_asked_for_no_columns_sends_none(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = Lines()
    path.write_bytes(b"".join(lines.train(i, 1.0) for i in range(900)))
    index_file(str(path), block_rows=100)
    assert "C" not in frame_kinds(agent_output(tmp_path, compress=COMPRESS_ZLIB))


def test_a_companion_that_cannot_be_written_is_counted_and_the_lines_are_whole(
    tmp_path: Path,
) -> None:
    """metrics.cols blocked (a directory by that name): every line is written, the
    failures are counted in the writer's errors (its heartbeat reports them)."""
    (tmp_path / COLUMNS_FILE).mkdir()
    path = tmp_path / "metrics.jsonl"
    w = JsonlWriter(path, writer_id="rank0")
    for i in range(2100):
        w.write_deferred("train", {"train": {"loss": 1.0}, "epoch": 0, "lr": 1e-4}, step=i)
    w.close()
    assert w.stats.written == 2100 and w.stats.dropped == 0
    # the writer's first mark block (it writes to this file), two full blocks, one at close
    assert sum(w.stats.errors.values()) == 4, w.stats.errors
    assert len(path.read_bytes().splitlines()) == 2100


def restamp(path: Path, change: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Each column block's header of ``path``'s companion as ``change`` makes it (the
    block's checksum made anew: a header the writer did not write, but whole)."""
    import zlib

    from eagle3_tui.telemetry.columns import HEAD, MAGIC, walk_blocks

    comp = path.with_name(COLUMNS_FILE)
    out = []
    for magic, head, body in walk_blocks(comp.read_bytes()):
        if magic == MAGIC:
            head = json.dumps(change(json.loads(head)), separators=(",", ":")).encode()
        crc = zlib.crc32(bytes(body), zlib.crc32(head))
        out.append(HEAD.pack(magic, len(head), len(body), crc) + head + bytes(body))
    comp.write_bytes(b"".join(out))


def stats_first(h: dict[str, Any]) -> dict[str, Any]:
    return {"stats": h.pop("stats"), **h}


def seq_off_by_one(h: dict[str, Any]) -> dict[str, Any]:
    h["stats"]["seq"][0] += 1
    return h


@pytest.mark.parametrize("change", [stats_first, seq_off_by_one])
def test_a_block_header_the_writer_did_not_write_is_read_whole_or_checked_out(
    tmp_path: Path, change: Callable[[dict[str, Any]], dict[str, Any]]
) -> None:
    """The plan parses a block's header without its stats where the writer put them
    (last), and takes the first row's sequence number from them: a header with its
    stats elsewhere is parsed whole (its blocks still go as columns); stats whose first
    sequence number is not the first row's fail the block's check against the file
    (its lines go as lines). Either way, the plain read's state."""
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(messy_run(3000, 11, samples=0.5))
    assert index_file(str(path), block_rows=200) > 5
    plain = state_of(parse(agent_output(tmp_path), []))
    written = frame_kinds(agent_output(tmp_path, **COLUMNS)).count("C")
    restamp(path, change)
    cols = agent_output(tmp_path, **COLUMNS)
    assert state_of(parse(cols, [])) == plain
    sent = frame_kinds(cols).count("C")
    # (a block the companion does not account for is checked row by row: still sent)
    assert sent == written if change is stats_first else sent < written


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_samples_of_several_writers_sent_as_envelopes_keep_each_writers_count(
    tmp_path: Path, seed: int
) -> None:
    """Two sidecars' samples interleaved (one losing records, one repeating one) and
    the trainer's own heartbeats among its steps, far more than the histories keep: the
    envelopes are told apart by writer, each writer's sequence numbers counted as the
    plain read counts them (lost, repeated), the trainer's among its steps."""
    rng = random.Random(seed)
    trainer, a, b = Lines("rank0"), Lines("side-a"), Lines("side-b")
    parts: list[bytes] = []
    for step in range(2500):
        parts.append(trainer.train(step, rng.uniform(0, 3)))
        for side in rng.sample([a, b], rng.randint(0, 2)):
            parts.append(side.gpu(rng.uniform(0, 100)) if rng.random() < 0.6 else side.heartbeat())
        if rng.random() < 0.01:
            a.seq += 2  # side-a loses records
        if rng.random() < 0.005 and b.seq > 3:
            b.seq -= 1  # side-b repeats one
        if rng.random() < 0.05:
            parts.append(trainer.heartbeat(written=step))  # the steps' writer's own sample
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"".join(parts))
    assert index_file(str(path), block_rows=150) > 5
    frames = parse(agent_output(tmp_path, **COLUMNS), [])
    heads = [payload_header(f.data) for f in frames if f.span >= 0]
    assert any("listed" in h or "stubs" in h for h in heads), "envelopes sent"
    want = state_of(parse(agent_output(tmp_path), []))
    assert state_of(frames) == want
    writers = want[7]
    assert isinstance(writers, dict) and writers["side-a"][1] > 0 and writers["side-b"][2] > 0


@pytest.mark.parametrize("base", [(1 << 53) + 1, 10**25])
def test_a_sampler_line_with_a_sequence_number_past_a_float_is_counted_exactly(
    tmp_path: Path, base: int
) -> None:
    """A run's line may say any sequence number: one past a float's exact integers
    (2**53) or past 64 bits goes as a line, not by its envelope (packed, one past 64
    bits raised in the agent and ended its read), and every read counts it as its
    digits say: the same state from the columns and from the lines, the writer's next
    number exact, no record called a duplicate."""
    trainer, side = Lines("rank0"), Lines("side")
    parts: list[bytes] = []
    for step in range(3000):
        parts.append(trainer.train(step, 1.0))
        if step % 2 == 0:
            parts.append(side.gpu(50.0))
        if step in (100, 101):
            parts.append(
                b'{"v":1,"seq":%d,"w":"odd","ts":1000100.0,"kind":"gpu","gpus":[]}\n'
                % (base + step)
            )
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"".join(parts))
    assert index_file(str(path), block_rows=200) > 5
    cols = agent_output(tmp_path, **COLUMNS)
    assert "C" in frame_kinds(cols)
    want = state_of(parse(agent_output(tmp_path), []))
    assert state_of(parse(cols, [])) == want
    writers = want[7]
    assert isinstance(writers, dict) and writers["odd"] == (base + 102, 0, 0)


def test_training_steps_numbered_past_a_float_go_as_lines_and_read_alike(tmp_path: Path) -> None:
    """A trainer whose sequence numbers pass 2**53 (a float's exact integers): its steps
    are no block's rows (the companion would hold them exactly, a line's reader not),
    so columns and lines give one state."""
    trainer = Lines("rank0")
    trainer.seq = (1 << 53) - 300
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"".join(trainer.train(step, 1.0 + step % 7) for step in range(1200)))
    index_file(str(path), block_rows=200)
    cols = agent_output(tmp_path, **COLUMNS)
    assert frame_kinds(cols).count("C") == 1  # the first block's rows, all below 2**53
    assert state_of(parse(cols, [])) == state_of(parse(agent_output(tmp_path), []))
