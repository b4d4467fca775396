"""``python benchmarks/frame_probe.py OUT.json ARGS...``: ``eagle3-tui ARGS`` with its frames timed.

For ``bench_follow.py`` only. Wraps Textual's screen update (``Screen._on_timer_update``:
layout when needed, the render of every refreshed widget, the compositor, the write to
the terminal) and appends each frame to ``OUT`` as a line ``WALL_TIME_AT_ITS_END
SECONDS_IT_TOOK``. The app itself is unchanged.

With ``E3_COSTS=FILE`` in the environment, the CPU time (``time.thread_time``) spent in
a few places is summed and written to ``FILE`` with the frames: each widget class's
renders, the charts' plotext builds and redraws, the app's tick; the screen updates as
a whole; and how many lines of each widget class the compositor asked for and how many
of them were styled anew (the rest came from Textual's cache). Cheap enough not to
change the picture it measures. ``E3_COSTS_FROM=SECONDS``: what came before that
many seconds after the start is left out (a long history's read).

With ``E3_WITHOUT=charts,panels,pictures`` those parts are left out (``bench_follow.py
--without``), to measure what each costs: no chart follows the data, the text panels
keep their first picture, or no snapshot is built after the first few.

With ``E3_PROFILE=FILE`` in the environment the main thread runs under cProfile, its
stats (from 20 s after the start on) written to ``FILE`` every 10 s (read them with ``pstats``).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from textual.screen import Screen

OUT = Path(sys.argv[1])
_out = os.open(OUT, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o600)
_update = Screen._on_timer_update


def _timed(self: Screen[Any]) -> None:
    t0 = time.perf_counter()
    _update(self)
    # one line a frame, appended (a rewrite of the whole list each second cost the app
    # ~1 ms a second, a tenth of what it measures)
    os.write(_out, b"%.6f %.6f\n" % (time.time(), time.perf_counter() - t0))


Screen._on_timer_update = _timed  # type: ignore[method-assign]

COSTS = os.environ.get("E3_COSTS", "")
if COSTS:
    from collections import defaultdict

    from textual.widget import Widget

    SPENT: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    _dumped_costs = [0.0]
    _costs_from = [time.time() + float(os.environ.get("E3_COSTS_FROM", "0")), False]
    """Costs before this (``E3_COSTS_FROM`` seconds after the start) are dropped: the
    read of a long history is not what following costs."""

    def _counted(name: str | None, fn: Any) -> Any:
        @functools.wraps(fn)  # Textual counts a watcher's parameters
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(self, *args, **kwargs)
            finally:
                entry = SPENT[name or type(self).__name__ + "." + fn.__name__]
                entry[0] += time.thread_time() - t0
                entry[1] += 1
                now = time.time()
                if now - _dumped_costs[0] >= 1.0:
                    _dumped_costs[0] = now
                    if not _costs_from[1] and now >= _costs_from[0]:  # the steady state
                        _costs_from[1] = True
                        SPENT.clear()
                    tmp = Path(COSTS).with_suffix(".tmp")
                    main_cpu = time.thread_time()  # the wrappers run in the main thread
                    tmp.write_text(json.dumps({"at": now, "main": main_cpu, "spent": SPENT}))
                    os.replace(tmp, COSTS)

        return wrapper

    import gc

    from textual._compositor import Compositor
    from textual.app import App

    _gc_start: list[float] = [0.0]

    def _gc_timer(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            _gc_start[0] = time.thread_time()
        else:
            entry = SPENT[f"gc generation {info['generation']}"]
            entry[0] += time.thread_time() - _gc_start[0]
            entry[1] += 1

    gc.callbacks.append(_gc_timer)
    Widget._render_content = _counted(None, Widget._render_content)  # type: ignore[method-assign]
    from textual._styles_cache import StylesCache

    _styled = StylesCache.render_line
    _drawing: list[str] = ["?"]
    _render_widget = StylesCache.render_widget

    def _counted_widget(self: StylesCache, widget: Widget, crop: Any) -> Any:
        _drawing[0] = type(widget).__name__
        SPENT[f"lines asked: {_drawing[0]}"][1] += crop.height
        return _render_widget(self, widget, crop)

    def _counted_line(self: StylesCache, *args: Any) -> Any:
        SPENT[f"lines re-styled: {_drawing[0]}"][1] += 1
        return _styled(self, *args)

    StylesCache.render_widget = _counted_widget  # type: ignore[method-assign]
    StylesCache.render_line = _counted_line  # type: ignore[method-assign,assignment]
    Widget.render_lines = _counted(None, Widget.render_lines)  # type: ignore[method-assign]
    Compositor.render_update = _counted("Compositor.render_update", Compositor.render_update)  # type: ignore[method-assign]
    App._display = _counted("App._display (to the terminal)", App._display)  # type: ignore[method-assign]
    Screen._on_timer_update = _counted("Screen update (all)", Screen._on_timer_update)  # type: ignore[method-assign]

    def _in_thread(name: str, fn: Any) -> Any:
        """A module function wrapped as _counted wraps methods."""
        counted = _counted(name, lambda _self, *args: fn(*args))
        return lambda *args: counted(None, *args)

    def _later_imports() -> None:
        from eagle3_tui.app import pipeline
        from eagle3_tui.app.app import MonitorApp
        from eagle3_tui.app.widgets.panels import Panel
        from eagle3_tui.app.widgets.plots import MetricPlot
        from eagle3_tui.transport import local

        MetricPlot._build_frame = _counted(None, MetricPlot._build_frame)  # type: ignore[method-assign]
        # in worker threads (their thread's CPU time): the snapshot, the parse, the read
        patched: Any = pipeline  # its module globals, looked up at each call
        build = patched.build_snapshot
        patched.build_snapshot = _in_thread("build_snapshot (thread)", build)
        pipeline.Pipeline._feed = _counted("Pipeline._feed (thread)", pipeline.Pipeline._feed)  # type: ignore[method-assign]
        local_module: Any = local
        local_module._read = _in_thread("_read (thread)", local._read)
        MetricPlot.redraw = _counted(None, MetricPlot.redraw)  # type: ignore[method-assign]
        MetricPlot.watch_snapshot = _counted(None, MetricPlot.watch_snapshot)  # type: ignore[method-assign]
        Panel.watch_snapshot = _counted(None, Panel.watch_snapshot)  # type: ignore[method-assign]
        MonitorApp.snapshot  # noqa: B018 (imported for its side: the app's module loaded)

else:

    def _later_imports() -> None:
        pass


PROFILE = os.environ.get("E3_PROFILE", "")
if PROFILE:
    import cProfile

    _profiler = cProfile.Profile()
    _started = time.monotonic()
    _dumped = [_started]
    _plain = Screen._on_timer_update
    _on = [False]

    def _profiled(self: Screen[Any]) -> None:
        _plain(self)
        now = time.monotonic()
        if not _on[0] and now - _started >= 20.0:  # the steady state: after the catch-up
            _on[0] = True
            _dumped[0] = now
            _profiler.enable()
        elif _on[0] and now - _dumped[0] >= 10.0:
            _dumped[0] = now
            _profiler.disable()
            _profiler.dump_stats(PROFILE)
            _profiler.enable()

    Screen._on_timer_update = _profiled  # type: ignore[method-assign]


def _leave_out(parts: set[str]) -> None:
    from eagle3_tui.app.app import MonitorApp
    from eagle3_tui.app.widgets.panels import Panel
    from eagle3_tui.app.widgets.plots import MetricPlot

    unknown = parts - {"charts", "panels", "pictures"}
    if unknown:
        raise SystemExit(f"E3_WITHOUT: unknown parts {sorted(unknown)}")
    if "charts" in parts:
        MetricPlot.watch_snapshot = lambda self: None  # type: ignore[method-assign]
    if "panels" in parts:
        Panel.watch_snapshot = lambda self, snap: None  # type: ignore[method-assign]
    if "pictures" in parts:
        tick = MonitorApp._tick
        built = [0]

        async def first_few(self: MonitorApp) -> None:
            if built[0] < 5 or self.snapshot.global_step is None:
                built[0] += 1
                await tick(self)

        MonitorApp._tick = first_few  # type: ignore[method-assign]


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from eagle3_tui.cli import main

    _later_imports()
    if os.environ.get("E3_WITHOUT"):
        _leave_out(set(os.environ["E3_WITHOUT"].split(",")))

    raise SystemExit(main(sys.argv[2:]))
