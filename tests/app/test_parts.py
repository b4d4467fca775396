"""The app's pure parts: inert text and cell formats, the view's keys, the pipeline's
coalescing and file names. No UI."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.text import Text

from eagle3_tui.app.pipeline import coalesce, export_name, short_label, short_labels
from eagle3_tui.app.text import (
    bar,
    clean,
    duration,
    inert,
    log_message,
    num,
    rate,
    size,
    sparkline,
)
from eagle3_tui.app.view import MIN_WINDOW, ViewState
from eagle3_tui.app.widgets.panels import rich_table, table_lines
from eagle3_tui.app.widgets.plots import nice_ticks, step_label
from eagle3_tui.transport.base import Chunk


def test_text_from_the_run_is_inert() -> None:
    hostile = (
        "\x1b[1;31mred\x1b[0m [bold]x[/bold] \x1b]8;;http://e\x07link\x1b]8;;\x07 \x9b2J\tend\x00"
    )
    cleaned = clean(hostile)  # every escape shown escaped, as the command line shows it
    assert cleaned == (
        "\\x1b[1;31mred\\x1b[0m [bold]x[/bold] \\x1b]8;;http://e\\x07link\\x1b]8;;\\x07"
        " \\x9b2J\\tend\\x00"
    )
    t = inert(hostile)
    assert isinstance(t, Text) and t.plain == cleaned and not t.spans  # no markup parsed
    # a log message: its colours (CSI, 7- and 8-bit) dropped, the rest escaped
    message = log_message(hostile)
    assert message.plain == (
        "red [bold]x[/bold] \\x1b]8;;http://e\\x07link\\x1b]8;;\\x07 \\tend\\x00"
    )
    assert not message.spans
    assert inert("[red]a[/red]", style="bold").plain == "[red]a[/red]"
    assert inert("x\ny", wrap=True).plain == "x\\ny"


def test_cell_formats() -> None:
    assert [num(None), num(float("nan")), num(float("inf")), num(0.5), num(1e-5)] == [
        "–",
        "NaN",
        "+inf",
        "0.5000",
        "1.00e-05",
    ]
    assert [size(512), size(2.5 * 2**30), size(None)] == ["512 B", "2.5 GiB", "–"]
    assert [duration(5), duration(125), duration(3 * 3600 + 60), duration(3 * 86400)] == [
        "5 s",
        "2m05s",
        "3h01m",
        "3d00h",
    ]
    assert [rate(1234.0, " tok/s"), rate(0.82)] == ["1.23k tok/s", "0.82"]
    assert sparkline([0, 50, 100], 3, top=100) == "▁▅█" and sparkline([], 5) == ""
    assert sparkline([1.0] * 10, 4) == "████"
    assert bar(0.5, 4) == "██  " and bar(None, 3) == "···" and len(bar(0.33, 7)) == 7
    assert nice_ticks(0, 599, 5) == [0, 200, 400]
    assert [step_label(950), step_label(12_000), step_label(1_500_000)] == ["950", "12k", "1.5M"]


def test_step_window_keys() -> None:
    v = ViewState()
    assert v.narrower(1000).window == 500
    assert v.narrower(1000).narrower(1000).window == 250
    assert v.narrower(1000).wider(1000).window is None  # 1000 covers the run
    assert ViewState(window=100).wider(1000).window == 200
    assert ViewState(window=MIN_WINDOW).narrower(1000).window == MIN_WINDOW
    assert ViewState(window=100).whole_run().window is None
    assert v.wider(1000) == v
    smoothing = [v.smoothing]
    for _ in range(4):
        v = v.next_smoothing()
        smoothing.append(v.smoothing)
    assert smoothing == [0.6, 0.9, 0.99, 0.0, 0.6]
    assert ViewState(window=64, smoothing=0.0, log_scale=True).title() == (
        "last 64 steps · smoothing off · log"
    )


def test_a_backlog_coalesces_into_contiguous_chunks() -> None:
    chunks = [Chunk(0, b"ab"), Chunk(2, b"cd"), Chunk(4, b"e"), Chunk(0, b"xy"), Chunk(2, b"z")]
    assert coalesce(chunks) == [Chunk(0, b"abcde"), Chunk(0, b"xyz")]  # a restart stays apart
    assert coalesce([]) == []


def test_file_names_from_labels() -> None:
    assert export_name("gpu-box:/runs/exp 7;rm", 10, 20) == "exp_7_rm-steps11-21.csv"
    assert export_name("/", None, None) == "run.csv"
    # the run's own name once: the demo's run directory already starts with eagle3-tui
    assert export_name("/tmp/eagle3-tui-demo-x1", 0, 50) == "eagle3-tui-demo-x1-steps1-51.csv"
    assert short_label("gpu-box:/runs/exp7/") == "exp7" and short_label("exp7") == "exp7"
    # two runs compared: as short as tells them apart (the compare screen's legend)
    assert short_labels("runs/exp7", "runs/exp6") == ("exp7", "exp6")
    assert short_labels("/a/seed1/run", "/b/seed1/run/") == ("a/seed1/run", "b/seed1/run")
    assert short_labels("h1:/runs/x", "h2:/runs/x") == ("h1:/runs/x", "h2:/runs/x")
    assert short_labels("exp7", "exp7") == ("exp7", "exp7")


def _cells(renderable: object, width: int) -> list[list[tuple[str, str]]]:
    """Each cell's character and style as a console of ``width`` renders it."""
    console = Console(width=width, color_system="truecolor", legacy_windows=False)
    lines = console.render_lines(renderable, console.options, pad=False)  # type: ignore[arg-type]
    return [[(ch, str(seg.style or "")) for seg in line for ch in seg.text] for line in lines]


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(
        st.lists(
            st.text(alphabet="0123456789.+-–…e more", max_size=9).map(str.strip),
            min_size=4,
            max_size=4,
        ),
        max_size=8,
    ),
    width=st.integers(min_value=1, max_value=80),
)
def test_table_lines_draw_what_a_rich_table_draws(rows: list[list[str]], width: int) -> None:
    header = ["k", "loss", "full", "cond"]
    lines = table_lines(header, rows, width)
    table = rich_table(header, rows)
    if lines is None:  # does not fit: the Table itself is drawn
        assert sum(max(len(r[i]) for r in [header, *rows]) + 2 for i in range(4)) > width
        return
    assert [cells for line in lines for cells in _cells(line, width)] == _cells(table, width)
