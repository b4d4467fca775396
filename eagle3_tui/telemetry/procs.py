"""What ``/proc`` says about the run's processes, read from outside them (Linux).

Every function returns ``None`` or an empty value when the process is gone or
the file is unreadable; none raises. No cooperation from the processes is
needed, so this works for any training script.
"""

from __future__ import annotations

import os
import sys
from typing import NamedTuple

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# Mapped or open files that are code or runtime, not data.
_SKIP_PREFIXES = ("/proc/", "/sys/", "/dev/", "/usr/lib", "/lib", "/usr/share/", "/etc/")
_SKIP_SUFFIXES = (".so", ".pyc", ".py", ".pyd", ".json", ".pth", ".lock")


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None


class ProcStat(NamedTuple):
    """One line of ``/proc/PID/stat``: what identifies, relates and times a process.

    A named tuple, not a dataclass: importing :mod:`dataclasses` (and with it
    :mod:`inspect`, :mod:`ast`, :mod:`dis`) cost each status probe of the agent, a new
    process every time, 15-20 ms of CPU (measured: see transport/bundle.py)."""

    pid: int
    comm: str
    state: str
    ppid: int
    cpu_s: float
    start_ticks: int
    pgrp: int = 0
    session: int = 0

    @property
    def start(self) -> int:
        """The start time in clock ticks since boot (with the boot id: the process's identity)."""
        return self.start_ticks

    @property
    def zombie(self) -> bool:
        return self.state in ("Z", "X")


def _stat_fields(pid: int) -> tuple[str, list[str]] | None:
    """``/proc/PID/stat`` cut once: the command name (it may hold spaces and
    parentheses: it ends at the last ")") and the fields after it (field 3, the
    state, at index 0); None when the process is gone."""
    raw = _read(f"/proc/{pid}/stat")
    close = -1 if raw is None else raw.rfind(")")
    if raw is None or close < 0:
        return None
    return raw[raw.find("(") + 1 : close], raw[close + 2 :].split()


def stat(pid: int) -> ProcStat | None:
    cut = _stat_fields(pid)
    if cut is None:
        return None
    comm, f = cut
    try:
        return ProcStat(
            pid=pid,
            comm=comm,
            state=f[0],
            ppid=int(f[1]),
            cpu_s=(int(f[11]) + int(f[12])) / CLK_TCK,
            start_ticks=int(f[19]),
            pgrp=int(f[2]),
            session=int(f[3]),
        )
    except (ValueError, IndexError):
        return None


def start_ticks(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat``: the start time in clock ticks since boot (with
    :func:`boot_id`, the process's identity); None when it is gone."""
    st = stat(pid)
    return None if st is None else st.start_ticks


def all_stats() -> dict[int, ProcStat]:
    """Every process this kernel shows (threads excluded), by PID."""
    out: dict[int, ProcStat] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if name.isdigit():
            st = stat(int(name))
            if st is not None:
                out[st.pid] = st
    return out


def boot_id() -> str | None:
    """This boot's id: with ``start_ticks`` it names a process across PID reuse."""
    raw = _read("/proc/sys/kernel/random/boot_id")
    return raw.strip() if raw else None


def boot_time() -> float | None:
    """When the machine booted (seconds since the epoch, ``btime`` of ``/proc/stat``)."""
    raw = _read("/proc/stat")
    if raw:
        for line in raw.splitlines():
            if line.startswith("btime "):
                try:
                    return float(line.split()[1])
                except (IndexError, ValueError):
                    return None
    return None


def started_at(st: ProcStat, btime: float | None = None) -> float | None:
    """When the process started, in seconds since the epoch."""
    btime = boot_time() if btime is None else btime
    return None if btime is None else btime + st.start_ticks / CLK_TCK


def owner(pid: int) -> int | None:
    """The process's (real) user id; None when it is gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


ENVIRON_LIMIT = 8 << 20
"""More than the kernel lets an ``execve`` pass (a quarter of the stack limit, at most
6 MiB): an environment this size is not whole."""


def environ(pid: int) -> dict[str, str] | None:
    """The environment the process started with (``/proc/PID/environ``: changes it made
    later with ``putenv`` are not there), decoded as ``os.environ`` is (undecodable
    bytes kept as surrogates: a relaunch gets them back exactly); None when unreadable
    (another user), gone, or larger than :data:`ENVIRON_LIMIT` (read bounded)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read(ENVIRON_LIMIT)
    except OSError:
        return None
    if len(raw) >= ENVIRON_LIMIT:
        return None
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            out[os.fsdecode(key)] = os.fsdecode(value)
    return out


def has_env(pid: int, entry: bytes) -> bool:
    """Whether ``KEY=VALUE`` (as bytes) is in the process's initial environment."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return entry in f.read().split(b"\0")
    except OSError:
        return False


def link(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def cwd(pid: int) -> str | None:
    """The working directory; None when unreadable or gone."""
    return link(f"/proc/{pid}/cwd")


def regular_path(target: str) -> str | None:
    """``target`` (what a descriptor's link in ``/proc/PID/fd`` names) when it is a
    regular file reachable by that absolute path: not a pipe, socket, terminal or other
    device, not a deleted file."""
    if target.endswith(" (deleted)") or not target.startswith("/") or target.startswith("/dev/"):
        return None
    return target if os.path.isfile(target) else None


def output_file(pid: int) -> str | None:
    """The regular file the process's stdout (else stderr) is, by absolute path: where its
    output goes (``> train.log``); None for a terminal, a pipe or a deleted file."""
    for fd in (1, 2):
        target = link(f"/proc/{pid}/fd/{fd}")
        found = regular_path(target) if target is not None else None
        if found is not None:
            return found
    return None


def fd_targets(pid: int) -> dict[int, str] | None:
    """What each open descriptor refers to (``/path``, ``pipe:[N]``, ``socket:[N]``...);
    None when unreadable (another user) or gone."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    out: dict[int, str] = {}
    for fd in fds[:4096]:
        target = link(f"/proc/{pid}/fd/{fd}")
        if target is not None and fd.isdigit():
            out[int(fd)] = target
    return out


def fd_writable(pid: int, fd: int) -> bool:
    """Whether descriptor ``fd`` is open for writing (``flags`` of ``fdinfo``)."""
    raw = _read(f"/proc/{pid}/fdinfo/{fd}")
    if raw:
        for line in raw.splitlines():
            if line.startswith("flags:"):
                try:
                    return int(line.split()[1], 8) & 0o3 in (1, 2)
                except (IndexError, ValueError):
                    return False
    return False


def maps_mention(pid: int, needle: str) -> bool | None:
    """Whether a mapped file's path contains ``needle`` (``libtorch`` for a torch
    process); None when the maps are unreadable (another user) or the process is gone."""
    raw = _read(f"/proc/{pid}/maps")
    if raw is None:
        return None
    return needle in raw


def rss_bytes(pid: int) -> int | None:
    """Resident memory (``/proc/PID/statm``)."""
    raw = _read(f"/proc/{pid}/statm")
    try:
        return int(raw.split()[1]) * os.sysconf("SC_PAGE_SIZE") if raw else None
    except (ValueError, IndexError, OSError):
        return None


def uptime() -> float | None:
    """Seconds since boot (the clock of ``start_ticks / CLK_TCK``)."""
    raw = _read("/proc/uptime")
    try:
        return float(raw.split()[0]) if raw else None
    except (ValueError, IndexError):
        return None


def alive(pid: int, start_ticks: int | None = None) -> bool:
    """Is ``pid`` running (and, when given, the same process that started at ``start_ticks``)?"""
    st = stat(pid)
    if st is None or st.state in ("Z", "X"):
        return False
    return start_ticks is None or st.start_ticks == start_ticks


def children(pid: int) -> list[int]:
    """Direct children of ``pid``."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    found_file = False
    for tid in tasks:
        raw = _read(f"/proc/{pid}/task/{tid}/children")
        if raw is None:
            continue
        found_file = True
        out.extend(int(c) for c in raw.split())
    if found_file:
        return out
    # kernels without CONFIG_PROC_CHILDREN: scan every process's parent
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = stat(int(name))
            if st is not None and st.ppid == pid:
                out.append(st.pid)
    return out


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo and len(out) < 4096:
        for c in children(todo.pop()):
            out.append(c)
            todo.append(c)
    return out


def cmdline(pid: int) -> list[str]:
    """The process's arguments, decoded as ``sys.argv`` is (exact, empty ones kept: a
    relaunch needs them as they were); [] when gone or a kernel thread."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return []
    args = raw.split(b"\0")
    if args[-1] == b"":  # the terminating NUL (a process that rewrote its title may lack it)
        args.pop()
    return [os.fsdecode(a) for a in args]


def io_counters(pid: int) -> dict[str, int] | None:
    """``/proc/PID/io``: ``rchar`` (bytes through read calls, page cache included),
    ``read_bytes`` (bytes fetched from storage), and the write side."""
    raw = _read(f"/proc/{pid}/io")
    if raw is None:
        return None
    out: dict[str, int] = {}
    for line in raw.splitlines():
        key, _, value = line.partition(":")
        try:
            out[key.strip()] = int(value)
        except ValueError:
            continue
    return out


def data_files(pid: int, limit: int = 256) -> set[str]:
    """Regular files ``pid`` has open or mapped right now, less code and runtime files."""
    files: set[str] = set()
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        fds = []
    for fd in fds[:4096]:
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue
        if target.startswith("/") and _is_data(target):
            files.add(target)
    maps = _read(f"/proc/{pid}/maps")
    if maps:
        for line in maps.splitlines():
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/") and _is_data(parts[5]):
                files.add(parts[5])
    if len(files) > limit:
        files = set(sorted(files)[:limit])
    return files


def _is_data(path: str) -> bool:
    if path.endswith(" (deleted)"):
        return False
    if path.startswith(_SKIP_PREFIXES) or path.startswith(sys.prefix):
        return False
    base = path.rsplit("/", 1)[-1]
    return not (base.endswith(_SKIP_SUFFIXES) or ".so." in base)


# ---- how a process ended (a process we are not the parent of) ---------------------------

PIDFD_GET_INFO = 0xC040FF0B
"""``_IOWR(0xFF, 11, struct pidfd_info)`` with the 64-byte first version of the struct."""
PIDFD_INFO_EXIT = 1 << 3
"""Linux 6.15+: the exit status of a reaped process, to anyone holding a pidfd on it."""


def open_pidfd(pid: int) -> int | None:
    """A pidfd on ``pid`` (Linux 5.3+, Python 3.9+), or None. Opened while the process
    lives, it later tells how the process ended (:func:`exit_status`)."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        fd: int = pidfd_open(pid)
    except OSError:
        return None
    return fd


def exit_status(pid: int, pidfd: int | None = None) -> int | None:
    """How ``pid`` ended, as ``subprocess`` says it (``-N``: killed by signal N), without
    being its parent: the zombie's ``/proc/PID/stat`` (field 52) while its parent has
    not reaped it yet, else the pidfd's exit information (Linux 6.15+). None when
    neither says (an older kernel, a pid we never held a pidfd on)."""
    cut = _stat_fields(pid)
    if cut is not None:
        fields = cut[1]
        if fields and fields[0] == "Z" and len(fields) >= 50:
            try:
                return _returncode(int(fields[49]))
            except ValueError:
                pass
    if pidfd is None:
        return None
    import fcntl
    import struct

    buf = bytearray(64)
    struct.pack_into("Q", buf, 0, PIDFD_INFO_EXIT)
    try:
        fcntl.ioctl(pidfd, PIDFD_GET_INFO, buf)
    except OSError:
        return None
    mask = struct.unpack_from("Q", buf, 0)[0]
    if not mask & PIDFD_INFO_EXIT:
        return None
    return _returncode(struct.unpack_from("i", buf, 60)[0])


def _returncode(wait_status: int) -> int:
    sig = wait_status & 0x7F
    return -sig if sig else (wait_status >> 8) & 0xFF


def describe_exit(status: int | None) -> str:
    """``killed by SIGKILL``, ``exit status 1``, or ``exit status unknown``."""
    if status is None:
        return "exit status unknown"
    if status < 0:
        import signal

        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return f"killed by {name}"
    return f"exit status {status}"
