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


def test_a_view_let_go_in_a_reference_cycle_does_not_stop_the_table_growing() -> None:
    """A step view let go but held in a cycle not yet collected exported the column: the
    next rows raised BufferError ("cannot resize an array that is exporting buffers",
    once under the suite's load). The table collects such garbage before it grows; a
    view still in use keeps its error."""
    import gc

    table = StepTable()
    table.append_row(0, 1.0, {"train/loss": 2.0})
    was = gc.isenabled()
    gc.disable()
    try:
        cycle: list[object] = [table.step_view()]
        cycle.append(cycle)
        del cycle  # garbage, not freed: the view still exports the steps' buffer
        table.append_row(1, 2.0, {"train/loss": 1.5})
        table.extend_columns(np.array([2, 3]), np.array([3.0, 4.0]), {"train/loss": np.ones(2)})
        assert list(table.step_view()) == [0, 1, 2, 3]
        held = table.step_view()
        with pytest.raises(BufferError):
            table.append_row(4, 5.0, {"train/loss": 1.0})
        del held
    finally:
        if was:
            gc.enable()
