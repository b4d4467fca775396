"""The pure core: a run's records decoded (``records.py``, ``reader.py``), kept as
series (``state.py``, ``table.py``), followed at their path (``run.py``, ``files.py``),
the figures derived from them (``derived.py``), the verdict (``verdict.py``,
``health.py``, ``observed_health.py``), and what is shown or printed (``snapshot.py``,
``summary.py``, ``compare.py``). No UI, no SSH, no training stack: see
docs/ARCHITECTURE.md.
"""
