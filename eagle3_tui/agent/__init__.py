"""The agent: the code that runs on the training host, shipped over the connection.

The client never builds shell code from data. It starts a constant bootstrap
(:data:`BOOTSTRAP`, run by ``python3 -c``) and sends it, on stdin, the bundle (a
zlib-compressed loader, then the sources of this package and
:mod:`eagle3_tui.telemetry`, imported from memory and their compiled code cached on
the host: see ``transport/bundle.py``), then one JSON request line. Paths
and names from the user reach the host only inside that JSON, so a run
directory called ``run $(touch x); `y` 'q"`` is data, never code.

The agent answers on stdout with frames, each a header line then a payload:

``D <offset> <length>\\n`` followed by ``length`` bytes of the file at ``offset``;
``J <json>\\n`` an event (``resolved``, ``waiting``, ``opened``, ``restarted``,
``progress``, ``result``, ``error``).

Operations: ``follow`` (tail a run file with inotify, from an offset, noticing
truncation and replacement), ``read`` (a file to its end), ``runs`` (the
per-user index), ``kill`` and ``resume`` (process control built on the run's
manifest ``run.json``), ``status`` (whether the trainer is alive, and its manifest).

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
