"""The health scenario suite (issue 13): verdicts over time, false alarms, wrong labels,
detection times. ``python -m benchmarks.scenarios`` runs it all (``--recorded`` only
the recorded streams, a second; the real tiny trainings take a few minutes)."""
