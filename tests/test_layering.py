"""The core never imports the UI or the SSH library; telemetry stays standard-library."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import sys
import {module}
bad = sorted(m for m in sys.modules if m.split('.')[0] in {banned!r})
print(','.join(bad))
"""


@pytest.mark.parametrize(
    ("module", "banned"),
    [
        ("eagle3_tui.model.snapshot", {"textual", "asyncssh", "rich", "textual_plotext"}),
        ("eagle3_tui.model.summary", {"textual", "asyncssh", "rich", "textual_plotext"}),
        ("eagle3_tui.telemetry", {"textual", "asyncssh", "rich", "msgspec", "numpy", "torch"}),
        # imported into a live trainer by `attach`, and by the agent on the host
        ("eagle3_tui.telemetry.inject", {"textual", "asyncssh", "rich", "msgspec", "numpy"}),
        ("eagle3_tui.telemetry.rerun", {"textual", "asyncssh", "rich", "msgspec", "numpy"}),
        ("eagle3_tui.agent.attach", {"textual", "asyncssh", "rich", "msgspec", "numpy", "torch"}),
        ("eagle3_tui.transport.local", {"textual", "rich", "textual_plotext"}),
        ("eagle3_tui.cli", {"textual", "asyncssh", "torch", "numpy"}),
        # a notebook's import: no UI, no SSH library until a host is reached
        ("eagle3_tui.api", {"textual", "asyncssh", "torch", "rich"}),
    ],
)
def test_module_does_not_pull_in(module: str, banned: set[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CHECK.format(module=module, banned=banned)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert proc.stdout.strip() == "", f"{module} imports {proc.stdout.strip()}"
