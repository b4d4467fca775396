"""JsonlWriter: whole lines, sequence numbers, valid JSON, and failures that never raise."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.telemetry.writer import JsonlWriter
from tests.conftest import need, read_jsonl


def test_envelope_and_sequence_on_every_line(tmp_path: Path) -> None:
    w = JsonlWriter(tmp_path / "m.jsonl", rank=2, writer_id="w1")
    for i in range(50):
        assert w.write("train", {"train": {"loss": 1.0 / (i + 1)}}, step=i)
    w.write("heartbeat")
    w.close()
    recs = read_jsonl(tmp_path / "m.jsonl")
    assert [r["seq"] for r in recs] == list(range(51))
    for r in recs:
        assert r["v"] == 1 and r["w"] == "w1" and r["rank"] == 2 and isinstance(r["ts"], float)
    assert [r["step"] for r in recs[:50]] == list(range(50))
    assert recs[-1]["kind"] == "heartbeat"
    assert w.stats.written == 51 and w.stats.dropped == 0


def test_a_payload_cannot_overwrite_the_envelope(tmp_path: Path) -> None:
    w = JsonlWriter(tmp_path / "m.jsonl", writer_id="me", background=False)
    w.write("log", {"seq": 99, "w": "other", "kind": "train", "msg": "hi"})
    w.close()
    (rec,) = read_jsonl(tmp_path / "m.jsonl")
    assert rec["seq"] == 0 and rec["w"] == "me" and rec["kind"] == "log" and rec["msg"] == "hi"


def test_non_finite_floats_tensors_and_numpy_are_valid_json(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    w = JsonlWriter(tmp_path / "m.jsonl", background=False)
    w.write(
        "train",
        {
            "train": {"loss": math.nan, "a": math.inf, "b": -math.inf, "c": None},
            "t": torch.tensor(2.5),
            "tn": torch.tensor(float("nan")),
            "vec": torch.arange(3),
            "n": np.float32(0.25),
            "ni": np.int64(7),
        },
    )
    w.close()
    raw = (tmp_path / "m.jsonl").read_bytes()
    # strict JSON: no bare NaN/Infinity tokens anywhere
    rec = json.loads(raw, parse_constant=lambda c: pytest.fail(f"bare {c} in {raw!r}"))
    assert rec["train"] == {"loss": "NaN", "a": "Infinity", "b": "-Infinity", "c": None}
    assert rec["t"] == 2.5 and rec["tn"] == "NaN" and rec["vec"] == [0, 1, 2]
    assert rec["n"] == 0.25 and rec["ni"] == 7
    assert w.stats.errors == {}


class Unrepresentable:
    def __repr__(self) -> str:
        raise RuntimeError("repr is broken too")


def test_an_unserializable_value_never_raises_and_is_counted(tmp_path: Path) -> None:
    w = JsonlWriter(tmp_path / "m.jsonl", background=False)
    payload: dict[Any, Any] = {"train": {"loss": 1.0}, "odd": Unrepresentable(), 3: "int key"}
    assert w.write("train", payload)  # an int key: not JSON, and not to raise
    w.close()
    (rec,) = read_jsonl(tmp_path / "m.jsonl")
    assert rec["train"] == {"loss": 1.0}
    assert rec["odd"] == "<unrepresentable Unrepresentable>" and rec["3"] == "int key"
    assert w.stats.errors == {"unserializable": 1} and w.stats.dropped == 0


def test_a_descriptor_closed_behind_its_back_is_reopened(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    w = JsonlWriter(path, background=False)
    w.write("log", {"msg": "one"})
    assert w._file.fd is not None
    os.close(w._file.fd)  # a library that closes every descriptor, say
    w.write("log", {"msg": "two"})
    w.close()
    assert [r["msg"] for r in read_jsonl(path)] == ["one", "two"]
    assert w.stats.reopened == 1 and w.stats.errors.get("EBADF") == 1


def test_a_reused_descriptor_is_never_written_to(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    w = JsonlWriter(path, background=False)
    w.write("log", {"msg": "one"})
    assert w._file.fd is not None
    fd = w._file.fd
    os.close(fd)
    other = tmp_path / "someone-elses.txt"
    reused = os.open(other, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        assert reused == fd  # the lowest free number: ours
        w.write("log", {"msg": "two"})
    finally:
        os.close(reused)
    w.close()
    assert other.read_bytes() == b""
    assert [r["msg"] for r in read_jsonl(path)] == ["one", "two"]
    assert w.stats.errors.get("fd_replaced") == 1


@contextlib.contextmanager
def frozen_filesystem(
    tmp_path: Path,
) -> Iterator[tuple[Path, Callable[[], None], Callable[[], None]]]:
    """A real ext4 filesystem (a loop-mounted image), and the functions that freeze and
    thaw it (``fsfreeze``): while frozen, every write to it blocks in the kernel, as on a
    hung mount (thawed on leaving, whatever happened)."""
    need(os.geteuid() == 0 and shutil.which("fsfreeze") is not None, "root and fsfreeze")
    image, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(image, "wb") as f:
        f.truncate(32 << 20)
    made = subprocess.run(["mkfs.ext4", "-q", str(image)], capture_output=True, check=False)
    need(made.returncode == 0, f"mkfs.ext4: {made.stderr.decode(errors='replace').strip()}")
    mount = subprocess.run(
        ["mount", "-o", "loop", str(image), str(mnt)], capture_output=True, check=False
    )
    need(mount.returncode == 0, f"a loop mount: {mount.stderr.decode(errors='replace').strip()}")
    frozen = []

    def freeze() -> None:
        subprocess.run(["fsfreeze", "-f", str(mnt)], check=True)
        frozen.append(True)

    def thaw() -> None:
        if frozen:
            subprocess.run(["fsfreeze", "-u", str(mnt)], check=True)
            frozen.clear()

    try:
        yield mnt, freeze, thaw
    finally:
        thaw()
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_blocked_filesystem_never_blocks_the_caller(tmp_path: Path) -> None:
    """A frozen filesystem is a hung mount: the writer thread's os.write blocks for real."""
    with frozen_filesystem(tmp_path) as (mnt, freeze, thaw):
        path = mnt / "m.jsonl"
        w = JsonlWriter(path, max_queue_bytes=256 << 10)
        w.write("log", {"msg": "before"})
        assert w.flush(10)
        freeze()
        payload = {"train": {f"loss_{k}": 0.1 * k for k in range(20)}, "pad": "x" * 400}
        done = threading.Event()
        results: list[bool] = []

        def trainer() -> None:
            for i in range(5000):  # ~3 MB: far beyond the queue
                results.append(w.write("train", payload, step=i))
            done.set()

        t = threading.Thread(target=trainer, daemon=True)
        t.start()
        assert done.wait(60), "the caller blocked on a blocked filesystem"
        dropped = results.count(False)
        assert dropped > 0 and w.stats.dropped == dropped
        assert w.stats.errors.get("queue_full") == dropped
        assert not w.flush(0.2)  # the thread is still stuck in os.write
        thaw()  # the queue drains
        assert w.flush(30)
        w.close()
        seqs = [r["seq"] for r in read_jsonl(path)]
    assert seqs == sorted(seqs) and len(seqs) == 5001 - dropped  # whole lines, in order
    assert w.stats.written == len(seqs)


TWO_WRITERS = """
import sys
from eagle3_tui.telemetry.writer import JsonlWriter
w = JsonlWriter(sys.argv[1], writer_id=sys.argv[2])
for i in range(3000):
    w.write("train", {"train": {"loss": i * 0.5}, "pad": sys.argv[2] * 300}, step=i)
w.close()
"""


def test_two_processes_appending_never_mix_their_lines(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    procs = [
        subprocess.Popen([sys.executable, "-c", TWO_WRITERS, str(path), name])
        for name in ("a", "b")
    ]
    for p in procs:
        assert p.wait(60) == 0
    by_writer: dict[str, list[int]] = {"a": [], "b": []}
    for line in path.read_bytes().splitlines():
        rec = json.loads(line)  # raises on a torn or mixed line
        assert rec["pad"] == rec["w"] * 300
        by_writer[rec["w"]].append(rec["seq"])
    assert by_writer == {"a": list(range(3000)), "b": list(range(3000))}


def test_a_forked_child_does_not_write_as_its_parent(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    w = JsonlWriter(path)
    w.write("log", {"msg": "parent"})
    assert w.flush(5)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        ok = w.write("log", {"msg": "child"})
        os._exit(0 if not ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    w.write("log", {"msg": "parent again"})
    w.close()
    assert [(r["msg"], r["seq"]) for r in read_jsonl(path)] == [("parent", 0), ("parent again", 1)]


def test_closed_writer_counts_instead_of_raising(tmp_path: Path) -> None:
    w = JsonlWriter(tmp_path / "m.jsonl")
    w.close()
    assert not w.write("log", {"msg": "late"})
    assert w.stats.dropped == 1 and w.stats.errors == {"closed": 1}


def test_overhead_percentiles(tmp_path: Path) -> None:
    w = JsonlWriter(tmp_path / "m.jsonl", background=False)
    assert w.overhead_us() == {}
    for ns in range(1000, 101000, 1000):
        w.note_overhead(ns)
    o = w.overhead_us()
    assert o["n"] == 100 and o["p50"] == 51.0 and o["p99"] == 100.0
    w.close()
