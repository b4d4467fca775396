"""What the user chose to see: step window, smoothing, log scale, pause.

A frozen value the app replaces on each key; panels read it, the snapshot is
built for it (:meth:`ViewState.params`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from eagle3_tui.model.snapshot import ViewParams

SMOOTHING = (0.0, 0.6, 0.9, 0.99)
"""What ``s`` cycles through: EMA weight per step, as TensorBoard's slider (0: off)."""
MIN_WINDOW = 10


@dataclass(frozen=True, slots=True)
class ViewState:
    window: int | None = None
    """Show the last ``window`` steps; None: the whole run."""
    smoothing: float = 0.6
    log_scale: bool = False
    """The loss on a log axis (non-positive points are left out and counted)."""
    paused: bool = False
    """The view is frozen; data keeps being read."""
    behind: int = 0
    """While paused: how many steps the run is ahead of what is shown."""

    def params(self, columns: int) -> ViewParams:
        return ViewParams(columns=max(10, columns), window=self.window, smoothing=self.smoothing)

    def next_smoothing(self) -> ViewState:
        i = SMOOTHING.index(self.smoothing) if self.smoothing in SMOOTHING else 0
        return replace(self, smoothing=SMOOTHING[(i + 1) % len(SMOOTHING)])

    def narrower(self, steps: int) -> ViewState:
        """Half the window (of the whole run's ``steps`` when showing all of it)."""
        current = self.window if self.window is not None else max(steps, MIN_WINDOW * 2)
        return replace(self, window=max(MIN_WINDOW, current // 2))

    def wider(self, steps: int) -> ViewState:
        """Twice the window; the whole run once that covers it."""
        if self.window is None:
            return self
        wider = self.window * 2
        return replace(self, window=None if wider >= steps else wider)

    def whole_run(self) -> ViewState:
        return replace(self, window=None)

    def title(self, log: bool = True, short: bool = False) -> str:
        """The view in words, for the plots' titles (``log``: say the log scale too;
        ``short``: for a narrow chart)."""
        if short:
            window = "all" if self.window is None else f"last {self.window:,}"
            smooth = "raw" if self.smoothing == 0 else f"ema {self.smoothing:g}"
        else:
            window = "all steps" if self.window is None else f"last {self.window:,} steps"
            smooth = "smoothing " + ("off" if self.smoothing == 0 else f"{self.smoothing:g}")
        scale = " · log" if log and self.log_scale else ""
        return f"{window} · {smooth}{scale}"
