"""Screens over the monitor: confirmation dialogs, the run picker, help."""
