"""What the attach tests share: a real interpreter eagle3-tui's injector cannot call."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import need

DEBIAN_PYTHON = Path("/usr/bin/python3.11")


@pytest.fixture
def python_without_the_call(tmp_path: Path) -> str:
    """A copy of Debian's python3.11 (libpython linked into the executable) whose dynamic
    symbol table no longer names ``Py_AddPendingCall``: it runs Python as before, and
    neither the injector nor gdb can find the function to call."""
    need(DEBIAN_PYTHON.exists(), f"{DEBIAN_PYTHON} (libpython linked in) is not here")
    data = DEBIAN_PYTHON.read_bytes()
    assert data.count(b"\0Py_AddPendingCall\0") == 1
    copy = tmp_path / "without-the-call" / "python3.11"
    copy.parent.mkdir()
    copy.write_bytes(data.replace(b"\0Py_AddPendingCall\0", b"\0Py_AddPendingCalX\0"))
    copy.chmod(0o755)
    return str(copy)
