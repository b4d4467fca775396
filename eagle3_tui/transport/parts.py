"""A local file's parts as the agent's catch-up makes them: its companion's columns
payloads and the ranges of bytes between them (agent/column_plan.py).

Light on purpose: a forked read's child (transport/forked.py) runs this alone, with
nothing of the model, numpy or asyncio imported, so that it can start before they are.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eagle3_tui.agent.column_plan import ready
from eagle3_tui.agent.names import COLUMNS_WANTED
from eagle3_tui.model.samples import SAMPLES_KEPT

READ_SIZE = 1024 * 1024
"""Reads of a few MiB: the freed buffer is reused for the next read, where a 16 MiB
read gets fresh pages from the kernel each time (35 MB read in 5 ms, not 25 ms)."""


def columnar_parts(
    fd: int, path: Path, offset: int, stop: int | None, history: dict[str, Any] | None = None
) -> Iterator[tuple[int, bytes | None, int]]:
    """Each columns payload of the file (open as ``fd``) from ``offset`` to ``stop``
    (None: its end now) as (offset, payload, span), each range of bytes between them
    as (offset, None, length), the last one's length -1 where it goes to the file's
    end (``stop`` None)."""
    size = os.fstat(fd).st_size if stop is None else stop
    for start, end, payload in ready(
        fd, str(path), offset, size, SAMPLES_KEPT, COLUMNS_WANTED, history
    ):
        if start > offset:
            yield offset, None, start - offset
        yield start, payload, end - start
        offset = end
    if stop is None or offset < stop:
        yield offset, None, -1 if stop is None else stop - offset


def file_bytes(fd: int, offset: int, stop: int | None) -> Iterator[tuple[int, bytes, int]]:
    """The file's bytes from ``offset`` to ``stop`` (None: its end), a read at a time."""
    while stop is None or offset < stop:
        want = READ_SIZE if stop is None else min(READ_SIZE, stop - offset)
        data = os.pread(fd, want, offset)
        if not data:
            return
        yield offset, data, -1
        offset += len(data)
