"""A run directory given as a command's input, checked before anything is read: the same
one-line answer on this machine and on a host over SSH.

Standard library only, Python 3.8: the agent imports it on the host, and the client's
local target (``transport/local.py``) does the same check here. A directory that may not
be listed or entered, a ``run.json`` or ``metrics.jsonl`` that may not be opened: no
permission (with the mode and owner that refuse it). A file where the directory should
be, a directory, FIFO or device where a run file should be, a link to nothing: not what
it must be. A path that does not exist is left to the caller, which says what it missed.
"""

from __future__ import annotations

import errno
import os
import stat

from eagle3_tui.agent.frames import AgentError
from eagle3_tui.agent.names import ERR_MISSING, ERR_PERMISSION, ERR_WRONG_KIND
from eagle3_tui.telemetry.safefs import (
    O_DIRECTORY,
    UnsafeFileError,
    kind_of,
    user_name,
)
from eagle3_tui.telemetry.schema import MANIFEST_FILE, METRICS_FILE


class BadInputError(AgentError):
    """Why an input cannot be read as it is: ``kind`` is one of the agent's error kinds
    (``permission``, ``wrong_kind``, ``missing``), the message one line naming the path;
    in the agent, the operation's one-line error."""


def refusal_mode(path: str) -> str:
    """`` (mode 000, owner alice)``: what refuses the reader; its directory's, when the
    file cannot even be seen (nothing when neither can)."""
    parent = os.path.dirname(os.path.normpath(path)) or "."
    for where, whose in ((path, ""), (parent, "its directory ")):
        try:
            st = os.stat(where)
        except OSError:
            continue
        named = whose + where + ": " if whose else ""
        return f" ({named}mode {stat.S_IMODE(st.st_mode):03o}, owner {user_name(st.st_uid)})"
    return ""


def input_problem(path: str, e: OSError) -> BadInputError:
    """The one-line problem for an input the system refused with ``e``."""
    if isinstance(e, UnsafeFileError):
        return BadInputError(ERR_WRONG_KIND, str(e))
    if e.errno in (errno.EACCES, errno.EPERM):
        return BadInputError(ERR_PERMISSION, f"{path}: permission denied{refusal_mode(path)}")
    if e.errno in (errno.ENOTDIR, errno.EISDIR, errno.ELOOP, errno.ENXIO):
        return BadInputError(ERR_WRONG_KIND, f"{path}: {e.strerror}")
    if e.errno == errno.ENOENT:
        return BadInputError(ERR_MISSING, f"{path}: no such file or directory")
    return BadInputError(ERR_MISSING, f"{path}: {e.strerror or e}")


def check_input(path: str) -> None:
    """``path`` as this user can read it, or :class:`BadInputError`. Nothing is read but
        the directory's entry and two files' modes and permissions; no file is opened (a link
    another user planted in a shared directory may name a device whose open does
    something, and the agent may be root)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise input_problem(path, e) from None
    if not stat.S_ISDIR(st.st_mode):
        raise BadInputError(ERR_WRONG_KIND, f"{path}: is {kind_of(st.st_mode)}, not a directory")
    try:
        os.close(os.open(path, os.O_RDONLY | O_DIRECTORY))
    except OSError as e:
        raise input_problem(path, e) from None
    for name in (MANIFEST_FILE, METRICS_FILE):
        file = os.path.join(path, name)
        try:
            at = os.lstat(file)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise input_problem(path, e) from None  # the directory may not be entered
        try:
            st = os.stat(file)  # never opened: a link another user planted may name a device
        except FileNotFoundError:
            raise BadInputError(
                ERR_WRONG_KIND,
                f"{file}: is a symbolic link to {_link(file)}, which does not exist",
            ) from None
        except OSError as e:
            raise input_problem(file, e) from None
        if not stat.S_ISREG(st.st_mode):
            raise BadInputError(
                ERR_WRONG_KIND, f"{file}: is {kind_of(st.st_mode)}, not a regular file"
            )
        if stat.S_ISLNK(at.st_mode) and _borrowed(at, st):
            raise BadInputError(
                ERR_PERMISSION,
                f"{file}: is a symbolic link of user {user_name(at.st_uid)} to "
                f"{_link(file)}, a file of user {user_name(st.st_uid)} that they may not "
                "read: not followed (read it at its own path, as its owner)",
            )
        if not os.access(file, os.R_OK):
            raise input_problem(file, PermissionError(errno.EACCES, "permission denied"))


def _borrowed(link: os.stat_result, target: os.stat_result) -> bool:
    """A link another user made to a file of someone else's that its maker may not read
    (not for every user to read): read through it, root would show them what it holds."""
    if link.st_uid in (0, target.st_uid):
        return False
    return not target.st_mode & stat.S_IROTH


def _link(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None
