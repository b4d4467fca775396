"""The columnar companion of ``metrics.jsonl``: its training steps, column by column.

A long run's ``metrics.jsonl`` is mostly training steps, ~800 bytes of JSON each,
of which the monitor keeps ~20 numbers at float32. Shipped as JSON over a slow
link, 200,000 steps are 157 MB (55 MB zlib-packed); as columns, ~12 MB. Parsing
the JSON on the host when a monitor connects would take seconds of the host's
CPU, so the writer keeps the columns as it goes: after it has appended a batch of
lines, the training steps among them (their byte offsets known from the
``O_APPEND`` write) are flattened into rows, and every :data:`BLOCK_ROWS` rows
(or :data:`BLOCK_AGE_S` seconds, or at close) a block of them is appended to
``metrics.cols`` next to the JSON lines. That costs one ``json.loads`` per step
in the writer's thread (~20 µs; never in the training loop) and ~15 % more disk.

The agent ships blocks instead of the lines they index (agent/follow.py); the
client rebuilds the steps from them (model/segments.py). The JSON lines stay the
truth: a block is used only where each of its rows is a whole line of the file it
names (device and inode), at the offset it says, with the sequence number it
says; anything else travels as the lines themselves.

A row is a training step of the usual shape only: the envelope (``v``, ``seq``,
``w``, ``ts``, ``kind``, ``rank``), ``train`` and optional ``profile`` and ``lr``
dicts of numbers (or a number ``lr``), integer ``epoch``, ``step`` and
``global_step``. A line with a non-finite value (written as a string), a nested
dict, another field... is not a row. Consecutive rows of one shape share a block.

Block layout (little-endian)::

    b"E3C1" | u32 header length | u32 body length | u32 crc32(header + body)
    header: JSON {"dev", "ino", "n", "const": {"w", "kind"},
                  "cols": [[path, type, size], ...]}
    body:   the columns' packed bytes, in the header's order

Paths are ``seq``, ``ts``, ``train.loss``... plus ``@off`` and ``@len`` (each row's
line); types ``q`` (int64, stored as differences), ``d`` (float64) and ``f``
(float32), each column byte-shuffled (all first bytes, then all second bytes...)
and zlib-packed: shuffled, the sign/exponent bytes of similar values pack to
almost nothing. An int64 column whose values step evenly (a block's ``seq``,
``step``, ``v``, ``rank``, mostly ``epoch``) is type ``a``: its first value and the
step, 16 bytes (``<qq``), no zlib (inflating the long runs of a ``q`` column's
planes took ~27 µs a column, a third of a reader's inflating).

Each column block's header also carries ``"span"`` (the byte range from its first
row to the end of its last) and ``"stats"``: per column ``[first, min, index of the
min, max, index of the max, last, mean]`` (floats to 7 significant digits), what a
glance draws a long history from without reading its rows (agent/glance.py).

**Marks.** A glance reads a run's newest lines and, of everything before them, only
the events: every line of a writer that is neither a training step kept as a row
nor a sampler's (:data:`SAMPLED_KINDS`, whose newest lines say all the monitor
keeps). Each writer (the trainer's, the sidecar's, each rank's) appends, right after
a batch of lines that held such an event, a mark block listing them, and one (empty)
when it first writes to a file, so that a glance knows every writer that has marks::

    b"E3M1" | u32 header length | u32 0 | u32 crc32(header)
    header: JSON {"dev", "ino", "w": the writer, "marks": [[offset, length, kind], ...]}
            (+ "lost": true when lines of the writer landed where it cannot say)

``index_file`` writes one writer ``"*"`` for every line of the file it indexed.

**Samples.** Each writer also lists its sampler lines (:data:`SAMPLED_KINDS`), by
their envelopes, in sample blocks, so that the companion accounts for every byte of
its lines: rows, samples and marks together tile the ranges they cover, and where
they do, a reader needs none of those bytes but the events' (agent/column_plan.py)::

    b"E3S1" | u32 header length | u32 body length | u32 crc32(header + body)
    header: JSON {"dev", "ino", "n", "span", "bytes": the lines' bytes,
                  "kinds", "writers", "cols": [[name, type, size], ...]}
    body:   packed columns @off, @len, kind, w (indexes into "kinds" and
            "writers"), seq (``q``) and ts (``d``)

A sampler line without the envelope as our writer writes it is marked instead.
Column blocks carry ``"bytes"`` (their rows' bytes) too.

**Digests.** After every :data:`DIGEST_BLOCKS` column blocks of one shape, a writer
appends the stats of them all, merged (what a glance draws a long history from,
agent/glance.py, without parsing each block's stats)::

    b"E3D1" | u32 header length | u32 0 | u32 crc32(header)
    header: JSON {"dev", "ino", "n": their rows, "spans": [[start, end], ...] (each
                  block's "span"), "stats": per column, as a block's, of them all}

Over 600 lines: the companion's one format, written (the trainer's writer) and read
back (the agent, the client) in one place, so that each type and check is spelled once.

Standard library only (imported inside the trainer and by the agent); Python 3.8+.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import sys
import zlib
from array import array
from itertools import accumulate
from operator import sub
from typing import Any, Tuple  # noqa: UP035 (Python 3.8 on the host)

from eagle3_tui.telemetry.parsing import parse_json

COLUMNS_FILE = "metrics.cols"
MAGIC = b"E3C1"
MARK_MAGIC = b"E3M1"
SAMPLE_MAGIC = b"E3S1"
DIGEST_MAGIC = b"E3D1"
MAGICS = (MAGIC, MARK_MAGIC, SAMPLE_MAGIC, DIGEST_MAGIC)
DIGEST_BLOCKS = 16
"""Column blocks a digest stands for (a 1M-step run's ~1,700 blocks: ~100 digests)."""
SAMPLE_ROWS = 8192
"""Sampler lines listed in one sample block at most (~6 KB packed)."""
SAMPLED_KINDS = frozenset({"gpu", "io", "heartbeat", "proc", "progress"})
"""Sampler kinds: written every few seconds, the newest say what is kept (not marked)."""
MARKS_PER_BLOCK = 4096
ALL_WRITERS = "*"
"""A mark block's writer when ``index_file`` marked every writer's lines."""
HEAD = struct.Struct("<4sIII")
STEPPED = struct.Struct("<qq")
"""An ``a`` column: its first value and the step between values."""
INT_KINDS = ("q", "a")
_INT64 = 1 << 63
BLOCK_ROWS = 1024
BLOCK_AGE_S = 300.0
"""A block is written at the latest this long after its first row: the rows after
the last block travel as JSON (at 2 steps/s, 1024 rows are ~8.5 minutes)."""
MAX_HEADER = 1 << 20
MAX_BODY = 64 << 20
ZLIB_LEVEL = 6
"""Blocks are packed once, in the writer's thread, and shipped many times."""

ENVELOPE_INTS = ("v", "seq", "rank", "epoch", "step", "global_step")
GROUPS = ("train", "profile", "lr")
"""Dicts of numbers whose values are stored as float32 (what the monitor keeps)."""
FLOAT32_MAX = 3.4028234663852886e38
MONITOR_PROFILE = ("step_ms", "tokens_per_s", "fetch_frac")
"""The ``profile`` timings the monitor keeps (model/records.py's ``Profile``): the
only ones it asks the agent to ship."""

Shape = Tuple[Tuple[str, str], ...]  # noqa: UP006 (evaluated: Python 3.8 cannot subscript tuple)

ENVELOPE = re.compile(
    rb'\{"v": ?1, ?"seq": ?(\d+), ?"w": ?"([^"\\]*)", ?"ts": ?([-0-9.eE+]+), ?"kind": ?"(\w+)"'
)
"""A line's envelope as our writer writes it (its fields first, in this order)."""
NL_ENVELOPE = re.compile(b"\n" + ENVELOPE.pattern)
"""The same after a newline: a literal start, which the regex engine scans for fast."""
PLAIN_TIME = re.compile(rb"[1-9][0-9]{0,11}(\.[0-9]+)?")
"""A time an envelope listed without its line may carry: positive, finite, plain
decimal (a sample whose time is written otherwise is marked, or sent whole)."""


def companion_path(jsonl_path: str) -> str:
    """``metrics.cols`` beside ``metrics.jsonl`` (``x.jsonl`` -> ``x.cols``)."""
    head, name = os.path.split(jsonl_path)
    stem = name[: -len(".jsonl")] if name.endswith(".jsonl") else name
    return os.path.join(head, stem + ".cols")


def _float_ok(v: Any) -> bool:
    return (
        type(v) is float
        and not (v != v or v in (math.inf, -math.inf))
        and -FLOAT32_MAX <= v <= FLOAT32_MAX
    ) or (type(v) is int and -(1 << 53) <= v <= (1 << 53))


def flatten(rec: Any) -> tuple[Shape, tuple[str, str], list[Any]] | None:
    """A training-step record as (shape, (w, kind), values), or None when it is not
    a row (see the module docstring)."""
    if not isinstance(rec, dict) or rec.get("kind") != "train":
        return None
    w = rec.get("w")
    if not isinstance(w, str) or not isinstance(rec.get("train"), dict) or not rec["train"]:
        return None
    shape: list[tuple[str, str]] = []
    values: list[Any] = []
    for key, v in rec.items():
        if key in ("w", "kind"):
            continue
        if key == "ts":
            if type(v) is not float or not _float_ok(v):
                return None
            shape.append(("ts", "d"))
            values.append(v)
        elif key in ENVELOPE_INTS:
            if type(v) is not int or not -(1 << 53) < v < (1 << 53):  # a float's exact ints
                return None
            shape.append((key, "q"))
            values.append(v)
        elif key == "lr" and not isinstance(v, dict):
            if not _float_ok(v):
                return None
            shape.append(("lr", "f"))
            values.append(float(v))
        elif key in GROUPS and isinstance(v, dict):
            if not v and key != "profile":
                return None
            shape.append((key, "{"))  # the group itself: present, perhaps empty
            for name, x in v.items():
                if not _float_ok(x):
                    return None
                shape.append((key + "." + name, "f"))
                values.append(float(x))
        else:
            return None
    return tuple(shape), (w, "train"), values


def seq_fits(seq: bytes) -> bool:
    """Whether an envelope's ``seq`` (its digits, as :data:`ENVELOPE` matched them) is
    one a reader holds exactly, as an int64 and as a float64 (below 2**53): a longer
    one is listed as a line, not by its envelope (packing one past 64 bits raised, and
    took the agent's read down with it)."""
    return len(seq) <= 15


def kind_of(line: bytes) -> str:
    """The ``kind`` a line names ("" when it names none), spelled compactly as our
    writer writes it or with spaces (a file written by another tool)."""
    at = line.find(b'"kind"')
    if at < 0:
        return ""
    at += 6
    n = len(line)
    while at < n and line[at] in (32, 58, 9):  # spaces and the colon
        at += 1
    if at >= n or line[at] != 34:
        return ""
    end = line.find(b'"', at + 1, at + 42)
    return line[at + 1 : end].decode("ascii", "replace") if end > 0 else ""


def _f7(v: float) -> float:
    return float(f"{v:.7g}")


def column_stats(kind: str, values: list[Any]) -> list[Any]:
    """``[first, min, index of the min, max, index of the max, last, mean]`` of a
    column's values (floats of an ``f`` column to 7 significant digits)."""
    lo, hi = min(values), max(values)
    stats = [values[0], lo, values.index(lo), hi, values.index(hi), values[-1]]
    stats.append(math.fsum(values) / len(values))
    if kind == "f":
        stats = [v if i in (2, 4) else _f7(v) for i, v in enumerate(stats)]
    return stats


# ---- packing ------------------------------------------------------------------------


def _shuffle(raw: bytes, width: int) -> bytes:
    return b"".join(raw[i::width] for i in range(width))


def _unshuffle(data: bytes, width: int) -> bytes:
    n = len(data) // width
    out = bytearray(len(data))
    for i in range(width):
        out[i::width] = data[i * n : (i + 1) * n]
    return bytes(out)


def pack_column(kind: str, values: list[Any], level: int = ZLIB_LEVEL) -> bytes:
    if kind == "q":
        diffs = array("q", map(sub, values, [0, *values[:-1]])) if values else array("q")
        raw, width = diffs.tobytes(), 8
    else:
        raw = array(kind, values).tobytes()
        width = 8 if kind == "d" else 4
    if array("i", [1]).tobytes()[0] != 1:  # a big-endian host: store little-endian
        swapped = array("q" if width == 8 else "f", raw)
        swapped.byteswap()
        raw = swapped.tobytes()
    return zlib.compress(_shuffle(raw, width), level)


def pack_ints(values: list[int], level: int = ZLIB_LEVEL) -> tuple[str, bytes]:
    """An int64 column's type and packed bytes: ``a`` where its values step evenly,
    else ``q``."""
    if values:
        first, step = values[0], (values[1] - values[0] if len(values) > 1 else 0)
        if -_INT64 <= step < _INT64 and all(
            b - a == step
            for a, b in zip(values, values[1:])  # noqa: B905, RUF007 (3.8)
        ):
            return "a", STEPPED.pack(first, step)
    return "q", pack_column("q", values, level)


def stepped(packed: bytes, n: int) -> tuple[int, int]:
    """An ``a`` column's first value and step (ValueError: not one of ``n`` int64
    values)."""
    if len(packed) != STEPPED.size or n <= 0:
        raise ValueError(f"a stepped column of {len(packed)} bytes")
    first, step = STEPPED.unpack(packed)
    if not -_INT64 <= first + step * (n - 1) < _INT64:
        raise ValueError("values beyond 64 bits")
    return first, step


def unpack_ints(packed: bytes, n: int, kind: str = "q") -> list[int]:
    """An int64 column's values (the agent reads ``seq``, ``@off`` and ``@len``)."""
    if kind == "a":
        first, step = stepped(packed, n)
        return list(range(first, first + step * n, step)) if step else [first] * n
    if kind != "q":
        raise ValueError(f"a column of type {kind!r}, not int64")
    return list(accumulate(_diffs(packed, n)))


def unpack_floats(packed: bytes, n: int, kind: str) -> array[float]:
    """A float column's ``n`` values (``f`` or ``d``; ValueError: not that): the agent
    sums the pace's timings of old blocks (agent/column_plan.py)."""
    if kind not in ("f", "d"):
        raise ValueError(f"a column of type {kind!r}, not floats")
    width = 8 if kind == "d" else 4
    raw = zlib.decompress(packed)
    if len(raw) != n * width:
        raise ValueError(f"{len(raw)} bytes for {n} values")
    out: array[float] = array(kind, _unshuffle(raw, width))
    if array("i", [1]).tobytes()[0] != 1:  # stored little-endian
        out.byteswap()
    return out


def unpack_int_array(
    packed: bytes, n: int, ascending: bool = False, kind: str = "q", positive: bool = False
) -> array[int]:
    """:func:`unpack_ints` as an array: 8 bytes a value, where a list holds an int
    object of ~32 bytes for each (what stays alive for long: a 1M-step run's sample
    blocks list 3M places, and as lists they took ~120 MB of small-object memory that
    the process kept after they were freed). ValueError unless each value is at least
    the one before (``ascending``), or above 0 (``positive``)."""
    if kind != "q":
        values = unpack_ints(packed, n, kind)
        if ascending and n > 1 and values[1] < values[0]:
            raise ValueError("values out of order")
        if positive and values and min(values) <= 0:
            raise ValueError("values not above 0")
        return array("q", values)
    np = sys.modules.get("numpy")
    if np is not None:  # a process that has numpy (a local read): ~8x faster
        fast = _numpy_sums(np, packed, n, ascending, positive)
        if fast is not None:
            return fast
    diffs = _diffs(packed, n)
    if ascending and n > 1 and min(diffs[1:]) < 0:
        raise ValueError("values out of order")
    try:
        out = array("q", list(accumulate(diffs)))  # (from a list: ~30 % faster)
    except OverflowError:
        raise ValueError("values beyond 64 bits") from None
    if positive and out and min(out) <= 0:
        raise ValueError("values not above 0")
    return out


def _numpy_sums(
    np: Any, packed: bytes, n: int, ascending: bool, positive: bool = False
) -> array[int] | None:
    """:func:`unpack_int_array` with numpy (never imported here: a process that already
    has it, a client reading a local run, gets the sums ~8x faster than a list's); None
    where the sums might not fit in 64 bits (the standard-library path tells)."""
    raw = zlib.decompress(packed)
    if len(raw) != 8 * n:
        raise ValueError(f"{len(raw) / 8:g} values, not {n}")
    if not n:
        return array("q")
    planes = np.frombuffer(raw, dtype=np.uint8).reshape(8, n)
    diffs = np.ascontiguousarray(planes.T).view("<i8").reshape(n)
    if ascending and n > 1 and int(diffs[1:].min()) < 0:
        raise ValueError("values out of order")
    if max(abs(int(diffs.max())), abs(int(diffs.min()))) * n >= 1 << 63:
        return None  # a sum might wrap around: told exactly without numpy
    sums = np.cumsum(diffs)
    if positive and int(sums.min()) <= 0:
        raise ValueError("values not above 0")
    out = array("q")
    out.frombytes(sums.astype("=i8").tobytes())
    return out


def _diffs(packed: bytes, n: int) -> array[int]:
    """A ``q`` column's stored differences (ValueError: not ``n`` of them)."""
    raw = _unshuffle(zlib.decompress(packed), 8)
    diffs = array("q")
    diffs.frombytes(raw)
    if array("i", [1]).tobytes()[0] != 1:
        diffs.byteswap()
    if len(diffs) != n:
        raise ValueError(f"{len(diffs)} values, not {n}")
    return diffs


PACE_TIMINGS = ("profile.tokens_per_s", "profile.step_ms")
"""The columns a pace reads: a step's tokens are ``tokens_per_s × step_ms / 1000``."""


def pace_of(cols: dict[str, list[Any]]) -> dict[str, float] | None:
    """A block's ``"pace"``: the tokens of its steps that logged both timings, and its
    newest row's time (a summary's read sends an old block's timings as this sum:
    agent/column_plan.py's ``pace_summed``); None without both columns or times."""
    tps, ms, ts = cols.get(PACE_TIMINGS[0]), cols.get(PACE_TIMINGS[1]), cols.get("ts")
    if not tps or not ms or not ts:
        return None
    steps = []
    for x, y in zip(tps, ms):  # noqa: B905 (3.8: no strict)
        if isinstance(x, float) and isinstance(y, float):  # (absent: NaN, or not a float)
            p = x * y / 1000.0
            if math.isfinite(p):
                steps.append(p)
    newest = max(ts)
    if not isinstance(newest, (int, float)) or not math.isfinite(newest):
        return None
    return {"tokens": math.fsum(steps), "ts": float(newest)}


def encode_block(
    ident: tuple[int, int],
    const: tuple[str, str],
    shape: Shape,
    offsets: list[int],
    lengths: list[int],
    rows: list[list[Any]],
    stats_out: dict[str, list[Any]] | None = None,
) -> bytes:
    """A column block (see the module docstring); ``stats_out`` gets its stats."""
    cols: list[list[Any]] = []
    parts: list[bytes] = []
    meta: list[list[Any]] = []
    data_shape = [(p, t) for p, t in shape if t != "{"]
    for i in range(len(data_shape)):
        cols.append([row[i] for row in rows])
    for path, kind, values in (("@off", "q", offsets), ("@len", "q", lengths)):
        kind, packed = pack_ints(values)
        parts.append(packed)
        meta.append([path, kind, len(packed)])
    groups = [p for p, t in shape if t == "{"]
    for (path, kind), values in zip(data_shape, cols):  # noqa: B905 (3.8: no strict)
        if kind == "q":
            kind, packed = pack_ints(values)
        else:
            packed = pack_column(kind, values)
        parts.append(packed)
        meta.append([path, kind, len(packed)])
    stats = {
        path: column_stats(kind, values)
        for (path, kind), values in zip(data_shape, cols)  # noqa: B905 (3.8)
        if values
    }
    if stats_out is not None:
        stats_out.update(stats)
    head: dict[str, Any] = {
        "dev": ident[0],
        "ino": ident[1],
        "n": len(rows),
        "const": {"w": const[0], "kind": const[1]},
        "groups": groups,
        "order": [p for p, _ in shape],
        "cols": meta,
        "span": [offsets[0], offsets[-1] + lengths[-1]] if offsets else [0, 0],
        "bytes": sum(lengths),
    }
    pace = pace_of(dict(zip((p for p, _ in data_shape), cols)))  # noqa: B905 (3.8)
    if pace is not None:
        head["pace"] = pace
    head["stats"] = stats  # last: a reader that needs none of them cuts them off
    header = json.dumps(head, separators=(",", ":")).encode()
    body = b"".join(parts)
    crc = zlib.crc32(body, zlib.crc32(header))
    return HEAD.pack(MAGIC, len(header), len(body), crc) + header + body


def merge_stats(
    blocks: list[tuple[int, dict[str, list[Any]]]], kinds: dict[str, str]
) -> dict[str, list[Any]]:
    """The stats of consecutive blocks' rows taken together, from each block's rows
    and stats (:func:`column_stats`; ``kinds``: each column's type): the first of the
    first, the least and the greatest with their rows (the first such), the last of the
    last, the mean weighted by rows. Only the columns every block has."""
    paths = set(blocks[0][1])
    for _, stats in blocks[1:]:
        paths &= set(stats)
    out: dict[str, list[Any]] = {}
    for path in sorted(paths):
        lo = hi = None
        ilo = ihi = at = 0
        total = 0.0
        for n, stats in blocks:
            s = stats[path]
            if lo is None or s[1] < lo:
                lo, ilo = s[1], at + s[2]
            if hi is None or s[3] > hi:
                hi, ihi = s[3], at + s[4]
            total += s[6] * n
            at += n
        mean = total / at
        out[path] = [
            blocks[0][1][path][0],
            lo,
            ilo,
            hi,
            ihi,
            blocks[-1][1][path][5],
            _f7(mean) if kinds.get(path) == "f" else mean,
        ]
    return out


def encode_digest(
    ident: tuple[int, int], spans: list[list[int]], n: int, stats: dict[str, list[Any]]
) -> bytes:
    """A digest block (see the module docstring)."""
    head = {"dev": ident[0], "ino": ident[1], "n": n, "spans": spans, "stats": stats}
    header = json.dumps(head, separators=(",", ":")).encode()
    return HEAD.pack(DIGEST_MAGIC, len(header), 0, zlib.crc32(header)) + header


def pack_envelopes(
    offsets: list[int],
    lengths: list[int],
    kinds: list[bytes],
    writers: list[bytes],
    seqs: list[int],
    times: list[float],
    level: int = ZLIB_LEVEL,
) -> tuple[dict[str, Any], list[bytes]]:
    """Lines listed by their envelopes (a sample block's body, a columns frame's stubs):
    the header's ``n``, ``kinds``, ``writers`` and ``cols``, and the packed columns."""
    kind_ix = {k: i for i, k in enumerate(dict.fromkeys(kinds))}
    writer_ix = {w: i for i, w in enumerate(dict.fromkeys(writers))}
    cols: list[tuple[str, str, list[Any]]] = [
        ("@off", "q", offsets),
        ("@len", "q", lengths),
        ("kind", "q", [kind_ix[k] for k in kinds]),
        ("w", "q", [writer_ix[w] for w in writers]),
        ("seq", "q", seqs),
        ("ts", "d", times),
    ]
    meta: list[list[Any]] = []
    parts: list[bytes] = []
    for name, kind, values in cols:
        if kind == "q":
            kind, packed = pack_ints(values, level)
        else:
            packed = pack_column(kind, values, level)
        meta.append([name, kind, len(packed)])
        parts.append(packed)
    head = {
        "n": len(offsets),
        "kinds": [k.decode() for k in kind_ix],
        "writers": [w.decode("utf-8", "replace") for w in writer_ix],
        "cols": meta,
    }
    return head, parts


def encode_samples(
    ident: tuple[int, int],
    offsets: list[int],
    lengths: list[int],
    kinds: list[bytes],
    writers: list[bytes],
    seqs: list[int],
    times: list[float],
) -> bytes:
    """A sample block (see the module docstring)."""
    head, parts = pack_envelopes(offsets, lengths, kinds, writers, seqs, times)
    head.update(
        dev=ident[0],
        ino=ident[1],
        span=[offsets[0], offsets[-1] + lengths[-1]],
        bytes=sum(lengths),
    )
    header = json.dumps(head, separators=(",", ":")).encode()
    body = b"".join(parts)
    crc = zlib.crc32(body, zlib.crc32(header))
    return HEAD.pack(SAMPLE_MAGIC, len(header), len(body), crc) + header + body


class Samples:
    """A sample block read back: where its lines are (one writer's, in file order),
    the kinds it names, and its packed columns as written (sent on as they are)."""

    __slots__ = (
        "_row_kinds",
        "body",
        "cols",
        "end",
        "kinds",
        "lengths",
        "n",
        "offsets",
        "start",
        "writers",
    )

    def __init__(self, header: dict[str, Any], body: memoryview) -> None:
        """Raises ValueError (or KeyError, TypeError, zlib.error) for a block that is not one."""
        n = header["n"]
        if type(n) is not int or n <= 0:
            raise ValueError(f"{n!r} lines")
        self.kinds = [str(k) for k in header["kinds"]]
        self.writers = [str(w) for w in header["writers"]]
        self.cols: list[list[Any]] = header["cols"]
        at = 0
        packed: dict[str, bytes] = {}
        kinds: dict[str, str] = {}
        for name, kind, size in self.cols:
            if kind not in ("q", "a", "d") or type(size) is not int or size < 0:
                raise ValueError(f"column {name!r}")
            packed[str(name)] = bytes(body[at : at + size])
            kinds[str(name)] = kind
            at += size
        if at != len(body) or set(packed) != {"@off", "@len", "kind", "w", "seq", "ts"}:
            raise ValueError("not a sample block's columns")
        self.n = n
        self.body = bytes(body)
        if kinds["ts"] != "d" or any(
            kinds[c] not in INT_KINDS for c in ("@off", "@len", "kind", "w", "seq")
        ):
            raise ValueError("not a sample block's columns")
        self.offsets = unpack_int_array(packed["@off"], n, True, kinds["@off"])
        # (lines of no length: not one; overlaps: a reader checks what it is sent)
        self.lengths = unpack_int_array(packed["@len"], n, kind=kinds["@len"], positive=True)
        self.start = self.offsets[0]
        self.end = self.offsets[-1] + self.lengths[-1]
        if self.start < 0 or header.get("span") != [self.start, self.end]:
            raise ValueError("a span its lines do not have")
        self._row_kinds: list[str] | None = None

    def row_kinds(self) -> list[str]:
        """Each line's kind (unpacked when first asked). ValueError when one names no
        kind of the block's."""
        if self._row_kinds is None:
            at = 0
            for name, kind, size in self.cols:
                if name == "kind":
                    codes = unpack_int_array(self.body[at : at + size], self.n, kind=kind)
                    if any(c < 0 or c >= len(self.kinds) for c in codes):
                        raise ValueError("a line of no kind")
                    self._row_kinds = [self.kinds[c] for c in codes]
                    break
                at += size
            else:
                raise ValueError("no kinds")
        return self._row_kinds


class Block:
    """One block read back: its header and each column's packed bytes."""

    __slots__ = ("_body", "_chunks", "_cols", "header", "n")

    def __init__(
        self, header: dict[str, Any], cols: list[tuple[str, str, int]], body: memoryview
    ) -> None:
        self.header = header
        self.n: int = header["n"]
        self._cols, self._body = cols, body
        self._chunks: dict[str, tuple[str, Any]] | None = None

    @property
    def cols(self) -> list[tuple[str, str, int]]:
        """Its columns (path, type, packed size), in the body's order."""
        return self._cols

    def packed(self, indices: tuple[int, ...]) -> list[tuple[str, str, Any]]:
        """The columns at these places of :attr:`cols` (in ascending order), each as
        (path, type, packed bytes: a view of the body)."""
        out: list[tuple[str, str, Any]] = []
        at = 0
        want = iter(indices)
        nxt = next(want, -1)
        for i, (path, kind, size) in enumerate(self._cols):
            if i == nxt:
                out.append((path, kind, self._body[at : at + size]))
                nxt = next(want, -1)
            at += size
        return out

    @property
    def chunks(self) -> dict[str, tuple[str, Any]]:
        """path -> (type, packed bytes: a view of the body), made when first asked (a
        plan walks ~1,700 blocks of a 1M-step run before its first frame, and uses
        each block's columns only when it sends it)."""
        if self._chunks is None:
            chunks: dict[str, tuple[str, Any]] = {}
            at, body = 0, self._body
            for path, kind, size in self._cols:
                chunks[path] = (kind, body[at : at + size])
                at += size
            self._chunks = chunks
        return self._chunks

    def ints(self, path: str) -> list[int]:
        kind, packed = self.chunks[path]
        return unpack_ints(packed, self.n, kind)


def encode_marks(ident: tuple[int, int], writer: str, marks: list[Any], lost: bool) -> bytes:
    """A mark block (see the module docstring)."""
    head: dict[str, Any] = {"dev": ident[0], "ino": ident[1], "w": writer, "marks": marks}
    if lost:
        head["lost"] = True
    header = json.dumps(head, separators=(",", ":")).encode()
    return HEAD.pack(MARK_MAGIC, len(header), 0, zlib.crc32(header)) + header


def walk_blocks(data: bytes) -> list[tuple[bytes, bytes, memoryview]]:
    """Every whole block of a companion's bytes, column, mark and sample blocks, as
    (magic, header, body: a view of ``data``, not a copy), in order: block to block by
    their lengths; past a torn or damaged one, at the next magic of any kind."""
    out: list[tuple[bytes, bytes, memoryview]] = []
    pos = 0
    size = len(data)
    view = memoryview(data)
    while pos + HEAD.size <= size:
        magic, hlen, blen, crc = HEAD.unpack_from(data, pos)
        start = pos + HEAD.size
        end = start + hlen + blen
        if (
            magic in MAGICS
            and hlen <= MAX_HEADER
            and blen <= MAX_BODY
            and end <= size
            and zlib.crc32(view[start + hlen : end], zlib.crc32(view[start : start + hlen])) == crc
        ):
            out.append((magic, data[start : start + hlen], view[start + hlen : end]))
            pos = end
            continue
        found = [data.find(m, pos + 1) for m in MAGICS]
        nexts = [at for at in found if at >= 0]
        if not nexts:
            break
        pos = min(nexts)
    return out


def block_cols(header: dict[str, Any], body_len: int) -> list[tuple[str, str, int]] | None:
    """A column block's columns (path, type, packed size) as its parsed header lists
    them, where they add up to its body's ``body_len`` bytes and name its rows' places
    and sequence numbers; None: not a column block's header."""
    try:
        cols: list[tuple[str, str, int]] = []
        at = 0
        for path, kind, size in header["cols"]:
            if kind not in ("q", "a", "d", "f") or not isinstance(size, int) or size < 0:
                return None
            cols.append((str(path), kind, size))
            at += size
        if at != body_len or not isinstance(header.get("n"), int) or header["n"] <= 0:
            return None
        if not {"@off", "@len", "seq"} <= {c[0] for c in cols}:
            return None
        return cols
    except (ValueError, KeyError, TypeError):
        return None


def block_of(header: dict[str, Any], body: memoryview) -> Block | None:
    """A column block from its parsed header and its body (None: not one); its
    columns are views of ``body`` (``Block.ints`` reads them as bytes would be)."""
    cols = block_cols(header, len(body))
    return None if cols is None else Block(header, cols, body)


def read_blocks(data: bytes) -> list[Block]:
    """The whole blocks in a companion file's bytes; a torn or damaged block is
    skipped (the reader looks for the next one)."""
    blocks: list[Block] = []
    pos = 0
    while True:
        at = data.find(MAGIC, pos)
        if at < 0 or at + HEAD.size > len(data):
            return blocks
        _, hlen, blen, crc = HEAD.unpack_from(data, at)
        start = at + HEAD.size
        end = start + hlen + blen
        block = None
        if hlen <= MAX_HEADER and blen <= MAX_BODY and end <= len(data):
            header_b = data[start : start + hlen]
            body = data[start + hlen : end]
            if zlib.crc32(body, zlib.crc32(header_b)) == crc:
                block = _parse_block(header_b, body)
        if block is None:
            pos = at + 1  # damaged: look for the next block
            continue
        blocks.append(block)
        pos = end


def _parse_block(header_b: bytes, body: bytes) -> Block | None:
    try:
        header = parse_json(header_b)
    except ValueError:
        return None
    return block_of(header, memoryview(body)) if isinstance(header, dict) else None
