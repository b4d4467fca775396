"""Files another user could have planted: created without following links, read bounded,
trusted only when nobody else could have changed them.

Training hosts are shared and eagle3-tui runs as root there. Everything here assumes
that a path may name a symbolic link, a FIFO, a device or another user's file, put
there on purpose:

* :func:`open_append` and :func:`create_exclusive` never follow a link at the last
  component (``O_NOFOLLOW``), create with ``O_EXCL``, and refuse an existing file
  that is not a regular file of this user with one link (a planted hard link to a
  root-only file, a FIFO that would block the writer);
* :func:`move_aside` renames a refused entry out of the way (a rename never follows a
  link), so that the writer's own file can be created in its place;
* :func:`write_atomic` writes through a temporary file with an unpredictable name,
  created exclusively, then renamed over the target (a link there is replaced, not
  followed);
* :func:`read_bounded` opens without blocking (a FIFO or a device never hangs the
  reader), reads regular files only, and at most ``limit`` bytes;
* :func:`trust_problem` says why a file (and every directory above it) could have
  been changed by someone other than the caller or root.

Each refusal is an :class:`UnsafeFileError` (an ``OSError``) whose message names the
file, its type or its owner: one line a user can act on.

Standard library only, Python 3.8+: imported inside the trainer and by the agent.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
import time
from typing import BinaryIO

O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)

READ_LIMIT = 1 << 20
"""What a bounded read takes at most unless told: 1 MiB (a manifest is ~2 KiB)."""


class UnsafeFileError(OSError):
    """A file refused: a link, not a regular file, another user's, writable by others."""

    def __init__(self, path: object, why: str, code: int = errno.EPERM) -> None:
        super().__init__(code, why, str(path))  # strerror: why; filename: the path
        self.path = str(path)
        self.why = why

    def __str__(self) -> str:
        return f"{self.path}: {self.why}"


def user_name(uid: int) -> str:
    """The login name of ``uid`` (its number when it has none)."""
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return str(uid)


def _group_name(gid: int) -> str:
    try:
        import grp

        return grp.getgrgid(gid).gr_name
    except (KeyError, ImportError):
        return str(gid)


def kind_of(mode: int) -> str:
    """What a file is, in words: ``a FIFO``, ``a character device``, ``a directory``..."""
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _open_error(path: object, e: OSError) -> OSError:
    """``O_NOFOLLOW`` on a link fails with ELOOP: say it in words."""
    if e.errno == errno.ELOOP:
        return UnsafeFileError(path, "is a symbolic link (not followed)", errno.ELOOP)
    return e


def _own_regular(fd: int, path: object, uid: int | None = None) -> os.stat_result:
    """The descriptor's stat, if it is a regular file of ``uid`` (this process's
    effective user) with one link; else :class:`UnsafeFileError`."""
    st = os.fstat(fd)
    uid = os.geteuid() if uid is None else uid
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFileError(path, f"is {kind_of(st.st_mode)}, not a regular file")
    if st.st_uid != uid:
        raise UnsafeFileError(
            path, f"belongs to {user_name(st.st_uid)}, not to {user_name(uid)} (not written)"
        )
    if st.st_nlink > 1:
        raise UnsafeFileError(path, f"has {st.st_nlink} hard links (not written)")
    return st


def _blocking(fd: int) -> None:
    if O_NONBLOCK:
        os.set_blocking(fd, True)


def create_exclusive(path: str | os.PathLike[str], mode: int = 0o644, flags: int = 0) -> int:
    """A new file at ``path`` opened to write and read (``O_CREAT | O_EXCL``: never an
    existing file, never through a link); FileExistsError when something is there."""
    try:
        return os.open(
            path, os.O_RDWR | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC | flags, mode
        )
    except OSError as e:
        raise _open_error(path, e) from None


def open_append(path: str | os.PathLike[str], mode: int = 0o644) -> tuple[int, bool]:
    """``(fd, created)``: ``path`` opened to append, made exclusively when absent.

    An existing entry must be a regular file of this user with one link: a symbolic
    link (never followed), a FIFO or device (opened without blocking, then refused),
    another user's file or a hard link to one raise :class:`UnsafeFileError`."""
    base = os.O_RDWR | os.O_APPEND | O_NOFOLLOW | O_CLOEXEC  # (read: a writer looks at the tail)
    for _ in range(3):  # created and removed meanwhile: try again
        try:
            return os.open(path, base | os.O_CREAT | os.O_EXCL, mode), True
        except FileExistsError:
            pass
        except OSError as e:
            raise _open_error(path, e) from None
        try:
            fd = os.open(path, base | O_NONBLOCK)
        except FileNotFoundError:
            continue
        except OSError as e:
            if e.errno == errno.ENXIO:  # a FIFO nobody reads
                raise UnsafeFileError(path, "is a FIFO, not a regular file") from None
            raise _open_error(path, e) from None
        try:
            _own_regular(fd, path)
            _blocking(fd)
        except BaseException:
            os.close(fd)
            raise
        return fd, False
    raise UnsafeFileError(path, "keeps appearing and disappearing", errno.EAGAIN)


def describe_entry(path: str | os.PathLike[str]) -> str:
    """What is at ``path``, in words, the link itself and not what it names: ``a symbolic
    link to /root/secret``, ``a FIFO``, ``a regular file of alice``, ``a regular file with 2
    hard links``; OSError when nothing is there."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return f"a symbolic link to {os.readlink(path)}"
    if stat.S_ISREG(st.st_mode):
        if st.st_uid != os.geteuid():
            return f"a regular file of {user_name(st.st_uid)}"
        if st.st_nlink > 1:
            return f"a regular file with {st.st_nlink} hard links"
    return kind_of(st.st_mode)


def move_aside(path: str | os.PathLike[str], tag: str, expect: tuple[int, int]) -> str:
    """Rename the entry at ``path`` (a rename never follows a link) to
    ``<path>.<tag>-<YYYYmmdd-HHMMSS>-<6 hex>`` beside it; the new path.

    ``expect`` is the (device, inode) of the entry meant: when what was renamed is
    another one (the path was replaced meanwhile, by a sibling writer, say), it is put
    back where nothing has taken its place since and :class:`UnsafeFileError` (EAGAIN)
    says so: look again."""
    path = os.fspath(path)
    aside = f"{path}.{tag}-{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(3).hex()}"
    if os.path.lexists(aside):  # 16 million names a second: never, but never replace one
        raise FileExistsError(errno.EEXIST, "name taken", aside)
    os.rename(path, aside)
    st = os.lstat(aside)
    if (st.st_dev, st.st_ino) == expect:
        return aside
    with contextlib.suppress(OSError):  # a link (hard, or of the link itself) fails if taken
        os.link(aside, path, follow_symlinks=False)
        os.unlink(aside)
    raise UnsafeFileError(path, "was replaced while being moved aside", errno.EAGAIN)


def claim_append(
    path: str | os.PathLike[str], mode: int = 0o644
) -> tuple[int, str | None, str | None]:
    """``(fd, moved_to, found)``: ``path`` opened to append (:func:`open_append`), or,
    when what is there may not be written (a link, a FIFO, another user's file, a hard
    link), that entry moved aside (:func:`move_aside`, tag ``refused``) and a file of
    our own made in its place; ``found`` says what it was. OSError when neither can be
    done (the directory is not ours to write)."""
    for _ in range(3):
        try:
            fd, _ = open_append(path, mode)
            return fd, None, None
        except UnsafeFileError:
            pass
        try:
            found = describe_entry(path)
            st = os.lstat(path)
        except FileNotFoundError:
            continue  # gone meanwhile: open again
        try:
            moved = move_aside(path, "refused", (st.st_dev, st.st_ino))
        except UnsafeFileError as e:
            if e.errno == errno.EAGAIN:
                continue
            raise
        try:
            return create_exclusive(path, mode, os.O_APPEND), moved, found
        except FileExistsError:
            continue
    raise UnsafeFileError(path, "keeps changing", errno.EAGAIN)


def write_atomic(
    path: str | os.PathLike[str], data: bytes, mode: int = 0o644, fsync: bool = True
) -> None:
    """Replace ``path`` with ``data``: written to an exclusively created temporary file
    of an unpredictable name in the same directory, then renamed (a reader sees the old
    or the new file whole; a link at ``path`` is replaced, never written through)."""
    path = os.fspath(path)
    folder, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder or ".")
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def open_regular(path: str | os.PathLike[str], follow: bool = True) -> tuple[int, os.stat_result]:
    """``path`` opened to read without blocking (a FIFO or device never hangs), if it is
    a regular file; else :class:`UnsafeFileError`. ``follow``: a link at the last component
    is followed to its (regular) target."""
    flags = os.O_RDONLY | O_NONBLOCK | O_CLOEXEC | (0 if follow else O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise _open_error(path, e) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFileError(path, f"is {kind_of(st.st_mode)}, not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def open_file(path: str | os.PathLike[str], follow: bool = True) -> BinaryIO:
    """:func:`open_regular` as a binary file object (``with open_file(p) as f``)."""
    fd, _ = open_regular(path, follow)
    return os.fdopen(fd, "rb")


def read_bounded(
    path: str | os.PathLike[str],
    limit: int = READ_LIMIT,
    tail: bool = False,
    follow: bool = True,
) -> bytes:
    """At most ``limit`` bytes of the regular file ``path`` (its last ones with ``tail``);
    never blocks on a FIFO or device and never reads more than ``limit``. Raises OSError
    (:class:`UnsafeFileError` for a file of the wrong type)."""
    fd, st = open_regular(path, follow)
    try:
        start = max(0, st.st_size - limit) if tail else 0
        chunks = []
        got = 0
        while got < limit:
            data = os.pread(fd, min(limit - got, 1 << 20), start + got)
            if not data:
                break
            chunks.append(data)
            got += len(data)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike[str], limit: int = READ_LIMIT, tail: bool = False) -> str:
    """:func:`read_bounded`, decoded (undecodable bytes replaced)."""
    return read_bounded(path, limit, tail).decode("utf-8", "replace")


def too_big(path: str | os.PathLike[str], limit: int) -> bool:
    """Whether the regular file at ``path`` is larger than ``limit`` bytes."""
    try:
        return os.stat(path).st_size > limit
    except OSError:
        return False


def _group_shared(st: os.stat_result) -> bool:
    """Whether the file's group has members besides its owner (a user private group,
    the owner's own group with nobody else in it, is not shared)."""
    try:
        import grp
        import pwd

        group = grp.getgrgid(st.st_gid)
        owner = pwd.getpwuid(st.st_uid)
    except (KeyError, ImportError):
        return True
    others = [m for m in group.gr_mem if m != owner.pw_name]
    return bool(others) or group.gr_name != owner.pw_name


def owner_problem(path: object, st: os.stat_result, uid: int | None = None) -> str | None:
    """Why ``uid`` (this process's effective user) should not trust the file whose stat
    is ``st``: owned by someone else than ``uid`` or root, or writable by others (a
    directory with the sticky bit, as ``/tmp``, lets nobody replace another's entry)."""
    uid = os.geteuid() if uid is None else uid
    mode = st.st_mode
    if st.st_uid not in (uid, 0):
        whom = "root" if uid == 0 else f"{user_name(uid)} or root"
        return f"{path} belongs to {user_name(st.st_uid)}, not to {whom}"
    sticky = stat.S_ISDIR(mode) and bool(mode & stat.S_ISVTX)
    if mode & stat.S_IWOTH and not sticky:
        return f"{path} is writable by every user"
    if mode & stat.S_IWGRP and not sticky and _group_shared(st):
        return f"{path} is writable by the group {_group_name(st.st_gid)}"
    return None


def trust_problem(
    path: str | os.PathLike[str], uid: int | None = None, chain: bool = True
) -> str | None:
    """Why ``path`` could have been changed by someone other than ``uid`` (this process's
    effective user) or root: the file itself, every symbolic link on the way to it and,
    with ``chain``, every directory above it (a directory another user may write lets
    them replace what is inside). None when nobody else could have; a missing file
    says so."""
    uid = os.geteuid() if uid is None else uid
    path = os.path.abspath(os.fspath(path))
    problem = _link_problem(path, uid)
    if problem is not None:
        return problem
    real = os.path.realpath(path)
    parts = [real]
    if chain:
        up = os.path.dirname(real)
        while True:
            parts.append(up)
            nxt = os.path.dirname(up)
            if nxt == up:
                break
            up = nxt
    for part in parts:
        try:
            st = os.stat(part)
        except OSError as e:
            return f"{part}: {e.strerror or e}"
        problem = owner_problem(part, st, uid)
        if problem is not None:
            return problem
    return None


def _link_problem(path: str, uid: int) -> str | None:
    """The first symbolic link on the way to ``path`` (any component) that someone
    other than ``uid`` or root owns, or a component that cannot be looked at."""
    todo = [p for p in path.split("/") if p]
    cur = "/"
    hops = 0
    while todo:
        name = todo.pop(0)
        if name == ".":
            continue
        if name == "..":
            cur = os.path.dirname(cur)
            continue
        nxt = os.path.join(cur, name)
        try:
            st = os.lstat(nxt)
        except OSError as e:
            return f"{nxt}: {e.strerror or e}"
        if not stat.S_ISLNK(st.st_mode):
            cur = nxt
            continue
        if st.st_uid not in (uid, 0):
            return f"{nxt} is a symbolic link of {user_name(st.st_uid)}"
        hops += 1
        if hops > 40:
            return f"{path}: too many levels of symbolic links"
        target = os.readlink(nxt)
        if target.startswith("/"):
            cur = "/"
        todo = [p for p in target.split("/") if p] + todo
    return None


def foreign_dir_problem(path: str | os.PathLike[str]) -> str | None:
    """Why this user should not write into the directory ``path``: it, a directory above
    it or a link on the way to it belongs to another user than this one or root, who
    could replace or redirect what is written there. None for a directory of ours or
    root's, in directories of ours or root's."""
    path = os.path.abspath(os.fspath(path))
    uid = os.geteuid()
    problem = _link_problem(path, uid)
    if problem is not None:
        return problem
    part = os.path.realpath(path)
    while True:
        try:
            st = os.stat(part)
        except OSError as e:
            return f"{part}: {e.strerror or e}"
        if st.st_uid not in (uid, 0):
            return f"{part} belongs to {user_name(st.st_uid)}"
        up = os.path.dirname(part)
        if up == part:
            return None
        part = up


def private_dir(path: str | os.PathLike[str], mode: int = 0o700) -> None:
    """Make ``path`` (and its parents) a directory of this user; refuse one that is a
    link or belongs to someone else."""
    os.makedirs(path, mode=mode, exist_ok=True)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafeFileError(path, f"is {kind_of(st.st_mode)}, not a directory")
    if st.st_uid != os.geteuid():
        raise UnsafeFileError(path, f"belongs to {user_name(st.st_uid)}")
