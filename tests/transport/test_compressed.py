"""The compressed catch-up (Z frames): the same bytes at the same offsets as the plain
one, so the same model state; and a disconnect in the middle of it over a real sshd
resumes with no record lost or repeated."""

from __future__ import annotations

import asyncio
import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from eagle3_tui.agent import BOOTSTRAP
from eagle3_tui.agent.names import COMPRESS_ZLIB
from eagle3_tui.model.reader import LineReader
from eagle3_tui.model.run import Run
from eagle3_tui.model.summary import summarize
from eagle3_tui.transport import channel
from eagle3_tui.transport.base import Link
from eagle3_tui.transport.channel import (
    AGENT_TAG,
    ChannelLostError,
    DataFrame,
    FrameParser,
    agent_payload,
    read_frames,
)
from tests.model.test_state import mixed_stream
from tests.records import Lines
from tests.transport.conftest import ssh_target
from tests.transport.sshd import Sshd
from tests.transport.test_ssh_stream import (
    Follower,
    client,
    drop_mid_catch_up,
    stream_host,
)

__all__ = ["client"]  # the fixture, used by name


def agent_output(run_dir: Path, **request: Any) -> bytes:
    """The real agent's stdout for one ``read`` of ``run_dir/metrics.jsonl``."""
    payload = agent_payload({"op": "read", "run_dir": str(run_dir), **request})
    proc = subprocess.run(
        [sys.executable, "-c", BOOTSTRAP, AGENT_TAG],
        input=payload,
        capture_output=True,
        timeout=60,
        check=True,
    )
    return proc.stdout


def parse(output: bytes, cuts: list[int]) -> list[DataFrame]:
    """The data frames of ``output`` fed to the client's parser in pieces cut at ``cuts``."""
    parser = FrameParser()
    frames: list[DataFrame] = []
    prev = 0
    for p in [*sorted({c % (len(output) + 1) for c in cuts}), len(output)]:
        frames += [f for f in parser.feed(output[prev:p]) if isinstance(f, DataFrame)]
        prev = p
    assert not parser.partial
    return frames


def payload_header(payload: bytes) -> dict[str, Any]:
    """A C frame's payload's header (agent/column_plan.py)."""
    (hlen,) = struct.unpack_from("<I", payload)
    header: dict[str, Any] = json.loads(payload[4 : 4 + hlen])
    return header


def payload_blocks(payload: bytes) -> list[int]:
    """The blocks a C frame's payload carries, by their rows (agent/column_plan.py:
    consecutive blocks alike share a frame)."""
    h = payload_header(payload)
    return [p[0] for p in h["pieces"]] if "pieces" in h else [h["n"]]


def frame_kinds(output: bytes) -> list[str]:
    """The kind of each frame of the agent's output (J, D, Z, C), read header by header:
    a D frame's payload may hold any bytes, ``\nZ `` too."""
    kinds: list[str] = []
    pos = 0
    while pos < len(output):
        end = output.index(b"\n", pos)
        head = output[pos:end].split(b" ")
        kind = head[0].decode()
        kinds.append(kind)
        pos = end + 1
        if kind == "D":
            pos += int(head[2])
        elif kind in ("Z", "C"):
            pos += int(head[3])
    return kinds


def state_of(frames: list[DataFrame]) -> tuple[object, ...]:
    """Everything the model holds after these frames, exactly (floats unrounded)."""
    run = Run()
    for f in frames:
        run.feed(f.offset, f.data)
    s = run.state
    return (
        list(s.table.steps),
        {k: bytes(v) for k, v in sorted(s.table.columns.items())},
        s.records,
        s.malformed_count,
        s.lost_records,
        s.duplicate_records,
        [(r.first, r.last) for r in s.redos],
        len(s.logs),
        sorted(s.samplers.gpu_devices),
        len(s.samplers.gpu_samples),
        json.dumps(summarize(s, 2_000_000.0), sort_keys=True, default=str),
        run.reader.complete_offset,
        run.reader.next_offset,
    )


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("z")


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@example(  # junk that looks like Z frame headers, inside a D frame (CI once drew b"Z ")
    seed=0, steps=1, junk=b"Z \n{}\nZ 1 2 3\n", torn=0, cuts=[], level=None
)
@given(
    seed=st.integers(0, 10_000),
    steps=st.integers(1, 9000),
    junk=st.binary(max_size=300),
    torn=st.integers(0, 200),
    cuts=st.lists(st.integers(0, 10**7), max_size=20),
    level=st.sampled_from([None, 0, 1, 6, 9]),
)
def test_the_compressed_catch_up_gives_exactly_the_state_of_the_plain_one(
    run_dir: Path,
    seed: int,
    steps: int,
    junk: bytes,
    torn: int,
    cuts: list[int],
    level: int | None,
) -> None:
    """Any file (records of every kind, resumes, junk bytes, a torn last line), any
    zlib level, the agent's output split anywhere: the compressed read delivers the
    file's bytes at their offsets, and the model ends in the plain read's state."""
    tail = Lines("w9").train(steps, 0.5)[: torn % 100]
    data = mixed_stream(steps, seed) + junk + b"\n" + tail
    (run_dir / "metrics.jsonl").write_bytes(data)
    plain = agent_output(run_dir)
    extra: dict[str, Any] = {} if level is None else {"level": level}
    packed = agent_output(run_dir, compress=COMPRESS_ZLIB, **extra)
    assert "Z" not in frame_kinds(plain)
    if len(data) >= 16 * 1024 and level != 0:
        assert "Z" in frame_kinds(packed), "a catch-up this big travels compressed"
        assert len(packed) < len(plain) / 2
    frames = parse(packed, cuts)
    assert b"".join(f.data for f in frames) == data
    assert [f.offset for f in frames] == [
        sum(len(g.data) for g in frames[:i]) for i in range(len(frames))
    ]
    assert state_of(frames) == state_of(parse(plain, []))


def test_a_corrupt_compressed_frame_loses_the_channel_not_a_record() -> None:
    """A Z frame that does not inflate to its length is never delivered: the stream
    treats it as a lost connection and asks again from the last good offset."""
    data = b'{"kind":"log"}\n' * 100
    good = zlib.compress(data)
    bomb = zlib.compress(bytes(64 << 20), 9)
    parser = FrameParser()
    (frame,) = parser.feed(b"Z 7 %d %d\n" % (len(data), len(good)) + good)
    assert isinstance(frame, DataFrame) and frame.offset == 7 and frame.data == data
    for bad in (
        b"Z 0 %d %d\n" % (len(data) + 1, len(good)) + good,  # the wrong length
        b"Z 0 %d %d\n" % (len(data), len(good)) + good[:-5] + b"xxxxx",  # corrupt
        b"Z 0 %d %d\n" % (len(data) - 1, len(good)) + good,  # more than it says
        b"Z 0 100 %d\n" % len(bomb) + bomb,  # 64 MiB from 64 KiB: not inflated at all
    ):
        with pytest.raises(ChannelLostError, match="bad compressed frame at offset 0"):
            FrameParser().feed(bad)


async def collect(reader: asyncio.StreamReader, into: list[DataFrame]) -> None:
    async for frame in read_frames(reader):
        assert isinstance(frame, DataFrame)
        into.append(frame)


async def test_output_that_ends_inside_a_compressed_frame_delivers_the_frames_before_it_only() -> (
    None
):
    """The agent's output cut anywhere inside a Z frame (a disconnect): the whole frames
    before it arrive, the torn one never does, and the stream's resume point is the end
    of the last line delivered."""
    data = b"".join(Lines().train(i, 1.0) for i in range(400))
    a, b = data[: len(data) // 2 + 17], data[len(data) // 2 + 17 :]  # cut mid-line
    za, zb = zlib.compress(a, 1), zlib.compress(b, 1)
    out = b"Z 0 %d %d\n" % (len(a), len(za)) + za + b"Z %d %d %d\n" % (len(a), len(b), len(zb)) + zb
    second = len(out) - len(zb)
    for cut in (second - 3, second + 1, second + len(zb) // 2, len(out) - 1):
        reader = asyncio.StreamReader()
        reader.feed_data(out[:cut])
        reader.feed_eof()
        got: list[DataFrame] = []
        with pytest.raises(ChannelLostError, match="inside a frame"):
            await collect(reader, got)
        assert [(f.offset, f.data) for f in got] == [(0, a)]
        lines = LineReader()
        lines.feed(0, got[0].data)
        assert lines.complete_offset == a.rfind(b"\n") + 1 < len(a)  # asked for again


def test_an_old_client_gets_plain_frames(tmp_path: Path) -> None:
    """A request without ``compress`` (an older client) is answered with D frames only."""
    (tmp_path / "metrics.jsonl").write_bytes(mixed_stream(3000, 1))
    out = agent_output(tmp_path)
    frames = parse(out, [])
    assert b"".join(f.data for f in frames) == (tmp_path / "metrics.jsonl").read_bytes()
    assert b"\nZ " not in out


@pytest.mark.slow
async def test_a_disconnect_in_the_middle_of_a_compressed_catch_up_loses_and_repeats_nothing(
    sshd: Sshd, tmp_path: Path, client: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = run_dir / "metrics.jsonl"
    lines = Lines()
    n = 60_000  # ~20 MB: a catch-up of ~20 Z frames
    path.write_bytes(b"".join(lines.train(i, 3.0 - i * 1e-5) for i in range(n)))
    size = path.stat().st_size
    inflated: list[int] = []  # the offsets of the Z frames the client unpacked
    real = channel._inflate

    def counted(packed: bytes, length: int, offset: int) -> bytes:
        inflated.append(offset)
        return real(packed, length, offset)

    monkeypatch.setattr(channel, "_inflate", counted)
    host = stream_host(client, ssh_target(sshd))
    f = Follower.ssh(host, run_dir)
    try:
        await f.until(lambda: len(f.records) > 0, what="the first records")
        seen = len(inflated)  # (no await before the kill: nothing arrives in between)
        more = await drop_mid_catch_up(f, sshd, path, lines, n, size)
    finally:
        await f.close()
        await host.close()
    assert f.count(Link.RECONNECTING) >= 1
    assert seen >= 1 and len(inflated) > seen, "Z frames before the kill and after it"
    assert max(inflated) > size - (1 << 20), "the catch-up's end came compressed too"
    assert [r.seq for r in f.records] == list(range(n + 100)), "a record was lost or repeated"
    assert f.restarts == [] and f.malformed == []
    assert f.reader.complete_offset == size + len(more)


def z_frames(output: bytes) -> list[tuple[int, int, bytes]]:
    """The Z frames of an agent's output: (offset, length, packed bytes)."""
    out, pos = [], 0
    while pos < len(output):
        nl = output.index(b"\n", pos)
        kind, *fields = output[pos:nl].split()
        pos = nl + 1
        if kind == b"Z":
            off, length, zlength = map(int, fields)
            out.append((off, length, output[pos : pos + zlength]))
            pos += zlength
        elif kind == b"D":
            pos += int(fields[1])
    return out


def test_the_level_asked_for_is_the_level_sent(tmp_path: Path) -> None:
    data = b"".join(Lines().train(i, 3.0 / (i + 1)) for i in range(12_000))  # ~3.5 MB
    (tmp_path / "metrics.jsonl").write_bytes(data)
    for level in (None, 1, 9):  # None: the default, level 1
        extra = {} if level is None else {"level": level}
        frames = z_frames(agent_output(tmp_path, compress=COMPRESS_ZLIB, **extra))
        assert len(frames) >= 3
        for off, length, packed in frames:
            assert packed == zlib.compress(data[off : off + length], level or 1)
