"""speculators' metrics read from the run file W&B writes (``--logger wandb``:
``wandb.init(dir=LOG_DIR, name=RUN_NAME)``, then ``run.log(flat_dict, step=step)`` per
metric dict), with the standard library only, without W&B's service: the agent runs
on the training host, where nothing of ours is installed.

The file: ``LOG_DIR/wandb/offline-run-<YYYYmmdd_HHMMSS>-<id>/run-<id>.wandb`` (``run-…``
online: W&B keeps the same log there), written by ``wandb-core``, a child of the trainer
that holds it open. Its format (wandb-core's ``pkg/leveldb/record.go`` and
``internal/transactionlog``; the Python ``sdk/internal/datastore.py`` of wandb < 0.29):

* a 7-byte header, ``:W&B``, the magic ``0xBEE1`` (``uint16`` LE) and version ``0``;
* LevelDB's log framing after it: 32 KiB blocks counted from the file's first byte
  (the header takes the first block's first 7 bytes); a record is one chunk (FULL) or
  FIRST, MIDDLE…, LAST chunks, each ``uint32`` CRC-32 (IEEE, zlib's) of the type byte
  and the data, ``uint16`` length, ``uint8`` type, the data; no chunk crosses a block,
  and a block's last 0-6 bytes, too few for a chunk header, are zeros;
* each record a ``Record`` protobuf (``wandb/proto/wandb_internal.proto``): ``num`` 1,
  ``history`` 2 → ``HistoryRecord``: ``item`` 1 (``key`` 1, ``nested_key`` 2,
  ``value_json`` 16; wandb 0.31 may also write a typed value, 3-8, beside it) and
  ``step`` 2 → ``num`` 1. wandb-core adds the items ``_step``, ``_timestamp`` (seconds
  since the epoch) and ``_runtime``. A row is written when its step is over (the next
  step is logged, or the run finishes): the newest step shows one step late.

speculators logs a validation dict at the step its next training dict is logged at:
W&B merges them into one row, the training dict's ``epoch`` over the validation's
(:func:`metric_dicts` puts both back).

Hostile files are survived, counted and said (:class:`Framing`): a torn record waits
for its end (the writer appends); a chunk whose CRC fails is skipped; a chunk header
that cannot be (an unknown type, a length past its block) loses the rest of its block,
as W&B's own reader recovers; a record over :data:`MAX_RECORD` is dropped without being
held; a file that does not begin with W&B's header is not read at all.
"""

from __future__ import annotations

import math
import os
import re
import struct
import zlib
from typing import Dict, List, Optional, Tuple  # noqa: UP035 (Python 3.8 on the host)

from eagle3_tui.agent.logparse import tracked_dict
from eagle3_tui.agent.tfevents import _SKIP_DIRS, _fields
from eagle3_tui.telemetry import procs
from eagle3_tui.telemetry.safefs import read_bounded, trust_problem

HEADER = b":W&B" + struct.pack("<H", 0xBEE1) + b"\x00"
"""The file's first 7 bytes: ident, magic, store version 0."""
BLOCK = 32 * 1024
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
MAX_RECORD = 1 << 20
"""A record longer than this is dropped (a history row is ~1 KiB; a big config or
console burst is what reaches it)."""
READ_BYTES = 2 << 20
"""What a follower reads per look: a record of :data:`MAX_RECORD` with its chunk headers
and block ends always fits, so a look that begins at a record always ends one."""
WALK_ENTRIES = 4000
"""At most this many directory entries are looked at per search."""
WALK_DEPTH = 4
_RUN_DIR = re.compile(r"^(?:offline-)?run-(\d{8}_\d{6})-([0-9a-z]+)$")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_SPECIAL = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_DEBUG_PID = re.compile(rb"Configure stats pid to (\d+)")
DEBUG_LOG_BYTES = 64 << 10
"""How much of a run's ``logs/debug.log`` is read for its writer's PID."""

Row = Tuple[Dict[str, float], Optional[int], Optional[float]]  # noqa: UP006, UP045 (3.8)
"""One history row: its numeric metrics by flattened key, its step, its ``_timestamp``."""


class Framing:
    """What a read found wrong, counted (a file's whole life)."""

    def __init__(self) -> None:
        self.bad_crc = 0
        """Chunks skipped: their data's CRC did not match."""
        self.lost_blocks = 0
        """Blocks whose rest was skipped: a chunk header there cannot be one."""
        self.too_big = 0
        """Records dropped for being over :data:`MAX_RECORD`."""
        self.cut = 0
        """Records cut short: a new record began before their last chunk."""
        self.not_metrics = 0
        """Records with no metric row (the header, config, summaries, console, system
        stats, a history row of text only, a record that does not parse)."""
        self.broken_at: int | None = None
        """Where the file stopped being readable (0: it has no W&B header)."""

    @property
    def problem(self) -> str | None:
        """What could not be read, in one line (None: nothing)."""
        said = []
        if self.broken_at is not None:
            said.append(f"not a W&B run file (no W&B header at byte {self.broken_at:,})")
        if self.bad_crc:
            said.append(f"{self.bad_crc} chunk(s) skipped (their CRC does not match)")
        if self.lost_blocks:
            said.append(f"{self.lost_blocks} block(s) cut short by a broken chunk header")
        if self.too_big:
            said.append(f"{self.too_big} record(s) over {MAX_RECORD >> 20} MiB skipped")
        if self.cut:
            said.append(f"{self.cut} record(s) cut short")
        return "; ".join(said) or None


# ---- records --------------------------------------------------------------------------


def records(data: bytes, framing: Framing, base: int = 0) -> tuple[list[bytes], int]:
    """The whole records in ``data``, read from the file's offset ``base`` (0, or where a
    previous call's records ended), and how many bytes they took; a torn record (or a
    broken chunk header in a block not yet whole) is left for the next read, so that
    reads from kept offsets, cut anywhere, find what one read finds."""
    if framing.broken_at is not None:
        return [], 0
    n = len(data)
    at = 0
    if base == 0:
        if data[:CHUNK_HEADER] != HEADER[: min(n, CHUNK_HEADER)]:
            framing.broken_at = 0
            return [], 0
        if n < CHUNK_HEADER:
            return [], 0
        at = CHUNK_HEADER
    view = memoryview(data)
    out: list[bytes] = []
    parts: list[bytes] = []
    size = 0
    start: int | None = None  # where the record being put together began
    unpack = struct.Struct("<IHB").unpack_from
    while True:
        room = BLOCK - (base + at) % BLOCK
        if room < CHUNK_HEADER:  # the block's zero trailer
            if n - at < room:
                break
            at += room
            continue
        if n - at < CHUNK_HEADER:
            break
        crc, length, kind = unpack(data, at)
        if kind not in (FULL, FIRST, MIDDLE, LAST) or CHUNK_HEADER + length > room:
            if n - at < room:
                break  # the block is not whole yet: wait for it
            framing.lost_blocks += 1
            if start is not None:
                framing.cut += 1
            parts, size, start = [], 0, None
            at += room
            continue
        end = at + CHUNK_HEADER + length
        if end > n:
            break  # torn: the writer is appending it
        chunk_at = at
        at = end
        if zlib.crc32(view[chunk_at + 6 : end]) != crc:
            framing.bad_crc += 1
            parts, size, start = [], 0, None
            continue
        if kind in (FULL, FIRST) and start is not None:
            framing.cut += 1
            parts, size, start = [], 0, None
        if kind == FULL:
            out.append(data[chunk_at + CHUNK_HEADER : end])
        elif kind == FIRST:
            start, parts, size = chunk_at, [data[chunk_at + CHUNK_HEADER : end]], length
        elif start is not None:  # MIDDLE or LAST of the record being put together
            size += length
            if size > MAX_RECORD:
                framing.too_big += 1
                parts, size, start = [], 0, None
                continue
            parts.append(data[chunk_at + CHUNK_HEADER : end])
            if kind == LAST:
                out.append(b"".join(parts))
                parts, size, start = [], 0, None
        # else: a MIDDLE or LAST whose record was already dropped (counted there)
    return out, (at if start is None else start)


# ---- protobuf: a Record's history row ---------------------------------------------------


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _number(text: str) -> float | None:
    """A JSON number (W&B's ``NaN``, ``Infinity``, ``-Infinity`` too) as a float; None
    for any other JSON (text, ``true``, ``null``, objects)."""
    special = _SPECIAL.get(text)
    if special is not None:
        return special
    if _NUMBER.fullmatch(text) is None:
        return None
    return float(text)


def history_row(record: bytes) -> Row | None:
    """``(metrics, step, wall_time)`` of a ``Record`` that is a history row with at
    least one numeric value; None for any other record or one that does not parse.
    W&B's own keys (``_step``, ``_timestamp``, ``_runtime``, any ``_…``) are not
    metrics; the step is the record's ``step`` (else ``_step``)."""
    history = None
    try:
        for field, wire, value in _fields(record):
            if field == 2 and wire == 2:
                history = value
        if history is None:
            return None
        metrics: dict[str, float] = {}
        step: int | None = None
        wall: float | None = None
        own_step: float | None = None
        for field, wire, value in _fields(history):
            if field == 1 and wire == 2:
                key, number = _item(value)
                if key is None or number is None:
                    continue
                if not key.startswith("_"):
                    metrics[key] = number
                elif key == "_timestamp":
                    wall = number if math.isfinite(number) else None
                elif key == "_step":
                    own_step = number
            elif field == 2 and wire == 2:
                step = 0  # a HistoryStep's num 0 is written as nothing
                for f2, w2, v2 in _fields(value):
                    if f2 == 1 and w2 == 0:
                        step = _signed(v2)
    except (ValueError, struct.error):
        return None
    if step is None and own_step is not None and math.isfinite(own_step):
        step = int(own_step) if own_step == int(own_step) else None
    if not metrics:
        return None
    return metrics, step, wall


def _item(buf: bytes) -> tuple[str | None, float | None]:
    """A ``HistoryItem``'s key (``key``, else its ``nested_key`` parts joined by ``/``,
    as speculators flattens) and its ``value_json`` when that is a number.

    The layout wandb-core writes (one key, then ``value_json``, each under 128 bytes)
    is read without the general decoder (half the time); anything else by it."""
    n = len(buf)
    end = 2 + buf[1] if n > 5 and buf[0] in (0x0A, 0x12) and buf[1] < 0x80 else 0
    if (
        2 < end <= n - 3
        and buf[end] == 0x82
        and buf[end + 1] == 0x01
        and buf[end + 2] < 0x80
        and end + 3 + buf[end + 2] == n
    ):
        key = buf[2:end].decode("utf-8", "replace")
        return key, _number(buf[end + 3 :].decode("utf-8", "replace"))
    return _decoded_item(buf)


def _decoded_item(buf: bytes) -> tuple[str | None, float | None]:
    """:func:`_item` by the general decoder (any field order, typed values, several
    ``nested_key`` parts)."""
    key: str | None = None
    nested: list[str] = []
    number: float | None = None
    for field, wire, value in _fields(buf):
        if wire != 2:
            continue
        if field == 16:
            number = _number(value.decode("utf-8", "replace"))
        elif field == 1:
            key = value.decode("utf-8", "replace")
        elif field == 2:
            nested.append(value.decode("utf-8", "replace"))
    if not key and nested:
        key = "/".join(nested)
    return key or None, number


def history(data: bytes, framing: Framing, base: int = 0) -> tuple[list[Row], int]:
    """The history rows of the whole records in ``data`` (read from offset ``base``) and
    how many bytes those took (:func:`records`); every other record is counted in
    ``framing.not_metrics`` and moves nothing."""
    bodies, used = records(data, framing, base)
    rows: list[Row] = []
    for body in bodies:
        row = history_row(body)
        if row is None:
            framing.not_metrics += 1
        else:
            rows.append(row)
    return rows, used


# ---- speculators' dicts back together ---------------------------------------------------


def metric_dicts(
    metrics: dict[str, float], step: int | None, wall: float | None
) -> List[Tuple[Dict[str, object], float]]:  # noqa: UP006 (3.8)
    """speculators' metric dicts in one history row, stamped with its time (the
    validation dict first: it was logged first), as :class:`~eagle3_tui.agent.tfevents.Regroup`
    makes them of event files: ``{"train": …, "profile": …, "epoch", "lr",
    "global_step"}`` and ``{"val": …, "epoch", "global_step"}``.

    A validation dict shares its row with the next epoch's first training dict (logged
    at the same step), whose ``epoch`` replaced its own: its epoch is then the one
    before the row's. A row with neither kind (only ``epoch``, say) is no dict."""
    ts = wall if wall is not None else 0.0
    val = [(k, v) for k, v in metrics.items() if k.startswith("val/")]
    rest = [(k, v) for k, v in metrics.items() if not k.startswith("val/")]
    out: List[Tuple[Dict[str, object], float]] = []  # noqa: UP006 (3.8)
    if val:
        epoch = metrics.get("epoch")
        trained = any(k.startswith("train/") for k, _ in rest)
        if epoch is not None and trained:
            epoch = epoch - 1 if epoch >= 1 else None
        d = tracked_dict(val + ([("epoch", epoch)] if epoch is not None else []), step)
        if d is not None:
            out.append((d, ts))
    if any(k.startswith("train/") for k, _ in rest):
        d = tracked_dict(rest, step)
        if d is not None:
            out.append((d, ts))
    return out


# ---- the trainer's file -----------------------------------------------------------------


def _run_file(run_dir: str) -> str | None:
    """``run_dir/run-<id>.wandb`` of a run directory named as W&B names them."""
    m = _RUN_DIR.match(os.path.basename(run_dir))
    return os.path.join(run_dir, f"run-{m.group(2)}.wandb") if m else None


def _held_files(pids: set[int]) -> set[str]:
    """Run files that ``pids`` or their descendants hold open: the ``.wandb`` file
    itself (wandb-core, the trainer's child, writes it), or the trainer's
    ``logs/debug.log`` in the run's directory (the trainer keeps it open while its
    core may be elsewhere)."""
    found: set[str] = set()
    everyone = set(pids)
    for pid in pids:
        everyone.update(procs.descendants(pid))
    for pid in everyone:
        for fd, target in (procs.fd_targets(pid) or {}).items():
            if target.endswith(".wandb"):
                run_dir = os.path.dirname(target)
            elif target.endswith("/logs/debug.log"):
                run_dir = os.path.dirname(os.path.dirname(target))
            else:
                continue
            run = _run_file(run_dir)
            path = procs.regular_path(target)
            if (
                run is not None
                and path is not None
                and _same_file(f"/proc/{pid}/fd/{fd}", path)  # the path names what it holds
                and (run == path or os.path.isfile(run))
            ):
                found.add(run)
    return found


def _same_file(a: str, b: str) -> bool:
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _logged_by(run_dir: str, pids: set[int], since: float | None) -> bool:
    """Whether the run's ``logs/debug.log`` says one of ``pids`` wrote it (``Configure
    stats pid to N``), and was written after ``since`` (an earlier process that had the
    same PID ended before the trainer began)."""
    log = os.path.join(run_dir, "logs", "debug.log")
    try:
        if since is not None and os.stat(log).st_mtime < since - 1:
            return False
        head = read_bounded(log, DEBUG_LOG_BYTES, follow=False)  # never a FIFO's wait
    except OSError:
        return False
    m = _DEBUG_PID.search(head)
    return m is not None and int(m.group(1)) in pids


def _walked_files(roots: list[str], pids: set[int], since: float | None) -> set[str]:
    """Run files under ``roots`` whose ``debug.log`` names one of ``pids``: a bounded
    walk (:data:`WALK_ENTRIES`, :data:`WALK_DEPTH`), no symlinked directory followed."""
    found: set[str] = set()
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
                if not e.is_dir(follow_symlinks=False):
                    continue
                run = _run_file(e.path)
                if run is not None:
                    if os.path.isfile(run) and _logged_by(e.path, pids, since):
                        found.add(run)
                elif depth < WALK_DEPTH and (
                    e.name in (".wandb", "wandb")
                    or (not e.name.startswith(".") and e.name not in _SKIP_DIRS)
                ):
                    todo.append((e.path, depth + 1))
            except OSError:
                continue
    return found


def find_run_files(
    roots: list[str], pids: set[int], uid: int | None, since: float | None
) -> list[str]:
    """The ``.wandb`` files of the trainer ``pids`` (with their descendants), newest
    run first: those it holds open (its wandb-core child writes the file; the trainer
    itself holds the run's ``logs/debug.log``), else those under ``roots`` whose
    ``debug.log`` its PID wrote after it started (``since``, seconds since the epoch).

    Only a file the trainer's user ``uid`` (or root) owns, in directories nobody else
    may write (:func:`~eagle3_tui.telemetry.safefs.trust_problem`), is taken. With
    ``uid`` None (the trainer's user unknown: it is gone) nothing is."""
    if uid is None:
        return []
    found = _held_files(pids) or _walked_files(roots, pids, since)
    trusted = [p for p in found if trust_problem(p, uid) is None]
    return sorted(trusted, key=_started, reverse=True)


def _started(run_file: str) -> str:
    """The run's start as its directory's name says it (``YYYYmmdd_HHMMSS``)."""
    m = _RUN_DIR.match(os.path.basename(os.path.dirname(run_file)))
    return m.group(1) if m else ""
