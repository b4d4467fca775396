"""speculators' metrics read from the TensorBoard event files its own backend writes
(``--logger tensorboard``, ``setup_metric_logger("tensorboard", …)``), with the
standard library only: the agent runs on the training host, where nothing of ours is
installed.

The format: TFRecord framing (``uint64 length``, ``uint32`` masked CRC-32C of the
length, the data, ``uint32`` masked CRC-32C of the data), each record an ``Event``
protobuf (``wall_time`` 1, ``step`` 2, ``summary`` 5 → ``value`` 1 → ``tag`` 1,
``simple_value`` 2 or ``tensor`` 8). speculators' handler flattens each metric dict
with ``/`` (``train/loss``, ``profile/step_s``, ``epoch``, ``lr``, ``global_step``) and
writes one scalar event per key at the dict's step: :class:`Regroup` puts the dicts
back together, so that they become the same records as a printed or JSON handler's.

Hostile files are survived, counted and said: a truncated record waits for its end
(the writer appends), a record whose data CRC fails is skipped, a length whose CRC
fails (or over :data:`MAX_RECORD`) stops the file there (its framing is lost), and a
record that is not an event of scalars moves nothing.

The writer (tensorboard's ``EventFileWriter``) opens, appends and closes the file per
flush: the trainer never holds it open. The file is found by its name instead, which
carries the writer's PID: ``events.out.tfevents.<time>.<host>.<pid>.<n>``
(:func:`find_event_files`).
"""

from __future__ import annotations

import math
import os
import re
import struct
from collections.abc import Iterator
from typing import Any

from eagle3_tui.agent.logparse import tracked_dict
from eagle3_tui.telemetry.safefs import trust_problem

MAX_RECORD = 16 << 20
"""A record longer than this is taken as a broken length (a scalar event is ~50 bytes)."""
READ_BYTES = 1 << 20
_NAME = re.compile(r"^events\.out\.tfevents\.(\d+)\.(.+)\.(\d+)\.(\d+)(?:\..*)?$")
WALK_ENTRIES = 4000
"""At most this many directory entries are looked at per search (a cwd may be $HOME)."""
WALK_DEPTH = 4
_SKIP_DIRS = frozenset(
    ("node_modules", "__pycache__", ".git", "site-packages", "checkpoints", ".cache", "wandb")
)


# ---- CRC-32C (Castagnoli), as TFRecord masks it -----------------------------------


def _table() -> list[int]:
    out = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        out.append(c)
    return out


_CRC_TABLE = _table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _CRC_TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


# ---- records ------------------------------------------------------------------------


class Framing:
    """What a read found wrong, counted (a file's whole life)."""

    def __init__(self) -> None:
        self.bad_crc = 0
        """Records skipped: their data's CRC did not match."""
        self.not_scalars = 0
        """Records that are no event of scalars (the file version, hparams, text)."""
        self.broken_at: int | None = None
        """The offset where the framing was lost (a length that fails its CRC or is too
        long): nothing after it is read."""


_LENGTH_CRCS: dict[bytes, int] = {}
"""Masked CRCs of record lengths already seen (a file's scalar events have a handful of
lengths: each length's CRC is computed once, a tenth of a long file's reading)."""


def _length_crc(head: bytes) -> int:
    crc = _LENGTH_CRCS.get(head)
    if crc is None:
        if len(_LENGTH_CRCS) >= 4096:
            _LENGTH_CRCS.clear()
        crc = _LENGTH_CRCS[head] = masked_crc(head)
    return crc


def records(
    data: bytes, framing: Framing, base: int = 0, ends: list[int] | None = None
) -> tuple[list[bytes], int]:
    """The whole records at the start of ``data`` (read from offset ``base``) and how many
    bytes they took; a torn record at the end is left for the next read. With ``ends``,
    where in ``data`` each record returned ends is appended to it."""
    out: list[bytes] = []
    at = 0
    n = len(data)
    while n - at >= 12:
        head = data[at : at + 8]
        (length,) = struct.unpack_from("<Q", data, at)
        (length_crc,) = struct.unpack_from("<I", data, at + 8)
        if _length_crc(head) != length_crc or length > MAX_RECORD:
            framing.broken_at = base + at
            break
        end = at + 12 + length + 4
        if end > n:
            break  # torn: the writer is appending it
        body = data[at + 12 : at + 12 + length]
        (body_crc,) = struct.unpack_from("<I", data, at + 12 + length)
        if masked_crc(body) == body_crc:
            out.append(body)
            if ends is not None:
                ends.append(end)
        else:
            framing.bad_crc += 1
        at = end
    return out, at


# ---- protobuf, the few fields an Event of scalars has --------------------------------


def _varint(buf: bytes, at: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if at >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        b = buf[at]
        at += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, at
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """``(field, wire type, value)``: ints for varints and fixed, bytes for the rest."""
    at = 0
    n = len(buf)
    value: Any
    while at < n:
        key, at = _varint(buf, at)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(buf, at)
        elif wire == 1:
            if at + 8 > n:
                raise ValueError("truncated fixed64")
            value = buf[at : at + 8]
            at += 8
        elif wire == 2:
            size, at = _varint(buf, at)
            if at + size > n:
                raise ValueError("truncated field")
            value = buf[at : at + size]
            at += size
        elif wire == 5:
            if at + 4 > n:
                raise ValueError("truncated fixed32")
            value = buf[at : at + 4]
            at += 4
        else:
            raise ValueError(f"wire type {wire}")
        yield field, wire, value


_DT_FLOAT, _DT_DOUBLE, _DT_HALF = 1, 2, 19


def _tensor_value(buf: bytes) -> float | None:
    """A scalar ``TensorProto`` (``add_scalar(new_style=True)``): float, double or half."""
    dtype = 0
    content = b""
    floats: list[float] = []
    for field, wire, value in _fields(buf):
        if field == 1 and wire == 0:
            dtype = value
        elif field == 4 and wire == 2:
            content = value
        elif field == 5:  # float_val: packed or not
            raw = value  # packed (wire 2) or one (wire 5): bytes either way
            floats.extend(struct.unpack(f"<{len(raw) // 4}f", raw[: len(raw) // 4 * 4]))
        elif field == 6:  # double_val
            raw = value
            floats.extend(struct.unpack(f"<{len(raw) // 8}d", raw[: len(raw) // 8 * 8]))
    if floats:
        return float(floats[0])
    if dtype == _DT_FLOAT and len(content) >= 4:
        return float(struct.unpack_from("<f", content)[0])
    if dtype == _DT_DOUBLE and len(content) >= 8:
        return float(struct.unpack_from("<d", content)[0])
    if dtype == _DT_HALF and len(content) >= 2:
        return float(struct.unpack_from("<e", content)[0])
    return None


_DOUBLE = struct.Struct("<d")
_FLOAT = struct.Struct("<f")


def _one_scalar(event: bytes) -> tuple[float, int, list[tuple[str, float]]] | None:
    """The layout ``add_scalar`` writes (``wall_time``, ``step``, one value with a tag
    and a ``simple_value``), read without the general decoder (a third of the time);
    None for anything else (the general decoder then decides)."""
    n = len(event)
    if n < 16 or event[0] != 0x09:
        return None
    wall = _DOUBLE.unpack_from(event, 1)[0]
    at = 9
    step = 0
    if event[at] == 0x10:
        step, at = _varint(event, at + 1)
    if at + 2 > n or event[at] != 0x2A:
        return None
    size, at = _varint(event, at + 1)
    if at + size != n or at + 2 > n or event[at] != 0x0A:
        return None
    size, at = _varint(event, at + 1)
    if at + size != n or event[at] != 0x0A:
        return None
    size, at = _varint(event, at + 1)
    end = at + size
    if end + 5 != n or event[end] != 0x15 or not math.isfinite(wall):
        return None
    tag = event[at:end].decode("utf-8", "replace")
    step = step - (1 << 64) if step >= 1 << 63 else step
    return wall, step, [(tag, float(_FLOAT.unpack_from(event, end + 1)[0]))]


def scalars(event: bytes) -> tuple[float, int, list[tuple[str, float]]] | None:
    """``(wall_time, step, [(tag, value), …])`` of an Event of scalars; None for any
    other record (or one that does not parse)."""
    try:
        quick = _one_scalar(event)
    except (ValueError, IndexError, struct.error):
        quick = None
    return quick if quick is not None else decoded(event)


def decoded(event: bytes) -> tuple[float, int, list[tuple[str, float]]] | None:
    """:func:`scalars` by the general decoder (any field order, several values, tensors)."""
    wall = None
    step = 0
    values: list[tuple[str, float]] = []
    try:
        for field, wire, value in _fields(event):
            if field == 1 and wire == 1:
                wall = struct.unpack("<d", value)[0]
            elif field == 2 and wire == 0:
                step = value - (1 << 64) if value >= 1 << 63 else value
            elif field == 5 and wire == 2:
                for f2, w2, v2 in _fields(value):
                    if f2 == 1 and w2 == 2:
                        pair = _summary_value(v2)
                        if pair is not None:
                            values.append(pair)
    except (ValueError, struct.error):
        return None
    if wall is None or not values or not math.isfinite(wall):
        return None
    return wall, step, values


def _summary_value(buf: bytes) -> tuple[str, float] | None:
    tag = None
    number = None
    for field, wire, value in _fields(buf):
        if field == 1 and wire == 2:
            tag = value.decode("utf-8", "replace")
        elif field == 2 and wire == 5:
            number = float(struct.unpack("<f", value)[0])
        elif field == 8 and wire == 2:
            number = _tensor_value(value)
    if tag is None or number is None:
        return None
    return tag, number


# ---- speculators' dicts back together ------------------------------------------------


class Regroup:
    """Scalar events, in file order, back into speculators' metric dicts: the trainer logs
    ``{"train": …, "profile": …, "epoch", "lr", "global_step"}`` per step and
    ``{"val": …, "epoch"}`` per epoch (at the step that follows its last), each key one
    event. A dict ends where the next begins (another step, or ``train/`` after
    ``val/``) or, for a train dict, at its last key (``global_step``)."""

    def __init__(self) -> None:
        self.flat: list[tuple[str, float]] = []
        self.kind: str | None = None
        self.step: int | None = None
        self.ts = 0.0

    def add(
        self, wall: float, step: int, tag: str, value: float
    ) -> list[tuple[dict[str, Any], float]]:
        done: list[tuple[dict[str, Any], float]] = []
        head = tag.split("/", 1)[0]
        kind = head if head in ("train", "val") else None
        if self.flat and (step != self.step or (kind is not None and kind != self.kind)):
            done.extend(self.flush())
        if not self.flat:
            self.step = step
            self.ts = wall
        if kind is not None and self.kind is None:
            self.kind = kind
        self.flat.append((tag, value))
        if (self.kind == "train" and tag == "global_step") or (
            self.kind == "val" and tag == "epoch"
        ):
            done.extend(self.flush())  # the dict's last key
        return done

    def flush(self) -> list[tuple[dict[str, Any], float]]:
        """The dict being put together, if it is one of speculators' (else dropped)."""
        flat, step, ts = self.flat, self.step, self.ts
        self.flat, self.kind, self.step = [], None, None
        d = tracked_dict(flat, step)
        return [] if d is None else [(d, ts)]


# ---- the files ------------------------------------------------------------------------


def writer_pid(name: str) -> int | None:
    """The PID in an event file's name (``events.out.tfevents.<t>.<host>.<pid>.<n>``)."""
    m = _NAME.match(name)
    return int(m.group(3)) if m else None


def find_event_files(
    roots: list[str], pids: set[int], uid: int | None, since: float | None = None
) -> list[str]:
    """Event files under ``roots`` written by one of ``pids`` (by their names): the
    newest writer's first, and of one time the writer made first (its metrics: the
    handler's ``add_hparams`` makes a second writer, ``….1``, with the run's
    configuration only); a bounded walk (:data:`WALK_ENTRIES`, :data:`WALK_DEPTH`), no symlinked
    directory followed, hidden and heavy directories skipped.

    A name is anyone's to give: only a file the trainer's user ``uid`` (or root) owns,
    in directories nobody else may write (:func:`~eagle3_tui.telemetry.safefs.trust_problem`),
    and named after the trainer started (``since``, seconds since the epoch: a file of
    an earlier process that had the same PID is not its) is taken. With ``uid`` None
    (the trainer's user unknown: it is gone) nothing is."""
    if uid is None:
        return []
    found: list[tuple[tuple[int, int], str]] = []
    seen = 0
    todo = [(os.path.abspath(r), 0) for r in roots if r]
    visited: set[str] = set()
    while todo and seen < WALK_ENTRIES:
        path, depth = todo.pop(0)
        if path in visited:
            continue
        visited.add(path)
        try:
            entries = list(os.scandir(path))
        except OSError:
            continue
        for e in entries:
            seen += 1
            if seen > WALK_ENTRIES:
                break
            try:
                if e.is_file(follow_symlinks=False) and e.name.startswith("events.out.tfevents."):
                    m = _NAME.match(e.name)
                    if (
                        m is not None
                        and int(m.group(3)) in pids
                        and (since is None or int(m.group(1)) >= int(since) - 1)
                        and trust_problem(e.path, uid) is None
                    ):
                        found.append(((-int(m.group(1)), int(m.group(4))), e.path))
                elif (
                    depth < WALK_DEPTH
                    and e.is_dir(follow_symlinks=False)
                    and not e.name.startswith(".")
                    and e.name not in _SKIP_DIRS
                ):
                    todo.append((e.path, depth + 1))
            except OSError:
                continue
    return [p for _, p in sorted(found)]
