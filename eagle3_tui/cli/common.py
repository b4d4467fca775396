"""What every command shares: its parser's pieces (TARGET, ``--pid``, ssh's options,
``--json``), and printing (every line through :func:`say`, inert and pipe-safe)."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from eagle3_tui import __version__, exits
from eagle3_tui.model.inert import json_ascii, printable
from eagle3_tui.transport.base import TargetError

if TYPE_CHECKING:
    from eagle3_tui.transport.target import SshOptions, Target

# 21 and 25 (eagle3_tui/exits.py): a local input this user may not read, or of the wrong
# kind; every command that reads a run says them in its help, in these words:
INPUT_EXITS = (
    "21 no permission (a run directory, its metrics.jsonl or run.json this user may not "
    "read, or another user's process), 25 not what it should be (a file for a run "
    "directory; a directory, FIFO, device or dangling link for metrics.jsonl or run.json)"
)


def version() -> str:
    return f"eagle3-tui {__version__}"


class Parser(argparse.ArgumentParser):
    """argparse's parser with its usage errors on one line: what is wrong and where the
    help is (argparse's own puts a usage synopsis of up to six lines first)."""

    def error(self, message: str) -> NoReturn:
        say(f"{self.prog}: {message} (see {self.prog} --help)", err=True)
        raise SystemExit(exits.ERROR)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[Any, list[str]]:
        """argparse's, but an option this command does not have is an error naming that
        option alone: argparse's "unrecognized arguments: --ssh-client HOST:DIR" named
        the TARGET too, after taking the option's value for it."""
        given = list(sys.argv[1:] if args is None else args)
        ns, extras = super().parse_known_args(given, namespace)
        before = given[: given.index("--")] if "--" in given else given  # after: positional
        unknown = [
            a.partition("=")[0] if a.startswith("--") else a
            for a in extras
            if _looks_like_option(a) and a in before
        ]
        if unknown:
            s = "s" if len(unknown) > 1 else ""
            self.error(f"unknown option{s} {', '.join(dict.fromkeys(unknown))}")
        return ns, extras


def _looks_like_option(arg: str) -> bool:
    """``-x``, ``--name``, ``--name=VALUE``; not ``-`` nor a negative number."""
    return len(arg) > 1 and arg.startswith("-") and not (arg[1].isdigit() or arg[1] == ".")


def process_id(text: str) -> int:
    """A ``--pid``: a whole number from 1 (``-5``, ``0`` or ``abc`` are a usage error,
    not a process that 'has exited')."""
    try:
        pid = int(text)
    except ValueError:
        pid = 0
    if pid < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a process ID is a whole number from 1")
    return pid


def command_parser(name: str, description: str) -> argparse.ArgumentParser:
    """The parser of ``eagle3-tui NAME``."""
    return Parser(prog=f"eagle3-tui {name}", description=description)


def add_json_and_ssh_options(p: argparse.ArgumentParser, json_help: str) -> argparse.ArgumentParser:
    """A command's last options: ``--json`` (what its JSON object is), then ssh's."""
    p.add_argument("--json", action="store_true", help=json_help)
    add_ssh_options(p)
    return p


def seconds(text: str) -> float:
    """A duration option's value: a finite number of seconds, 0 or more (``-1``, ``nan``
    or ``inf`` are a usage error, not a grace that SIGKILLs at once or never)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text!r}: a number of seconds, 0 or more")
    return value


def add_seconds_option(
    p: argparse.ArgumentParser, flag: str, default: float | None, help: str
) -> None:
    """An option that is a duration (``--grace``, ``--wait``)."""
    p.add_argument(flag, type=seconds, default=default, metavar="SECONDS", help=help)


def add_pid_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--pid",
        type=process_id,
        metavar="PID",
        help="the training process PID on the target's host (a trainer, its torchrun agent, "
        "a rank or a worker: its training); without TARGET, on this machine",
    )


def add_ssh_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("SSH options (for a HOST target; as in ssh)")
    g.add_argument("-p", dest="port", metavar="PORT", help="port on the host")
    g.add_argument(
        "-i", dest="identity", action="append", default=[], metavar="KEY", help="private key file"
    )
    g.add_argument(
        "-J", dest="jump", metavar="[USER@]HOST[:PORT]", help="jump host(s), comma-separated"
    )
    g.add_argument(
        "-F", dest="ssh_config", metavar="FILE", help="ssh config file (default ~/.ssh/config)"
    )
    g.add_argument("-l", dest="login", metavar="USER", help="user to log in as")
    g.add_argument(
        "-o",
        dest="ssh_option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an ssh option, e.g. StrictHostKeyChecking=accept-new to record an unknown host key",
    )
    g.add_argument(
        "--remote-python",
        default="python3",
        metavar="PATH",
        help="the interpreter that runs eagle3-tui's agent on the host (default python3)",
    )


def ssh_options(ns: argparse.Namespace) -> SshOptions:
    from eagle3_tui.transport.target import SshOptions, parse_port

    opts = SshOptions(remote_python=ns.remote_python)
    for text in ns.ssh_option:
        opts = opts.with_option(text)
    if ns.ssh_config is not None:
        if not os.path.isfile(ns.ssh_config):
            raise TargetError(f"-F {ns.ssh_config}: no such file")
        opts = replace(opts, config=(ns.ssh_config,))
    if ns.port is not None:
        opts = replace(opts, port=parse_port(ns.port))
    if ns.login is not None:
        opts = replace(opts, user=ns.login)
    if ns.identity:
        keys = tuple(os.path.expanduser(k) for k in ns.identity)
        opts = replace(opts, identities=keys + opts.identities)
    if ns.jump is not None:
        opts = replace(opts, jump=ns.jump)
    return opts


def cli_target(ns: argparse.Namespace) -> Target:
    """The command's TARGET; with --pid and no TARGET, this machine."""
    from eagle3_tui.transport.target import LocalTarget, parse_target

    if ns.target is None:
        if getattr(ns, "pid", None) is None:
            raise TargetError(
                "a TARGET is needed (a run directory, or [USER@]HOST[:DIR]), or --pid PID"
            )
        return LocalTarget(Path("."))  # --pid decides: see choose()
    return parse_target(ns.target, ssh_options(ns))


def say(text: str, *, err: bool = False) -> None:
    """Print ``text`` for a terminal and for a reader that may go away (``| head -1``).

    Every line a command prints goes through here, and what it quotes of a run (argv,
    a working directory, a path, a log line, an error naming one) is inert: every
    character a terminal would act on (ESC, BEL, C1 controls, bidi overrides, line
    separators) is shown escaped (``\\x1b``, ``\\u202e``, see ``model/inert.py``);
    only the report's own newlines stay. When the reader has gone, the rest of the
    output is dropped and the command still finishes, with its own exit status."""
    stream = sys.stderr if err else sys.stdout
    try:
        print(printable(text, keep="\n"), file=stream, flush=True)
    except OSError:  # a closed pipe (EPIPE), a closed terminal (EIO): nobody reads
        drop_output(stream)


def say_json(text: str) -> None:
    """Print a JSON text (``--json``): every character outside printable ASCII written
    as its ``\\uXXXX`` escape, so the value is the same and a terminal shows it inert."""
    say(json_ascii(text))


def drop_output(stream: Any) -> None:
    """Point the stream's descriptor at /dev/null: what is buffered and what follows
    is discarded quietly (no ``BrokenPipeError`` again at exit)."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def say_chosen(note: object) -> None:
    """What was chosen, on stderr (headless commands)."""
    if note:
        say(f"eagle3-tui: {printable(str(note))}", err=True)


_last_progress: list[str] = [""]
"""The last progress line printed: the same again is not (a kill's wait for a step
boundary says it is asking at every look: 12-23 times the same line in a log)."""


def print_progress(event: Any, prefix: str = "") -> None:
    from eagle3_tui.reports import format_progress

    line = format_progress(event)
    if line is not None and prefix + line != _last_progress[0]:
        _last_progress[0] = prefix + line
        say(prefix + line, err=True)
