"""The model's median is NumPy's, bit for bit, without importing ``numpy.ma``."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from eagle3_tui.model.median import median

FLOATS = st.floats(allow_nan=True, allow_infinity=True, width=64)


@settings(max_examples=300, deadline=None)
@given(
    hnp.arrays(np.float64, hnp.array_shapes(min_dims=1, max_dims=2, max_side=9), elements=FLOATS)
)
def test_the_median_of_any_float_array_is_numpys(a: np.ndarray) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an empty slice's mean: NaN
        axes = [None] + ([1] if a.ndim == 2 else [])
        for axis in axes:
            got, want = median(a, axis), np.median(a, axis=axis)
            assert np.asarray(got).tobytes() == np.asarray(want).tobytes(), (a, axis)
            assert type(got) is type(want)


@given(st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=20))
def test_the_median_of_ints_is_numpys(xs: list[int]) -> None:
    a = np.array(xs, dtype=np.int64)
    assert median(a) == np.median(a) and type(median(a)) is type(np.median(a))


def test_it_does_not_import_the_masked_arrays() -> None:
    code = (
        "import sys, numpy as np\n"
        "from eagle3_tui.model.median import median\n"
        "median(np.array([1.0, np.nan, 3.0])); median(np.ones((3, 4)), 1)\n"
        "print('numpy.ma' in sys.modules)\n"
        "np.median(np.array([1.0]))\n"
        "print('numpy.ma' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]  # (numpy's own does)
