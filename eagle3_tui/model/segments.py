"""A columns payload (a ``C`` frame, agent/column_plan.py) back into the records it stands for.

The agent sends a range of ``metrics.jsonl`` as the training steps' columns (from
the companion the writer keeps, telemetry/columns.py) and the range's other lines
as text. Here the steps become :class:`~eagle3_tui.model.records.Record` values
again and the other lines are decoded as :class:`~eagle3_tui.model.reader.LineReader`
decodes any line; both are put back in file order, so the state applies them
exactly as it applies the lines themselves. The one difference: the steps'
``train``, ``profile`` and ``lr`` values are float32, which is all the step table
keeps; the newest values, kept at full precision, come from the JSON lines after
the last block (the agent never sends the last block as columns).

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

import functools
import json
import zlib
from typing import Any

import numpy as np
import numpy.typing as npt

from eagle3_tui.model.inflate import (
    FEW_BYTES,
    HEADER_LEN,
    BadColumnsError,
    Inflated,
    column,
    column_pieces,
    inflate_joined,
)
from eagle3_tui.model.reader import Item, LineReader
from eagle3_tui.model.records import (
    Malformed,
    Profile,
    Record,
    TrainMetrics,
    train_metrics_type,
)
from eagle3_tui.model.samples import SAMPLES_KEPT
from eagle3_tui.model.state import RunState
from eagle3_tui.model.step_ingest import Envelopes, StepColumns


@functools.cache
def _metrics_type(keys: tuple[str, ...]) -> type[TrainMetrics]:
    return train_metrics_type(keys)


def _column_at(
    kind: str, payload: bytes, at: int, size: int, n: int, ahead: Inflated | None
) -> npt.NDArray[Any]:
    if ahead is not None:
        got = ahead.pop((at, kind, size, n), None)
        if got is not None:
            return got
    return column(kind, payload[at : at + size], n)


def _pieces_at(
    pieces: list[tuple[str, int, int]], payload: bytes, at: int, ahead: Inflated | None
) -> tuple[npt.NDArray[Any], int]:
    """A column's values from its pieces at ``at`` in the payload, and where the next
    column starts: inflated together where they are alike and none was inflated ahead
    (``inflate_joined``: one unshuffling and one sum), else one by one."""
    kind = pieces[0][0]
    if (
        len(pieces) > 1
        and not ahead
        and kind in ("q", "d", "f")
        and all(k == kind and size > FEW_BYTES for k, _, size in pieces)
    ):
        packed, rows = [], []
        for _, n, size in pieces:
            packed.append(payload[at : at + size])
            rows.append(n)
            at += size
        return inflate_joined(kind, packed, rows), at
    got = []
    for k, n, size in pieces:
        got.append(_column_at(k, payload, at, size, n, ahead))
        at += size
    return (got[0] if len(got) == 1 else np.concatenate(got)), at


def apply_segment(
    reader: LineReader,
    state: RunState,
    offset: int,
    span: int,
    payload: bytes,
    ahead: Inflated | None = None,
) -> int:
    """Apply the ``span`` bytes at ``offset`` that ``payload`` stands for to ``state``;
    the reader's position moves past them. Returns the items applied. A payload that
    cannot be read is one malformed line naming the range (its lines are not in the
    state: never half of them)."""
    restart, seg = _read(reader, offset, span, payload, ahead)
    state.apply_all(restart)
    if isinstance(seg, Malformed):
        state.apply(seg)
        return len(restart) + 1
    rows = seg.step_columns()
    env = seg.envelopes
    if rows is None or not state.apply_steps(
        rows, seg.others, seg.before, env if env.n else None, seg.places
    ):
        state.apply_all(seg.items())  # as records, line by line, in file order
    return len(restart) + seg.n + len(seg.others) + env.n


def segment_items(
    reader: LineReader, offset: int, span: int, payload: bytes, ahead: Inflated | None = None
) -> list[Item]:
    """What :func:`apply_segment` applies, as items in file order (the steps as
    records): for a reader of records rather than of state."""
    restart, seg = _read(reader, offset, span, payload, ahead)
    return [*restart, seg] if isinstance(seg, Malformed) else restart + seg.items()


def _read(
    reader: LineReader, offset: int, span: int, payload: bytes, ahead: Inflated | None
) -> tuple[list[Item], _Segment | Malformed]:
    """A restart, if the stream jumped; then the payload decoded, or the one malformed
    line that stands for it. Either way the reader moves past the range."""
    restart: list[Item] = reader.feed(offset, b"")
    line_no = reader.line_no
    try:
        seg = _decode(reader, offset, span, payload, line_no, ahead)
    except (BadColumnsError, ValueError, KeyError, TypeError, zlib.error) as e:
        reader.skip(offset, span, 1)
        reason = f"bytes {offset}..{offset + span}: unreadable columns frame ({e})"
        return restart, Malformed(line_no + 1, offset, reason[:200], "")
    reader.skip(offset, span, seg.lines)
    seg.teach(reader)
    return restart, seg


class _Segment:
    """A decoded payload: the steps' columns and the other lines' items."""

    def __init__(
        self,
        header: dict[str, Any],
        cols: dict[str, npt.NDArray[Any]],
        others: list[Item],
        before: list[int],
        places: list[int],
        envelopes: Envelopes,
        lines: int,
    ) -> None:
        self.header = header
        self.cols = cols
        self.n: int = header["n"]
        self.others = others
        self.before = before
        """How many steps come before each of ``others``."""
        self.places = places
        """Where each of ``others`` is in the file (its run's start: in file order with
        the envelopes)."""
        self.envelopes = envelopes
        self.lines = lines

    def teach(self, reader: LineReader) -> None:
        """The reader's decoders learn from these steps as from their lines."""
        order: list[str] = self.header["order"]
        keys = tuple(p[6:] for p in order if p.startswith("train."))
        lr_keys = tuple(p[3:] for p in order if p.startswith("lr."))
        reader.decoders.saw(keys, lr_keys)

    def step_columns(self) -> StepColumns | None:
        """The steps as :class:`StepColumns`, where they have what the batch path needs:
        a sequence number, a step, an epoch and one float ``lr``."""
        h, cols = self.header, self.cols
        order: list[str] = h["order"]
        step = cols.get("step", cols.get("global_step"))
        if step is None or "seq" not in cols or "epoch" not in cols:
            return None
        if "lr" not in order or "lr" in h.get("groups", ()):  # one float ``lr`` a step
            return None
        if "v" not in cols or "ts" not in cols or h["const"]["kind"] != "train":
            return None
        keys = tuple(p[6:] for p in order if p.startswith("train."))
        # a column the request left out of an old block (agent/names.py's SUMMARY_HISTORY)
        # is not there: that metric's old rows are not read
        columns: dict[str, npt.NDArray[Any]] = {
            "train/" + k: cols["train." + k] for k in keys if "train." + k in cols
        }
        columns.update(
            ("profile/" + p[8:], cols[p]) for p in order if p.startswith("profile.") and p in cols
        )
        columns["lr"] = cols["lr"] if "lr" in cols else np.full(self.n, np.nan, dtype=np.float32)
        columns["epoch"] = cols["epoch"].astype(np.float64)
        return StepColumns(
            str(h["const"]["w"]),
            cols["seq"],
            step,
            cols["ts"],
            cols["epoch"],
            cols["v"],
            keys,
            columns,
        )

    def items(self) -> list[Item]:
        """Steps, other lines and envelopes as records, in file order."""
        rows = _records(self.header, self.cols, self.n)
        env = self.envelopes
        if env.n:  # the envelopes among the other lines, by their places in the file
            places = np.concatenate((np.asarray(self.places, dtype=np.int64), env.at))
            order = np.argsort(places, kind="stable").tolist()
            others = [*self.others, *env.items()]
            before = [*self.before, *env.before.tolist()]
            pairs = [(others[i], before[i]) for i in order]
        else:
            pairs = list(zip(self.others, self.before, strict=True))
        out: list[Item] = []
        r = 0
        for item, b in pairs:
            if b > r:
                out.extend(rows[r:b])
                r = b
            out.append(item)
        out.extend(rows[r:])
        return out


def _decode(
    reader: LineReader,
    offset: int,
    span: int,
    payload: bytes,
    line_no: int,
    ahead: Inflated | None = None,
) -> _Segment:
    (hlen,) = HEADER_LEN.unpack_from(payload, 0)
    header = json.loads(payload[4 : 4 + hlen])
    at = 4 + hlen
    cols: dict[str, npt.NDArray[Any]] = {}
    for path, pieces in column_pieces(header):  # one a block (agent/column_plan.py)
        cols[path], at = _pieces_at(pieces, payload, at, ahead)
    n: int = header["n"]
    offsets, lengths = cols["@off"], cols["@len"]
    parts: list[_Listed] = []
    if "stubs" in header:
        stubs, at = _listed(header["stubs"], payload, at, ahead)
        stubs.offsets += offset
        parts.append(stubs)
    listings = _listings(reader, offset)
    for meta in header.get("listings", ()):
        listed, at = _listed(meta, payload, at, ahead)
        listings[int(meta["id"])] = listed
    for ident, i, j in header.get("listed", ()):
        found = listings.get(ident)
        if found is None or not 0 <= i < j <= len(found.offsets):
            raise BadColumnsError(f"samples {ident}[{i}:{j}] not sent")
        parts.append(found.part(i, j))
    env, env_lengths = _envelopes(parts, offsets, offset, span)
    env_size = int(env_lengths.sum())
    runs_size, text_size, text_len = header["gaps"]
    runs = _runs(payload[at : at + runs_size])
    at += runs_size
    text = zlib.decompress(payload[at : at + text_size]) if text_size else b""
    if len(text) != text_len or at + text_size != len(payload):
        raise BadColumnsError("the other lines do not add up")
    covered = int(lengths.sum()) + len(text) + env_size
    if covered != span or int(offsets[0]) < offset:
        raise BadColumnsError("rows and lines do not cover the range")
    if env.n:  # and fill it: every byte once, rows, envelopes and runs of lines alike
        starts = np.concatenate((offsets, env.at, offset + np.asarray([r for r, _ in runs])))
        ends = starts + np.concatenate((lengths, env_lengths, [n for _, n in runs]))
        order = np.argsort(starts, kind="stable")
        if not (
            int(starts[order[0]]) == offset
            and bool((starts[order[1:]] == ends[order[:-1]]).all())
            and int(ends[order[-1]]) == offset + span
        ):
            raise BadColumnsError("rows and lines that do not tile the range")
    # the other lines (runs of text), in file order, numbered as the file numbers them
    # (the envelopes among them counted by where they are)
    others: list[Item] = []
    before: list[int] = []
    places: list[int] = []
    lines = 0
    pos = 0
    for rel, size in runs:
        start = offset + rel
        r = int(np.searchsorted(offsets, start))  # the steps before this run
        chunk = text[pos : pos + size]
        pos += size
        if not chunk.endswith(b"\n"):
            raise BadColumnsError("a run of lines without its newline")
        env_before = int(np.searchsorted(env.at, start))
        decoded = reader.decode_lines(start, chunk, line_no + r + lines + env_before)
        others.extend(decoded)
        before.extend([r] * len(decoded))
        places.extend([start] * len(decoded))
        lines += chunk.count(b"\n")
    return _Segment(header, cols, others, before, places, env, n + lines + env.n)


class _Listed:
    """Samples listed by their envelopes (a frame's ``stubs``, or a sample block the
    agent sent once, agent/column_plan.py), as arrays."""

    __slots__ = ("end", "kind", "kinds", "lengths", "offsets", "seq", "ts", "w", "writers")

    def __init__(self, meta: dict[str, Any], cols: dict[str, npt.NDArray[Any]]) -> None:
        self.kinds = tuple(str(k) for k in meta["kinds"])
        self.writers = tuple(str(w) for w in meta["writers"])
        if not set(self.kinds) <= set(SAMPLES_KEPT):
            raise BadColumnsError(f"envelopes of {self.kinds}")
        self.offsets: npt.NDArray[np.int64] = cols["@off"]
        self.lengths: npt.NDArray[np.int64] = cols["@len"]
        self.kind: npt.NDArray[np.int64] = cols["kind"]
        self.w: npt.NDArray[np.int64] = cols["w"]
        self.seq: npt.NDArray[np.int64] = cols["seq"]
        self.ts: npt.NDArray[np.float64] = cols["ts"]
        n = len(self.offsets)
        bad = (self.kind < 0) | (self.kind >= len(self.kinds)) | (self.w < 0)
        if bool((bad | (self.w >= len(self.writers)) | (self.lengths <= 0)).any()):
            raise BadColumnsError("envelopes that name no kind or writer sent")
        if n > 1 and not bool((self.offsets[1:] >= self.offsets[:-1] + self.lengths[:-1]).all()):
            raise BadColumnsError("envelopes out of order")
        self.end = int(self.offsets[-1] + self.lengths[-1])

    def part(self, i: int, j: int) -> _Listed:
        part = object.__new__(_Listed)
        part.kinds, part.writers, part.end = self.kinds, self.writers, self.end
        for name in ("offsets", "lengths", "kind", "w", "seq", "ts"):
            setattr(part, name, getattr(self, name)[i:j])
        return part


def _listed(
    meta: dict[str, Any], payload: bytes, at: int, ahead: Inflated | None
) -> tuple[_Listed, int]:
    n = meta["n"]
    if not isinstance(n, int) or n <= 0:
        raise BadColumnsError(f"{n!r} envelopes")
    cols: dict[str, npt.NDArray[Any]] = {}
    for name, kind, size in meta["cols"]:
        cols[name] = _column_at(kind, payload, at, size, n, ahead)
        at += size
    return _Listed(meta, cols), at


def _listings(reader: LineReader, offset: int) -> dict[int, _Listed]:
    """The sample blocks the agent sent on this stream, less those wholly before
    ``offset`` (the agent forgets them at the same frame)."""
    kept = {k: v for k, v in reader.listings.items() if v.end > offset}
    reader.listings = kept
    return kept


def _envelopes(
    parts: list[_Listed], offsets: npt.NDArray[np.int64], offset: int, span: int
) -> tuple[Envelopes, npt.NDArray[np.int64]]:
    """The listed samples of a range as one :class:`Envelopes` in file order, and each
    one's length."""
    if not parts:
        return _NO_ENVELOPES, np.zeros(0, dtype=np.int64)
    kinds = tuple(dict.fromkeys(k for p in parts for k in p.kinds))
    writers = tuple(dict.fromkeys(w for p in parts for w in p.writers))
    kind_ix = [np.asarray([kinds.index(k) for k in p.kinds], dtype=np.int64) for p in parts]
    w_ix = [np.asarray([writers.index(w) for w in p.writers], dtype=np.int64) for p in parts]
    at = np.concatenate([p.offsets for p in parts])
    # in file order already (the parts' ranges in order, as the agent sends them): kept
    ordered = len(at) < 2 or bool((at[1:] >= at[:-1]).all())
    order = None if ordered else np.argsort(at, kind="stable")

    def in_order(values: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return values if order is None else values[order]

    at = in_order(at)
    lengths = in_order(np.concatenate([p.lengths for p in parts]))
    if len(at) and (int(at[0]) < offset or int(at[-1] + lengths[-1]) > offset + span):
        raise BadColumnsError("envelopes outside the range")
    if len(at) > 1 and not bool((at[1:] >= at[:-1] + lengths[:-1]).all()):
        raise BadColumnsError("envelopes that overlap")
    env = Envelopes(
        at,
        np.searchsorted(offsets, at),
        in_order(np.concatenate([ix[p.kind] for ix, p in zip(kind_ix, parts, strict=True)])),
        kinds,
        in_order(np.concatenate([ix[p.w] for ix, p in zip(w_ix, parts, strict=True)])),
        writers,
        in_order(np.concatenate([p.seq for p in parts])),
        in_order(np.concatenate([p.ts for p in parts])),
    )
    return env, lengths


_NO_ENVELOPES = Envelopes(
    *(np.zeros(0, dtype=np.int64),) * 3, (), np.zeros(0, dtype=np.int64), (),
    np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64),
)  # fmt: skip


def _runs(packed: bytes) -> list[tuple[int, int]]:
    if not packed:
        return []
    raw = zlib.decompress(packed)
    if len(raw) % 16:
        raise BadColumnsError("runs of odd length")
    flat = column("q", packed, len(raw) // 8).tolist()
    return list(zip(flat[0::2], flat[1::2], strict=True))


def _records(header: dict[str, Any], cols: dict[str, npt.NDArray[Any]], n: int) -> list[Record]:
    """The rows as the records the decoder makes of their lines (values at float32)."""
    const = header["const"]
    w, kind = str(const["w"]), str(const["kind"])
    groups = set(header.get("groups", ()))
    order: list[str] = header["order"]
    fields: dict[str, list[Any]] = {}
    for key in ("v", "seq", "rank", "epoch", "step", "global_step", "ts"):
        if key in cols:
            fields[key] = cols[key].tolist()
    if "lr" in cols:
        fields["lr"] = cols["lr"].astype(np.float64).tolist()
    train_keys = tuple(p[6:] for p in order if p.startswith("train.") and p in cols)
    metrics = _metrics_type(train_keys)
    train_cols = [cols["train." + k].astype(np.float64).tolist() for k in train_keys]
    fields["train"] = list(map(metrics, *train_cols))
    if "profile" in groups:
        names = [p[8:] for p in order if p.startswith("profile.") and p in cols]
        if names:
            pcols = [cols["profile." + k].astype(np.float64).tolist() for k in names]
            fields["profile"] = [
                Profile(**dict(zip(names, vals, strict=True))) for vals in zip(*pcols, strict=True)
            ]
        else:
            fields["profile"] = [Profile()] * n
    if "lr" in groups:
        names = [p[3:] for p in order if p.startswith("lr.") and p in cols]
        lcols = [cols["lr." + k].astype(np.float64).tolist() for k in names]
        fields["lr"] = [dict(zip(names, vals, strict=True)) for vals in zip(*lcols, strict=True)]
    keys = list(fields)
    return [
        Record(kind=kind, w=w, **dict(zip(keys, vals, strict=True)))
        for vals in zip(*(fields[k] for k in keys), strict=True)
    ]
