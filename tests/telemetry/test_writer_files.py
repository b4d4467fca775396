"""JsonlWriter and its file, on real files: never written through a link, into another
user's file, a hard link or a FIFO; a file deleted, replaced or truncated under it is
noticed and said (the ``file`` event); a full disk (a real small tmpfs) loses exactly
the records it says (the ``write_gap`` event) and never glues a record onto a torn line.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.agent.column_plan import column_plan
from eagle3_tui.telemetry.columns import companion_path, read_blocks
from eagle3_tui.telemetry.writer import JsonlWriter
from tests.conftest import fill_filesystem, need, small_tmpfs

RUN = "run-7f3a"


def lines_of(path: Path) -> list[dict[str, Any]]:
    """Every line of ``path`` as a record (each must parse: nothing glued, nothing torn)."""
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def file_events(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in recs if r.get("kind") == "lifecycle" and r.get("event") == "file"]


def aside(path: Path, tag: str) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}.{tag}-*"))


def identity(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}"


def write_steps(w: JsonlWriter, steps: range) -> None:
    for i in steps:
        assert w.write("train", {"train": {"loss": 1.0 / (i + 1)}}, step=i)
    assert w.flush(10)


def test_a_planted_symlink_is_moved_aside_and_never_written_through(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"root only\n")
    secret.chmod(0o600)
    path = tmp_path / "metrics.jsonl"
    path.symlink_to(secret)
    w = JsonlWriter(path, run_id=RUN, writer_id="t")
    write_steps(w, range(5))
    w.close()
    assert secret.read_bytes() == b"root only\n"
    (moved,) = aside(path, "refused")
    assert moved.is_symlink() and os.readlink(moved) == str(secret)
    assert not path.is_symlink() and path.stat().st_uid == os.geteuid()
    recs = lines_of(path)
    first = recs[0]
    assert first["kind"] == "lifecycle" and first["event"] == "file"
    assert first["change"] == "refused" and first["found"] == f"a symbolic link to {secret}"
    assert first["moved_to"] == moved.name and first["run_id"] == RUN
    assert first["file"] == "metrics.jsonl" and first["written_before"] == 0
    assert first["previous"]["identity"] == identity(moved.lstat())
    assert [r["seq"] for r in recs] == list(range(6))  # the event first, no gap, no repeat
    assert [r["step"] for r in recs[1:]] == list(range(5))
    assert w.stats.written == 6 and w.stats.dropped == 0
    assert "a symbolic link to" in w.outcome() and moved.name in w.outcome()


def test_a_fifo_at_the_path_never_hangs_the_writer(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    os.mkfifo(path)
    done: list[JsonlWriter] = []

    def write() -> None:  # in the caller's thread (background=False): a hang would be ours
        w = JsonlWriter(path, run_id=RUN, background=False)
        w.write("log", {"msg": "one"})
        w.close()
        done.append(w)

    t = threading.Thread(target=write, daemon=True)
    t.start()
    t.join(10)
    assert done, "the writer hung on a FIFO"
    (moved,) = aside(path, "refused")
    assert moved.is_fifo()
    first, rec = lines_of(path)
    assert first["change"] == "refused" and first["found"] == "a FIFO"
    assert rec["msg"] == "one" and done[0].stats.written == 2


def test_another_users_file_is_moved_aside_unchanged(tmp_path: Path) -> None:
    need(os.geteuid() == 0, "root (chown to another uid)")
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"theirs":1}\n')
    os.chown(path, 54321, 54321)
    w = JsonlWriter(path, run_id=RUN, background=False)
    w.write("log", {"msg": "ours"})
    w.close()
    (moved,) = aside(path, "refused")
    assert moved.read_bytes() == b'{"theirs":1}\n' and moved.stat().st_uid == 54321
    first, rec = lines_of(path)
    assert first["found"] == "a regular file of 54321" and rec["msg"] == "ours"
    assert path.stat().st_uid == os.geteuid()


def test_a_hard_link_to_a_root_only_file_is_never_written(tmp_path: Path) -> None:
    secret = tmp_path / "shadow"
    secret.write_bytes(b"root:x:0:\n")
    secret.chmod(0o600)
    path = tmp_path / "metrics.jsonl"
    os.link(secret, path)
    w = JsonlWriter(path, run_id=RUN, background=False)
    w.write("log", {"msg": "ours"})
    w.close()
    assert secret.read_bytes() == b"root:x:0:\n"
    (moved,) = aside(path, "refused")
    assert moved.samefile(secret)
    first, rec = lines_of(path)
    assert first["found"] == "a regular file with 2 hard links" and rec["msg"] == "ours"
    assert not path.samefile(secret)


def test_a_file_deleted_mid_stream_is_made_again_and_said(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    w = JsonlWriter(path, run_id=RUN, writer_id="t")
    write_steps(w, range(10))
    before = path.stat()
    path.unlink()
    write_steps(w, range(10, 20))
    w.close()
    recs = lines_of(path)
    (event,) = file_events(recs)
    assert recs[0] == event and event["change"] == "deleted"
    assert event["previous"] == {"identity": identity(before), "size": before.st_size}
    assert event["written_before"] == 10 and event["seq"] == 10
    assert [r["step"] for r in recs[1:]] == list(range(10, 20))  # every one after, once
    assert [r["seq"] for r in recs] == list(range(10, 21))
    assert w.stats.written == 21 and w.stats.dropped == 0
    assert "it was deleted at" in w.outcome()


def test_records_queued_when_a_change_is_noticed_follow_its_event_in_order(
    tmp_path: Path,
) -> None:
    """The event takes the number of the first record not yet written, and every record
    still queued behind it moves up by one: no number twice, none missing."""
    path = tmp_path / "metrics.jsonl"
    armed, entered, gate = threading.Event(), threading.Event(), threading.Event()

    def tick() -> None:  # runs in the writer thread: holds it while records pile up
        if armed.is_set() and not gate.is_set():
            entered.set()
            gate.wait(30)

    w = JsonlWriter(path, run_id=RUN, writer_id="t", tick=(0.02, tick))
    write_steps(w, range(3))
    armed.set()
    assert entered.wait(10)
    for i in range(3, 300):  # ~300 kB: several batches, most of them still queued
        assert w.write("train", {"train": {"loss": 1.0 / (i + 1)}, "pad": "p" * 900}, step=i)
    path.unlink()
    gate.set()
    assert w.flush(10)
    w.close()
    recs = lines_of(path)
    assert recs[0]["event"] == "file" and recs[0]["seq"] == 3
    assert [r["seq"] for r in recs] == list(range(3, 301))
    assert [r["step"] for r in recs[1:]] == list(range(3, 300))


def test_a_foreign_file_put_in_its_place_is_moved_aside_never_mixed(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    w = JsonlWriter(path, run_id=RUN, writer_id="t")
    write_steps(w, range(10))
    foreign = tmp_path / "other-run.jsonl"
    theirs = b'{"v":1,"seq":0,"w":"x","ts":1.0,"kind":"train","rank":0,"train":{"loss":9.0}}\n'
    foreign.write_bytes(theirs)
    old = path.stat()
    os.replace(foreign, path)  # mv other-run.jsonl metrics.jsonl
    write_steps(w, range(10, 15))
    w.close()
    (moved,) = aside(path, "replaced")
    assert moved.read_bytes() == theirs  # intact, and nothing of ours in it
    recs = lines_of(path)
    assert recs[0]["change"] == "replaced" and recs[0]["moved_to"] == moved.name
    assert recs[0]["previous"]["identity"] == identity(old)
    assert [r["step"] for r in recs[1:]] == list(range(10, 15))
    assert all(r["w"] == "t" for r in recs)


def test_a_sibling_writers_new_file_is_adopted(tmp_path: Path) -> None:
    """The trainer and its sidecar write one file: after a deletion, the one that notices
    first makes the new file; the other knows it by its first line and writes into it."""
    path = tmp_path / "metrics.jsonl"
    trainer = JsonlWriter(path, run_id=RUN, writer_id="trainer", background=False)
    sidecar = JsonlWriter(path, run_id=RUN, writer_id="sidecar", background=False)
    trainer.write("log", {"msg": "t0"})
    sidecar.write("log", {"msg": "s0"})
    path.unlink()
    trainer.write("log", {"msg": "t1"})  # notices: the new file, its event first
    sidecar.write("log", {"msg": "s1"})  # notices: the new file is this run's
    trainer.close()
    sidecar.close()
    assert aside(path, "replaced") == []
    recs = lines_of(path)
    assert [(r["w"], r.get("msg", r.get("event"))) for r in recs] == [
        ("trainer", "file"),
        ("trainer", "t1"),
        ("sidecar", "s1"),
    ]
    assert recs[0]["change"] == "deleted" and sidecar.changes[0].adopted
    assert [r["seq"] for r in recs if r["w"] == "sidecar"] == [1]  # no event: adopted silently
    assert "a new file made by another writer of the run" in sidecar.outcome()


def test_a_file_without_a_run_id_is_never_adopted(tmp_path: Path) -> None:
    """Only a first line that names this very run makes a file this run's."""
    path = tmp_path / "metrics.jsonl"
    w = JsonlWriter(path, run_id=RUN, background=False)
    w.write("log", {"msg": "one"})
    other = json.dumps({"kind": "lifecycle", "event": "file", "run_id": "another-run"}) + "\n"
    path.unlink()
    path.write_text(other)
    w.write("log", {"msg": "two"})
    w.close()
    (moved,) = aside(path, "replaced")
    assert moved.read_text() == other
    assert [r.get("msg", r.get("event")) for r in lines_of(path)] == ["file", "two"]


def test_a_truncated_file_is_said_and_the_companion_starts_again(tmp_path: Path) -> None:
    """Truncated under the writer: the ``file`` event goes into it; the companion's blocks
    indexed the old bytes, so it is emptied, and the agent never ships a block that is not
    the file's lines."""
    path = tmp_path / "metrics.jsonl"
    trainer = JsonlWriter(path, run_id=RUN, writer_id="trainer")
    sidecar = JsonlWriter(path, run_id=RUN, writer_id="sidecar", columns=False)
    assert trainer._columns is not None
    trainer._columns.block_rows = 4
    for i in range(16):
        trainer.write("train", {"train": {"loss": 1.0 / (i + 1)}}, step=i)
        sidecar.write("heartbeat", {"pad": "x" * (i % 7)})
        assert trainer.flush(10) and sidecar.flush(10)
    size = path.stat().st_size
    assert len(read_blocks(Path(companion_path(str(path))).read_bytes())) == 4
    os.truncate(path, 0)
    for i in range(16, 40):
        trainer.write("train", {"train": {"loss": 2.0 / (i + 1)}}, step=i)
        sidecar.write("heartbeat", {"pad": "y" * (i % 5)})
        assert trainer.flush(10) and sidecar.flush(10)
    trainer.close()
    sidecar.close()
    recs = lines_of(path)
    mine = [r for r in file_events(recs) if r["w"] == "trainer"]
    assert mine[0]["change"] == "truncated" and 0 < mine[0]["previous"]["size"] <= size
    assert [r["step"] for r in recs if r["kind"] == "train"] == list(range(16, 40))
    trainer_seqs = [r["seq"] for r in recs if r["w"] == "trainer"]
    assert trainer_seqs == list(range(trainer_seqs[0], trainer_seqs[0] + len(trainer_seqs)))
    blocks = read_blocks(Path(companion_path(str(path))).read_bytes())
    assert blocks and all(min(b.ints("seq")) > mine[0]["seq"] for b in blocks)
    by_offset = {}
    at = 0
    for line in path.read_bytes().splitlines(keepends=True):
        by_offset[at] = line
        at += len(line)
    fd = os.open(path, os.O_RDONLY)
    try:
        plan = column_plan(fd, str(path), 0, os.fstat(fd).st_size)
        assert plan, "the file's own blocks stand for its lines"
        for seg in plan:
            assert seg.check(fd)
            for off, n, seq in zip(seg.offsets, seg.lengths, seg.block.ints("seq"), strict=True):
                line = by_offset[off]
                assert len(line) == n and json.loads(line)["seq"] == seq
                assert json.loads(line)["w"] == seg.block.header["const"]["w"]
    finally:
        os.close(fd)


def test_two_writers_noticing_one_deletion_make_one_file(tmp_path: Path) -> None:
    """Two processes of one run write for 3 s while the file is deleted five times:
    each time one new file, both writing into it; every record of both is in one
    of the files exactly once (the deleted ones read through a descriptor kept open)."""
    path = tmp_path / "metrics.jsonl"
    script = (
        "import sys, time\n"
        "from eagle3_tui.telemetry.writer import JsonlWriter\n"
        f"w = JsonlWriter(sys.argv[1], writer_id=sys.argv[2], run_id={RUN!r})\n"
        "end = time.monotonic() + 3\n"
        "i = 0\n"
        "while time.monotonic() < end:\n"
        "    w.write('log', {'msg': i})\n"
        "    i += 1\n"
        "    if i % 20 == 0: time.sleep(0.001)\n"
        "w.close()\n"
        "print(w.stats.written, w.stats.dropped)\n"
    )
    path.touch()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(path), name], stdout=subprocess.PIPE, text=True
        )
        for name in ("a", "b")
    ]
    kept: list[int] = []
    try:
        for _ in range(5):
            time.sleep(0.3)
            with contextlib.suppress(FileNotFoundError):
                kept.append(os.open(path, os.O_RDONLY))
                path.unlink()
        outs = [p.communicate(timeout=120)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0]
        files = [os.pread(fd, 1 << 30, 0) for fd in kept] + [path.read_bytes()]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for fd in kept:
            os.close(fd)
    assert aside(path, "replaced") == [] and aside(path, "refused") == []
    seen: dict[str, list[int]] = {"a": [], "b": []}
    for data in files:
        recs = [json.loads(line) for line in data.splitlines()]
        events = file_events(recs)
        assert len(events) <= 1 and (not events or recs[0] == events[0])  # one maker per file
        for r in recs:
            seen[r["w"]].append(r["seq"])
    assert len(file_events([json.loads(x) for x in files[-1].splitlines()])) == 1
    for name, out in zip(("a", "b"), outs, strict=True):
        written, dropped = map(int, out.split())
        assert dropped == 0 and sorted(seen[name]) == list(range(written))


def test_a_full_disk_loses_exactly_what_it_says_and_glues_nothing(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "fs", "256k") as fs:
        path = fs / "metrics.jsonl"
        w = JsonlWriter(path, run_id=RUN, writer_id="t")
        queued = 0
        for i in range(50):
            w.write("train", {"train": {"loss": 1.0 / (i + 1)}, "pad": "p" * 300}, step=i)
            queued += 1
        assert w.flush(10)
        fill_filesystem(fs / "filler")
        for i in range(50, 150):  # the page our file ends in fills: a short write, then ENOSPC
            w.write("train", {"train": {"loss": 1.0 / (i + 1)}, "pad": "p" * 300}, step=i)
            queued += 1
            if i % 10 == 0:
                assert w.flush(10)
        assert w.flush(10)
        lost = w.stats.dropped
        assert lost > 0 and w.stats.dropped_by.get("ENOSPC") == lost
        (fs / "filler").unlink()
        for i in range(150, 160):
            w.write("train", {"train": {"loss": 1.0 / (i + 1)}, "pad": "p" * 300}, step=i)
            queued += 1
        w.close()
        data = path.read_bytes()
    lines = data.splitlines()
    recs, torn = [], []
    for line in lines:
        try:
            recs.append(json.loads(line))
        except ValueError:
            torn.append(line)
    assert len(torn) <= 1 and data.endswith(b"\n")  # at most one torn line, ended
    assert all(t.count(b'{"v":') == 1 for t in torn)  # no record glued onto it
    (gap,) = [r for r in recs if r.get("event") == "write_gap"]
    steps = [r["step"] for r in recs if r["kind"] == "train"]
    assert len(steps) == len(set(steps)) and steps == sorted(steps)
    assert gap["records"] == lost == queued - len(steps)  # exact: every record once
    assert gap["reason"] == "ENOSPC" and gap["since"] <= gap["until"]
    missing = set(range(gap["first_seq"], gap["last_seq"] + 1)) - {r["seq"] for r in recs}
    assert len(missing) == lost and gap["seq"] == gap["last_seq"] + 1  # the next number
    after = recs[recs.index(gap) + 1 :]
    assert [r["step"] for r in after] == list(range(150, 160))
    assert w.stats.written == len(recs) and w.stats.written + w.stats.dropped == queued + 1
    assert f"{lost} not written (ENOSPC: {lost})" in w.outcome()


def test_no_file_it_may_write_counts_every_record_and_says_so_once(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A planted link in a directory the writer cannot change (read-only here): nothing
    is written anywhere, every record is counted, one line on stderr says why."""
    with small_tmpfs(tmp_path / "fs", "64k") as fs:
        secret = tmp_path / "secret"
        secret.write_bytes(b"s\n")
        (fs / "metrics.jsonl").symlink_to(secret)
        subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)
        w = JsonlWriter(fs / "metrics.jsonl", run_id=RUN)
        for i in range(30):
            w.write("log", {"msg": i})
            w.flush(10)
        w.close()
    assert secret.read_bytes() == b"s\n"
    assert w.stats.written == 0 and w.stats.dropped == 30
    assert w.stats.dropped_by == {"EROFS": 30}
    said = [line for line in capfd.readouterr().err.splitlines() if "eagle3-tui" in line]
    assert len(said) == 1 and str(fs / "metrics.jsonl") in said[0] and "file system" in said[0]
    assert f"a symbolic link to {secret} is there" in said[0]
    assert "30 not written (EROFS: 30)" in w.outcome()


def test_a_torn_line_ended_by_a_sibling_gets_no_second_newline(tmp_path: Path) -> None:
    """Two writers of one file on a full disk (the trainer and its sidecar): ``b``'s
    line is torn and its newline owed, ``a``'s writes fail. Space returns and ``a``
    writes first, ending ``b``'s torn line; ``b`` then owed nothing (its newline made a
    blank line: two lines that are no record, seen in the real training's test)."""
    with small_tmpfs(tmp_path / "fs", "256k") as fs:
        path = fs / "metrics.jsonl"
        a = JsonlWriter(path, run_id=RUN, writer_id="a")
        b = JsonlWriter(path, run_id=RUN, writer_id="b")
        write_steps(a, range(3))
        write_steps(b, range(3))
        fill_filesystem(fs / "filler")
        for i in range(3, 100):  # the page the file ends in fills: b's line is torn
            write_steps(b, range(i, i + 1))
            if b.stats.dropped:
                break
        assert not path.read_bytes().endswith(b"\n")  # b's newline is owed
        write_steps(a, range(3, 4))
        assert a.stats.dropped == 1  # a has a gap too: it looks at the file's end
        (fs / "filler").unlink()
        write_steps(a, range(4, 5))
        write_steps(b, range(100, 101))
        a.close()
        b.close()
        data = path.read_bytes()
    lines = data.split(b"\n")
    assert lines[-1] == b""  # ended
    recs, torn = [], []
    for line in lines[:-1]:
        try:
            recs.append(json.loads(line))
        except ValueError:  # a blank line too
            torn.append(line)
    assert len(torn) == 1 and torn[0].count(b'{"v":') == 1, torn  # b's, nothing glued on
    gaps = {r["w"]: r["records"] for r in recs if r.get("event") == "write_gap"}
    assert gaps == {"a": 1, "b": b.stats.dropped}
    assert [r["step"] for r in recs if r.get("w") == "a" and r["kind"] == "train"] == [0, 1, 2, 4]
    assert [r["step"] for r in recs if r.get("w") == "b" and r["kind"] == "train"][-1] == 100


@pytest.mark.parametrize("columns", [False, True])
def test_a_line_torn_before_its_newline_only_is_a_record_once_ended(
    tmp_path: Path, columns: bool
) -> None:
    """The disk fills exactly at a line's newline: the line is whole JSON but for it.
    Counted lost at first, it is a record once its owed newline is written, so nothing
    is said lost (a reader would count it as written and the gap as one too many)."""
    with small_tmpfs(tmp_path / "fs", "256k") as fs:
        path = fs / "metrics.jsonl"
        w = JsonlWriter(
            path, run_id=RUN, writer_id="t", clock=lambda: 1.8e9, background=False, columns=columns
        )

        def line(step: int, pad: int) -> None:
            train = {"loss": 0.5, "p" * (pad + 1): 0.0}  # a row of the companion's
            assert w.write("train", {"train": train}, step=step)
            assert w.flush(10)

        line(1, 0)
        before = path.stat().st_size
        line(2, 0)
        width = path.stat().st_size - before  # a line of these, without padding
        room = 400  # what is left of the page the file ends in, once padded
        line(3, (4096 - room - path.stat().st_size - width) % 4096)
        assert 4096 - path.stat().st_size % 4096 == room
        fill_filesystem(fs / "filler")
        line(4, room + 1 - width)  # all of it fits but its newline
        assert w.stats.dropped == 1 and not path.read_bytes().endswith(b"\n")
        (fs / "filler").unlink()
        line(5, 0)
        w.close()
        recs = [json.loads(x) for x in path.read_bytes().splitlines()]  # every line a record
        companion = Path(companion_path(str(path)))
        blocks = read_blocks(companion.read_bytes()) if columns else []
    assert [r["step"] for r in recs if r["kind"] == "train"] == [1, 2, 3, 4, 5]
    if columns:  # the companion indexes it too, at its offset
        indexed = {s for b in blocks for s in b.ints("seq")}
        assert {r["seq"] for r in recs if r["kind"] == "train"} <= indexed, indexed
    assert not [r for r in recs if r.get("event") == "write_gap"]
    assert w.stats.dropped == 0 and w.stats.dropped_by == {}
    assert w.stats.written == len(recs)


def test_a_file_truncated_mid_line_keeps_the_next_records_whole(tmp_path: Path) -> None:
    """``truncate -s HALF`` cuts a line in two: the next record written (the sidecar's
    notice of the truncation, here) went onto that torn line, and both were lost as one
    malformed line. Each writer's next line starts on a line of its own."""
    path = tmp_path / "metrics.jsonl"
    trainer = JsonlWriter(path, run_id=RUN, writer_id="trainer")
    sidecar = JsonlWriter(path, run_id=RUN, writer_id="sidecar", columns=False)
    for i in range(8):
        trainer.write("train", {"train": {"loss": 1.0 / (i + 1)}}, step=i)
        sidecar.write("heartbeat", {"pad": "x" * i})
        assert trainer.flush(10) and sidecar.flush(10)
    data = path.read_bytes()
    cut = data.rindex(b"\n", 0, len(data) // 2) + 20  # 20 bytes into a line
    os.truncate(path, cut)
    sidecar.write("heartbeat", {"pad": "after"})
    assert sidecar.flush(10)
    for i in range(8, 12):
        trainer.write("train", {"train": {"loss": 1.0 / (i + 1)}}, step=i)
        assert trainer.flush(10)
    trainer.close()
    sidecar.close()
    recs, torn = [], []
    for line in path.read_bytes().splitlines():
        try:
            recs.append(json.loads(line))
        except ValueError:
            torn.append(line)
    assert torn == [data[:cut].splitlines()[-1]], torn  # the cut line alone, nothing on it
    assert [r["step"] for r in recs if r["kind"] == "train"][-4:] == [8, 9, 10, 11]
    assert any(r.get("pad") == "after" for r in recs), "the sidecar's line is whole"
    changes = [r for r in recs if r.get("event") == "file"]
    assert {r["w"] for r in changes} == {"trainer", "sidecar"}, changes
