"""Text for the panels: numbers, sizes and durations as cells, and inert text.

Everything that comes from the run (log messages, metric and file names, paths,
argv, error strings, user and host names) goes through :func:`inert` (or
:func:`clean`, for a notification): every character a terminal acts on is shown
escaped (``\\x1b``, ``\\u202e``: ``model/inert.py``, what the command line prints
too), and the result is a :class:`rich.text.Text`, never a markup string, so
``[bold]`` in a message is shown as ``[bold]``. A log message alone has its colour
and cursor sequences dropped first (:func:`log_message`).
"""

from __future__ import annotations

import math
import re
import time

from rich.text import Text

from eagle3_tui.model.inert import printable
from eagle3_tui.model.units import duration as duration
from eagle3_tui.model.units import size as size

_CSI = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]")
"""A CSI sequence (7- or 8-bit): colours, cursor moves, erasing."""

SPARK = "▁▂▃▄▅▆▇█"


def clean(text: object) -> str:
    """``text`` as one inert line: control characters, escape sequences, bidi and
    separator characters shown escaped as the command line shows them."""
    return printable(str(text))


def inert(text: object, style: str = "", wrap: bool = False) -> Text:
    """Text from the run, shown exactly as written (no markup, escapes shown escaped);
    one line cut with an ellipsis unless ``wrap``."""
    if wrap:
        return Text(clean(text), style=style, overflow="fold")
    return Text(clean(text), style=style, no_wrap=True, overflow="ellipsis")


def log_message(msg: str, style: str = "") -> Text:
    """A message of the trainer's log: its colour and cursor sequences (CSI: a coloured
    logger, a progress bar redrawing itself) dropped, as they only dress the text; what
    remains as :func:`inert` (an OSC title or clipboard sequence shown escaped)."""
    if "\x1b" in msg or "\x9b" in msg:
        msg = _CSI.sub("", msg)
    return inert(msg, style)


def num(x: float | None, digits: int = 4) -> str:
    """A metric value for a cell; non-finite spelled out, tiny and huge in e-notation."""
    if x is None:
        return "–"
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+inf" if x > 0 else "-inf"
    if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e5):
        return f"{x:.{max(1, digits - 2)}e}"
    return f"{x:.{digits}f}"


def rate(x: float | None, unit: str = "") -> str:
    """A rate with a metric prefix: ``1.23k tok/s``."""
    if x is None or not math.isfinite(x):
        return "–"
    for prefix, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f}{prefix}{unit}"
    return f"{x:.2f}{unit}" if abs(x) < 100 else f"{x:.0f}{unit}"


def clock_time(ts: float) -> str:
    """Local wall-clock ``HH:MM:SS`` of a timestamp."""
    return time.strftime("%H:%M:%S", time.localtime(ts))


def sparkline(values: tuple[float, ...] | list[float], width: int, top: float | None = None) -> str:
    """The last ``width`` values as block characters (scaled to ``top`` or their max)."""
    vals = [v for v in values if math.isfinite(v)][-width:] if width > 0 else []
    if not vals:
        return ""
    hi = top if top is not None else max(vals)
    if hi <= 0:
        return SPARK[0] * len(vals)
    last = len(SPARK) - 1
    return "".join(SPARK[min(last, max(0, round(v / hi * last)))] for v in vals)


def bar(fraction: float | None, width: int) -> str:
    """A horizontal bar of ``width`` cells filled to ``fraction`` (eighths of a cell)."""
    if width <= 0:
        return ""
    if fraction is None or not math.isfinite(fraction):
        return "·" * width
    f = min(1.0, max(0.0, fraction))
    eighths = round(f * width * 8)
    full, part = divmod(eighths, 8)
    partial = " ▏▎▍▌▋▊▉"[part] if part and full < width else ""
    return ("█" * full + partial).ljust(width, " ")[:width]
