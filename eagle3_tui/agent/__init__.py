"""The agent: the code that runs on the training host, shipped over the connection.

The client never builds shell code from data. It starts a constant bootstrap
(:data:`BOOTSTRAP`, run by ``python3 -c``) and sends it, on stdin, the bundle (a
zlib-compressed loader, then the sources of this package and
:mod:`eagle3_tui.telemetry`, imported from memory and their compiled code cached on
the host: see ``transport/bundle.py``), then one JSON request line. Paths
and names from the user reach the host only inside that JSON, so a run
directory called ``run $(touch x); `y` 'q"`` is data, never code.

The agent answers on stdout with frames, each a header line then a payload (the
four kinds are in :mod:`eagle3_tui.agent.frames`): ``D`` bytes of the file at an
offset, ``Z`` the same zlib-compressed, ``C`` those bytes as columns (their training
steps) and the other lines, ``J <json>`` an event (``resolved``, ``waiting``,
``opened``, ``restarted``, ``progress``, ``result``, ``error``...: :mod:`.names`).

Operations (``main.py`` maps each to its module and function):

- ``follow`` and ``read`` (``follow.py``): tail a run's file with inotify from an
  offset, noticing truncation and replacement; or read it to its end;
- ``glance`` (``glance.py``): a long run's first picture without reading it all (its
  newest lines, its events, its history's digest), from the companion's marks and stats;
- ``resolve``, ``runs``, ``status`` (``runs.py``): which run a directory means, the
  per-user index, whether the trainer lives (and its manifest);
- ``kill``, ``save_wait``, ``resume`` (``kill_resume.py``): stop a run at a step boundary
  and verify its whole process tree gone; wait for a checkpoint save; relaunch it;
- ``discover`` (``discover.py``; what one process is: ``process_facts.py``): the host's
  live trainings with or without telemetry; ``choose``, ``describe`` (``choose.py``):
  what a target means, one process;
- ``observe`` (``observe.py``): records made from outside a training without
  telemetry (its process tree, its log, its checkpoints, its metric backend's files);
- ``attach`` (``attach.py``): add telemetry to a live training (the plan, then the
  injection: ``ptrace.py``, or gdb).

Standard library only, Python 3.8+ and Linux ``/proc``: the remote interpreter
may be any ``python3``. Nothing is installed on the host. Run locally with
``python -m eagle3_tui.agent``.
"""

from __future__ import annotations

BOOTSTRAP = (
    "import sys,zlib;b=sys.stdin.buffer;n=int(b.readline());"
    'exec(compile(zlib.decompress(b.read(n)),"eagle3-tui-agent","exec"))'
)
"""What ``python3 -c`` runs: reads the bundle's loader from stdin and executes it."""
