"""A column in pieces (a C frame of several blocks) inflated at once is the pieces
inflated one by one and put end to end, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eagle3_tui.model.inflate import BadColumnsError, inflate, inflate_joined
from eagle3_tui.telemetry.columns import pack_column

INT = st.integers(-(2**61), 2**61)  # differences within 64 bits; running sums wrap
FLOAT = st.floats(allow_nan=True, allow_infinity=True)
FLOAT32 = st.floats(width=32, allow_nan=True, allow_infinity=True)


def pieces(kind: str) -> st.SearchStrategy[list[list[object]]]:
    values = {"q": INT, "d": FLOAT, "f": FLOAT32}[kind]
    return st.lists(st.lists(values, min_size=1, max_size=300), min_size=2, max_size=6)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from("qdf").flatmap(lambda k: st.tuples(st.just(k), pieces(k))))
def test_pieces_inflated_at_once_are_the_pieces_one_by_one(
    case: tuple[str, list[list[object]]],
) -> None:
    kind, parts = case
    packed = [pack_column(kind, p) for p in parts]
    rows = [len(p) for p in parts]
    one_by_one = np.concatenate([inflate(kind, b, n) for b, n in zip(packed, rows, strict=True)])
    joined = inflate_joined(kind, packed, rows)
    assert joined.dtype == one_by_one.dtype
    assert joined.tobytes() == one_by_one.tobytes()
    if kind == "q":  # each piece's own values, not a running sum across pieces
        assert joined.tolist() == [v for p in parts for v in p]


def test_a_piece_that_is_not_its_rows_is_refused() -> None:
    packed = [pack_column("q", [1, 2, 3]), pack_column("q", [4, 5])]
    with pytest.raises(BadColumnsError):
        inflate_joined("q", packed, [3, 3])
