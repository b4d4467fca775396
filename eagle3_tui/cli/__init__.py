"""Command line: ``eagle3-tui TARGET``, ``demo``, ``summary``, ``compare``, ``kill``,
``resume``, ``runs``, ``attach``, ``watch``, ``fleet``: one module per command, each a
thin layer over :mod:`eagle3_tui.api` (parse, call, print, exit status).

A TARGET is a local run directory or ``[USER@]HOST[:RUN_DIR]`` reached over SSH
with ssh's own options (``-p``, ``-i``, ``-J``, ``-F``, ``-o``) and files
(``~/.ssh/config``, ``known_hosts``, ssh-agent).

Every failure a user can cause (a missing run, a bad flag) ends with one line on
stderr and a non-zero exit status (``eagle3_tui/exits.py``), never a traceback.

A command's module is imported when that command runs, and it imports the API (the
model, numpy, the transport) only inside ``run``: ``--help`` and ``--version`` start
without them (tests/test_layering.py).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Collection, Sequence
from types import ModuleType

from eagle3_tui import exits, heap
from eagle3_tui.cli.common import drop_output, say
from eagle3_tui.model.inert import printable
from eagle3_tui.transport.base import TargetError

COMMANDS = ("demo", "summary", "kill", "resume", "runs", "attach", "compare", "watch", "fleet")
"""Each is the module ``eagle3_tui.cli.<name>``, with ``build_parser()`` and ``run(ns)``;
anything else on the command line is the monitor's TARGET (``cli/monitor.py``)."""


def command(name: str) -> ModuleType:
    """The module of a command (``monitor`` for the monitor)."""
    return importlib.import_module(f"eagle3_tui.cli.{name}")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return _command(args)
    except BrokenPipeError:  # argparse's own writes (--help, usage) into a closed pipe
        drop_output(sys.stdout)
        return exits.OK
    finally:
        for stream in (sys.stdout, sys.stderr):  # argparse's help is printed unflushed
            try:
                stream.flush()
            except BrokenPipeError:
                drop_output(stream)
            except (OSError, ValueError):
                pass


def _command(args: list[str]) -> int:
    heap.keep_large_blocks_apart()  # a command may read a long run; the monitor then stays
    heap.collect_less()
    try:
        if args and args[0] in COMMANDS:
            cmd = command(args[0])
            status: int = cmd.run(cmd.build_parser().parse_args(args[1:]))
            return status
        if args and args[0] == "help":  # help, help COMMAND: as --help
            if len(args) > 1 and args[1] in COMMANDS:
                command(args[1]).build_parser().print_help()
            elif len(args) > 1:
                raise TargetError(not_a_command(args[1], COMMANDS) or f"{args[1]}: no such command")
            else:
                command("monitor").build_parser().print_help()
            return exits.OK
        mistyped = not_a_command(args[0], COMMANDS) if args else None
        if mistyped is not None:
            raise TargetError(mistyped)
        monitor = command("monitor")
        status = monitor.run(monitor.build_parser().parse_args(args))
        return status
    except TargetError as e:
        from eagle3_tui.reports import exit_status_of

        say(f"eagle3-tui: {printable(str(e))}", err=True)
        return exit_status_of(e)
    except KeyboardInterrupt:
        return exits.INTERRUPTED


def not_a_command(word: str, commands: Collection[str]) -> str | None:
    """What to say of a first word that is no command, no directory here and no host
    written as one (``sumary``: 'did you mean eagle3-tui summary?'), where it reads as a
    command mistyped; None when it is none of those (a host name is a TARGET). A host
    whose name is that close to a command is written ``HOST:`` or ``USER@HOST``."""
    import difflib

    if word.startswith("-") or os.path.lexists(word) or any(c in word for c in "/:@.~["):
        return None
    if any(c.isdigit() for c in word):  # node0, gpu12: host names, never a command's typo
        return None
    meant = difflib.get_close_matches(word, [*commands, "help"], n=1, cutoff=0.75)
    if not meant:
        return None
    return (
        f"{word!r} is not a command: did you mean 'eagle3-tui {meant[0]}'? "
        f"(to monitor a host of that name: eagle3-tui {word}:)"
    )
