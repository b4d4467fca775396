"""``python benchmarks/frame_probe.py OUT.json ARGS...``: ``eagle3-tui ARGS`` with its frames timed.

For ``bench_follow.py`` only. Wraps Textual's screen update (``Screen._on_timer_update``:
layout when needed, the render of every refreshed widget, the compositor, the write to
the terminal) and, at most once a second, writes every frame seen so far to ``OUT.json``
as ``[[wall time at its end, seconds it took], ...]``. The app itself is unchanged.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from textual.screen import Screen

OUT = Path(sys.argv[1])
FRAMES: list[tuple[float, float]] = []
_written = [0.0]
_update = Screen._on_timer_update


def _timed(self: Screen[Any]) -> None:
    t0 = time.perf_counter()
    _update(self)
    end = time.time()
    FRAMES.append((end, time.perf_counter() - t0))
    if end - _written[0] >= 1.0:
        _written[0] = end
        tmp = OUT.with_suffix(".tmp")
        tmp.write_text(json.dumps(FRAMES))
        os.replace(tmp, OUT)


Screen._on_timer_update = _timed  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from eagle3_tui.cli import main

    raise SystemExit(main(sys.argv[2:]))
