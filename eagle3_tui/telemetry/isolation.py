"""eagle3-tui's own Python processes, started apart from the caller's directory.

``python -m MODULE`` and ``python -c CODE`` put the working directory first on
``sys.path``: a ``json.py`` another user left in a shared directory would be imported
by the sampler sidecar, the log copier or the demo's trainer, as whoever started it
(root, on a shared GPU box). Each of them is started here instead as

    PYTHON -I -c BOOT ROOT MODULE PATHS ARGS...

``-I`` (isolated mode: no working directory or script directory on ``sys.path``, no
``PYTHON*`` variables, no user site) and ``BOOT`` puts back exactly what it needs:
``ROOT``, the directory this ``eagle3_tui`` was imported from, first, then ``PATHS``
(a JSON list: the caller's ``sys.path`` less the empty entry, its working directory and
its script's directory), so that whatever the trainer imported from its environment
(``PYTHONPATH``, a user site) the child still finds. ``MODULE`` stays visible in
``ps`` (discovery tells the helpers of a training by it).

Standard library only, Python 3.8+: imported inside the trainer.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

BOOT = (
    "import sys,json;a=sys.argv;r=a.pop(1);m=a.pop(1);p=json.loads(a.pop(1));"
    "sys.path[:0]=[r];sys.path+=[x for x in p if x not in sys.path];"
    "import runpy;runpy.run_module(m,run_name='__main__',alter_sys=True)"
)
"""What ``-c`` runs: ROOT first on ``sys.path``, the caller's paths after, then MODULE
as ``python -m`` would (``sys.argv`` = [its file, ARGS...])."""


def package_root() -> str:
    """The directory holding the ``eagle3_tui`` package this module came from."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))


def _caller_dirs() -> set[str]:
    """The directories ``-m``/``-c``/a script put on the caller's path by themselves."""
    out = set()
    with contextlib.suppress(OSError):
        out.add(os.path.realpath(os.getcwd()))
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if isinstance(main, str):
        out.add(os.path.realpath(os.path.dirname(main)))
    return out


def inherited_paths() -> list[str]:
    """The caller's ``sys.path`` without the entries that come from where it was started
    (the empty entry, its working directory, its script's directory)."""
    skip = _caller_dirs()
    out = []
    for p in sys.path:
        if not isinstance(p, str) or not p or os.path.realpath(p) in skip:
            continue
        out.append(p)
    return out


def module_argv(module: str, *args: str, python: str | None = None) -> list[str]:
    """The command line that runs ``python -m module args...`` isolated (see above)."""
    return [
        python or sys.executable,
        "-I",
        "-c",
        BOOT,
        package_root(),
        module,
        json.dumps(inherited_paths()),
        *args,
    ]


def as_module(argv: list[str]) -> list[str]:
    """``argv`` as a person reads it: ``PYTHON -I -c BOOT ROOT MODULE PATHS ARGS...``
    (:func:`module_argv`) shown as ``PYTHON -I -m MODULE ARGS...``; anything else as is."""
    for i in range(len(argv) - 4):
        if argv[i] == "-c" and argv[i + 1] == BOOT:
            return [*argv[:i], "-m", argv[i + 3], *argv[i + 5 :]]
    return list(argv)
