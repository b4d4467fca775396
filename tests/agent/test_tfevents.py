"""The agent's reader of TensorBoard event files (standard library only) against
TensorBoard's own loader, on files written by the real writer (PyTorch's
``SummaryWriter``, as speculators' backend uses it), and on hostile files: a torn
record, a bad data CRC, a bad length CRC, a length larger than memory allows,
garbage that is no event. Nothing crashes, bad records are counted, none moves a
metric."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.agent import tfevents
from eagle3_tui.agent.observe import EventFollower
from tests.conftest import OtherUser, lazy_module

tb_loader = lazy_module("tensorboard.backend.event_processing.event_accumulator")
writer_mod = lazy_module("torch.utils.tensorboard")


class Sink:
    def __init__(self) -> None:
        self.records: list[tuple[str, dict[str, Any], float | None]] = []

    def write(self, kind: str, payload: Any = None, step: Any = None, ts: Any = None) -> bool:
        self.records.append((kind, dict(payload or {}), ts))
        return True


def speculators_like(log_dir: Path, steps: int, new_style: bool = False) -> Path:
    """The events speculators' TensorBoardHandler writes: one scalar per flattened key of
    each train dict (per step) and of the val dict (per epoch, at the next step)."""
    w = writer_mod.SummaryWriter(log_dir=str(log_dir))
    for step in range(steps):
        flat = {
            "train/loss": 2.0 / (step + 1),
            "train/full_acc_0": 0.1 * step,
            "train/cond_acc_1": 0.05 * step,
            "profile/step_s": 0.25,
            "epoch": step // 4,
            "lr": 3e-4,
            "global_step": step,
        }
        for k, v in flat.items():
            w.add_scalar(k, v, global_step=step, new_style=new_style)
        if step % 4 == 3:
            w.add_scalar("val/loss_epoch", 1.0 / (step + 1), global_step=step + 1)
            w.add_scalar("epoch", step // 4, global_step=step + 1)
    w.close()
    [path] = list(log_dir.glob("events.out.tfevents.*"))
    return path


def their_scalars(acc: Any, tag: str) -> dict[int, float]:
    """TensorBoard's own values of ``tag``: scalars, or (``new_style``) scalar tensors."""
    if tag in acc.Tags()["scalars"]:
        return {e.step: e.value for e in acc.Scalars(tag)}
    from tensorboard.util import tensor_util

    return {e.step: float(tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)}


def follow(path: Path) -> tuple[Sink, EventFollower]:
    sink = Sink()
    f = EventFollower(str(path), sink)  # type: ignore[arg-type]
    f.poll(0.0)
    return sink, f


@pytest.mark.parametrize("new_style", [False, True], ids=["simple_value", "tensor"])
def test_the_same_values_as_tensorboards_own_loader(tmp_path: Path, new_style: bool) -> None:
    path = speculators_like(tmp_path, 10, new_style)
    sink, f = follow(path)
    acc = tb_loader.EventAccumulator(str(tmp_path))
    acc.Reload()
    train = [p for k, p, _ in sink.records if k == "train"]
    val = [p for k, p, _ in sink.records if k == "val"]
    assert [p["step"] for p in train] == list(range(10))
    theirs = their_scalars(acc, "train/loss")
    assert {p["step"]: p["train"]["loss"] for p in train} == theirs
    acc1 = their_scalars(acc, "train/cond_acc_1")
    assert {p["step"]: p["train"]["cond_acc_1"] for p in train} == acc1
    assert all(isinstance(p["epoch"], int) and isinstance(p["global_step"], int) for p in train)
    assert [p["epoch"] for p in train] == [s // 4 for s in range(10)]
    assert [(p["step"], p["epoch"]) for p in val] == [(4, 0), (8, 1)]
    their_val = their_scalars(acc, "val/loss_epoch")
    assert {p["step"]: p["val"]["loss_epoch"] for p in val} == their_val
    assert f.framing.bad_crc == 0 and f.framing.broken_at is None
    assert f.offset == path.stat().st_size
    # the quick path for add_scalar's layout reads what the general decoder reads
    bodies, _ = tfevents.records(path.read_bytes(), tfevents.Framing())
    quick = [tfevents._one_scalar(b) for b in bodies]
    quick_train = [q for q in quick if q and q[2][0][0].startswith("train/")]
    assert bool(quick_train) != new_style  # simple values take it, tensors do not
    assert all(q == tfevents.decoded(b) for q, b in zip(quick, bodies, strict=True) if q)


def test_a_file_read_as_it_grows_gives_each_step_once(tmp_path: Path) -> None:
    """Read in pieces cut anywhere (a writer appending): no record lost, none twice."""
    path = speculators_like(tmp_path / "whole", 8)
    data = path.read_bytes()
    grow = tmp_path / "events.out.tfevents.1.host.7.0"
    sink = Sink()
    f = EventFollower(str(grow), sink)  # type: ignore[arg-type]
    for cut in range(0, len(data) + 37, 37):
        grow.write_bytes(data[:cut])
        f.poll(0.0)
    assert [p["step"] for k, p, _ in sink.records if k == "train"] == list(range(8))
    assert f.framing.bad_crc == 0


def _frame(body: bytes) -> bytes:
    head = struct.pack("<Q", len(body))
    return (
        head
        + struct.pack("<I", tfevents.masked_crc(head))
        + body
        + struct.pack("<I", tfevents.masked_crc(body))
    )


def test_hostile_records_are_counted_and_move_nothing(tmp_path: Path) -> None:
    path = speculators_like(tmp_path / "good", 4)
    good = path.read_bytes()
    bodies, _ = tfevents.records(good, tfevents.Framing())
    # 1. a record whose data no longer matches its CRC: skipped, counted
    flipped = bytearray(_frame(bodies[3]))
    flipped[20] ^= 0xFF
    # 2. a record that is no event (garbage with a good CRC): counted, moves nothing
    garbage = _frame(b"\xff\xff\xff\xff not a protobuf")
    bad = tmp_path / "events.out.tfevents.1.host.9.0"
    bad.write_bytes(good + bytes(flipped) + garbage)
    sink, f = follow(bad)
    assert f.framing.bad_crc == 1 and f.framing.not_scalars >= 2
    assert f.problem == "1 record(s) skipped (their CRC does not match)"
    assert [p["step"] for k, p, _ in sink.records if k == "train"] == [0, 1, 2, 3]
    # 3. a length that fails its CRC, or larger than memory allows: the framing is
    # lost there, nothing after it is read, the file is not read past it again
    huge = struct.pack("<Q", 1 << 40)
    for tail in (
        huge + struct.pack("<I", tfevents.masked_crc(huge)) + b"x" * 64,
        struct.pack("<Q", 40) + b"\0\0\0\0" + b"y" * 64,
    ):
        broken = tmp_path / "events.out.tfevents.1.host.10.0"
        broken.write_bytes(good + tail + _frame(bodies[3]))
        sink, f = follow(broken)
        assert f.framing.broken_at == len(good)
        assert f.problem == f"its framing is broken at byte {len(good):,}: nothing after it is read"
        assert [p["step"] for k, p, _ in sink.records if k == "train"] == [0, 1, 2, 3]
        before = len(sink.records)
        f.poll(0.0)
        assert len(sink.records) == before
    # 4. a torn record at the end waits; the truncated file starts again at 0
    torn = tmp_path / "events.out.tfevents.1.host.11.0"
    torn.write_bytes(good[:-5])
    sink, f = follow(torn)  # the val dict's last event is torn: it waits
    assert [(k, p["step"]) for k, p, _ in sink.records] == [("train", s) for s in range(4)]
    torn.write_bytes(good)
    f.poll(0.0)
    assert [(k, p["step"]) for k, p, _ in sink.records][4:] == [("val", 4)]
    torn.write_bytes(good[:100])  # truncated (a new writer): from 0 again, no crash
    f.poll(0.0)
    assert len(sink.records) == 5 and f.offset <= 100  # its file-version record


def test_event_files_are_found_by_their_writers_pid(tmp_path: Path) -> None:
    logs = tmp_path / "logs" / "run_a"
    logs.mkdir(parents=True)
    mine = logs / "events.out.tfevents.1796306822.gpu-node.lab.4242.0"
    other = logs / "events.out.tfevents.1796306822.gpu-node.lab.4343.0"
    mine.write_bytes(b"")
    other.write_bytes(b"")
    (tmp_path / "link").symlink_to(logs)  # not followed: found once
    me = os.geteuid()
    assert tfevents.writer_pid(mine.name) == 4242
    assert tfevents.find_event_files([str(tmp_path)], {4242}, me) == [str(mine)]
    assert tfevents.find_event_files([str(tmp_path)], {1}, me) == []
    assert tfevents.find_event_files([str(tmp_path / "missing")], {4242}, me) == []
    # named before the trainer started: an earlier process's, with the same PID
    assert tfevents.find_event_files([str(tmp_path)], {4242}, me, since=1796306900) == []
    assert tfevents.find_event_files([str(tmp_path)], {4242}, None) == []  # owner unknown


def test_an_event_file_another_user_could_plant_is_not_read(
    other_user: OtherUser, shared_dir: Path
) -> None:
    """A file named after the trainer's PID is not the trainer's when another user made
    it, or could have replaced it (in a directory every user may write)."""
    me = os.geteuid()
    run = shared_dir / "run"  # a sticky shared place: the trainer's own files are kept
    run.mkdir()
    open_logs = run / "logs"  # a careless 0777 directory: anyone may swap what is in it
    open_logs.mkdir()
    open_logs.chmod(0o777)
    planted = shared_dir / "planted"
    name = "events.out.tfevents.1796306822.gpu-node.4242.0"
    done = other_user.run(
        "sh", "-c", f"mkdir {planted} && touch {planted}/{name}.a {open_logs}/{name}.b"
    )
    assert done.returncode == 0, done.stderr
    assert (planted / f"{name}.a").stat().st_uid == other_user.uid
    (open_logs / f"{name}.c").write_bytes(b"")  # the trainer's user's, but replaceable
    assert tfevents.find_event_files([str(shared_dir)], {4242}, me) == []
    kept = run / f"{name}.d"
    kept.write_bytes(b"")
    assert tfevents.find_event_files([str(shared_dir)], {4242}, me) == [str(kept)]
    # the other user's own trainer does get its own file
    assert tfevents.find_event_files([str(planted)], {4242}, other_user.uid) == [
        str(planted / f"{name}.a")
    ]


def test_the_kept_offset_loses_no_dict_and_repeats_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long file read over several rounds (small reads here): after every round, a
    follower started afresh from the cursor (offset, identity) sends exactly the dicts
    not yet sent, none twice (a reconnect mid-history)."""
    from eagle3_tui.agent import observe

    path = speculators_like(tmp_path / "logs", 60)
    whole, _ = follow(path)
    every = [(k, p.get("step")) for k, p, _ in whole.records]
    assert len(every) == 60 + 15
    monkeypatch.setattr(tfevents, "READ_BYTES", 700)  # reads end inside dicts
    monkeypatch.setattr(observe, "MAX_ROUND_BYTES", 2000)
    sink = Sink()
    f = EventFollower(str(path), sink)  # type: ignore[arg-type]
    rounds = 0
    while len(sink.records) < len(every):
        f.poll(0.0)
        rounds += 1
        assert f.behind == (f._read_to < path.stat().st_size)
        fresh = Sink()
        again = EventFollower(str(path), fresh, f.offset, f.identity)  # type: ignore[arg-type]
        again.poll(0.0)
        while again.behind:
            again.poll(0.0)
        sent = [(k, p.get("step")) for k, p, _ in sink.records]
        rest = [(k, p.get("step")) for k, p, _ in fresh.records]
        assert sent + rest == every, (rounds, f.offset)
    assert rounds > 5
