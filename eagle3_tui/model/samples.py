"""How much of each sampler's history the client keeps: the state's limits, and a
protocol constant (a catch-up asks the agent for the newest records of each kind in
full, the older ones as envelopes only: ``agent/column_plan.py``). Its own module so that
the transport sends it without importing the state."""

GPU_HISTORY = 600
"""``gpu`` samples kept (10 min at 1 s)."""
IO_HISTORY = 600
"""``io`` samples kept."""
SAMPLES_KEPT = {"gpu": GPU_HISTORY, "io": IO_HISTORY, "heartbeat": 256}
"""Sampler kinds and how many of their newest records the state keeps."""
