"""The monitor's C heap hands back the large blocks a snapshot drops (eagle3_tui/heap.py):
glibc's rising mmap threshold kept them, and the monitor's memory grew while it followed."""

from __future__ import annotations

import subprocess
import sys

import pytest

HOLES = """
import sys
from eagle3_tui import heap
if sys.argv[1] == "fixed":
    heap.keep_large_blocks_apart()

def anon_mb():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024

big = bytearray(8 << 20)  # a large array freed: glibc's threshold rises to its size
del big
before = anon_mb()
blocks, kept = [], []
for _ in range(64):  # a snapshot's arrays, each beside something that stays
    blocks.append(b"x" * (1 << 20))
    kept.append(bytearray(4096))
del blocks
print(anon_mb() - before)
"""


def grown_mb(mode: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", HOLES, mode], capture_output=True, text=True, check=True
    )
    return float(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap, /proc")
def test_large_blocks_freed_go_back_to_the_system() -> None:
    plain = grown_mb("plain")
    if plain < 32:  # this libc keeps no such holes: nothing to show
        pytest.skip(f"the plain heap kept only {plain:.0f} MB")
    assert grown_mb("fixed") < 8, "the freed 1 MB blocks stayed in the heap"


def test_the_command_line_collects_young_objects_less_often() -> None:
    """Every command (a summary of a long run among them) starts with the collector
    set as the monitor runs: at Python's default it walked what was alive ~300 times
    while ``summary`` read the 1M-step run."""
    code = (
        "import gc, sys; from eagle3_tui import cli; from eagle3_tui.heap import YOUNG_OBJECTS;"
        "before = gc.get_threshold()[0];"
        "cli._command(['help']);"
        "print(before, gc.get_threshold()[0] == YOUNG_OBJECTS, file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr.split()[-2:] == ["700", "True"], out.stderr
