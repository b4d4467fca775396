"""The agent's reader of W&B run files (standard library only) against W&B's own reader
(wandb-core's, through ``wandb leet inspect --json``: wandb 0.31 has no Python one
left), on a run written by the real wandb through speculators' own ``WandbHandler``
(``setup_metric_logger("wandb", …)``, offline), and on hostile files: a torn record, a
bad CRC, an impossible chunk length, a record bigger than memory allows, a file read
while it grows, a file that is not W&B's. The trainer's file is found by what it holds
open, or by its ``debug.log``, never in a place another user could have planted it."""

from __future__ import annotations

import json
import math
import os
import random
import struct
import subprocess
import sys
import textwrap
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.agent import tfevents, wandbfile
from eagle3_tui.agent.wandbfile import BLOCK, CHUNK_HEADER, Framing, Row
from tests.conftest import OtherUser, lazy_module, need_training, skip_module_without, wait_until

skip_module_without("wandb")
pb = lazy_module("wandb.proto.wandb_internal_pb2")

STEPS = 120
PER_EPOCH = 40

SCRIPT = textwrap.dedent(
    """
    # metrics to W&B as speculators' CLI configures them (--logger wandb), offline
    import json, logging, os, sys

    from speculators.train.logger import setup_metric_logger

    log_dir, steps, per_epoch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    setup_metric_logger("wandb", "wb_run", log_dir)
    metrics = logging.getLogger("speculators.metrics")
    # the run's configuration, long enough to take chunks in three blocks
    metrics.info({"notes": "x" * 70000, "lr": 3e-4}, extra={"hparams": True})
    logged = []
    for step in range(steps):
        train = {"loss": 2.0 / (step + 1), "text": "not a number"}
        train.update({f"full_acc_{i}": step / steps / (i + 1) for i in range(4)})
        train.update({f"cond_acc_{i}": 0.9 - i / 10 + step / 1000 for i in range(4)})
        if step == 5:
            train["loss"] = float("nan")
        if step == 6:
            train["loss"] = float("inf")
        d = {
            "train": train,
            "profile": {"step_s": 0.25 + step / 1000},
            "epoch": step // per_epoch,
            "lr": 3e-4 * (1 - step / steps),
            "global_step": step,
        }
        metrics.info(d, extra={"step": step})
        logged.append([d, step])
        if step % per_epoch == per_epoch - 1:
            v = {"val": {"loss_epoch": 1.0 / (step + 1)}, "epoch": step // per_epoch}
            metrics.info(v, extra={"step": step + 1})
            logged.append([v, step + 1])
    print(json.dumps({"pid": os.getpid(), "logged": logged}), flush=True)
    sys.stdin.readline()  # held open (a live run) until told to finish
    import wandb

    wandb.finish()
    """
)


class WandbRun:
    """The script above, run by the real wandb in offline mode: live until :meth:`finish`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.logs = root / "logs"
        (root / "train.py").write_text(SCRIPT)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(root),
            "WANDB_MODE": "offline",
            "WANDB_SILENT": "true",
            "WANDB_DIR": str(root),
            "WANDB_CACHE_DIR": str(root / "cache"),
            "WANDB_CONFIG_DIR": str(root / "config"),
        }
        self.env = env
        self.started = time.time()
        self.proc = subprocess.Popen(
            [sys.executable, "train.py", str(self.logs), str(STEPS), str(PER_EPOCH)],
            cwd=root,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(root / "stderr.txt", "wb"),  # noqa: SIM115 (the child's)
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the script's report, once all is logged
        assert line, (root / "stderr.txt").read_text()[-3000:]
        report = json.loads(line)
        self.pid: int = report["pid"]
        self.logged: list[tuple[dict[str, Any], int]] = [(d, s) for d, s in report["logged"]]

    @property
    def path(self) -> Path:
        [found] = list(self.logs.glob("wandb/offline-run-*/run-*.wandb"))
        return found

    def finish(self) -> Path:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write(b"\n")
            self.proc.stdin.close()
            assert self.proc.wait(timeout=60) == 0, (self.root / "stderr.txt").read_text()[-3000:]
        return self.path

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()


@pytest.fixture(scope="module")
def wandb_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WandbRun]:
    need_training()
    run = WandbRun(tmp_path_factory.mktemp("wandb"))
    try:
        yield run
    finally:
        run.stop()


def their_history(path: Path, env: dict[str, str]) -> list[Row]:
    """The history rows W&B's own reader (wandb-core's) reads from ``path``: numbers
    only, as ours keeps them (``NaN``/``Infinity`` spelled out), W&B's ``_`` keys aside."""
    wandb_cli = Path(sys.executable).parent / "wandb"
    out = subprocess.run(
        [str(wandb_cli), "leet", "inspect", "--json", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    ).stdout
    rows: list[Row] = []
    for line in out.splitlines():
        rec = json.loads(line)
        if rec.get("type") != "history":
            continue
        items = rec["history"]["item"]
        metrics = {}
        for k, v in items.items():
            if k.startswith("_"):
                continue
            number = isinstance(v, (int, float)) and not isinstance(v, bool)
            if number or v in ("NaN", "Infinity", "-Infinity"):
                metrics[k] = float(v)
        step = rec["history"].get("step", {}).get("num", 0)
        rows.append((metrics, step, float(items["_timestamp"])))
    return rows


def read(data: bytes) -> tuple[list[Row], int, Framing]:
    framing = Framing()
    rows, used = wandbfile.history(data, framing)
    return rows, used, framing


def same(a: list[Row], b: list[Row]) -> bool:
    """Rows equal, NaN equal to NaN."""

    def key(rows: list[Row]) -> list[Any]:
        return [
            (sorted((k, "nan" if math.isnan(v) else v) for k, v in m.items()), s, t)
            for m, s, t in rows
        ]

    return key(a) == key(b)


def chunks(data: bytes) -> list[tuple[int, int, int]]:
    """``(offset, length, type)`` of each chunk of a good file (the test's own walk)."""
    out = []
    at = CHUNK_HEADER
    while at + CHUNK_HEADER <= len(data):
        room = BLOCK - at % BLOCK
        if room < CHUNK_HEADER:
            at += room
            continue
        _, length, kind = struct.unpack_from("<IHB", data, at)
        out.append((at, length, kind))
        at += CHUNK_HEADER + length
    return out


def history_chunk(data: bytes) -> tuple[int, int]:
    """``(offset, length)`` of a one-chunk history record well inside its block, in
    the file's middle."""
    found = [
        (at, length)
        for at, length, kind in chunks(data)
        if kind == 1
        and 2000 < at % BLOCK < BLOCK - 2000
        and pb.Record.FromString(data[at + CHUNK_HEADER : at + CHUNK_HEADER + length]).HasField(
            "history"
        )
    ]
    return found[len(found) // 2]


def read_grown(
    data: bytes, rng: random.Random, most: int, read: Callable[[bytes, int], int]
) -> None:
    """``read(what is there from the kept offset, that offset) -> bytes used`` on
    ``data`` as a follower sees it while a writer appends pieces of 1 to ``most``
    bytes; the next look begins where the last one's used bytes end."""
    end = 0
    offset = 0
    while offset < len(data):
        end = min(len(data), end + rng.randint(1, most))
        used = read(data[offset:end], offset)
        assert end < len(data) or used, "a look at the whole file read nothing"
        offset += used


def log_file(records: list[bytes]) -> bytes:
    """A W&B run file of ``records`` as wandb writes one (LevelDB log framing, 32 KiB
    blocks from the file's start, the 7-byte W&B header first)."""
    out = bytearray(wandbfile.HEADER)
    for rec in records:
        first = True
        while True:
            room = BLOCK - len(out) % BLOCK
            if room < CHUNK_HEADER:
                out += b"\0" * room
                continue
            piece, rec = rec[: room - CHUNK_HEADER], rec[room - CHUNK_HEADER :]
            kind = (1 if not rec else 2) if first else (4 if not rec else 3)
            crc = zlib.crc32(bytes([kind]) + piece)
            out += struct.pack("<IHB", crc, len(piece), kind) + piece
            first = False
            if not rec:
                break
    return bytes(out)


# ---- the trainer's live run ------------------------------------------------------------


def test_the_live_trainers_file_is_found_and_read_as_wandbs_own_reader_reads_it(
    wandb_run: WandbRun,
) -> None:
    """While the trainer runs, its wandb-core child holds the file: found by that, and
    read as W&B's reader reads it, the row of the step still open aside."""
    assert wandb_run.proc.poll() is None
    me = os.geteuid()
    found = wandbfile.find_run_files([str(wandb_run.root)], {wandb_run.pid}, me, None)
    assert found == [str(wandb_run.path)]
    # by what it holds, or its log: another PID finds nothing of it
    other = wandb_run.pid + 1
    while os.path.exists(f"/proc/{other}"):
        other += 1
    assert wandbfile.find_run_files([str(wandb_run.root)], {other}, me, None) == []
    assert wandbfile.find_run_files([str(wandb_run.root)], {wandb_run.pid}, None, None) == []

    def rows_written() -> list[Row] | None:
        rows, _, _ = read(wandb_run.path.read_bytes())
        return rows if len(rows) >= STEPS else None  # the last step's row is open

    ours = wait_until(rows_written, 30, "the history rows to be written")
    theirs = their_history(wandb_run.path, wandb_run.env)
    assert same(ours[: len(theirs)], theirs)


# ---- the finished run against W&B's own reader -----------------------------------------


def test_the_same_rows_as_wandbs_own_reader(wandb_run: WandbRun) -> None:
    path = wandb_run.finish()
    data = path.read_bytes()
    assert len(data) > 3 * BLOCK  # rows across blocks, a record in three
    assert {kind for _, _, kind in chunks(data)} == {1, 2, 3, 4}
    rows, used, framing = read(data)
    assert used == len(data)
    assert framing.problem is None and framing.not_metrics > 0  # config, summaries...
    theirs = their_history(path, wandb_run.env)
    assert len(theirs) == STEPS + 1 and same(rows, theirs)  # the last: validation only
    assert [s for _, s, _ in rows] == list(range(STEPS + 1))
    by_step = {s: m for m, s, _ in rows}
    assert math.isnan(by_step[5]["train/loss"]) and by_step[6]["train/loss"] == math.inf
    assert "train/text" not in by_step[7]  # text is no metric
    # every record read is one W&B's protobuf reads, and the history ones alike
    bodies, _ = wandbfile.records(data, Framing())
    decoded = [pb.Record.FromString(b) for b in bodies]
    assert sum(1 for r in decoded if r.HasField("history")) == STEPS + 1
    # the quick path for wandb-core's item layout reads what the general decoder reads
    items = [
        item
        for body in bodies
        for field, _, history in tfevents._fields(body)
        if field == 2
        for f2, _, item in tfevents._fields(history)
        if f2 == 1
    ]
    assert all(wandbfile._item(i) == wandbfile._decoded_item(i) for i in items)
    assert sum(1 for i in items if i[2 + i[1]] == 0x82) > len(items) // 2  # it takes most


def test_metric_dicts_are_those_of_the_event_file_reader(wandb_run: WandbRun) -> None:
    """The dicts a history row gives are the ones tfevents' Regroup makes of the same
    logged metrics (one event per flattened key, as speculators' TensorBoard handler
    writes them), W&B's merged train-and-validation rows pulled apart."""
    rows, _, _ = read(wandb_run.finish().read_bytes())
    ours = [d for row in rows for d, _ in wandbfile.metric_dicts(*row)]
    regroup = tfevents.Regroup()
    theirs = []
    for d, step in wandb_run.logged:
        flat = unflattened_keys(d)
        for tag, value in flat:
            theirs += [x for x, _ in regroup.add(0.0, step, tag, value)]
    theirs += [x for x, _ in regroup.flush()]
    assert len(ours) == STEPS + STEPS // PER_EPOCH
    assert [nan_free(d) for d in ours] == [nan_free(d) for d in theirs]
    assert [d["epoch"] for d in ours if "val" in d] == [0, 1, 2]
    assert all(ts > wandb_run.started - 5 for row in rows for _, ts in wandbfile.metric_dicts(*row))


def unflattened_keys(d: dict[str, Any], prefix: str = "") -> list[tuple[str, float]]:
    """speculators' ``_flatten_dict``, numbers only (what a TensorBoard scalar can be)."""
    out: list[tuple[str, float]] = []
    for k, v in d.items():
        if isinstance(v, dict):
            out += unflattened_keys(v, f"{prefix}{k}/")
        elif isinstance(v, (int, float)):
            out.append((prefix + k, float(v)))
    return out


def nan_free(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: nan_free(v) for k, v in d.items()}
    return "nan" if isinstance(d, float) and math.isnan(d) else d


def test_a_finished_run_is_found_by_its_debug_log(wandb_run: WandbRun) -> None:
    """Once the trainer let its run go (nothing holds the file), its ``debug.log``, with
    its PID, written after it started, names it."""
    path = wandb_run.finish()
    me = os.geteuid()
    root = [str(wandb_run.root)]
    assert wandbfile.find_run_files(root, {wandb_run.pid}, me, wandb_run.started) == [str(path)]
    assert wandbfile.find_run_files(root, {wandb_run.pid + 1}, me, None) == []
    # written before "the trainer" started: an earlier process with the same PID
    assert wandbfile.find_run_files(root, {wandb_run.pid}, me, time.time() + 60) == []
    (wandb_run.root / "link").symlink_to(wandb_run.logs)  # not followed: found once
    assert wandbfile.find_run_files(root, {wandb_run.pid}, me, None) == [str(path)]


# ---- hostile files -----------------------------------------------------------------------


@pytest.mark.parametrize("seed", [27, 28, 29])
def test_a_file_read_as_it_grows_reads_as_one_read(wandb_run: WandbRun, seed: int) -> None:
    """Cut anywhere, read from the kept offsets: the same rows, none twice."""
    data = wandb_run.finish().read_bytes()
    whole, _, whole_framing = read(data)
    framing = Framing()
    rows: list[Row] = []

    def look(piece: bytes, offset: int) -> int:
        got, used = wandbfile.history(piece, framing, offset)
        rows.extend(got)
        return used

    read_grown(data, random.Random(seed), 9000, look)
    assert same(rows, whole) and vars(framing) == vars(whole_framing)


def test_a_truncated_file_reads_a_prefix_and_waits_for_the_rest(wandb_run: WandbRun) -> None:
    data = wandb_run.finish().read_bytes()
    whole, _, _ = read(data)
    multi = [at for at, _, kind in chunks(data) if kind == 2]
    for cut in [*range(0, len(data), 997), multi[0] + 100, len(data) - 1]:
        rows, used, framing = read(data[:cut])
        assert same(rows, whole[: len(rows)]) and used <= cut
        assert framing.problem is None
    _, used, _ = read(data[: multi[0] + 100])
    assert used == multi[0]  # the torn record's first chunk: read again with the rest


def test_a_bad_crc_skips_that_record_only(wandb_run: WandbRun) -> None:
    """A byte flipped in one row: that row is skipped and counted, every other read;
    W&B's own reader loses the rest of that block (it skips to the next)."""
    data = wandb_run.finish().read_bytes()
    whole, _, _ = read(data)
    bad = bytearray(data)
    at, length = history_chunk(data)
    bad[at + CHUNK_HEADER + length // 2] ^= 0x01
    rows, used, framing = read(bytes(bad))
    assert framing.bad_crc == 1 and used == len(data)
    assert framing.problem == "1 chunk(s) skipped (their CRC does not match)"
    lost = [r for r in whole if not any(same([r], [x]) for x in rows)]
    assert len(lost) == 1 and len(rows) == len(whole) - 1
    path = wandb_run.root / "bad-crc" / "run-x.wandb"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(bytes(bad))
    theirs = their_history(path, wandb_run.env)
    assert len(theirs) < len(rows) and all(any(same([t], [r]) for r in rows) for t in theirs)


def test_an_impossible_chunk_length_loses_its_block_as_wandbs_reader_does(
    wandb_run: WandbRun,
) -> None:
    data = wandb_run.finish().read_bytes()
    bad = bytearray(data)
    at, _ = history_chunk(data)
    struct.pack_into("<H", bad, at + 4, 0xFFFF)  # longer than a block
    rows, used, framing = read(bytes(bad))
    assert framing.lost_blocks == 1 and used == len(data)
    path = wandb_run.root / "bad-length" / "run-x.wandb"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(bytes(bad))
    theirs = their_history(path, wandb_run.env)
    assert same(rows, theirs) and 0 < len(rows) < STEPS


def test_a_record_bigger_than_memory_allows_is_dropped_unheld(wandb_run: WandbRun) -> None:
    """A record of 4 MiB (FIRST, 130 MIDDLE, LAST chunks): dropped once it passes
    MAX_RECORD, never held whole; the rows around it read."""
    bodies, _ = wandbfile.records(wandb_run.finish().read_bytes(), Framing())
    history = [b for b in bodies if pb.Record.FromString(b).HasField("history")]
    huge = pb.Record(num=9, output_raw=pb.OutputRawRecord(line="y" * (4 << 20)))
    data = log_file([history[0], huge.SerializeToString(), history[1]])
    tracemalloc.start()
    rows, used, framing = read(data)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert framing.too_big == 1 and used == len(data) and [s for _, s, _ in rows] == [0, 1]
    assert peak < 2 * wandbfile.MAX_RECORD
    assert framing.problem == "1 record(s) over 1 MiB skipped"


@pytest.mark.parametrize("left", range(9))
def test_records_that_end_anywhere_in_a_block(left: int) -> None:
    """A record that leaves ``left`` bytes of its block: fewer than a chunk header are
    the block's zero trailer, skipped; read whole or cut anywhere, the same records."""
    records = [b"a" * (BLOCK - 2 * CHUNK_HEADER - left), b"second", b"third" * 10000, b"4"]
    data = log_file(records)
    assert wandbfile.records(data, Framing()) == (records, len(data))
    framing = Framing()
    got: list[bytes] = []

    def look(piece: bytes, offset: int) -> int:
        bodies, used = wandbfile.records(piece, framing, offset)
        got.extend(bodies)
        return used

    read_grown(data, random.Random(left), 5000, look)
    assert got == records and framing.problem is None


def test_a_record_cut_short_by_the_next_is_counted() -> None:
    """A FIRST chunk whose record never ends (the next record begins): counted, not read."""
    first_block = log_file([b"a" * 40000])[:BLOCK]
    chunk = log_file([b"next"])[CHUNK_HEADER:]
    framing = Framing()
    assert wandbfile.records(first_block + chunk, framing) == ([b"next"], BLOCK + len(chunk))
    assert framing.cut == 1 and framing.problem == "1 record(s) cut short"


def test_a_file_that_is_not_wandbs_is_not_read(tmp_path: Path) -> None:
    for data in (
        b"events.out.tfevents garbage" * 100,
        b":W&B\xe1\xbe\x01" + b"\0" * 100,  # a store version this reader does not know
        b"",
        wandbfile.HEADER[:3],
    ):
        rows, used, framing = read(data)
        assert rows == [] and used == 0
        if data[:3] == wandbfile.HEADER[:3] and len(data) < 7:
            assert framing.problem is None  # a header being written: wait
        elif data:
            assert framing.broken_at == 0
            assert framing.problem == "not a W&B run file (no W&B header at byte 0)"
            assert wandbfile.history(data + data, framing, len(data)) == ([], 0)  # stays


def test_a_typed_history_value_beside_value_json(tmp_path: Path) -> None:
    """wandb 0.31's ``x_history_value_encoding="json,typed"`` writes each value twice:
    the JSON one is read, the typed one skipped; text and ``_`` keys are not metrics."""
    h = pb.HistoryRecord()
    for key, json_text, typed in (
        ("train/loss", "0.5", ("number", 0.5)),
        ("global_step", "7", ("integer", 7)),
        ("train/note", '"hi"', ("text", "hi")),
        ("_timestamp", "1796315514.5", ("number", 1796315514.5)),
    ):
        item = h.item.add(key=key, value_json=json_text)
        setattr(item, *typed)
    h.step.num = 7
    rec = pb.Record(history=h).SerializeToString()
    assert wandbfile.history_row(rec) == (
        {"train/loss": 0.5, "global_step": 7.0},
        7,
        1796315514.5,
    )
    assert wandbfile.history_row(pb.Record(num=3).SerializeToString()) is None
    assert wandbfile.history_row(b"\x12\xff\xff") is None  # a length past the end


def test_a_run_file_another_user_could_plant_is_not_read(
    other_user: OtherUser, shared_dir: Path
) -> None:
    """A run directory whose ``debug.log`` names the trainer's PID is not the trainer's
    when another user made it, or could have replaced it (a directory every user may
    write)."""
    me = os.geteuid()
    log = b"2026-12-03 16:34:42,087 INFO    MainThread:4242 Configure stats pid to 4242\n"

    def make_run(parent: Path, name: str) -> Path:
        run_dir = parent / "wandb" / f"offline-run-20261203_163442-{name}"
        (run_dir / "logs").mkdir(parents=True)
        (run_dir / "logs" / "debug.log").write_bytes(log)
        (run_dir / f"run-{name}.wandb").write_bytes(wandbfile.HEADER)
        return run_dir / f"run-{name}.wandb"

    planted = shared_dir / "planted"  # the other user's own
    script = (
        "import pathlib,sys;p=pathlib.Path(sys.argv[1])/'wandb'/'offline-run-20261203_163442-aa';"
        "(p/'logs').mkdir(parents=True);(p/'logs'/'debug.log').write_bytes(sys.argv[2].encode());"
        "(p/'run-aa.wandb').write_bytes(b':W&B')"
    )
    done = other_user.run("/usr/bin/python3", "-c", script, str(planted), log.decode())
    assert done.returncode == 0, done.stderr
    open_logs = shared_dir / "open"  # a careless 0777 directory of the trainer's user
    open_logs.mkdir()
    open_logs.chmod(0o777)
    make_run(open_logs, "bb")
    assert wandbfile.find_run_files([str(shared_dir)], {4242}, me, None) == []
    fifo = make_run(shared_dir / "fifo", "dd").parent / "logs" / "debug.log"
    fifo.unlink()
    os.mkfifo(fifo)  # a debug.log nobody writes: never waited on
    kept = shared_dir / "kept"  # in the sticky shared place: the trainer's own is kept
    kept.mkdir()
    mine = make_run(kept, "cc")
    assert wandbfile.find_run_files([str(shared_dir)], {4242}, me, None) == [str(mine)]
    # the other user's own trainer does get its own file
    theirs = planted / "wandb" / "offline-run-20261203_163442-aa" / "run-aa.wandb"
    assert theirs.stat().st_uid == other_user.uid
    assert wandbfile.find_run_files([str(planted)], {4242}, other_user.uid, None) == [str(theirs)]
