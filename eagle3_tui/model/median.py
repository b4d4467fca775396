"""``np.median``, without its first call's import of ``numpy.ma`` (~7-12 ms).

NumPy's median checks its result for NaN through ``np.ma.isMaskedArray``, and the
first touch of ``np.ma`` imports the masked-array package: the first picture of every
run (its loss anomalies' baselines, the health's levels) paid it. This is NumPy's own
algorithm for plain arrays (the same partition, the same mean of the middle values,
NaN wherever a slice holds one), tested equal to ``np.median`` bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def median(a: Any, axis: int | None = None) -> Any:
    """``np.median(a, axis)`` of an array that is not a masked one."""
    a = np.asarray(a)
    if axis is None:
        a = a.ravel()
        axis = 0
    sz = a.shape[axis]
    kth = [sz // 2 - 1, sz // 2] if sz % 2 == 0 else [(sz - 1) // 2]
    inexact = np.issubdtype(a.dtype, np.inexact)
    if inexact:
        kth.append(-1)  # a NaN sorts last: the slice's last value tells
    part = np.partition(a, kth, axis=axis) if sz else a
    index = sz // 2
    middle = slice(index, index + 1) if sz % 2 == 1 else slice(index - 1, index + 1)
    indexer = tuple(middle if i == axis else slice(None) for i in range(part.ndim))
    result = np.mean(part[indexer], axis=axis)
    if not inexact or sz == 0:
        return result
    last = part.take(-1, axis=axis)
    nan = np.isnan(last)
    if not nan.any():
        return result
    if isinstance(result, np.generic):
        return last
    np.copyto(result, last, where=nan)
    return result
