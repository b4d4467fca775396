"""A line's braille cells, computed as plotext computes them, with numpy.

plotext draws a braille line in three passes over Python lists: it maps the points onto
a grid of dots (2 across and 4 down per character cell), joins each pair of neighbours
with the dots between them (``get_lines``: one list element per dot), then groups the
dots into cells and looks up each cell's braille character (``hd_group``). For the
charts of a live run that was most of a figure's build (a noisy loss line crosses the
height of the chart between neighbouring points: hundreds of dots a column).

:func:`braille_cells` does the same three passes on arrays: the same mapping (plotext's
own ``get_matrix_data`` for the points), the same interpolation (plotext's ``linspace``
arithmetic, operation for operation, truncated as ``int()`` truncates), the same
grouping (floor division and modulo as Python's ``//`` and ``%``), and each cell's
character from plotext's own table. The chart hands plotext one point per cell with
that character as its marker: plotext still lays out the figure (axes, ticks, labels,
colours) and writes the cells into its matrix, and the picture is the one its own line
would give, cell for cell (``tests/app/test_braille.py`` checks that over random
lines, sizes and limits).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotext._utility as ut

BITS = 8
"""Dots in a braille cell: 2 columns, 4 rows."""


def _table() -> list[str]:
    """Each cell's character by the bits of its dots, from plotext's table: bit
    ``7 - i`` is the dot that plotext's code lists at ``i`` (rows from the top, the
    left dot first)."""
    return [
        ut.get_hd_marker(tuple((v >> (BITS - 1 - i)) & 1 for i in range(BITS))) for v in range(256)
    ]


CHARS = _table()


FAR = 4e6
"""Beyond this, a float's spacing (4e6 * 2**-52 ~ 1e-9) is no longer below the 1e-8
that tells a value near an integer."""


def dots(values: Sequence[float], lim: Sequence[float], bins: int) -> np.ndarray[Any, Any]:
    """plotext's ``get_matrix_data``: ``floor(round(0.5 + (bins - 1) * (v - lo) /
    (hi - lo), 8))`` for each value, computed on an array (the same float operations
    in the same order, so the same bits). The rounding to 8 decimals moves a value
    across an integer only within 1e-8 of one: those few go through plotext's own
    function, as do those far off the canvas (beyond ``FAR``: there a float's spacing
    is too coarse for that test, and plotext's decimal rounding may land elsewhere)."""
    lo, hi = lim[0], lim[1]
    v = np.asarray(values, dtype=np.float64)
    scaled = 0.5 + (bins - 1) * (v - lo) / (hi - lo)
    out = np.floor(scaled).astype(np.int64)
    near = (np.abs(scaled - np.rint(scaled)) < 1e-8) | (np.abs(scaled) > FAR)
    if near.any():
        idx = np.flatnonzero(near)
        exact = ut.get_matrix_data([float(v[i]) for i in idx], list(lim), bins)
        out[idx] = exact
    return out


def braille_cells(
    xs: Sequence[float],
    ys: Sequence[float],
    xlim: Sequence[float],
    ylim: Sequence[float],
    cols: int,
    rows: int,
) -> tuple[list[int], list[int], list[str]]:
    """The cells (column, row from the bottom, character) that plotext's braille line
    through ``xs``/``ys`` lights on a canvas of ``cols`` × ``rows`` cells with those
    axis limits, cells off the canvas left out (as plotext leaves them out).

    ``xs``/``ys`` finite, ``cols``/``rows`` ≥ 1, limits as plotext's build settles
    them (``lo < hi``)."""
    if not len(xs):
        return [], [], []
    px = dots(xs, xlim, 2 * cols)
    py = dots(ys, ylim, 4 * rows)
    if len(px) > 1:
        # get_line for each pair: a = max(|dx|, |dy|) + 1 points from linspace, all
        # but the last kept (the next segment starts there); the last point appended
        x0, y0 = px[:-1], py[:-1]
        dx, dy = px[1:] - x0, py[1:] - y0
        a = np.maximum(np.abs(dx), np.abs(dy)) + 1
        n = a - 1
        seg = np.repeat(np.arange(len(a)), n)
        k = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
        steps = np.maximum(a - 1, 1)[seg]  # a == 1 keeps no point: never divided by
        sx = dx[seg] / steps  # linspace's slope, (upper - lower) / (length - 1)
        sy = dy[seg] / steps
        lx = (x0[seg] + k * sx).astype(np.int64)  # lower + x * slope, then int()
        ly = (y0[seg] + k * sy).astype(np.int64)
        px = np.concatenate((lx, px[-1:]))
        py = np.concatenate((ly, py[-1:]))
    cx, cy = px // 2, py // 4
    bit = 1 << (BITS - 1 - ((3 - py % 4) * 2 + px % 2))
    inside = (cx >= 0) & (cx < cols) & (cy >= 0) & (cy < rows)
    cx, cy, bit = cx[inside], cy[inside], bit[inside]
    keys, where = np.unique(cy * cols + cx, return_inverse=True)
    codes = np.zeros(len(keys), dtype=np.int64)
    np.bitwise_or.at(codes, where, bit)
    return (keys % cols).tolist(), (keys // cols).tolist(), [CHARS[c] for c in codes.tolist()]


def centres(cells: list[int], lim: Sequence[float], bins: int) -> list[float]:
    """Values that plotext maps to these cells (``bins`` of them across ``lim``): each
    cell's centre, half a cell from either edge."""
    lo, hi = float(lim[0]), float(lim[1])
    step = (hi - lo) / (bins - 1)
    return [lo + c * step for c in cells]
