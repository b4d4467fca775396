"""Training launchers that run a real speculators Trainer with telemetry attached.

This folder is installed as ``eagle3_tui.train`` (see pyproject.toml), so a training
host with ``eagle3-tui[train]`` can run ``python -m eagle3_tui.train.tiny``.
"""
