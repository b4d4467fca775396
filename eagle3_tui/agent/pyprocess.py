"""What ``/proc`` tells about a process before anything touches it: is it CPython,
which version, may we trace it, is it a PyTorch / speculators training, and was
it launched with eagle3-tui telemetry. Read-only; never raises on a process that
vanishes (its answers say so)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from typing import Any

from eagle3_tui.telemetry.rerun import split_python_argv
from eagle3_tui.telemetry.safefs import read_bounded, trust_problem

CAP_SYS_PTRACE = 19
YAMA = "/proc/sys/kernel/yama/ptrace_scope"
_LIBPYTHON = re.compile(r"/libpython(\d)\.(\d+)([a-z]*)\.so")
_EXE_NAME = re.compile(r"^python(\d)\.(\d+)([a-z]*)$")
_TORCH_LIBS = ("libtorch_cpu.so", "libtorch_python.so", "libtorch.so")
_SCRIPT_BYTES = 1 << 20


def read_text(path: str) -> str | None:
    """A file of ``/proc`` as text (None when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None


def status_ids(pid: int) -> dict[str, list[int]]:
    """``Uid`` and ``Gid`` of ``/proc/PID/status``: real, effective, saved, filesystem."""
    out: dict[str, list[int]] = {}
    for line in (read_text(f"/proc/{pid}/status") or "").splitlines():
        key, _, value = line.partition(":")
        if key in ("Uid", "Gid"):
            with contextlib.suppress(ValueError):
                out[key] = [int(v) for v in value.split()]
    return out


def own_capabilities() -> int:
    """This process's effective capability set (``CapEff``), 0 when unknown."""
    for line in (read_text("/proc/self/status") or "").splitlines():
        if line.startswith("CapEff:"):
            try:
                return int(line.split()[1], 16)
            except (IndexError, ValueError):
                return 0
    return 0


def has_ptrace_capability() -> bool:
    return bool(own_capabilities() >> CAP_SYS_PTRACE & 1)


def ptrace_scope() -> int | None:
    """Yama's ``ptrace_scope`` (0-3); None where Yama is not there (no restriction)."""
    raw = read_text(YAMA)
    try:
        return int(raw.strip()) if raw else None
    except ValueError:
        return None


def user_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def permission_problem(pid: int) -> str | None:
    """Why this process may not trace ``pid`` (gdb or ``sys.remote_exec``), and the fix;
    None when it may. The same rules as the kernel's ptrace access check."""
    ids = status_ids(pid)
    uids = ids.get("Uid", [])
    me = os.geteuid()
    cap = has_ptrace_capability()
    if uids and any(u != me for u in uids[:3]) and not cap:
        owner = uids[0]
        return (
            f"pid {pid} belongs to {user_name(owner)} (uid {owner}) and you are {user_name(me)} "
            f"(uid {me}) without CAP_SYS_PTRACE: attach as {user_name(owner)}, or as root"
        )
    scope = ptrace_scope()
    if scope == 3:
        return (
            f"{YAMA} is 3: no process may be traced on this host until it reboots with a "
            "lower setting"
        )
    if scope == 2 and not cap:
        return (
            f"{YAMA} is 2: only a process with CAP_SYS_PTRACE may trace: attach as root "
            "(sudo), or lower it: sudo sysctl kernel.yama.ptrace_scope=0"
        )
    if scope == 1 and not cap:
        return (
            f"{YAMA} is 1: a process may only trace its own descendants: attach as root "
            "(sudo), or allow it until the next reboot: sudo sysctl kernel.yama.ptrace_scope=0"
        )
    return None


def container_hint() -> str:
    """A hint for a ptrace refused although the checks passed (a seccomp or container)."""
    if os.geteuid() == 0 and not has_ptrace_capability():
        return (
            " (this looks like a container without CAP_SYS_PTRACE: docker run "
            "--cap-add=SYS_PTRACE, or the equivalent securityContext capability)"
        )
    return " (a container or seccomp profile may forbid ptrace: docker run --cap-add=SYS_PTRACE)"


class PythonInfo:
    """Which interpreter a process runs, as far as ``/proc`` tells."""

    def __init__(
        self,
        exe: str,
        version: tuple[int, int] | None,
        implementation: str,
        libpython: str | None,
        abiflags: str = "",
        how: str = "",
    ) -> None:
        self.exe = exe
        self.version = version
        self.implementation = implementation
        self.libpython = libpython
        self.abiflags = abiflags
        self.how = how

    @property
    def label(self) -> str:
        v = ".".join(map(str, self.version)) if self.version else "?"
        name = "CPython" if self.implementation == "cpython" else self.implementation
        return f"{name} {v}{self.abiflags} ({self.exe})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "exe": self.exe,
            "version": list(self.version) if self.version else None,
            "implementation": self.implementation,
            "libpython": self.libpython,
            "abiflags": self.abiflags,
            "label": self.label,
        }


def mapped_files(pid: int) -> list[str]:
    out = []
    for line in (read_text(f"/proc/{pid}/maps") or "").splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            out.append(parts[5])
    return sorted(set(out))


def exe_path(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def _run_python(exe: str, code: str) -> str | None:
    """What ``exe -I -S -c code`` prints (isolated: no site, no environment, so only
    the binary answers); None when it cannot be run, or may not be: a binary another
    user could have changed is never run (the agent may be root)."""
    if trust_problem(exe) is not None:
        return None
    try:
        return subprocess.run(
            [exe, "-I", "-S", "-c", code],
            capture_output=True,
            text=True,
            timeout=15,
            check=False,
            stdin=subprocess.DEVNULL,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def ask_interpreter(exe: str) -> tuple[str, tuple[int, int], str] | None:
    """Run ``exe -I -S`` (only when it is named like a Python) for its implementation,
    version and ABI flags."""
    out = _run_python(
        exe,
        "import sys;print(sys.implementation.name, sys.version_info[0], sys.version_info[1], "
        "getattr(sys, 'abiflags', ''))",
    )
    try:
        f = (out or "").split()
        return f[0], (int(f[1]), int(f[2])), f[3] if len(f) > 3 else ""
    except (ValueError, IndexError):
        return None


def python_of(pid: int, maps: list[str] | None = None) -> PythonInfo | None:
    """The interpreter of ``pid``, or None when it is not a Python process."""
    exe = exe_path(pid)
    if exe is None:
        return None
    maps = mapped_files(pid) if maps is None else maps
    exe_real = exe[: -len(" (deleted)")] if exe.endswith(" (deleted)") else exe
    base = os.path.basename(exe_real)
    if any("libpypy" in m for m in maps) or base.startswith("pypy"):
        return PythonInfo(exe_real, None, "pypy", None, how="name")
    for m in maps:
        found = _LIBPYTHON.search(m)
        if found:
            version = (int(found.group(1)), int(found.group(2)))
            return PythonInfo(exe_real, version, "cpython", m, found.group(3), "libpython")
    found = _EXE_NAME.match(base)
    if found:
        version = (int(found.group(1)), int(found.group(2)))
        return PythonInfo(exe_real, version, "cpython", None, found.group(3), "name")
    if base.startswith("python"):
        asked = ask_interpreter(exe_real if os.path.exists(exe_real) else f"/proc/{pid}/exe")
        if asked is not None:
            return PythonInfo(exe_real, asked[1], asked[0], None, asked[2], "asked")
    return None


def remote_debug_problem(pid: int, argv: list[str], env: dict[str, str] | None) -> str | None:
    """Why CPython 3.14+ in ``pid`` refuses ``sys.remote_exec`` (PEP 768), from its
    command line and environment; None when nothing says it does."""
    for i, a in enumerate(argv[1:], 1):
        if a == "-X" and i + 1 < len(argv) and argv[i + 1] == "disable_remote_debug":
            return (
                f"pid {pid} was started with -X disable_remote_debug: it refuses remote code; "
                "restart it without that option"
            )
        if a.startswith("-") and not a.startswith("--") and "Xdisable_remote_debug" in a:
            return f"pid {pid} was started with -Xdisable_remote_debug: it refuses remote code"
        if not a.startswith("-"):
            break
    if env is not None and env.get("PYTHON_DISABLE_REMOTE_DEBUG"):
        return (
            f"pid {pid} was started with PYTHON_DISABLE_REMOTE_DEBUG set: it refuses remote "
            "code; restart it without that variable"
        )
    return None


def build_allows_remote_debug(exe: str) -> bool | None:
    """Whether an interpreter binary was built with remote debugging
    (``sys.is_remote_debug_enabled()`` under ``-I``: only the build decides)."""
    out = _run_python(
        exe, "import sys;print(getattr(sys, 'is_remote_debug_enabled', lambda: None)())"
    )
    return {"True": True, "False": False}.get((out or "").strip())


def program_of(argv: list[str], cwd: str | None) -> tuple[str, str | None]:
    """What the interpreter runs (``script``, ``-m module``, ``-c``) and, for a
    script, its path resolved against the process's working directory."""
    split = split_python_argv(argv)
    if split is None:
        return "", None
    program = split[1]
    if program[0] == "-m":
        return f"-m {program[1]}", None
    if program[0] == "-c":
        return "-c", None
    script = program[0]
    if not os.path.isabs(script) and cwd:
        script = os.path.join(cwd, script)
    return program[0], script


def training_evidence(pid: int, argv: list[str], maps: list[str]) -> tuple[bool | None, str]:
    """Is ``pid`` a speculators training, by what can be seen from outside? (False: it
    is not — no PyTorch loaded; True: speculators named in its command or script;
    None: PyTorch is loaded but speculators is not seen; the trainer is then looked
    for in the process itself, which changes nothing when there is none.)"""
    if not any(os.path.basename(m).startswith(_TORCH_LIBS) for m in maps):
        return False, "no PyTorch library is loaded in it"
    if any("speculators" in a for a in argv):
        return True, "its command line names speculators"
    try:
        cwd: str | None = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = None
    shown, script = program_of(argv, cwd)
    if script is not None:
        try:
            text = read_bounded(script, _SCRIPT_BYTES)
        except OSError:
            text = b""
        if b"speculators" in text:
            return True, f"{shown} imports speculators"
    return None, "PyTorch is loaded; speculators' Trainer is looked for in the process"
