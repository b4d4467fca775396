"""A columns payload's columns inflated (a ``C`` frame, agent/column_plan.py): the
values of each, as :mod:`eagle3_tui.model.segments` applies them.

Light on purpose (numpy and the standard library): a forked read's child
(transport/forked.py) inflates payloads ahead of its parent without the model.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

import functools
import json
import struct
import zlib
from typing import Any

import numpy as np
import numpy.typing as npt

from eagle3_tui.telemetry.columns import stepped

HEADER_LEN = struct.Struct("<I")
_WIDTH = {"q": 8, "d": 8, "f": 4}
_DTYPE = {"q": "<i8", "a": "<i8", "d": "<f8", "f": "<f4"}
DTYPES = {k: np.dtype(v) for k, v in _DTYPE.items()}
"""The values of each type of column, inflated."""
FEW_BYTES = 64
"""A column packed into this few bytes is a constant or nearly (``v``, ``rank``, an
epoch's ``epoch``, a sampler's writer and kinds): the same bytes block after block."""


class BadColumnsError(ValueError):
    """A payload that cannot be what the agent sends."""


Inflated = dict[tuple[int, str, int, int], npt.NDArray[Any]]
"""A payload's columns inflated ahead (:func:`inflate_ahead`), by place, type, size
and length in the payload."""


def inflate_ahead(payload: bytes) -> Inflated | None:
    """Each column of a columns payload that is not a few bytes, inflated: what
    ``segments.apply_segment`` would inflate, done beforehand (a forked read's child
    does it while its parent applies the frames before). None where the payload does
    not read as one: its applying says why."""
    try:
        (hlen,) = HEADER_LEN.unpack_from(payload, 0)
        header = json.loads(payload[4 : 4 + hlen])
        out: Inflated = {}
        at = 4 + hlen
        metas = [header, *([header["stubs"]] if "stubs" in header else ())]
        for meta in [*metas, *header.get("listings", ())]:
            for _name, pieces in column_pieces(meta):
                for kind, n, size in pieces:
                    packed = payload[at : at + size]
                    if len(packed) > FEW_BYTES:
                        out[at, kind, size, n] = inflate(kind, packed, n)
                    at += size
        return out
    except Exception:  # anything: the applying decides, and says why
        return None


def column_pieces(meta: dict[str, Any]) -> list[tuple[str, list[tuple[str, int, int]]]]:
    """Each column a payload's header (or its stubs' or a listing's) names, as its
    path and pieces: each piece's type, rows and packed size, in order. One piece but
    where the frame holds several blocks (``"pieces"``: each block's rows and its
    columns' types and sizes, agent/column_plan.py's ``group_payload``; the columns'
    own types are then null). BadColumnsError where they do not add up."""
    n, cols, pieces = meta["n"], meta["cols"], meta.get("pieces")
    if type(n) is not int or n <= 0:
        raise BadColumnsError(f"{n!r} rows")
    if pieces is None:
        return [(path, [(kind, n, size)]) for path, kind, size in cols]
    if not (
        isinstance(pieces, list)
        and pieces
        and all(
            isinstance(p, list)
            and len(p) == 2
            and type(p[0]) is int
            and p[0] > 0
            and isinstance(p[1], list)
            and len(p[1]) == len(cols)
            and all(_piece(c) for c in p[1])
            for p in pieces
        )
        and sum(p[0] for p in pieces) == n
    ):
        raise BadColumnsError("pieces that do not add up to the rows")
    out: list[tuple[str, list[tuple[str, int, int]]]] = []
    for c, (path, _, size) in enumerate(cols):
        got = [(p[1][c][0], p[0], p[1][c][1]) for p in pieces]
        if sum(g[2] for g in got) != size:
            raise BadColumnsError(f"pieces of {path!r} that do not add up to it")
        out.append((path, got))
    return out


def inflate_joined(kind: str, packed: list[bytes], rows: list[int]) -> npt.NDArray[Any]:
    """The values of a column's pieces (``q``, ``d`` or ``f``, each ``rows[i]`` values)
    one after the other: :func:`inflate` of each, concatenated, with one unshuffling
    and one sum for them all (a frame of several blocks)."""
    width = _WIDTH[kind]
    planes = []
    for p, n in zip(packed, rows, strict=True):
        raw = zlib.decompress(p, bufsize=n * width + 1)
        if len(raw) != n * width:
            raise BadColumnsError(f"a column of {len(raw)} bytes, not {n} values")
        planes.append(np.frombuffer(raw, dtype=np.uint8).reshape(width, n))
    joined = np.concatenate(planes, axis=1)  # each byte plane of every piece, then unshuffled
    values = np.ascontiguousarray(joined.T).view(_DTYPE[kind]).reshape(-1)
    if kind != "q":
        return values
    # each piece's first difference is from 0: the sums less the sum before the piece
    # (wrapped as each piece's own sum wraps: the same values, bit for bit)
    sums = np.cumsum(values)
    ends = np.cumsum(rows)[:-1]
    before = np.concatenate((np.zeros(1, dtype=np.int64), sums[ends - 1]))
    out: npt.NDArray[np.int64] = sums - np.repeat(before, rows)
    return out


def _piece(c: Any) -> bool:
    """A piece of a column: [type, size]."""
    return (
        isinstance(c, list) and len(c) == 2 and c[0] in DTYPES and type(c[1]) is int and c[1] >= 0
    )


def column(kind: str, packed: bytes, n: int) -> npt.NDArray[Any]:
    """A column's ``n`` values (BadColumnsError, or zlib.error: not that)."""
    if len(packed) <= FEW_BYTES:  # inflated once (zlib makes a long run at ~460 MB/s)
        return _repeated(kind, bytes(packed), n).copy()
    return inflate(kind, packed, n)


@functools.lru_cache(maxsize=256)
def _repeated(kind: str, packed: bytes, n: int) -> npt.NDArray[Any]:
    return inflate(kind, packed, n)


def inflate(kind: str, packed: bytes, n: int) -> npt.NDArray[Any]:
    if kind == "a":  # values that step evenly: the first and the step
        try:
            first, step = stepped(packed, n)
        except ValueError as e:
            raise BadColumnsError(str(e)) from None
        values: npt.NDArray[np.int64] = np.arange(n, dtype=np.int64) * step + first
        return values
    width = _WIDTH[kind]
    raw = zlib.decompress(packed, bufsize=n * width + 1)
    if len(raw) != n * width:
        raise BadColumnsError(f"a column of {len(raw)} bytes, not {n} values")
    planes = np.frombuffer(raw, dtype=np.uint8).reshape(width, n)
    values = np.ascontiguousarray(planes.T).view(_DTYPE[kind]).reshape(n)
    return np.cumsum(values) if kind == "q" else values
