"""Sizes and durations as short text: one way to say them, in the panels, the
health verdicts and the headless summary alike.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

import math
import time


def size(n: float | None) -> str:
    """Bytes in binary units: ``1.5 GiB``."""
    if n is None or not math.isfinite(n):
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def duration(s: float | None) -> str:
    """Seconds as ``45 s``, ``12m05s``, ``3h07m``, ``2d04h``."""
    if s is None or not math.isfinite(s):
        return "–"
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f} s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def clock(t: float) -> str:
    """A time of day, ``HH:MM:SS`` (local), as the verdicts and notices say it."""
    return time.strftime("%H:%M:%S", time.localtime(t))
