"""What ``/proc`` says about the run's processes, read from outside them (Linux).

Every function returns ``None`` or an empty value when the process is gone or
the file is unreadable; none raises. No cooperation from the processes is
needed, so this works for any training script.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

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


@dataclass(frozen=True)
class ProcStat:
    pid: int
    comm: str
    state: str
    ppid: int
    cpu_s: float
    start_ticks: int


def stat(pid: int) -> ProcStat | None:
    raw = _read(f"/proc/{pid}/stat")
    if raw is None:
        return None
    try:
        close = raw.rindex(")")
        comm = raw[raw.index("(") + 1 : close]
        f = raw[close + 2 :].split()
        return ProcStat(
            pid=pid,
            comm=comm,
            state=f[0],
            ppid=int(f[1]),
            cpu_s=(int(f[11]) + int(f[12])) / CLK_TCK,
            start_ticks=int(f[19]),
        )
    except (ValueError, IndexError):
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
    raw = _read(f"/proc/{pid}/cmdline")
    return [a for a in raw.split("\0") if a] if raw else []


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
    raw = _read(f"/proc/{pid}/stat")
    if raw is not None:
        fields = raw[raw.rfind(")") + 2 :].split()
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
