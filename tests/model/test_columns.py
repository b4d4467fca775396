"""struct_columns: every float field of many decoded structs, in one pass, or None —
never a value read from the wrong place."""

from __future__ import annotations

import itertools
import math

import msgspec
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from eagle3_tui.model.records import (
    Decoders,
    Profile,
    TrainStep,
    _key_sizes,
    struct_columns,
    train_metrics_type,
)

KEYS = ("loss_0", "full_acc_0", "cond_acc_0", "loss")


def lean_type() -> type[TrainStep]:
    decoders = Decoders()
    decoders.learn(KEYS)
    assert decoders._lean is not None
    return type(decoders._lean.decode(b'{"kind":"train"}'))


floats = st.floats(allow_nan=True, allow_infinity=True, width=64)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(floats, floats, floats, floats, floats, floats), min_size=1, max_size=40))
def test_columns_equal_the_values_of_every_struct(rows: list[tuple[float, ...]]) -> None:
    structs = []
    decoders = Decoders()
    decoders.learn(KEYS)
    for seq, (a, b, c, d, ts, lr) in enumerate(rows):
        values = (v if math.isfinite(v) else str(v) for v in (a, b, c, d))  # "nan", "inf"
        line = msgspec.json.encode(
            {
                "kind": "train",
                "w": "w1",
                "seq": seq,
                "ts": ts if math.isfinite(ts) else 0.0,
                "step": seq,
                "epoch": 0,
                "lr": lr if math.isfinite(lr) else 1e-3,
                "train": dict(zip(KEYS, values, strict=True)),
                "profile": {"step_ms": a if math.isfinite(a) else 1.0},
            }
        )
        assert decoders._lean is not None
        structs.append(decoders._lean.decode(line))
    cols = struct_columns(structs)
    assert cols is not None
    for i, rec in enumerate(structs):
        assert cols["seq_f"][i] == rec.seq_f
        assert cols["ts"][i] == rec.ts
        assert cols["lr_f"][i] == rec.lr_f
        for j, value in enumerate(msgspec.structs.astuple(rec.train)):
            got = cols[f"train/m{j}"][i]
            assert got == value or (math.isnan(got) and math.isnan(value))
        assert cols["profile/step_ms"][i] == rec.profile.step_ms  # type: ignore[union-attr]
        assert math.isnan(cols["profile/fetch_frac"][i])


def test_a_none_or_a_longer_string_in_one_row_yields_none_not_shifted_values() -> None:
    decoders = Decoders()
    decoders.learn(KEYS)
    assert decoders._lean is not None
    decode = decoders._lean.decode
    base = b'"kind":"train","seq":1,"ts":5.0,"step":1,"epoch":0,"lr":0.1,"train":{"loss":2.0}'
    same = [decode(b'{"w":"ab",' + base + b"}") for _ in range(20)]
    assert struct_columns(same) is not None
    # one row's lr is null, another's writer name is longer, a third shorter:
    # sizes that may even add up to the same total
    odd = [
        decode(b'{"w":"ab",' + base.replace(b'"lr":0.1', b'"lr":null') + b"}"),
        decode(b'{"w":"abc",' + base + b"}"),
        decode(b'{"w":"a",' + base + b"}"),
    ]
    for bad in odd:
        assert struct_columns([*same[:10], bad, *same[10:]]) is None
    # a longer and a shorter name: the same total size, every value after them moved
    assert struct_columns([*same[:10], odd[1], odd[2], *same[10:]]) is None
    assert struct_columns([same[0], decode(b'{"w":"ab",' + base + b',"profile":{}}')]) is None
    assert struct_columns([]) is None
    assert struct_columns([same[0], Profile()]) is None  # two types


def test_structs_holding_ints_or_dicts_have_no_fixed_layout() -> None:
    class WithInt(msgspec.Struct):
        n: int = 0

    assert struct_columns([WithInt(1), WithInt(2)]) is None


def test_declared_float_fields_are_exactly_those_typed_float() -> None:
    """Values of fields declared always-float are not checked row by row; the
    declaration must match the types msgspec enforces when decoding."""
    for cls in (Profile, train_metrics_type(KEYS), TrainStep, lean_type()):
        declared = [sure for _, _, sure in _key_sizes(cls)[1]]
        typed = [f.type is float for f in msgspec.structs.fields(cls)]
        assert declared == typed, cls.__name__


def test_many_rows_and_a_wide_struct() -> None:
    wide = train_metrics_type(tuple(f"k{i}" for i in range(20)))  # a map16 header
    rows = [wide(*[float(i + j) for j in range(20)]) for i in range(70_000)]  # array32
    cols = struct_columns(rows)
    assert cols is not None
    assert np.array_equal(cols["m19"], np.arange(70_000) + 19.0)


def test_a_column_packed_small_is_inflated_once_and_each_caller_gets_its_own() -> None:
    """A near-constant column (``v``, ``rank``, a sampler's writer) is the same bytes in
    every block: inflated once (inflate.column), each caller gets its own array (one
    changed in place changes no other's), and a bad one still raises each time."""
    from eagle3_tui.model import inflate
    from eagle3_tui.telemetry.columns import pack_column

    packed = pack_column("q", [7] * 1024)
    assert len(packed) <= inflate.FEW_BYTES
    inflate._repeated.cache_clear()
    a = inflate.column("q", packed, 1024)
    b = inflate.column("q", packed, 1024)
    assert inflate._repeated.cache_info().hits == 1
    assert a.tolist() == [7] * 1024 == b.tolist()
    a[0] = 99
    assert inflate.column("q", packed, 1024)[0] == 7 and b[0] == 7
    for _ in range(2):
        try:
            inflate.column("q", packed, 1000)  # not 1000 values
        except inflate.BadColumnsError:
            pass
        else:
            raise AssertionError("a column of the wrong length was taken")
    big = pack_column("d", [float(i) ** 0.5 for i in range(1024)])
    assert len(big) > inflate.FEW_BYTES
    assert inflate.column("d", big, 1024)[4] == 2.0


def _unpacked(packed: bytes, n: int, ascending: bool) -> list[int] | str:
    from eagle3_tui.telemetry.columns import unpack_int_array

    try:
        return unpack_int_array(packed, n, ascending).tolist()
    except ValueError:
        return "ValueError"


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.integers(-(1 << 63), (1 << 63) - 1), min_size=1, max_size=50),
    st.booleans(),
    st.integers(-1, 1),
)
def test_a_process_with_numpy_unpacks_sums_as_the_standard_library_does(
    values: list[int], ascending: bool, off_by: int
) -> None:
    """A sample block's places (telemetry/columns.py's ``unpack_int_array``) unpack
    with numpy where the process has it, else with the standard library alone (the
    agent on a host): the same values, or the same refusal (out of order, a sum past 64
    bits, not ``n`` of them)."""
    import sys

    from eagle3_tui.telemetry.columns import pack_column

    diffs = [values[0], *(b - a for a, b in itertools.pairwise(values))]
    if not all(-(1 << 63) <= d < 1 << 63 for d in diffs):
        return  # differences past 64 bits: packed as the writer never would
    packed = pack_column("q", values)
    n = len(values) + off_by
    with_numpy = _unpacked(packed, n, ascending)
    saved = sys.modules["numpy"]
    sys.modules["numpy"] = None  # type: ignore[assignment]
    try:
        without = _unpacked(packed, n, ascending)
    finally:
        sys.modules["numpy"] = saved
    assert with_numpy == without
    if off_by == 0 and not (ascending and values != sorted(values)):
        assert without == values


def test_unpacked_sums_near_64_bits_are_exact_or_refused_with_numpy_too() -> None:
    """Where numpy's sums might wrap around, the standard library's say: exact values
    that fit, a ValueError for a sum past 64 bits (numpy would wrap it around)."""
    import zlib

    from eagle3_tui.telemetry.columns import _shuffle, pack_column, unpack_int_array

    top = (1 << 63) - 1
    near = [top - 5, top - 2, top]
    assert unpack_int_array(pack_column("q", near), 3, ascending=True).tolist() == near
    raw = b"".join(d.to_bytes(8, "little", signed=True) for d in (top, top))
    try:
        unpack_int_array(zlib.compress(_shuffle(raw, 8)), 2)
    except ValueError:
        pass
    else:
        raise AssertionError("a sum past 64 bits was taken")


@settings(max_examples=120, deadline=None)
@given(
    st.one_of(
        st.tuples(
            st.integers(-(1 << 63), (1 << 63) - 1),
            st.integers(-(1 << 20), 1 << 20),
            st.integers(1, 3000),
        ).map(lambda t: [t[0] + t[1] * i for i in range(t[2])]),
        st.lists(st.integers(-(1 << 40), 1 << 40), min_size=1, max_size=60),
    )
)
def test_an_int_column_is_stepped_only_where_its_values_step_evenly(values: list[int]) -> None:
    """An int64 column whose values step evenly (a block's ``seq``, ``step``, ``v``) is
    written as its first value and step (type ``a``, 16 bytes); any other as ``q``.
    Either reads back as the same values everywhere: the agent's lists and arrays, the
    client's inflating (numpy), a forked read's inflating ahead."""
    from eagle3_tui.model import inflate
    from eagle3_tui.telemetry.columns import pack_ints, unpack_int_array, unpack_ints

    if not all(-(1 << 63) <= v < 1 << 63 for v in values):
        return  # not int64 values: no writer packs them
    diffs = {b - a for a, b in itertools.pairwise(values)}
    if any(not -(1 << 63) <= d < 1 << 63 for d in diffs):
        return
    kind, packed = pack_ints(values)
    assert kind == ("a" if len(diffs) <= 1 else "q")
    assert len(packed) == 16 or kind == "q"
    n = len(values)
    assert unpack_ints(packed, n, kind) == values
    assert unpack_int_array(packed, n, kind=kind).tolist() == values
    assert inflate.inflate(kind, packed, n).tolist() == values
    assert inflate.column(kind, packed, n).tolist() == values


def test_a_stepped_column_that_is_not_one_is_refused_by_every_reader() -> None:
    """A column of type ``a`` of the wrong size, or whose values would pass 64 bits, or
    a type no writer writes: a ValueError for the agent, BadColumnsError for the client
    (its frame one malformed line), never values read from the wrong place."""
    import struct

    from eagle3_tui.model import inflate
    from eagle3_tui.telemetry.columns import unpack_int_array, unpack_ints

    top = (1 << 63) - 1
    cases = [
        ("a", struct.pack("<qq", 1, 1)[:12], 4),  # torn
        ("a", struct.pack("<qq", 1, 1) + b"\0", 4),  # too long
        ("a", struct.pack("<qq", top - 2, 1), 4),  # the fourth value past 64 bits
        ("a", struct.pack("<qq", -top, -1), 3),
        ("a", struct.pack("<qq", 1, 1), 0),
        ("z", struct.pack("<qq", 1, 1), 4),
    ]
    for kind, packed, n in cases:
        for read in (unpack_ints, lambda p, m, k: unpack_int_array(p, m, kind=k)):
            try:
                read(packed, n, kind)
            except ValueError:
                pass
            else:
                raise AssertionError(f"{kind} {packed!r} {n} was taken by the agent")
        if kind == "z" or n == 0:
            continue
        try:
            inflate.inflate(kind, packed, n)
        except inflate.BadColumnsError:
            pass
        else:
            raise AssertionError(f"{kind} {packed!r} {n} was taken by the client")
    assert unpack_ints(struct.pack("<qq", top - 3, 1), 4, "a")[-1] == top
    assert inflate.inflate("a", struct.pack("<qq", top - 3, 1), 4)[-1] == top


def test_a_block_and_a_sample_block_write_stepped_columns_and_read_them_back() -> None:
    """The writer's blocks (``encode_block``, ``encode_samples``) step their counting
    columns: a block's ``seq``, ``step``, ``v``, a sample block's writer; ``@off`` (lines
    of differing lengths) stays ``q``. Read back, every column is what was written."""
    import json

    from eagle3_tui.telemetry.columns import (
        HEAD,
        Samples,
        encode_block,
        encode_samples,
        read_blocks,
    )

    n = 300
    lengths = [40 + i % 7 for i in range(n)]
    offsets = list(itertools.accumulate([0, *lengths[:-1]]))
    shape = (("v", "q"), ("seq", "q"), ("step", "q"), ("epoch", "q"), ("train.loss", "f"))
    rows = [[1, 10 + i, 500 + 2 * i, i // 100, 0.5] for i in range(n)]
    data = encode_block((1, 2), ("w", "train"), shape, offsets, lengths, rows)
    (block,) = read_blocks(data)
    kinds = {path: kind for path, (kind, _) in block.chunks.items()}
    assert kinds == {
        "@off": "q", "@len": "q", "v": "a", "seq": "a", "step": "a", "epoch": "q", "train.loss": "f"
    }  # fmt: skip
    assert block.ints("seq") == [10 + i for i in range(n)]
    assert block.ints("step") == [500 + 2 * i for i in range(n)]
    assert block.ints("epoch") == [i // 100 for i in range(n)]
    assert block.ints("@off") == offsets
    kinds_b = [b"gpu", b"io"] * (n // 2)
    sample = encode_samples(
        (1, 2), offsets, lengths, kinds_b, [b"w"] * n, list(range(n)), [1.0 * i for i in range(n)]
    )
    _, hlen, _, _ = HEAD.unpack_from(sample, 0)
    header = json.loads(sample[HEAD.size : HEAD.size + hlen])
    assert {c[0]: c[1] for c in header["cols"]} == {
        "@off": "q", "@len": "q", "kind": "q", "w": "a", "seq": "a", "ts": "d"
    }  # fmt: skip
    got = Samples(header, memoryview(sample)[HEAD.size + hlen :])
    assert got.offsets.tolist() == offsets and got.lengths.tolist() == lengths
