"""A full refresh of every panel of the monitor: a 1,000-step run against a 1,000,000-step run.

    python benchmarks/bench_app.py [--steps 1000000] [--repeat 7]

"Full refresh" = what the app does when new data arrives, with every panel forced
to redraw: build the Snapshot for the plot width (in a worker thread in the app;
called directly here, so that thread hand-off latency does not blur the cost),
assign it, rebuild both plotext charts and render every panel
(header, banner, plots, TTT table, progress, GPUs, data, log) to terminal lines
at 120×40. Both runs carry the same sampler history (8 GPUs, 8 workers); only
the step table differs. Target: 1M / 1k ≤ 1.5.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.records import mixed_lines
from eagle3_tui.model.run import Run

T0 = 1.79e9
DT = 0.5
STEPS_PER_EPOCH = 15_000


def make_run(steps: int, head: int = 1000) -> Run:
    """``head`` steps with every kind of record, then the rest of the steps as columns."""
    run = Run()
    data = b"".join(mixed_lines(min(steps, head), t0=T0, dt=DT))
    run.feed(0, data)
    if steps > head:
        table = run.state.table
        first = table.last_step or 0
        new_steps = np.arange(first + 1, steps, dtype=np.int64)
        rng = np.random.default_rng(0)
        columns: dict[str, npt.NDArray[np.float64]] = {}
        for key, view in table.views().items():
            base = view.astype(np.float64)
            columns[key] = rng.choice(base[np.isfinite(base)], size=len(new_steps))
        columns["epoch"] = (new_steps // STEPS_PER_EPOCH).astype(np.float64)
        table.extend_columns(new_steps, T0 + new_steps * DT, columns)
    return run


async def refresh_times(run: Run, repeat: int) -> tuple[list[float], list[float]]:
    """Times of full refreshes, and of the snapshot builds within them."""
    from rich.console import Console
    from textual.widget import Widget

    from eagle3_tui.app.app import make_app
    from eagle3_tui.app.widgets.plots import MetricPlot
    from eagle3_tui.model.snapshot import build_snapshot
    from eagle3_tui.transport.replay import ReplayTransport

    now = T0 + (run.state.global_step or 0) * DT + 1.0
    app = make_app(ReplayTransport(), clock=lambda: now, refresh_interval=3600)
    times, builds = [], []
    with open(os.devnull, "w") as sink:  # noqa: ASYNC230 - /dev/null, once
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            app.pipeline.run = run
            panels = [w for w in app.screen.walk_children(Widget) if hasattr(w, "snapshot")]
            for _ in range(repeat):
                gc.collect()
                t = time.perf_counter()
                # what the app's worker thread does, timed without the thread hand-off
                # (whose latency depends on the event loop, not on the run's length)
                snap = build_snapshot(run.state, now, app.view.params(app._columns()))
                builds.append(time.perf_counter() - t)
                app.snapshot = snap
                for w in panels:
                    if isinstance(w, MetricPlot):
                        w.redraw(force=True)
                    width, height = w.content_size.width, w.content_size.height
                    console = Console(file=sink, width=max(1, width), height=max(1, height))
                    console.print(w.render())
                times.append(time.perf_counter() - t)
    return times, builds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=9)
    ns = p.parse_args()
    t = time.perf_counter()
    small = make_run(1000)
    big = make_run(ns.steps)
    print(f"built runs of 1,000 and {ns.steps:,} steps in {time.perf_counter() - t:.1f} s")
    small_t, small_b = asyncio.run(refresh_times(small, ns.repeat))
    big_t, big_b = asyncio.run(refresh_times(big, ns.repeat))
    a, b = statistics.median(small_t), statistics.median(big_t)
    print(f"full refresh of every panel, median of {ns.repeat} (min):")
    for label, ts, builds in (("1,000", small_t, small_b), (f"{ns.steps:,}", big_t, big_b)):
        print(
            f"  {label:>9} steps: {statistics.median(ts) * 1000:6.1f} ms ({min(ts) * 1000:.1f}), "
            f"of which the snapshot {statistics.median(builds) * 1000:.1f} ms"
        )
    ratio = b / a
    verdict = "ok" if ratio <= 1.5 else "OVER the 1.5 target"
    print(f"  ratio of medians {ratio:.2f}, of minima {min(big_t) / min(small_t):.2f}")
    print(f"  target <= 1.5: {verdict}")


if __name__ == "__main__":
    main()
