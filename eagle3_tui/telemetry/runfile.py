"""``metrics.jsonl`` as one writer appends to it: opened safely, watched, made again.

The run directory is shared with whoever may write there (root runs the training on a
shared host). So the writer's file is opened with :func:`safefs.open_append` (never
through a link, never another user's file, a hard link or a FIFO), and it is watched:
something planted at the path at the start is moved aside; a file deleted, moved away,
replaced or truncated while the run writes is noticed before the next write. Each
change becomes a :class:`FileChange`, which the writer writes as the ``file`` event,
the first line of the file it then writes to.

Two processes of one run append to the same file (the trainer and its sampler sidecar,
or several ranks). When both notice a deletion, ``O_EXCL`` decides which one makes the
new file; the other finds it made and adopts it, knowing it by its first line: a
``file`` event of the same run id. A file of anything else is moved aside
(``metrics.jsonl.replaced-<YYYYmmdd-HHMMSS>-<6 hex>``), never appended to.

What it costs the writer: one ``fstat`` of its descriptor per write (which it made
anyway to notice a descriptor closed behind its back): a deletion (no link left), a
rename over the file and a truncation (smaller than this writer's last write's end) are
seen there at once; one ``lstat`` of the path at most every :data:`CHECK_S` (the file
moved away, or another put in its place while ours still has a name), and on close.

Standard library only, Python 3.8+ (runs inside the trainer).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable  # noqa: UP035 (Python 3.8 on the host)

from eagle3_tui.telemetry.parsing import parse_json
from eagle3_tui.telemetry.safefs import (
    UnsafeFileError,
    create_exclusive,
    describe_entry,
    move_aside,
    open_append,
    open_regular,
)

CHECK_S = 1.0
"""The path is looked at (an ``lstat``) at most this often; the descriptor every write."""
RETRY_S = 1.0
"""A file that could not be opened or made is tried again this often."""
FIRST_LINE_MAX = 64 << 10
"""How much of a file found at the path is read to know it by its first line."""
ADOPT_WAIT_S = 0.5
"""How long a file just made by a sibling writer may stay without its first line (it is
written right after the ``O_EXCL`` create; an empty file after this is nobody's)."""
FILE_MODE = 0o644

ADOPTED, EMPTY, AGAIN = "adopted", "empty", "again"
"""What :meth:`RunFile._examine` made of a file found at the path."""


@dataclass
class FileChange:
    """What happened to the file under the writer: the facts of its ``file`` event."""

    change: str
    """``deleted`` (nothing at the path: deleted or moved away), ``replaced`` (another
    file there), ``truncated`` (ours, shorter than we wrote it), ``refused`` (at the start:
    a link, a FIFO, another user's file, a hard link)."""
    noticed: float
    previous: tuple[int, int, int] | None
    """(device, inode, size) of what was there when last seen."""
    moved_to: str | None = None
    """Where the foreign entry was moved (replaced and refused only)."""
    found: str | None = None
    """What was refused, in words: ``a symbolic link to /root/secret``."""
    adopted: bool = False
    """The new file was made by a sibling writer of the run (which wrote the event)."""

    def payload(self, run_id: str | None, name: str, written_before: int) -> dict[str, Any]:
        """The ``file`` event's fields (kind ``lifecycle``)."""
        out: dict[str, Any] = {
            "event": "file",
            "change": self.change,
            "run_id": run_id,
            "file": name,
            "noticed": self.noticed,
        }
        if self.previous is not None:
            dev, ino, size = self.previous
            out["previous"] = {"identity": f"{dev}:{ino}", "size": size}
        if self.moved_to is not None:
            out["moved_to"] = os.path.basename(self.moved_to)
        if self.found is not None:
            out["found"] = self.found
        out["written_before"] = written_before
        return out


class RunFile:
    """The file one writer appends to, and what it has noticed happen to it.

    ``fd`` is None while no file may be written (the refusal or error in
    :attr:`problem`, also said once on stderr): the writer counts its records as not
    written. ``on_error`` counts each failure by name (the writer's error counts),
    ``on_reopened`` each time the same file is opened again."""

    def __init__(
        self,
        path: str,
        run_id: str | None,
        clock: Callable[[], float],
        on_error: Callable[[BaseException | str], None],
        on_reopened: Callable[[], None],
    ) -> None:
        self.path = path
        self.run_id = run_id
        self._clock = clock
        self._on_error = on_error
        self._on_reopened = on_reopened
        self.fd: int | None = None
        self.ident: tuple[int, int] | None = None
        self.end = 0
        """Where this writer's last write ended: the file shorter than this was truncated."""
        self.size = 0
        """The file's size when last looked at."""
        self.cut_mid = False
        """The file was found truncated in the middle of a line (``truncate -s``): the
        next write starts with a newline, so its line is not glued onto that one."""
        self.problem = ""
        """Why no file is open: the reason the records are counted as not written."""
        self.said = ""
        """The one line said on stderr when the file could not be written ('' before)."""
        self._pending: FileChange | None = None
        """A change noticed whose new file could not be made yet (tried again)."""
        self._check_at = 0.0
        self._retry_at = 0.0

    # ---- before each write ----------------------------------------------------------
    def verify(self, force: bool = False) -> FileChange | None:
        """Is the descriptor still the file at the path, and whole? Called before each
        write (``force``: look at the path now, not at most every :data:`CHECK_S`).
        Returns the change handled (the file now open is new: its ``file`` event goes
        first, unless ``adopted``), or None (nothing changed, or no file to write)."""
        now = time.monotonic()
        fd = self.fd
        if fd is not None:
            try:
                st = os.fstat(fd)
            except OSError as e:  # closed behind our back (a library closing descriptors)
                self._on_error(e)
                self.fd = None
            else:
                if (st.st_dev, st.st_ino) != self.ident:
                    self._on_error("fd_replaced")  # the number reused: not ours to close
                    self.fd = None
                elif st.st_nlink and st.st_size >= self.end and now < self._check_at and not force:
                    self.size = st.st_size
                    return None
                else:
                    self._check_at = now + CHECK_S
                    return self._look(st)
        if force or now >= self._retry_at:
            return self._reopen()
        return None

    def wrote(self, n: int) -> tuple[int | None, FileChange | None]:
        """After ``n`` bytes were appended: the offset they start at (None if it cannot be
        told), and a truncation they reveal (they landed below the end of this writer's
        previous write: the file shrank, though another writer's appends hid it)."""
        assert self.fd is not None and self.ident is not None
        try:
            end = os.lseek(self.fd, 0, os.SEEK_CUR)  # O_APPEND: the end of this write
        except OSError as e:
            self._on_error(e)
            return None, None
        start = end - n
        change = None
        if start < self.end:
            change = FileChange("truncated", self._clock(), (*self.ident, max(self.size, self.end)))
        self.end = end
        self.size = max(self.size, end) if change is None else end
        return start, change

    def ends_mid_line(self) -> bool:
        """Whether the file ends in another writer's torn line: bytes appended since this
        writer's last write (a sibling's) whose last is not a newline — a line that
        writer could not end (a full disk), which our next line must not be glued onto.
        A one-byte read, only when someone else wrote since (the size seen before this
        write differs from the end of our last one). Asked by a writer coming back from
        failed writes only: a sibling's write still being copied in (the size grows page
        by page while it is) can look torn too, and a newline then is a blank line."""
        if self.fd is None or self.size == 0 or self.size == self.end:
            return False
        try:
            return os.pread(self.fd, 1, self.size - 1) != b"\n"
        except OSError:
            return False

    def lost(self) -> None:
        """The descriptor was found closed (EBADF on write): opened again next time."""
        self.fd = None

    def close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)

    # ---- noticing ---------------------------------------------------------------------
    def _look(self, st: os.stat_result) -> FileChange | None:
        """Our file (its stat ``st``) against what the path names now."""
        assert self.ident is not None
        previous = (*self.ident, st.st_size if st.st_nlink == 0 else max(self.size, st.st_size))
        try:
            at = os.lstat(self.path)
        except FileNotFoundError:
            return self._take_over(FileChange("deleted", self._clock(), previous))
        except OSError as e:  # the path cannot be looked at (a directory above): carry on
            self._on_error(e)
            self.size = st.st_size
            return None
        if (at.st_dev, at.st_ino) != self.ident:
            return self._take_over(FileChange("replaced", self._clock(), previous))
        if st.st_size < self.end:
            change = FileChange("truncated", self._clock(), (*self.ident, max(self.size, self.end)))
            self.end = self.size = st.st_size
            try:
                last = (
                    os.pread(self.fd, 1, st.st_size - 1)
                    if self.fd is not None and st.st_size
                    else b"\n"
                )
                self.cut_mid = last != b"\n"
            except OSError:
                self.cut_mid = False
            return change
        self.size = st.st_size
        return None

    def _reopen(self) -> FileChange | None:
        """No descriptor: the first open, a change whose file could not be made yet, or a
        descriptor closed behind our back (the same file again, if it is still there)."""
        if self._pending is not None:
            return self._take_over(self._pending)
        if self.ident is None:
            return self._first_open()
        previous = (*self.ident, self.size)
        try:
            at = os.lstat(self.path)
        except FileNotFoundError:
            return self._take_over(FileChange("deleted", self._clock(), previous))
        except OSError as e:
            return self._cannot(None, e)
        if (at.st_dev, at.st_ino) == self.ident and stat.S_ISREG(at.st_mode):
            try:
                fd, _ = open_append(self.path, FILE_MODE)
            except OSError as e:
                return self._cannot(None, e)
            if self._use(fd, self.ident, again=True):
                self._on_reopened()  # the same file, its descriptor closed behind our back
                return None
        return self._take_over(FileChange("replaced", self._clock(), previous))

    def _first_open(self) -> FileChange | None:
        """Open the path to append; what is there and may not be written (a link, a FIFO,
        another user's file, a hard link) is moved aside and our own file made."""
        for _ in range(3):
            try:
                fd, _ = open_append(self.path, FILE_MODE)
            except UnsafeFileError:
                pass
            except OSError as e:  # a directory, no permission, no directory
                return self._cannot(None, e)
            else:
                self._use(fd)
                return None
            try:
                found = describe_entry(self.path)
                st = os.lstat(self.path)
            except FileNotFoundError:
                continue  # gone meanwhile: open again
            except OSError as e:
                return self._cannot(None, e)
            change = FileChange(
                "refused", self._clock(), (st.st_dev, st.st_ino, st.st_size), found=found
            )
            try:
                change.moved_to = move_aside(self.path, "refused", (st.st_dev, st.st_ino))
            except UnsafeFileError as e:
                if e.errno == errno.EAGAIN:
                    continue  # replaced while being moved: look again
                return self._cannot(change, e)
            except OSError as e:  # a directory we may not write: nothing written
                return self._cannot(change, e)
            return self._take_over(change)
        return self._cannot(None, UnsafeFileError(self.path, "keeps changing", errno.EAGAIN))

    def _take_over(self, change: FileChange) -> FileChange | None:
        """Make the path this run's file again after ``change``: created exclusively (its
        event goes first), or a sibling writer's new file adopted (``change.adopted``: its
        maker wrote the event); a stranger's file is moved aside first."""
        if self.fd is not None:
            old, self.fd = self.fd, None
            try:
                os.close(old)  # our old file: its name is gone or another's
            except OSError as e:
                self._on_error(e)
        for _ in range(4):
            try:
                fd = create_exclusive(self.path, FILE_MODE, os.O_APPEND)
            except FileExistsError:
                try:
                    got = self._examine(change)
                except OSError as e:
                    return self._cannot(change, e)
                if got == AGAIN:
                    continue
                change.adopted = got == ADOPTED
                return change
            except OSError as e:
                return self._cannot(change, e)
            self._use(fd)
            return change
        again = UnsafeFileError(self.path, "keeps being replaced", errno.EAGAIN)
        return self._cannot(change, again)

    def _examine(self, change: FileChange) -> str:
        """A file someone made at the path: this run's (a regular file of ours whose first
        line is a ``file`` event of this run id: a sibling writer made it), adopted:
        ADOPTED; an empty file of ours, adopted (its first line will be our event):
        EMPTY; anything else is moved aside (``change`` says where): AGAIN."""
        try:
            rfd, st = open_regular(self.path, follow=False)
        except FileNotFoundError:
            return AGAIN
        except UnsafeFileError:  # a link, a FIFO, a device: not read, moved aside
            st = os.lstat(self.path)
            first: bytes | None = None
        else:
            try:
                first = _first_line(rfd)
            finally:
                os.close(rfd)
        ident = (st.st_dev, st.st_ino)
        ours = stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_nlink == 1
        event = self._event_of_this_run(first) if first else None
        if ours and (first == b"" or event is not None):
            fd, _ = open_append(self.path, FILE_MODE)
            if not self._use(fd, ident):
                return AGAIN
            if event is None:
                return EMPTY
            if event.get("change") in ("deleted", "replaced", "truncated", "refused"):
                change.change = event["change"]  # what its maker saw happen, and did
            moved = event.get("moved_to")
            if isinstance(moved, str) and moved and os.sep not in moved:
                change.moved_to = os.path.join(os.path.dirname(self.path), moved)
            return ADOPTED
        tag = "refused" if change.change == "refused" else "replaced"
        if change.change == "deleted":
            change.change = "replaced"
        try:
            moved = move_aside(self.path, tag, ident)
        except UnsafeFileError as e:
            if e.errno != errno.EAGAIN:
                raise
            return AGAIN
        if change.moved_to is None:
            change.moved_to = moved
        return AGAIN

    def _event_of_this_run(self, line: bytes) -> dict[str, Any] | None:
        """``line`` as a ``file`` event of this run, or None (never without a run id)."""
        if self.run_id is None:
            return None
        try:
            rec = parse_json(line)
        except ValueError:
            return None
        if (
            isinstance(rec, dict)
            and rec.get("kind") == "lifecycle"
            and rec.get("event") == "file"
            and rec.get("run_id") == self.run_id
        ):
            return rec
        return None

    def _use(self, fd: int, expect: tuple[int, int] | None = None, again: bool = False) -> bool:
        """Write to ``fd`` from now on (if it is the file ``expect``; else it is closed
        and False). ``again``: the same file as before (where our writes ended holds);
        else a new one, even with the old one's inode number (reused at once)."""
        st = os.fstat(fd)
        ident = (st.st_dev, st.st_ino)
        if expect is not None and ident != expect:
            os.close(fd)
            return False
        if not again:
            self.end = 0
        self.fd, self.ident, self.size = fd, ident, st.st_size
        self.problem = ""
        self._pending = None
        self._check_at = time.monotonic() + CHECK_S
        return True

    def _cannot(self, change: FileChange | None, e: OSError) -> FileChange | None:
        """No file to write for now (tried again in :data:`RETRY_S`; ``change`` is then
        handled): the reason counted once, and said once on stderr. None: no change yet."""
        self.fd = None
        self._pending = change
        self._retry_at = time.monotonic() + RETRY_S
        why = e.why if isinstance(e, UnsafeFileError) else (e.strerror or str(e))
        if change is not None and change.found is not None:
            why = f"{change.found} is there, not moved aside: {why}"
        name = errno.errorcode.get(e.errno or 0, type(e).__name__)
        if name != self.problem:
            self.problem = name
            self._on_error(e)
        if not self.said:
            self.said = f"{self.path}: {why}"
            line = f"eagle3-tui telemetry: cannot write {self.said}; its records are not written"
            with contextlib.suppress(OSError, ValueError):  # a closed stderr: the count says it
                print(line, file=sys.stderr, flush=True)
        return None


def _first_line(fd: int) -> bytes | None:
    """The first line of the file open as ``fd``, without its newline; ``b""`` when the
    file stays empty for :data:`ADOPT_WAIT_S`, None when it holds no whole first line."""
    deadline = time.monotonic() + ADOPT_WAIT_S
    while True:
        head = os.pread(fd, FIRST_LINE_MAX, 0)
        nl = head.find(b"\n")
        if nl >= 0:
            return head[:nl]
        if len(head) >= FIRST_LINE_MAX or time.monotonic() >= deadline:
            return None if head else b""
        time.sleep(0.01)
