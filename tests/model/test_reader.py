"""LineReader: any split of a byte stream yields the records of reading it whole."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from eagle3_tui.model.reader import Item, LineReader, Restarted
from eagle3_tui.model.records import Deferred, Malformed, Record, TrainStep, train_items
from tests.records import Lines


def stream() -> bytes:
    lines = Lines()
    parts = [lines.train(s, 2.0 / (s + 1)) for s in range(20)]
    parts.insert(5, b"{not json}\n")
    parts.insert(9, b'{"kind":"train","train":{"loss":NaN},"step":99}\n')
    parts.insert(12, '{"kind":"log","msg":"ünïcode"}\n'.encode())
    return b"".join(parts)


def whole(data: bytes) -> list[Item]:
    return LineReader().feed(0, data)


def key(item: object) -> object:
    if isinstance(item, Deferred):  # kept undecoded, in whichever buffer it came
        return key(item.resolve())
    if isinstance(item, (Record, TrainStep)):  # whichever decoder made it
        loss = train_items(item.train).get("loss") if item.train is not None else None
        return (
            "r",
            item.kind,
            item.seq,
            item.step,
            "nan" if loss is not None and math.isnan(loss) else loss,
        )
    return item


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=4000), max_size=30))
def test_any_split_yields_the_same_items(cuts: list[int]) -> None:
    data = stream()
    points = sorted({c % (len(data) + 1) for c in cuts})
    reader = LineReader()
    got: list[Item] = []
    prev = 0
    for p in [*points, len(data)]:
        got += reader.feed(prev, data[prev:p])
        prev = p
    assert [key(i) for i in got] == [key(i) for i in whole(data)]
    assert reader.pending() == 0


def test_a_torn_last_line_waits_for_its_newline() -> None:
    line = Lines().train(0, 1.5)
    reader = LineReader()
    assert reader.feed(0, line[:-10]) == []
    assert reader.pending() == len(line) - 10
    (rec,) = reader.feed(len(line) - 10, line[-10:])
    assert isinstance(rec, Record) and rec.train is not None
    assert train_items(rec.train)["loss"] == 1.5


def test_malformed_lines_are_kept_with_line_number_and_reason() -> None:
    items = whole(stream())
    bad = [i for i in items if isinstance(i, Malformed)]
    assert len(bad) == 1 and bad[0].line_no == 6 and "JSON" in bad[0].reason
    nan = [i for i in items if isinstance(i, Record) and i.step == 99]
    assert nan and nan[0].train is not None
    loss = train_items(nan[0].train)["loss"]
    assert loss is not None and math.isnan(loss)


def test_a_restart_at_zero_is_reported() -> None:
    reader = LineReader()
    data = stream()
    reader.feed(0, data)
    items = reader.feed(0, data[:200])
    assert isinstance(items[0], Restarted) and items[0].reason == "truncated or replaced"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000), st.integers(min_value=1, max_value=64))
def test_arbitrary_bytes_never_raise(data: bytes, step: int) -> None:
    reader = LineReader()
    for i in range(0, len(data), step):
        reader.feed(i, data[i : i + step])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 22), min_size=1, max_size=12, unique=True))
def test_lines_at_their_places_decode_as_each_does_alone(picked: list[int]) -> None:
    """A glance's events: lines from here and there, decoded in one call where all of
    them decode, one by one (offsets and all) where one does not."""
    data = stream()
    starts = [0, *(i + 1 for i, b in enumerate(data) if b == 10)][:-1]
    pieces = []
    for i in sorted(picked):
        end = data.index(b"\n", starts[i]) + 1
        pieces.append((starts[i], data[starts[i] : end]))
    one_by_one = [x for off, line in pieces for x in LineReader().decode_lines(off, line, 0)]
    together = LineReader().decode_pieces(pieces)
    assert [key(x) for x in together] == [key(x) for x in one_by_one]
    assert len(together) == len(pieces)
