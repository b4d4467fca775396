"""A glance at a long run: what its first picture needs, without reading all of it.

A run of a million steps with per-second samples is gigabytes of JSON lines; its
first picture needs a few hundred points a chart, the newest lines and every event.
The companion (telemetry/columns.py) holds what finds them: each column block's
stats stand for its rows, and each writer's mark blocks list its events. A glance is

- the **tail**: the newest ``tail_rows`` training steps and everything after them,
  as the lines themselves (from a column block's first row to the file's end, at
  most ``max_tail`` bytes);
- the **events** before the tail: every marked line, each read at its offset and
  checked (a whole line naming the kind its mark says);
- the **digest**: per column block before the tail, its steps, times and rows, and
  the stats of the columns asked for (``[first, min, index of min, max, index of
  max, last, mean]``); per run of blocks a writer's digest stands for (every 16 of a
  shape, telemetry/columns.py), one entry of them all: those blocks' headers are not
  parsed (~1,700 of them were ~100 ms of a 1M-step run's glance), only their file,
  rows and span matched by pattern, and a digest is used only where exactly its
  blocks are there, one after the other, with its rows (else each is parsed).

There is no glance (a reason instead, and the client reads the file whole, as
before) where the companion cannot stand for the file: none, or no column block of
this very file (device and inode); a writer's marks said lost; a writer in the tail
that never marked and whose first line is not in the tail (its earlier events would
be missed); more events than :data:`MAX_MARKS`. Lines of a writer older than marks
(an earlier version of telemetry) and wholly before the tail cannot be seen: the
whole file, read behind the first picture, has them.

``op: glance`` sends ``J glance`` (``ok``, ``size``, ``tail_from``, ``identity``, or
``ok`` false and ``why``), then a ``Z`` frame at offset -2 (the digest and the
events' places, JSON), one at offset -1 (the events' lines, one after the other) and
the tail as ``Z`` frames at their offsets, then ``J eof``. Python 3.8+, standard
library only.

Over 600 lines: what a glance trusts of the companion (digests, blocks, marks) and
what it sends are one protocol, read together.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import zlib
from typing import Any, Callable, Dict, List, Tuple  # noqa: UP035 (Python 3.8 on the host)

from eagle3_tui.agent.column_plan import ENVELOPE, MAX_COMPANION, NL_ENVELOPE
from eagle3_tui.agent.frames import AgentError, emit, emit_zdata
from eagle3_tui.agent.listing import line_at, marks_of
from eagle3_tui.agent.names import ERR_MISSING, EV_EOF, EV_GLANCE, EV_RESOLVED
from eagle3_tui.agent.runs import check_run_dir, resolve_run_dir
from eagle3_tui.telemetry.columns import (
    ALL_WRITERS,
    DIGEST_MAGIC,
    MAGIC,
    MARK_MAGIC,
    SAMPLE_MAGIC,
    Block,
    block_cols,
    column_stats,
    companion_path,
    kind_of,
)
from eagle3_tui.telemetry.parsing import parse_json
from eagle3_tui.telemetry.safefs import open_regular
from eagle3_tui.telemetry.scan import read_block, scan_heads, whole_header

TAIL_ROWS = 512
"""Training steps read whole at the end (at least: the steps after the companion's last
block come too): what the header, the TTT table, pace and health read, and the "last N
steps" views at full resolution."""
MAX_TAIL = 4 << 20
"""At most this many bytes of the tail (fewer steps where samples are many): a glance
stays about 1 MB on the wire."""
HEAD_PREFIX = 2048
"""Bytes of each header a glance reads first: a column block's span is in them (its
stats after it, ~3.3 KB in all, are read only where no digest stands for them)."""
MAX_MARKS = 50_000
LOGS_KEPT = 2000
"""Of the ``log`` events before the tail, the newest this many (what the model keeps)."""
FRAME = 4 << 20
LEVEL = 1

Digest = Dict[str, Any]  # noqa: UP006 (evaluated: Python 3.8)
Marks = List[Tuple[int, bytes]]  # noqa: UP006


class Glance:
    """What :func:`glance` found: see the module docstring."""

    __slots__ = ("digest", "identity", "marks", "size", "tail", "tail_from")

    def __init__(
        self,
        size: int,
        identity: str,
        tail_from: int,
        tail: bytes,
        marks: Marks,
        digest: Digest,
    ) -> None:
        self.size = size
        self.identity = identity
        self.tail_from = tail_from
        self.tail = tail
        self.marks = marks
        """(offset, the whole line) of each event before the tail, in file order."""
        self.digest = digest
        """``blocks``: [first step, last step, rows, first ts, last ts] per column block
        before the tail, in file order; ``stats``: per column path, one stats list a block."""


class _Col:
    """A column block of the file: where its rows are, and the stats the digest takes
    of it, from its header where it has them (its body is not read: :meth:`offsets`
    reads the block where its rows' places are needed). One a writer's digest stands
    for (:meth:`covered`) has no stats of its own until :meth:`parsed`."""

    __slots__ = ("at", "blen", "digest", "end", "head", "hlen", "n", "paths", "start", "stats")

    def __init__(
        self,
        start: int,
        end: int,
        n: int,
        at: int,
        paths: tuple[str, ...],
        stats: dict[str, Any],
    ) -> None:
        self.start, self.end, self.n, self.at = start, end, n, at
        """``at``: the block's offset in the companion."""
        self.paths = paths
        self.stats = stats
        self.digest: _Digest | None = None
        self.head = b""
        self.hlen = self.blen = 0

    @classmethod
    def covered(
        cls,
        head: bytes,
        hlen: int,
        blen: int,
        at: int,
        ident: tuple[bytes, bytes],
        digests: dict[tuple[bytes, bytes], tuple[_Digest, int, int]],
    ) -> _Col | None:
        """The block of this header (``head``: its first bytes, of ``hlen``), without
        parsing it, where a digest of this file names its span (the writer's own header:
        its file, rows and span read by pattern, their digits as JSON writes them:
        ``ident`` the file's device and inode, ``digests`` by each span they stand
        for); None otherwise (it is parsed as any block is)."""
        m = _HEAD.match(head)
        if m is None or m.group(1, 2) != ident:
            return None
        span = _SPAN.search(head, m.end())
        found = digests.get((span.group(1), span.group(2))) if span is not None else None
        if found is None:
            return None
        digest, start, end = found
        col = cls(start, end, int(m.group(3)), at, (), {})
        col.digest, col.head, col.hlen, col.blen = digest, head, hlen, blen
        return col

    def parsed(self, companion: int, keys: list[str]) -> _Col | None:
        """A covered block as any block is read (its digest not used)."""
        head = whole_header(companion, self.at, self.head, self.hlen)
        try:
            header = parse_json(head) if head is not None else None
        except ValueError:
            return None
        if not isinstance(header, dict):
            return None
        return _Col.of(header, self.blen, self.at, companion, keys)

    @classmethod
    def of(
        cls, header: dict[str, Any], blen: int, at: int, companion: int, keys: list[str]
    ) -> _Col | None:
        """The block whose header is ``header`` (at ``at`` in the companion, its body
        ``blen`` bytes); None when it is not a column block. A block written before its
        header had its span and stats (or one without a wanted column's) is read whole
        for them."""
        cols = block_cols(header, blen)
        if cols is None:
            return None
        paths, wanted, named = _plan(tuple(p for p, _, _ in cols), tuple(keys))
        span, stats = _header_span(header), header.get("stats")
        if span is not None and isinstance(stats, dict) and all(p in stats for p in named):
            # its stats from the header alone: all are there
            return cls(span[0], span[1], header["n"], at, paths, _header_stats(stats, wanted))
        # a column whose stats (or span) the header lacks: from the block read whole
        read = read_block(companion, at)
        if read is None or read.header != header:
            return None
        span = _span(read)
        if span is None:
            return None
        return cls(span[0], span[1], read.n, at, paths, {p: _stats(read, p) for p in wanted})

    def offsets(self, fd: int) -> list[int]:
        """Its rows' offsets, from the block read whole (ValueError: not the block seen
        before: the companion changed under the glance)."""
        block = read_block(fd, self.at)
        if block is None or block.n != self.n:
            raise ValueError("the companion changed")
        return block.ints("@off")


_HEAD = re.compile(rb'\{"dev":(\d{1,20}),"ino":(\d{1,20}),"n":(\d{1,12}),')
_SPAN = re.compile(rb'"span":\[(\d{1,20}),(\d{1,20})\]')


class _Digest:
    """A writer's digest of its consecutive column blocks (telemetry/columns.py): their
    spans, rows and merged stats. Used where exactly those blocks, one after the
    other, are before the tail; else each is parsed."""

    __slots__ = ("n", "spans", "stats")

    def __init__(self, spans: list[tuple[int, int]], n: int, stats: dict[str, Any]) -> None:
        self.spans, self.n, self.stats = spans, n, stats

    @classmethod
    def of(cls, header: dict[str, Any]) -> _Digest | None:
        spans, n, stats = header.get("spans"), header.get("n"), header.get("stats")
        if not (isinstance(spans, list) and spans and type(n) is int and n > 0):
            return None
        if not isinstance(stats, dict):
            return None
        out: list[tuple[int, int]] = []
        end = 0
        for sp in spans:
            if type(sp) is not list or len(sp) != 2:
                return None
            a, b = sp
            if type(a) is not int or type(b) is not int or not end <= a < b:
                return None
            out.append((a, b))
            end = b
        return cls(out, n, stats)

    def col(self, keys: list[str]) -> _Col:
        """Its blocks as one, for the digest a glance sends."""
        paths, wanted, _ = _plan(tuple(sorted(self.stats)), tuple(keys))
        start, end = self.spans[0][0], self.spans[-1][1]
        return _Col(start, end, self.n, -1, paths, _header_stats(self.stats, wanted))


PLANNED_COLUMNS = 256
"""Blocks of at most this many columns share one :func:`_plan` (a companion's headers
are the run's to write: what is kept of them stays small)."""


def _plan(
    names: tuple[str, ...], keys: tuple[str, ...]
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """For a block of these columns: the paths whose stats the digest carries
    (``keys``: paths, or prefixes ending in ``.``), with the steps' and times' (the
    stats taken), and those of them the block has (the stats its header must hold).
    A writer's blocks mostly share their columns: worked out once for them all (was
    ~20 ms of the 1M-step run's glance)."""
    if len(names) <= PLANNED_COLUMNS:
        return _planned(names, keys)
    return _plan_of(names, keys)


def _plan_of(
    names: tuple[str, ...], keys: tuple[str, ...]
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    paths = tuple(
        p
        for p in names
        if not p.startswith("@")
        and any(p == k or (k.endswith(".") and p.startswith(k)) for k in keys)
    )
    wanted = ("step", "global_step", "ts", *paths)
    have = set(names)
    return paths, wanted, tuple(p for p in wanted if p in have)


_planned = functools.lru_cache(maxsize=64)(_plan_of)


def _header_stats(stats: dict[str, Any], wanted: tuple[str, ...]) -> dict[str, Any]:
    """:func:`_stats` of each wanted path, from a header's stats (as the writer wrote
    them: the client checks every number)."""
    out: dict[str, Any] = {}
    for p in wanted:
        s = stats.get(p)
        out[p] = s if isinstance(s, list) and len(s) == 7 else None
    return out


def _header_span(header: dict[str, Any]) -> tuple[int, int] | None:
    span = header.get("span")
    if (
        isinstance(span, list)
        and len(span) == 2
        and all(type(v) is int for v in span)
        and 0 <= span[0] < span[1]
    ):
        return span[0], span[1]
    return None


def _span(block: Block) -> tuple[int, int] | None:
    span = _header_span(block.header)
    if span is not None:
        return span
    try:  # a block written before spans: from its rows
        offs, lens = block.ints("@off"), block.ints("@len")
    except (ValueError, KeyError, zlib.error):
        return None
    return (offs[0], offs[-1] + lens[-1]) if offs and lens else None


def _stats(block: Block, path: str) -> list[Any] | None:
    stats = block.header.get("stats")
    if isinstance(stats, dict):
        s = stats.get(path)
        if s is not None:  # as the writer wrote it (the client checks every number)
            return s if isinstance(s, list) and len(s) == 7 else None
    chunk = block.chunks.get(path)  # a block written before stats: from its column
    if chunk is None:
        return None
    try:
        values = _unpack(chunk[0], chunk[1], block.n)
    except (ValueError, zlib.error):
        return None
    return column_stats(chunk[0], values) if values else None


def _unpack(kind: str, packed: bytes, n: int) -> list[Any]:
    from array import array

    from eagle3_tui.telemetry.columns import _unshuffle, unpack_ints

    if kind in ("q", "a"):
        return unpack_ints(packed, n, kind)
    width = 8 if kind == "d" else 4
    raw = _unshuffle(zlib.decompress(packed), width)
    values = array(kind)
    values.frombytes(raw)
    if array("i", [1]).tobytes()[0] != 1:
        values.byteswap()
    if len(values) != n:
        raise ValueError(f"{len(values)} values, not {n}")
    return values.tolist()


def _line_ok(fd: int, off: int, n: int, kind: str) -> bytes | None:
    """The line a mark names, if it is one: whole, and of the marked kind."""
    try:
        line = line_at(fd, off, n)
    except OSError:
        return None
    return line if line is not None and kind_of(line) == kind else None


def _tail_writers(tail: bytes) -> dict[str, int]:
    """Each writer in the tail and the sequence number of its first line there."""
    first: dict[str, int] = {}
    m0 = ENVELOPE.match(tail)
    found = NL_ENVELOPE.finditer(tail)
    for m in [m0, *found] if m0 is not None else found:
        w = m.group(2).decode("utf-8", "replace")
        if w not in first:
            first[w] = int(m.group(1))
    return first


def glance(
    fd: int,
    jsonl_path: str,
    keys: list[str],
    tail_rows: int = TAIL_ROWS,
    max_tail: int = MAX_TAIL,
    min_size: int = 0,
    loads: Callable[[bytes], Any] = json.loads,
) -> Glance | str:
    """The glance at the file open as ``fd``, or why there is none. ``keys``: the
    column paths (or their prefixes, ending in ``.``) whose stats the digest carries.
    ``loads``: what parses the digests, ``json.loads`` or one that reads the same
    values faster (ValueError on what is not JSON; a glance in the monitor's own
    process: transport/glancing.py)."""
    st = os.fstat(fd)
    size = st.st_size
    if size < min_size:
        return f"{size} bytes: read whole"
    try:
        companion, cst = open_regular(companion_path(jsonl_path))
    except OSError:
        return "no companion file"
    if not 0 < cst.st_size <= MAX_COMPANION:
        os.close(companion)
        return "no companion file"
    try:
        return _glance(fd, st, companion, cst.st_size, keys, tail_rows, max_tail, loads)
    finally:
        os.close(companion)


def _glance(
    fd: int,
    st: os.stat_result,
    companion: int,
    length: int,
    keys: list[str],
    tail_rows: int,
    max_tail: int,
    loads: Callable[[bytes], Any] = json.loads,
) -> Glance | str:
    """:func:`glance` with the companion open (``length`` bytes)."""
    size = st.st_size
    ident = (st.st_dev, st.st_ino)
    cols: list[_Col] = []
    marks: list[tuple[int, int, str]] = []
    marked: set[str] = set()
    heads = list(scan_heads(companion, length, HEAD_PREFIX, (SAMPLE_MAGIC,)))
    digests: dict[tuple[bytes, bytes], tuple[_Digest, int, int]] = {}  # by each span's digits
    digits = (b"%d" % st.st_dev, b"%d" % st.st_ino)
    for magic, head, at, hlen, _ in heads:
        if magic == DIGEST_MAGIC:
            d = _digest_of(whole_header(companion, at, head, hlen), ident, loads)
            named = {(b"%d" % a, b"%d" % b): (d, a, b) for a, b in d.spans} if d else {}
            if named and not any(k in digests for k in named):
                digests.update(named)
    for magic, head, at, hlen, blen in heads:
        if magic == DIGEST_MAGIC:
            continue  # (samples are not listed: the tail's are read, the earlier not needed)
        whole = head if len(head) == hlen else None
        if magic == MAGIC and digests:
            col = _Col.covered(head, hlen, blen, at, digits, digests)
            if col is None and whole is None:  # its span not in the first bytes read
                whole = whole_header(companion, at, head, hlen)
                col = _Col.covered(whole, hlen, blen, at, digits, digests) if whole else None
            if col is not None:
                if col.end <= size:
                    cols.append(col)
                continue
        if whole is None:
            whole = whole_header(companion, at, head, hlen)
        try:
            header = parse_json(whole) if whole is not None else None
        except ValueError:
            continue
        if not isinstance(header, dict):
            continue
        if header.get("dev") != st.st_dev or header.get("ino") != st.st_ino:
            continue  # another file's (the run's file was replaced)
        if magic == MARK_MAGIC:
            w = header.get("w")
            found = marks_of(header)
            if not isinstance(w, str) or found is None:
                continue
            if header.get("lost"):
                return f"writer {w} lost track of where its lines went"
            marked.add(w)
            marks += found
            continue
        col = _Col.of(header, blen, at, companion, keys)
        if col is not None and col.end <= size:
            cols.append(col)
    if not cols:
        return "no column block of this file"
    cols.sort(key=lambda c: c.start)
    kept: list[_Col] = []
    for c in cols:  # not overlapping one kept (two writers' blocks)
        if not kept or c.start >= kept[-1].end:
            kept.append(c)
    tail_from, need = kept[-1].end, tail_rows  # the rows after the last block: all in it
    for c in reversed(kept):
        if need <= 0:
            break
        n = c.n
        tail_from = c.start
        if n > need:  # from the row that leaves ``tail_rows`` rows in the tail
            with contextlib.suppress(OSError, ValueError, KeyError, zlib.error):
                tail_from = c.offsets(companion)[n - need]
        need -= n
    if size - tail_from > max_tail:  # fewer steps at full resolution: bounded bytes
        tail_from = size - max_tail
    if tail_from > 0 and os.pread(fd, 1, tail_from - 1) != b"\n":
        tail_from = _line_start(fd, tail_from, size)  # the companion said no line's start
    digest_cols = _digested([c for c in kept if c.end <= tail_from], companion, keys)
    tail = os.pread(fd, size - tail_from, tail_from)
    if len(tail) != size - tail_from:
        return "the file shrank while it was read"
    if ALL_WRITERS not in marked:
        for w, seq in _tail_writers(tail).items():
            if w not in marked and seq != 0:
                return f"writer {w} has lines before the tail but no marks"
    before = sorted({m for m in marks if m[0] + m[1] <= tail_from})
    logs = [m for m in before if m[2] == "log"]
    if len(logs) > LOGS_KEPT:
        dropped = set(logs[:-LOGS_KEPT])
        before = [m for m in before if m not in dropped]
    if len(before) > MAX_MARKS:
        return f"{len(before)} events before the tail"
    lines: Marks = []
    for off, n, kind in before:
        line = _line_ok(fd, off, n, kind)
        if line is not None:
            lines.append((off, line))
    return Glance(
        size,
        f"{st.st_dev}:{st.st_ino}",
        tail_from,
        tail,
        lines,
        _digest(digest_cols),
    )


def _digest_of(
    head: bytes | None, ident: tuple[int, int], loads: Callable[[bytes], Any]
) -> _Digest | None:
    if head is None:
        return None
    try:
        header = loads(head)
    except (ValueError, RecursionError):
        return None
    if not isinstance(header, dict) or (header.get("dev"), header.get("ino")) != ident:
        return None
    return _Digest.of(header)


def _digested(cols: list[_Col], companion: int, keys: list[str]) -> list[_Col]:
    """The blocks before the tail, each run of blocks a digest stands for as one (where
    they are all there, one after the other, with its rows); a covered block whose
    digest cannot stand for it, parsed."""
    out: list[_Col] = []
    i = 0
    while i < len(cols):
        c = cols[i]
        d = c.digest
        if d is None:
            out.append(c)
            i += 1
            continue
        run = cols[i : i + len(d.spans)]
        spans = [(x.start, x.end) for x in run]
        if spans == d.spans and all(x.digest is d for x in run) and sum(x.n for x in run) == d.n:
            out.append(d.col(keys))
            i += len(run)
            continue
        parsed = c.parsed(companion, keys)
        if parsed is not None:
            out.append(parsed)
        i += 1
    return out


def _line_start(fd: int, at: int, size: int) -> int:
    """The first line start at or after ``at`` (``size`` when none)."""
    if at <= 0:
        return 0
    pos = at - 1
    while pos < size:
        chunk = os.pread(fd, min(1 << 16, size - pos), pos)
        if not chunk:
            break
        nl = chunk.find(b"\n")
        if nl >= 0:
            return pos + nl + 1
        pos += len(chunk)
    return size


def _digest(cols: list[_Col]) -> Digest:
    blocks: list[list[Any]] = []
    used: list[_Col] = []
    for c in cols:
        step = c.stats["step"] or c.stats["global_step"]
        ts = c.stats["ts"]
        if step is None or ts is None:
            continue
        blocks.append([step[0], step[5], c.n, ts[0], ts[5], c.start, c.end])
        used.append(c)
    paths = sorted({p for c in used for p in c.paths})
    stats = {p: [c.stats.get(p) for c in used] for p in paths}
    return {"blocks": blocks, "stats": stats}


# ---- the operation ----------------------------------------------------------------------


def op_glance(req: dict[str, Any]) -> int:
    run_dir = resolve_run_dir(req.get("run_dir"))
    emit(EV_RESOLVED, run_dir=str(run_dir))
    check_run_dir(run_dir)
    name = str(req.get("file") or "metrics.jsonl")
    path = run_dir / name
    try:
        fd, _ = open_regular(path)
    except FileNotFoundError:
        raise AgentError(
            ERR_MISSING, f"{run_dir}: no {name} here (is telemetry attached to the trainer?)"
        ) from None
    except OSError as e:
        raise AgentError(ERR_MISSING, f"{path}: {e.strerror}") from None
    try:
        keys = [str(k) for k in req.get("keys") or [] if isinstance(k, str)]
        g = glance(
            fd,
            str(path),
            keys,
            _int(req.get("tail_rows"), TAIL_ROWS),
            _int(req.get("max_tail"), MAX_TAIL),
            _int(req.get("min_size"), 0),
        )
    finally:
        os.close(fd)
    if isinstance(g, str):
        emit(EV_GLANCE, ok=False, why=g)
        emit(EV_EOF)
        return 0
    emit(EV_GLANCE, ok=True, size=g.size, tail_from=g.tail_from, identity=g.identity)
    digest = dict(g.digest)
    digest["marks"] = [[off, len(line)] for off, line in g.marks]
    raw = json.dumps(digest, separators=(",", ":")).encode()
    emit_zdata(-2, len(raw), zlib.compress(raw, LEVEL))
    raw = b"".join(line for _, line in g.marks)
    emit_zdata(-1, len(raw), zlib.compress(raw, LEVEL))
    for at in range(0, len(g.tail), FRAME):
        part = g.tail[at : at + FRAME]
        emit_zdata(g.tail_from + at, len(part), zlib.compress(part, LEVEL))
    emit(EV_EOF, size=g.size)
    return 0


def _int(v: Any, default: int) -> int:
    return v if type(v) is int and v >= 0 else default
