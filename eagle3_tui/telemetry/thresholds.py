"""Thresholds that the host's agent (``runs``' one-word health, ``agent/discover.py``)
and the client's model (the verdict, ``model/verdict.py``) both judge a run by, so that
``runs`` and ``summary`` say one thing. Standard library (nothing at all): it travels
to the host with the agent.
"""

BUSY_CPU_PCT = 10.0
"""A training's process tree above this share of one core (%) is working."""

SILENT_FROM_START_S = 90.0
"""A process start's least start-up allowance: with no metric yet, a working process is
called silent only after this long (CPU or a growing log alone look like a start-up)."""
