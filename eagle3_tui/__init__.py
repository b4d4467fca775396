"""eagle3-tui: a terminal monitor for EAGLE-3 draft-model training with speculators."""

__version__ = "0.1.0"
