"""The step table's readers: views share the columns' memory, copies convert a tail."""

from __future__ import annotations

import math

import numpy as np
import pytest

from eagle3_tui.model.table import StepTable


def table() -> StepTable:
    t = StepTable()
    t.append_row(1, 10.0, {"loss": 3.0})
    t.append_row(2, 11.0, {"loss": 2.0, "lr": 1e-3})
    t.append_row(3, 12.0, {"loss": 1.5})
    return t


def test_views_read_the_columns_without_a_copy() -> None:
    t = table()
    assert t.step_view().tolist() == [1, 2, 3]
    assert t.ts_view().tolist() == [10.0, 11.0, 12.0]
    lr = t.view("lr")
    assert lr is not None and lr.dtype == np.float32
    assert math.isnan(lr[0]) and lr[1] == pytest.approx(1e-3) and math.isnan(lr[2])
    assert t.view("absent") is None
    assert sorted(t.views()) == ["loss", "lr"]
    view = t.step_view()
    with pytest.raises(BufferError):  # a view is the column itself: it pins its memory
        t.append_row(4, 13.0, {})
    del view, lr
    t.append_row(4, 13.0, {"loss": 1.0})
    assert t.step_view().tolist() == [1, 2, 3, 4]


def test_floats_are_float64_copies_of_a_tail() -> None:
    t = table()
    loss = t.floats("loss")
    assert loss is not None and loss.dtype == np.float64 and loss.tolist() == [3.0, 2.0, 1.5]
    loss[0] = 99.0  # a copy: the table keeps its value
    tail, longer = t.floats("loss", 2), t.floats("loss", 10)
    assert tail is not None and tail.tolist() == [2.0, 1.5]
    assert longer is not None and longer.tolist() == [3.0, 2.0, 1.5]
    assert t.floats("absent") is None
