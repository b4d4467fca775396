"""Relaunch a training command with telemetry, unchanged otherwise: what ``resume``
runs for a run that ``eagle3-tui attach`` instrumented while it trained.

The trainer was a user's own script (``python train.py …``) with no telemetry;
attach added it live. Resuming it by its bare command line would bring back a
silent run, so the resume command wraps the same command line::

    PYTHON [its interpreter options] -c BOOTSTRAP LIB RUN_DIR -- PROGRAM…

``BOOTSTRAP`` puts ``LIB`` (the private copy of this package) on ``sys.path``
and calls :func:`main`, which attaches telemetry to ``RUN_DIR`` (a ``resume``
event), arranges for :meth:`Telemetry.watch_trainer` to see the speculators
Trainer when its ``run_training`` starts, and runs ``PROGRAM`` as Python would:
``script.py args``, ``-m module args`` or ``-c code args``, with the same
``sys.argv``, ``sys.path[0]`` and ``__main__``. Its exit status is the
program's.

Standard library only, Python 3.8+.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import runpy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

TRAINER_MODULE = "speculators.train.trainer"
BOOTSTRAP = (
    "import sys;sys.path.insert(0,sys.argv[1]);from eagle3_tui.telemetry.rerun import main;main()"
)
"""The ``-c`` program of a resume command (``sys.argv[1]`` is the package's directory)."""

_WITH_ARG = frozenset("XW")
_LONG_WITH_ARG = frozenset({"--check-hash-based-pycs"})


def split_python_argv(argv: list[str]) -> tuple[list[str], list[str]] | None:
    """``PYTHON OPTIONS… PROGRAM…`` split into (``[PYTHON, OPTIONS…]``, ``PROGRAM…``),
    where PROGRAM is ``script args…``, ``-m module args…`` or ``-c code args…``.
    None when there is no program (an interactive interpreter, a script on stdin)."""
    if not argv:
        return None
    head = [argv[0]]
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "-" or a == "--":
            return None
        if not a.startswith("-"):
            return head, argv[i:]
        if a.startswith("--"):
            head.append(a)
            if a in _LONG_WITH_ARG and i + 1 < len(argv):
                head.append(argv[i + 1])
                i += 1
            i += 1
            continue
        j = 1
        while j < len(a):
            ch = a[j]
            if ch in "cm":
                if j > 1:  # -uc CODE: the flags before it are options
                    head.append(a[:j])
                rest = a[j + 1 :]
                if rest:
                    return head, [f"-{ch}", rest, *argv[i + 1 :]]
                if i + 1 >= len(argv):
                    return None
                return head, [f"-{ch}", *argv[i + 1 :]]
            if ch in _WITH_ARG:
                if j > 1:
                    head.append(a[:j])
                if a[j + 1 :]:
                    head.append(f"-{ch}{a[j + 1 :]}")
                elif i + 1 < len(argv):
                    head.extend([f"-{ch}", argv[i + 1]])
                    i += 1
                break
            j += 1
        else:
            head.append(a)
        i += 1
    return None


def resume_command(
    argv: list[str], lib: str, run_dir: str, python: str | None = None
) -> list[str] | None:
    """The command that relaunches ``argv`` with telemetry in ``run_dir`` (None when
    ``argv`` runs no program). ``python`` replaces a relative ``argv[0]``."""
    split = split_python_argv(argv)
    if split is None:
        return None
    head, program = split
    if python and not os.path.isabs(head[0]):
        head = [python, *head[1:]]
    return [*head, "-c", BOOTSTRAP, lib, run_dir, "--", *program]


_TORCHRUN_ENTRY_FLAGS = frozenset(
    {"-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path"}
)
"""torchrun's flags that say how it starts a rank's program (the command below says it
anew)."""


def torchrun_resume_command(
    agent_argv: list[str], rank_argv: list[str], lib: str, run_dir: str
) -> list[str] | None:
    """The torchrun agent's own command (``torchrun`` stays ``torchrun``: the same
    options, number of processes, rendezvous) whose ranks each run their program under
    the bootstrap, so that every rank has telemetry from its first line.

    torchrun starts each rank as ``PYTHON -u [-m] PROGRAM ARGS`` (``--no-python``:
    ``PROGRAM ARGS`` as given), so the agent's command ends with the rank's program:
    that part becomes ``--no-python PYTHON -u -c BOOTSTRAP LIB RUN_DIR -- [-m] PROGRAM
    ARGS`` (:func:`resume_command` of a rank's own command line). None when a rank runs
    no Python program or the agent's command does not end with the rank's."""
    rank = resume_command(rank_argv, lib, run_dir)
    split = split_python_argv(agent_argv)
    if rank is None or split is None:
        return None
    head, program = split
    entry = 2 if program[0] == "-m" else 1  # -m torch.distributed.run, or the torchrun script
    options = program[entry:]
    shared = 0
    while (
        shared < min(len(options), len(rank_argv))
        and options[-1 - shared] == rank_argv[-1 - shared]
    ):
        shared += 1
    if shared == 0:
        return None
    own = [a for a in options[: len(options) - shared] if a not in _TORCHRUN_ENTRY_FLAGS]
    return [*head, *program[:entry], *own, "--no-python", *rank]


def _watch_trainer(on_trainer: Callable[[Any], None]) -> None:
    """Call ``on_trainer(trainer)`` when a speculators Trainer starts ``run_training``:
    patched in when ``speculators.train.trainer`` is imported (never imported here)."""

    def patch(module: Any) -> None:
        cls = getattr(module, "Trainer", None)
        original = getattr(cls, "run_training", None)
        if cls is None or original is None:
            return

        @functools.wraps(original)
        def run_training(self: Any, *args: Any, **kwargs: Any) -> Any:
            with contextlib.suppress(Exception):  # never into the trainer
                on_trainer(self)
            return original(self, *args, **kwargs)

        cls.run_training = run_training

    loaded = sys.modules.get(TRAINER_MODULE)
    if loaded is not None:
        patch(loaded)
        return

    class Finder:
        """A one-shot meta path finder: lets the import happen, then patches."""

        @staticmethod
        def find_spec(name: str, path: Any = None, target: Any = None) -> Any:
            if name != TRAINER_MODULE:
                return None
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(Finder)
            spec = importlib.util.find_spec(name)
            loader = getattr(spec, "loader", None)
            exec_module = getattr(loader, "exec_module", None)
            if exec_module is None:
                return spec

            def exec_and_patch(module: Any) -> None:
                exec_module(module)
                with contextlib.suppress(Exception):
                    patch(module)

            loader.exec_module = exec_and_patch  # type: ignore[union-attr]
            return spec

    sys.meta_path.insert(0, Finder)


def _own_command() -> list[str]:
    try:
        raw = Path("/proc/self/cmdline").read_bytes()
        return [os.fsdecode(a) for a in raw.split(b"\0")[:-1]]
    except OSError:
        return list(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))


def main(argv: list[str] | None = None) -> None:
    """``LIB RUN_DIR -- PROGRAM…`` (``sys.argv[1:]`` of the bootstrap)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 4 or args[2] != "--":
        sys.exit("usage: python -c BOOTSTRAP LIB RUN_DIR -- (script | -m module | -c code) ...")
    lib, run_dir, program = args[0], args[1], args[3:]
    if lib in sys.path:  # the package's directory stays off the program's path
        sys.path.remove(lib)
    from eagle3_tui.telemetry import attach

    telemetry = attach(run_dir, resume_command=_own_command())
    _watch_trainer(telemetry.watch_trainer)
    if program[0] == "-m":
        sys.argv = ["-m", *program[2:]]
        if not sys.path or sys.path[0] != os.getcwd():
            sys.path.insert(0, os.getcwd())
        runpy.run_module(program[1], run_name="__main__", alter_sys=True)
    elif program[0] == "-c":
        sys.argv = ["-c", *program[2:]]
        main_module = type(sys)("__main__")
        main_module.__dict__["__builtins__"] = __builtins__
        sys.modules["__main__"] = main_module
        exec(compile(program[1], "<string>", "exec"), main_module.__dict__)
    else:
        script = program[0]
        sys.argv = list(program)
        sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python script.py` sets it
        runpy.run_path(script, run_name="__main__")
