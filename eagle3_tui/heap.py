"""The heap of a process that reads a long run and then stays (the monitor, ``watch``).

Python's collector (:func:`collect_less`): a long run's read allocates millions of
short-lived objects (each block's header, its columns' arrays, the records of the lines
between); at Python's default the collector ran after every 700 of them, walking each
time what was still alive: ~0.15 s of ``summary``'s ~2 s on the 1M-step run, ~40 ms of
a glance at it.

The C heap:
glibc serves an allocation of more than its *mmap threshold* with a mapping of its own,
handed back to the system when freed; smaller ones come from the heap, which keeps what
is freed. The threshold starts at 128 KiB and rises to the size of each mapped block
freed (up to 32 MiB): after a long run's read, the 1-8 MB arrays a snapshot makes and
drops each second came from the heap and stayed there. Following the 1M-step run
(``benchmarks/bench_open.py``'s, in a real terminal), the monitor's memory grew from
274 to 360 MB within 15 s of the read, with no new data; 790 MB while a live run
appended (``bench_follow.py --history 1000000``). With the threshold fixed: 251-261 MB
in four runs, steady; the whole read as fast (2.6-3.2 s against 2.9-3.5 s, three runs
each).
"""

from __future__ import annotations

import contextlib
import gc

MMAP_THRESHOLD = 256 << 10
"""Allocations from this size on are mapped apart and handed back when freed."""
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)


YOUNG_OBJECTS = 10_000
"""Allocations between two collections of the youngest objects (Python's default: 700):
a snapshot a second, or a block of a long run read, allocates thousands of short-lived
objects, freed by reference counting long before a collection; at 700 the collector ran
~3 times a second while following, and ~300 times while ``summary`` read a 1M-step run,
walking each time what was still alive."""


def collect_less() -> None:
    """The youngest objects collected every :data:`YOUNG_OBJECTS` allocations (the
    older generations as before): what the command line sets as it starts."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_OBJECTS, older, oldest)


def keep_large_blocks_apart() -> None:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD` (it no longer rises); not
    glibc: nothing to do."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def give_back() -> None:
    """The heap's free memory handed back to the system (glibc keeps it otherwise)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
