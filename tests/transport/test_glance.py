"""A long run at a glance (agent/glance.py, model/glance.py, app/pipeline.py): the
companion's marks and stats find what the first picture needs; what a glance shows
is what the lines say; whatever the companion holds, nothing false is shown and the
whole read takes its place."""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import time
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from eagle3_tui.agent import glance as glance_module
from eagle3_tui.agent.glance import Glance, glance
from eagle3_tui.app import pipeline as pipeline_module
from eagle3_tui.app.pipeline import Pipeline
from eagle3_tui.model.glance import GlanceData, glance_run
from eagle3_tui.model.history import history_of
from eagle3_tui.model.run import Run
from eagle3_tui.model.snapshot import ViewParams, build_snapshot
from eagle3_tui.telemetry.column_log import index_file
from eagle3_tui.telemetry.columns import (
    COLUMNS_FILE,
    DIGEST_BLOCKS,
    DIGEST_MAGIC,
    HEAD,
    MAGIC,
    MARK_MAGIC,
    SAMPLE_MAGIC,
    SAMPLED_KINDS,
    encode_marks,
    flatten,
    read_blocks,
    walk_blocks,
)
from eagle3_tui.telemetry.scan import read_block, scan_headers, scan_heads, whole_header
from eagle3_tui.telemetry.writer import JsonlWriter
from eagle3_tui.transport.base import StreamEvent
from eagle3_tui.transport.glancing import assemble, fast_loads, glance_local, glance_remote
from eagle3_tui.transport.local import LocalTransport
from eagle3_tui.transport.ssh import SshTransport
from tests.records import Lines
from tests.transport.conftest import ssh_target
from tests.transport.sshd import Sshd
from tests.transport.test_columnar import messy_run
from tests.transport.test_ssh_stream import client, stream_host

__all__ = ["client"]  # the fixture, used by name


def events_before(data: bytes, end: int) -> list[tuple[int, bytes]]:
    """Every line before ``end`` a glance must carry: neither a row nor a sample."""
    out, off = [], 0
    for line in data.splitlines(keepends=True):
        if off + len(line) > end:
            break
        if line.endswith(b"\n") and line.strip():
            try:
                rec = json.loads(line)
            except ValueError:
                rec = None
            kind = rec.get("kind") if isinstance(rec, dict) else None
            row = kind == "train" and flatten(rec) is not None
            if kind not in SAMPLED_KINDS and not row:
                out.append((off, line))
        off += len(line)
    return out


def glanced(path: Path, tail_rows: int = 300) -> Glance | str:
    fd = os.open(path, os.O_RDONLY)
    try:
        return glance(fd, str(path), ["train."], tail_rows)
    finally:
        os.close(fd)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_glance_is_the_files_end_every_event_before_it_and_its_blocks_stats(
    tmp_path: Path, seed: int
) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(messy_run(4000, seed, samples=0.3))
    assert index_file(str(path), block_rows=100) > 10
    without_digests(tmp_path / COLUMNS_FILE)  # block by block (digests: below)
    data = path.read_bytes()
    g = glanced(path)
    assert isinstance(g, Glance), g
    assert g.size == len(data) and g.tail == data[g.tail_from :]
    assert g.tail_from > 0 and data[g.tail_from - 1] == 10  # a line's start
    assert g.marks == events_before(data, g.tail_from)
    # the digest: each block before the tail, its stats those of its rows
    blocks = [b for b in read_blocks((tmp_path / COLUMNS_FILE).read_bytes())]
    before = [b for b in blocks if b.header["span"][1] <= g.tail_from]
    assert len(g.digest["blocks"]) == len(before) > 5
    loss = g.digest["stats"]["train.loss"]
    for b, row, s in zip(before, g.digest["blocks"], loss, strict=True):
        offs, lens = b.ints("@off"), b.ints("@len")
        recs = [json.loads(data[o : o + n]) for o, n in zip(offs, lens, strict=True)]
        values = np.array([r["train"]["loss"] for r in recs], dtype=np.float32)
        assert row[:3] == [recs[0]["step"], recs[-1]["step"], len(recs)]
        assert s[1] == pytest.approx(float(values.min()), rel=1e-6)
        assert s[3] == pytest.approx(float(values.max()), rel=1e-6)
        assert values[s[2]] == values.min() and values[s[4]] == values.max()
        assert s[6] == pytest.approx(float(values.astype(np.float64).mean()), rel=1e-5)


def block_bytes(magic: bytes, header: bytes, body: bytes | memoryview) -> bytes:
    """A companion block as a writer writes it (its head, with the checksum)."""
    crc = zlib.crc32(body, zlib.crc32(header))
    return HEAD.pack(magic, len(header), len(body), crc) + header + body


def without_digests(comp: Path) -> bytes:
    """The companion as a writer before digests wrote it (returns its bytes before)."""
    before = comp.read_bytes()
    kept = [block_bytes(m, h, b) for m, h, b in walk_blocks(before) if m != DIGEST_MAGIC]
    comp.write_bytes(b"".join(kept))
    return before


def test_a_writers_digest_is_the_stats_of_its_blocks_rows_together(tmp_path: Path) -> None:
    """Every DIGEST_BLOCKS column blocks of a shape, the writer appends their stats
    merged: the first and last values, the least and greatest at their rows (the first
    such), the mean of all their rows."""
    path = tmp_path / "metrics.jsonl"
    lines = Lines()
    rng = random.Random(5)
    path.write_bytes(b"".join(lines.train(i, rng.random()) for i in range(7000)))
    index_file(str(path), block_rows=200)
    data = path.read_bytes()
    found = walk_blocks((tmp_path / COLUMNS_FILE).read_bytes())
    blocks = {tuple(json.loads(h)["span"]): json.loads(h) for m, h, _ in found if m == MAGIC}
    blocks_by_span = {span: b for span, b in blocks.items()}
    digests = [json.loads(h) for m, h, _ in found if m == DIGEST_MAGIC]
    assert len(digests) == 35 // DIGEST_BLOCKS == 2
    for d in digests:
        assert len(d["spans"]) == DIGEST_BLOCKS
        covered = [blocks_by_span[tuple(sp)] for sp in d["spans"]]
        assert d["n"] == sum(b["n"] for b in covered) == 200 * DIGEST_BLOCKS
        start, end = d["spans"][0][0], d["spans"][-1][1]
        recs = [json.loads(x) for x in data[start:end].splitlines()]
        loss = np.array([r["train"]["loss"] for r in recs], dtype=np.float32)
        steps = [r["step"] for r in recs]
        s = d["stats"]["train.loss"]
        assert s[0] == pytest.approx(float(loss[0]), rel=1e-6)
        assert s[5] == pytest.approx(float(loss[-1]), rel=1e-6)
        assert s[1] == pytest.approx(float(loss.min()), rel=1e-6) and loss[s[2]] == loss.min()
        assert s[3] == pytest.approx(float(loss.max()), rel=1e-6) and loss[s[4]] == loss.max()
        assert s[6] == pytest.approx(float(loss.astype(np.float64).mean()), rel=1e-5)
        assert d["stats"]["step"][:6] == [
            steps[0], steps[0], 0, steps[-1], len(steps) - 1, steps[-1]
        ]  # fmt: skip


def plain_run(tmp_path: Path) -> tuple[Path, Path]:
    """6,000 steps, a GPU sample every 10 and an epoch's events every 1,000, indexed in
    blocks of 100 rows (three digests): its path and its companion's."""
    path = tmp_path / "metrics.jsonl"
    lines, side = Lines("rank0"), Lines("sidecar")
    rng = random.Random(8)
    parts = [lines.event("start", pid=1, global_step=0, run_id="r")]
    for step in range(6000):
        parts.append(lines.train(step, rng.uniform(1, 3), epoch=step // 1000))
        if step % 10 == 0:
            parts.append(side.gpu(95.0))
        if step % 1000 == 999:
            parts.append(lines.ckpt("save_finished", f"/c/{step // 1000}", complete=True))
    path.write_bytes(b"".join(parts))
    index_file(str(path), block_rows=100)
    return path, tmp_path / COLUMNS_FILE


@pytest.mark.parametrize("prefix", [0, 40, 700])
def test_a_glance_reading_headers_in_part_is_the_glance_of_them_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefix: int
) -> None:
    """A glance reads the first bytes of each header (HEAD_PREFIX), the rest where it
    parses one: however few those are (none; not the span; the span, not the stats),
    the glance is the same, digests used or not."""
    path, comp = plain_run(tmp_path)
    for _ in range(2):
        whole = glanced(path)
        monkeypatch.setattr(glance_module, "HEAD_PREFIX", prefix)
        part = glanced(path)
        monkeypatch.undo()
        assert isinstance(whole, Glance) and isinstance(part, Glance)
        assert [getattr(part, k) for k in Glance.__slots__] == [
            getattr(whole, k) for k in Glance.__slots__
        ]
        without_digests(comp)


def test_a_glance_through_digests_draws_the_same_history_from_fewer_headers(
    tmp_path: Path,
) -> None:
    """The blocks a digest stands for are not parsed (their headers read by pattern):
    the glance sends one entry for them, with the same steps, rows and extremes at the
    same steps as the blocks one by one."""
    path, comp = plain_run(tmp_path)
    quick = glanced(path)
    without_digests(comp)
    slow = glanced(path)
    assert isinstance(quick, Glance) and isinstance(slow, Glance)
    assert (quick.tail_from, quick.tail, quick.marks) == (slow.tail_from, slow.tail, slow.marks)
    fast, full = history_of(quick.digest), history_of(slow.digest)
    assert fast is not None and full is not None
    assert fast.blocks == full.blocks - 3 * (DIGEST_BLOCKS - 1) and fast.steps == full.steps
    assert (fast.first[0], fast.last[-1]) == (full.first[0], full.last[-1])
    for key in full.stats:
        got, want = fast.points(key, 0, 1e12), full.points(key, 0, 1e12)
        assert got is not None and want is not None
        (x1, y1), (x0, y0) = got, want
        assert np.nanmin(y1) == np.nanmin(y0) and x1[np.nanargmin(y1)] == x0[np.nanargmin(y0)]
        assert np.nanmax(y1) == np.nanmax(y0) and x1[np.nanargmax(y1)] == x0[np.nanargmax(y0)]


def _tampered(h: dict[str, Any], how: str) -> dict[str, Any]:
    if how == "rows":
        h["n"] += 1
    elif how == "span":
        h["spans"][3][1] -= 1
    elif how == "order":
        h["spans"].reverse()
    elif how == "stats":
        h["stats"] = [1, 2]
    elif how == "file":
        h["ino"] += 1
    return h


@pytest.mark.parametrize("how", ["rows", "span", "order", "stats", "file"])
def test_a_digest_that_does_not_stand_for_its_blocks_is_not_used(tmp_path: Path, how: str) -> None:
    """A digest is the companion's, untrusted: one whose spans, rows or file are not
    exactly its blocks' leaves them parsed one by one (the glance of no digest)."""
    path, comp = plain_run(tmp_path)
    good = without_digests(comp)
    slow = glanced(path)
    parts = []
    for m, h, b in walk_blocks(good):
        if m == DIGEST_MAGIC:
            h = json.dumps(_tampered(json.loads(h), how), separators=(",", ":")).encode()
        parts.append(block_bytes(m, h, b))
    comp.write_bytes(b"".join(parts))
    assert sum(1 for m, _, _ in walk_blocks(comp.read_bytes()) if m == DIGEST_MAGIC) == 3
    tampered = glanced(path)
    assert isinstance(slow, Glance) and isinstance(tampered, Glance)
    assert tampered.digest == slow.digest and tampered.tail_from == slow.tail_from


def test_the_real_writers_mark_their_events_and_announce_themselves(tmp_path: Path) -> None:
    """The trainer's writer and a sidecar's (no rows) write into one file; each marks
    exactly its events, and a glance needs nothing but the companion they kept."""
    path = tmp_path / "metrics.jsonl"
    sidecar = JsonlWriter(path, writer_id="sidecar", columns=False)
    trainer = JsonlWriter(path, writer_id="rank0")
    rng = random.Random(4)
    for i in range(3000):
        loss = float("nan") if i == 1500 else rng.random()
        trainer.write_deferred("train", {"train": {"loss": loss}, "epoch": 0, "lr": 1e-4}, step=i)
        if i % 200 == 0:
            trainer.write("ckpt", {"event": "save_finished", "path": f"/c/{i}", "complete": True})
            sidecar.write("gpu", {"status": "ok", "devices": []})
            sidecar.write("log", {"level": "WARNING", "logger": "x", "msg": f"at {i}"})
        if i % 7 == 0:
            time.sleep(0.001)  # the writers' threads interleave their lines
    trainer.close()
    sidecar.close()
    data = path.read_bytes()
    marks: dict[str, list[tuple[int, int, str]]] = {}
    for magic, head, _ in walk_blocks((tmp_path / COLUMNS_FILE).read_bytes()):
        if magic == b"E3M1":
            h = json.loads(head)
            marks.setdefault(h["w"], []).extend(tuple(m) for m in h["marks"])
    assert set(marks) == {"rank0", "sidecar"}  # each announced itself
    for w, found in marks.items():
        expected = []
        off = 0
        for line in data.splitlines(keepends=True):
            rec = json.loads(line)
            event = rec["kind"] != "train" or flatten(rec) is None
            if rec["w"] == w and rec["kind"] not in SAMPLED_KINDS and event:
                expected.append((off, len(line), rec["kind"]))
            off += len(line)
        assert sorted(found) == expected
    assert any(k == "train" for _, _, k in marks["rank0"])  # the NaN step: not a row
    g = glanced(path, tail_rows=1000)
    assert isinstance(g, Glance), g
    assert g.marks == events_before(data, g.tail_from)


def indexed_run(tmp_path: Path, steps: int, seed: int, samples: float) -> tuple[Path, Path, bytes]:
    """A messy run's file indexed in blocks of 100 rows: its path, its companion's and
    the companion's bytes."""
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(messy_run(steps, seed, samples=samples))
    index_file(str(path), block_rows=100)
    comp = tmp_path / COLUMNS_FILE
    return path, comp, comp.read_bytes()


@pytest.mark.parametrize("which", [DIGEST_MAGIC, MAGIC, MARK_MAGIC])
def test_a_header_nested_past_the_stack_is_no_header(tmp_path: Path, which: bytes) -> None:
    """A companion is the run's to write: a block whose header nests deeper than the
    parser's stack is a damaged block (left out), never an exception out of a glance."""
    path, comp = plain_run(tmp_path)
    good = comp.read_bytes()
    parts, changed = [], 0
    for m, h, b in walk_blocks(good):
        if m == which and not changed:
            h, changed = b"[" * 100_000 + b"]" * 100_000, 1
        parts.append(block_bytes(m, h, b))
    assert changed
    comp.write_bytes(b"".join(parts))
    for loads in (json.loads, fast_loads):
        fd = os.open(path, os.O_RDONLY)
        try:
            g = glance(fd, str(path), ["train."], 300, loads=loads)
        finally:
            os.close(fd)
        assert isinstance(g, Glance | str)
    before = read_blocks(b"".join(block_bytes(m, h, b) for m, h, b in walk_blocks(good)))
    after = read_blocks(comp.read_bytes())  # column blocks, parsed: the nested one left out
    assert len(after) == len(before) - (which == MAGIC)
    cfd = os.open(comp, os.O_RDONLY)
    try:
        at = next(at for m, _, at, _ in scan_headers(cfd, comp.stat().st_size) if m == which)
        assert read_block(cfd, at) is None  # (a column block's reader: the others' is None)
    finally:
        os.close(cfd)


def test_digests_parsed_by_msgspec_are_what_json_makes_of_them(tmp_path: Path) -> None:
    """The monitor's own glance parses the digests with msgspec (``fast_loads``): the
    same glance as ``json.loads`` makes, NaN and numbers past a float's range too."""
    path, comp = plain_run(tmp_path)
    good = comp.read_bytes()
    parts, odd = [], 0
    for magic, h, body in walk_blocks(good):
        if magic == DIGEST_MAGIC and odd % 2 == 0:
            h = h.replace(b'"stats":{', b'"stats":{"odd.x":[NaN,1e400,0,-1e999,1,2,1.5],', 1)
        odd += magic == DIGEST_MAGIC
        parts.append(block_bytes(magic, h, body))
    assert odd >= 2
    comp.write_bytes(b"".join(parts))
    fd = os.open(path, os.O_RDONLY)
    try:
        slow = glance(fd, str(path), ["train.", "odd."], 300)
        fast = glance(fd, str(path), ["train.", "odd."], 300, loads=fast_loads)
    finally:
        os.close(fd)
    assert isinstance(slow, Glance) and isinstance(fast, Glance)
    assert [x is None for x in slow.digest["stats"]["odd.x"]].count(False) >= 1
    for name in Glance.__slots__:
        a, b = getattr(slow, name), getattr(fast, name)
        assert json.dumps(a, default=repr) == json.dumps(b, default=repr), name


def test_blocks_written_before_their_headers_had_spans_or_stats_glance_the_same(
    tmp_path: Path,
) -> None:
    """A glance reads a column block's span and stats from its header, its body unread;
    a block of an older writer (no span, no stats, or stats without a column the digest
    wants) is read whole for them: the glance is the same either way."""
    path, comp, good = indexed_run(tmp_path, 4000, 4, 0.3)
    before = glanced(path)
    assert isinstance(before, Glance)
    parts, k = [], 0
    for magic, h, body in walk_blocks(good):
        header = json.loads(h)
        if magic == MAGIC:
            k += 1
            if k % 3 == 0:
                del header["span"], header["stats"]
            elif k % 3 == 1:
                del header["stats"]["train.loss"]
            h = json.dumps(header, separators=(",", ":")).encode()
        parts.append(block_bytes(magic, h, body))
    assert k > 20
    comp.write_bytes(b"".join(parts))
    after = glanced(path)
    assert isinstance(after, Glance)
    assert after.digest["blocks"] == before.digest["blocks"] and after.tail_from == before.tail_from
    stats = before.digest["stats"]
    assert after.digest["stats"].keys() == stats.keys() and "train.loss" in stats
    for key, rows in stats.items():  # from a column: its float32 values, to 7 digits
        for x, y in zip(rows, after.digest["stats"][key], strict=True):
            assert (x is None) == (y is None)
            if x is not None:
                assert (x[2], x[4]) == (y[2], y[4])
                assert y == pytest.approx(x, rel=2e-6, abs=1e-12)
    assert after.marks == before.marks and after.tail == before.tail


def test_no_glance_where_the_companion_cannot_stand_for_the_file(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(messy_run(3000, 5))
    assert "no companion" in str(glanced(path))
    index_file(str(path), block_rows=100)
    st = os.stat(path)
    comp = tmp_path / COLUMNS_FILE
    good = comp.read_bytes()
    # a writer lost track of where its lines went
    comp.write_bytes(good + encode_marks((st.st_dev, st.st_ino), "rank0", [], True))
    assert "lost track" in str(glanced(path))
    # a companion of another file (same name, another inode)
    comp.write_bytes(good)
    fresh = tmp_path / "fresh.jsonl"
    fresh.write_bytes(path.read_bytes())
    os.replace(fresh, path)
    assert "no column block of this file" in str(glanced(path))


def test_headers_read_block_to_block_are_the_blocks_of_the_whole(tmp_path: Path) -> None:
    """``scan_headers`` (the glance's: header to header, bodies unread) finds what
    ``walk_blocks`` finds in the bytes whole, past a torn block a later writer wrote
    past, junk between blocks and a torn end. A block damaged where the chain of blocks
    holds is listed as it reads (a body is not read; a header is the glance's to parse
    or not), where walk_blocks leaves it out (its checksum fails)."""
    _, comp, good = indexed_run(tmp_path, 3000, 7, 0.5)
    whole = walk_blocks(good)
    assert len(whole) > 20 and len({m for m, _, _ in whole}) == 4  # rows, marks, samples, digest
    starts = []
    for m, h, body in whole:
        starts.append(good.find(HEAD.pack(m, len(h), len(body), zlib.crc32(body, zlib.crc32(h)))))
    a, b, c, d = starts[5], starts[9], starts[12], starts[14]
    damaged = bytearray(good)
    damaged[c - 5] ^= 0xFF  # the body of the block before c
    damaged[b + HEAD.size + 3] ^= 0xFF  # a header
    broken = (
        bytes(damaged[: a + HEAD.size + 10])  # a torn block (its head, a bit of its header)
        + bytes(damaged[a:d])
        + b"E3junk\x00E3C" * 3  # junk, magics' beginnings among it
        + bytes(damaged[d:])
        + bytes(damaged[starts[2] : starts[3] - 7])  # a torn end
    )
    comp.write_bytes(broken)
    assert len(walk_blocks(broken)) == len(whole) - 2  # the two damaged ones
    fixed = broken.replace(bytes(damaged[c - 5 : c]), good[c - 5 : c])
    fixed = fixed.replace(bytes(damaged[b : b + 64]), good[b : b + 64])
    expected = [(m, h) for m, h, _ in walk_blocks(fixed)]
    assert expected == [(m, h) for m, h, _ in whole]
    i = starts.index(b)
    expected[i] = (expected[i][0], bytes(damaged[b + HEAD.size :][: len(expected[i][1])]))
    fd = os.open(comp, os.O_RDONLY)
    try:
        found = list(scan_headers(fd, len(broken)))
        for prefix in (0, 30, 500):  # headers read in part, the rest after: the same
            heads = list(scan_heads(fd, len(broken), prefix))
            assert all(len(h) <= prefix for _, h, _, _, _ in heads)
            assert [
                (m, whole_header(fd, at, h, hlen), at, blen) for m, h, at, hlen, blen in heads
            ] == found
            for skip in ((SAMPLE_MAGIC,), (MAGIC, MARK_MAGIC)):  # hopped over, not listed
                rest = list(scan_heads(fd, len(broken), prefix, skip))
                assert rest == [x for x in heads if x[0] not in skip]
                assert len(rest) < len(heads)
        for m, h, at, blen in found:  # each at its place
            assert broken[at : at + 4] == m and broken[at + HEAD.size :][: len(h)] == h
            assert HEAD.unpack_from(broken, at)[1:3] == (len(h), blen)
        first = starts[next(i for i, (m, _, _) in enumerate(whole) if m == MAGIC)]
        assert first < a and read_block(fd, first) is not None  # a column block, whole
        assert read_block(fd, first + 1) is None
    finally:
        os.close(fd)
    assert [(m, h) for m, h, _, _ in found] == expected


def test_a_writer_without_marks_in_the_tail_means_no_glance(tmp_path: Path) -> None:
    """Writers of an older telemetry (column blocks, no marks) whose lines began before
    the tail: their earlier events would be missed, so the file is read whole."""
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(messy_run(3000, 5, samples=0.3))
    index_file(str(path), block_rows=100)
    comp = tmp_path / COLUMNS_FILE
    comp.write_bytes(
        b"".join(
            block_bytes(magic, h, b)
            for magic, h, b in walk_blocks(comp.read_bytes())
            if magic == MAGIC
        )
    )
    assert len(read_blocks(comp.read_bytes())) > 10
    assert "but no marks" in str(glanced(path))


def test_a_planted_mark_shows_no_line_that_is_not_one(tmp_path: Path) -> None:
    """Marks that point into the middle of a line, past a line's end, at a line of
    another kind: nothing of them is shown."""
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(messy_run(3000, 9))
    index_file(str(path), block_rows=100)
    data = path.read_bytes()
    st = os.stat(path)
    g0 = glanced(path)
    assert isinstance(g0, Glance)
    step_line = data.index(b'"kind": "train"', 5000)
    start = data.rindex(b"\n", 0, step_line) + 1
    end = data.index(b"\n", step_line) + 1
    planted = [
        [start + 3, 10, "log"],
        [start, end - start + 5, "train"],
        [start, end - start, "ckpt"],
    ]
    with open(tmp_path / COLUMNS_FILE, "ab") as f:
        f.write(encode_marks((st.st_dev, st.st_ino), "*", planted, False))
    g = glanced(path)
    assert isinstance(g, Glance)
    assert g.marks == g0.marks


def test_a_glance_shows_what_the_whole_read_shows_of_the_run_now(tmp_path: Path) -> None:
    """Its latest step and values, checkpoints, validations, logs and verdict are the
    whole read's; its charts reach back to the first step; it counts no record lost
    that the lines do not show lost."""
    path = tmp_path / "metrics.jsonl"
    lines = Lines("rank0")
    side = Lines("sidecar")
    parts = [lines.event("start", pid=1, global_step=0, run_id="r")]
    for step in range(6000):
        parts.append(lines.train(step, 3.0 - step / 3000, epoch=step // 1000))
        if step % 10 == 0:
            parts.append(side.gpu(95.0))
        if step % 1000 == 999:
            parts.append(lines.val(step + 1, step // 1000, 1.5))
            parts.append(lines.ckpt("save_finished", f"/c/{step // 1000}", complete=True))
            parts.append(lines.log(f"epoch {step // 1000} done"))
    path.write_bytes(b"".join(parts))
    index_file(str(path), block_rows=200)
    data = path.read_bytes()
    g = glanced(path, tail_rows=500)
    assert isinstance(g, Glance), g
    built = glance_run(GlanceData(g.size, g.tail_from, g.tail, tuple(g.marks), g.digest))
    assert not isinstance(built, str), built
    quick, history = built
    whole = Run()
    whole.feed(0, data)
    now = lines.ts + 5
    a, b = build_snapshot(quick.state, now), build_snapshot(whole.state, now)
    assert (a.progress.step, a.progress.epoch, a.latest) == (
        b.progress.step,
        b.progress.epoch,
        b.latest,
    )
    assert [(c.event, c.path) for c in a.checkpoints] == [(c.event, c.path) for c in b.checkpoints]
    assert a.val_rows == b.val_rows and [x.msg for x in a.logs] == [x.msg for x in b.logs]
    assert (a.diagnosis.health, a.diagnosis.reason) == (b.diagnosis.health, b.diagnosis.reason)
    assert a.lost == 0 == b.lost and a.malformed == 0
    assert len(quick.state.table) < 1000 and history.steps > 5000
    loss = next(line for line in a.loss_lines if line.label == "loss")
    assert min(loss.x) == 0 and max(loss.x) == 5999
    whole_loss = next(line for line in b.loss_lines if line.label == "loss")
    assert max(loss.y) == pytest.approx(max(whole_loss.y), rel=1e-6)
    assert min(loss.y) == pytest.approx(min(whole_loss.y), rel=1e-6)
    # τ from the history's means: the first at the middle of its first entry (a digest's)
    assert a.tau_line is None or min(a.tau_line.x) <= (history.first[0] + history.last[0]) / 2


@pytest.mark.parametrize(
    "digest",
    [
        None,
        [],
        {"blocks": [], "stats": {}},
        {"blocks": [[5, 1, 10, 0, 1]], "stats": {}},  # last before first
        {"blocks": "x", "stats": {}},
        {"blocks": [["a", 2, 3, 4, 5]], "stats": {}},
    ],
)
def test_a_digest_that_is_not_one_is_no_history(digest: Any) -> None:
    assert history_of(digest) is None


def test_a_digest_keeps_its_good_blocks_and_columns_only() -> None:
    h = history_of(
        {
            "blocks": [[0, 9, 10, 1.0, 2.0], [5, 20, 10, 2, 3], [10, 19, 10, 3.0, 4.0]],
            "stats": {
                "train.loss": [[1, 0.5, 3, 2, 4, 1, 1.1], None, [1, math.inf, 0, 2, 1, 1, 1]],
                "train.x": [[1, 2, 3]],  # not one a block
            },
        }
    )
    assert h is not None and h.blocks == 2  # the second overlaps the first: left out
    assert set(h.stats) == {"train/loss"}
    pts = h.points("train/loss", 0, 100)
    assert pts is not None and list(pts[1]) == [1, 0.5, 2, 1]  # the non-finite one: left out


@pytest.mark.parametrize(
    "rows",
    [
        [[1, 0.5, 3, 2, 4, 1, 1.1], [2.0, 1.0, 0, 3.0, 5, 2.5, 2.0]],  # all at once
        [[1, 0.5, 3, 2, 4, 1, 1.1], [1, math.inf, 0, 2, 1, 1, 1]],  # all at once, one NaN
        [[1, 0.5, 3, 2, 4, 1, 1.1], [1, math.nan, 0, 2, 1, 1, 1]],
        [[1, 0.5, 3, 2, 4, 1, 1.1], [True, 0.5, 3, 2, 4, 1, 1.1]],  # a bool: one by one
        [[1, 0.5, 3, 2, 4, 1, 1.1], [10**400, 0.5, 3, 2, 4, 1, 1.1]],  # no float holds it
        [[1, 0.5, 3, 2, 4, 1, 1.1], ["1", 0.5, 3, 2, 4, 1, 1.1]],
        [[1, 0.5, 3, 2, 4, 1, 1.1], [1, 0.5, 3, 2, 4, 1]],
    ],
)
def test_a_digests_stats_are_kept_where_they_are_seven_finite_numbers(rows: Any) -> None:
    """Whether read all at once or one by one, a block's stats are its row where they
    are seven finite numbers (not bools, not strings), and NaN where they are not."""
    h = history_of(
        {"blocks": [[0, 9, 10, 1.0, 2.0], [10, 19, 10, 3.0, 4.0]], "stats": {"train.loss": rows}}
    )
    assert h is not None
    got = h.stats["train/loss"]
    for row, s in zip(got, rows, strict=True):
        plain = all(type(v) in (int, float) and abs(v) < 1e300 and math.isfinite(v) for v in s)
        if plain and len(s) == 7:
            assert list(row) == [float(v) for v in s]
        else:
            assert np.isnan(row).all()


def test_frames_that_do_not_add_up_are_no_glance() -> None:
    from eagle3_tui.transport.channel import DataFrame

    said = {"ok": True, "size": 10, "tail_from": 5}
    digest = json.dumps({"blocks": [], "stats": {}, "marks": [[0, 3]]}).encode()
    good = [DataFrame(-2, digest), DataFrame(-1, b"ab\n"), DataFrame(5, b"12345")]
    assert isinstance(assemble(said, good), GlanceData)
    assert "not in one piece" in str(assemble(said, [*good[:2], DataFrame(6, b"2345")]))
    assert "ends before" in str(assemble(said, [*good[:2], DataFrame(5, b"1234")]))
    assert "do not add up" in str(assemble(said, [good[0], DataFrame(-1, b"ab\nc"), good[2]]))
    assert "without its digest" in str(assemble(said, good[1:]))
    assert "no glance" in str(assemble({"ok": False}, good))
    assert "size" in str(assemble({"ok": True, "size": "x"}, good))


def glance_file(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    path = run / "metrics.jsonl"
    path.write_bytes(messy_run(5000, 11, samples=0.5))
    index_file(str(path), block_rows=200)
    return run


async def test_the_monitor_shows_a_glance_then_the_whole_read_in_its_place(tmp_path: Path) -> None:
    run = glance_file(tmp_path)
    pipeline = Pipeline(glance_min=1)
    source = LocalTransport(run)
    tasks = [
        asyncio.ensure_future(pipeline.pump(source, lambda _e: None)),
        asyncio.ensure_future(pipeline.ingest()),
    ]
    seen: list[tuple[bool, str | None]] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            await asyncio.sleep(0.001)
            if not pipeline.run.unsettled.records:
                continue
            snap, _ = await pipeline.snapshot(time.time(), ViewParams())
            seen.append((pipeline.run.unsettled.history is not None, snap.history))
            if pipeline.filling is None and pipeline.run.unsettled.history is None:
                break
        live = pipeline._live_task  # the glance's own stream ends with it, the file idle
        await asyncio.sleep(0.05)
        assert live is not None and live.done() and not tasks[0].done()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert pipeline.glance_note is None
    assert seen[0][0] and seen[0][1] is not None and "reading the whole history" in seen[0][1]
    assert seen[-1] == (False, None)
    whole = Run()
    whole.feed(0, (run / "metrics.jsonl").read_bytes())
    assert list(pipeline.run.state.table.steps) == list(whole.state.table.steps)
    assert pipeline.run.state.records == whole.state.records


def test_a_host_sends_the_glance_this_machine_reads(
    tmp_path: Path, sshd: Sshd, client: str
) -> None:
    run = glance_file(tmp_path)
    local = glance_local(run / "metrics.jsonl", 300, 0)
    assert isinstance(local, GlanceData)

    async def remote() -> GlanceData | str:
        transport = SshTransport(stream_host(client, ssh_target(sshd, str(run))), str(run))
        return await transport.glance(300, 0)

    got = asyncio.run(remote())
    assert isinstance(got, GlanceData), got
    assert (got.size, got.tail_from, got.tail, got.marks) == (
        local.size,
        local.tail_from,
        local.tail,
        local.marks,
    )
    assert got.digest == local.digest
    host = stream_host(client, ssh_target(sshd, str(run)))
    small = asyncio.run(glance_remote(host, str(run), "metrics.jsonl", 300, 1 << 40))
    assert isinstance(small, str) and "read whole" in small


class HeldTransport(LocalTransport):
    """This machine's run, whose whole read (the stream from 0) waits for ``go``."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir)
        self.go = asyncio.Event()

    def fork(self) -> LocalTransport:
        return LocalTransport(self.run_dir)

    async def stream(self, offset: int = 0) -> AsyncIterator[StreamEvent]:
        if offset == 0:
            await self.go.wait()
        async for event in super().stream(offset):
            yield event


async def test_the_monitor_opens_a_long_run_at_a_glance_and_its_keys_work_meanwhile(
    tmp_path: Path,
) -> None:
    from eagle3_tui.app.app import make_app
    from eagle3_tui.app.widgets.header import RunHeader
    from tests.app.conftest import text_of
    from tests.conftest import until

    run = glance_file(tmp_path)
    source = HeldTransport(run)
    app = make_app(source, refresh_interval=0.02, glance_min=1)
    whole = Run()
    whole.feed(0, (run / "metrics.jsonl").read_bytes())
    last = whole.state.global_step
    assert last is not None
    async with app.run_test(size=(120, 40)) as pilot:
        header = app.query_one(RunHeader)
        await until(pilot, lambda: "reading the whole history" in text_of(header), what="glance")
        assert f"step {last + 1:,}" in text_of(header)  # the newest step, shown 1-based
        loss = app.snapshot.loss_lines[0]
        assert min(loss.x) < 1000 and max(loss.x) == last  # the history in brief, then the tail
        await pilot.press("e")  # the table holds the newest steps only: said, not written
        await until(
            pilot,
            lambda: any("still being read" in str(n.message) for n in app._notifications),
            what="export refused",
        )
        await pilot.press("p")  # a view key works meanwhile
        await until(pilot, lambda: "PAUSED" in text_of(header), what="paused")
        await pilot.press("p")
        source.go.set()
        await until(pilot, lambda: "reading" not in text_of(header), what="the whole read")
        await until(pilot, lambda: app.pipeline.run.unsettled.history is None, what="swapped")
        assert list(app.pipeline.run.state.table.steps) == list(whole.state.table.steps)


def test_marks_that_could_not_be_written_are_said_lost_once_they_can(tmp_path: Path) -> None:
    """An event while the companion cannot be written (a full disk; here a directory in
    its place): its mark is lost, and once the companion can be written again the
    writer says so, so no glance trusts marks that miss an event."""
    path = tmp_path / "metrics.jsonl"
    blocked = tmp_path / COLUMNS_FILE
    blocked.mkdir()
    w = JsonlWriter(path, writer_id="rank0", background=False)
    w.write("log", {"level": "ERROR", "logger": "speculators", "msg": "an event"})
    blocked.rmdir()
    for i in range(2500):
        w.write("train", {"train": {"loss": 1.0}, "epoch": 0, "lr": 1e-4}, step=i)
    w.close()
    assert len(read_blocks(blocked.read_bytes())) == 3  # the steps' blocks are there
    assert "lost track" in str(glanced(path))
    assert sum(w.stats.errors.values()) == 2  # its announcement and the event's mark, once each


def test_a_tail_that_begins_in_a_stretch_of_nan_losses_is_read_whole(tmp_path: Path) -> None:
    """Since when the loss is NaN is told only by the lines before the tail: no glance
    (the verdict names the first non-finite step, read from the lines)."""
    path = tmp_path / "metrics.jsonl"
    lines = Lines("rank0")
    path.write_bytes(
        b"".join(lines.train(s, float("nan") if s >= 1000 else 1.0) for s in range(3000))
    )
    index_file(str(path), block_rows=200)
    fd = os.open(path, os.O_RDONLY)
    try:  # NaN steps are no rows: only a tail cut by its byte bound starts among them
        g = glance(fd, str(path), ["train."], 300, max_tail=50_000)
    finally:
        os.close(fd)
    assert isinstance(g, Glance), g
    built = glance_run(GlanceData(g.size, g.tail_from, g.tail, tuple(g.marks), g.digest))
    assert isinstance(built, str) and "non-finite" in built
    whole = glanced(path, tail_rows=300)  # uncut: the stretch's start is in the tail
    assert isinstance(whole, Glance)
    assert not isinstance(
        glance_run(
            GlanceData(whole.size, whole.tail_from, whole.tail, tuple(whole.marks), whole.digest)
        ),
        str,
    )


@pytest.mark.parametrize("pictured", [True, False])
async def test_the_whole_read_behind_a_glance_waits_for_the_first_picture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pictured: bool
) -> None:
    """The whole read behind a glance reads nothing until the first picture is built
    (the build has the interpreter to itself), or until FIRST_PICTURE_S has passed
    without one (a caller that never asks for a picture still gets the whole run)."""
    monkeypatch.setattr(pipeline_module, "FIRST_PICTURE_S", 3.0)
    run = glance_file(tmp_path)
    pipeline = Pipeline(glance_min=1)
    links: list[object] = []
    tasks = [
        asyncio.ensure_future(pipeline.pump(LocalTransport(run), links.append)),
        asyncio.ensure_future(pipeline.ingest()),
    ]
    try:
        for _ in range(6000):  # the glance shown, its whole read set up
            if pipeline._fill is not None:
                break
            await asyncio.sleep(0.005)
        fill = pipeline._fill
        assert fill is not None and pipeline.run.unsettled.history is not None
        at = time.monotonic()
        await asyncio.sleep(0.5)
        assert links, "the link's state is said before the first picture"
        assert fill.reader.next_offset == 0 and not pipeline._fill_pending  # nothing read
        if pictured:
            await pipeline.snapshot(time.time(), ViewParams())
        await asyncio.wait_for(pipeline.filled.wait(), 30)
        took = time.monotonic() - at
        assert took < 2.5 if pictured else took >= 2.8, took  # (the read itself: ~0.1 s)
        assert pipeline.run.unsettled.history is None  # the whole read, shown
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
