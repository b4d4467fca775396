"""The agent: a fixed, self-contained script that runs on the training host.

The client never builds shell code from data. It starts this script's source
with a constant bootstrap (:data:`BOOTSTRAP`, run by ``python3 -c``) and sends
it, on stdin, the source's length, the source, then one JSON request line. Paths
and names from the user reach the host only inside that JSON, so a run
directory called ``run $(touch x); `y` 'q"`` is data, never code.

The agent answers on stdout with frames, each a header line then a payload:

``D <offset> <length>\\n`` followed by ``length`` bytes of the file at ``offset``;
``J <json>\\n`` an event (``resolved``, ``waiting``, ``opened``, ``restarted``,
``progress``, ``result``, ``error``).

Operations: ``follow`` (tail a run file with inotify, from an offset, noticing
truncation and replacement), ``read`` (a file to its end), ``runs`` (the
per-user index), ``kill`` and ``resume`` (process control built on the run's
manifest ``run.json``), ``status`` (whether the trainer is alive, and its manifest).

Standard library only, Python 3.8+ and Linux ``/proc``: the remote interpreter
may be any ``python3``. Run locally with ``python -m eagle3_tui.transport.agent``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import IO, Any, NoReturn

BOOTSTRAP = (
    "import sys;b=sys.stdin.buffer;n=int(b.readline());"
    'exec(compile(b.read(n),"eagle3-tui-agent","exec"))'
)
"""What ``python3 -c`` runs: reads the agent's source from stdin and executes it."""

PROTOCOL = 1
RUN_ID_ENV = "EAGLE3_TUI_RUN_ID"
MANIFEST = "run.json"
READ_SIZE = 1 << 20
SAFETY_POLL_S = 0.5  # with inotify: re-check anyway (NFS sends no events)
POLL_S = 0.05  # without inotify

# inotify (linux/inotify.h)
IN_MODIFY = 0x002
IN_ATTRIB = 0x004
IN_CLOSE_WRITE = 0x008
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000

FILE_MASK = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_DELETE_SELF | IN_MOVE_SELF
DIR_MASK = IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF


class AgentError(Exception):
    """A one-line answer: the run is missing, the request is refused..."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


# ---- output -----------------------------------------------------------------------

_client_gone = False


def _write_all(data: bytes) -> None:
    global _client_gone
    if _client_gone:
        return
    view = memoryview(data)
    try:
        while view:
            n = os.write(1, view)
            view = view[n:]
    except OSError:  # the client went away (EPIPE): finish the work anyway
        _client_gone = True


def emit(event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, **fields}, separators=(",", ":"), sort_keys=True)
    _write_all(b"J " + line.encode() + b"\n")


def emit_data(offset: int, data: bytes) -> None:
    _write_all(b"D %d %d\n" % (offset, len(data)) + data)


# ---- run directories and the index --------------------------------------------------


def index_path() -> Path:
    """``${XDG_STATE_HOME:-~/.local/state}/eagle3-tui/runs.jsonl`` (as the manifest writes it)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return Path(state) / "eagle3-tui" / "runs.jsonl"


def read_index() -> list[dict[str, Any]]:
    """Entries of the index, oldest first; malformed lines skipped."""
    try:
        raw = index_path().read_bytes()
    except OSError:
        return []
    out = []
    for line in raw.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("run_dir"), str):
            out.append(obj)
    return out


def resolve_run_dir(run_dir: str | None) -> Path:
    """The given directory (``~`` expanded), or the latest registered run that still exists."""
    if run_dir:
        return Path(os.path.expanduser(run_dir))
    for entry in reversed(read_index()):
        if os.path.isdir(entry["run_dir"]):
            return Path(entry["run_dir"])
    raise AgentError("missing", f"no run registered on this host (index {index_path()})")


def check_run_dir(run_dir: Path) -> None:
    if not run_dir.exists():
        raise AgentError("missing", f"{run_dir}: no such run directory")
    if not run_dir.is_dir():
        raise AgentError("missing", f"{run_dir}: not a directory")


def read_manifest(run_dir: Path) -> dict[str, Any]:
    check_run_dir(run_dir)
    path = run_dir / MANIFEST
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        raise AgentError(
            "missing", f"{run_dir}: no {MANIFEST} here (was the run started with telemetry?)"
        ) from None
    except (OSError, ValueError) as e:
        raise AgentError("missing", f"{path}: unreadable manifest ({e})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("pid"), int):
        raise AgentError("missing", f"{path}: not a run manifest")
    return obj


# ---- inotify --------------------------------------------------------------------------


class Inotify:
    """inotify through ctypes; ``fd`` is None where it is unavailable."""

    def __init__(self) -> None:
        self.fd: int | None = None
        try:
            self._libc = ctypes.CDLL(None, use_errno=True)
            fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        except (OSError, AttributeError):
            return
        if fd >= 0:
            self.fd = fd

    def add(self, path: Path, mask: int) -> int | None:
        if self.fd is None:
            return None
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(str(path)), mask)
        return int(wd) if wd >= 0 else None

    def remove(self, wd: int | None) -> None:
        if self.fd is not None and wd is not None:
            self._libc.inotify_rm_watch(self.fd, wd)

    def drain(self) -> None:
        """Consume the queued events (one read takes them all; more wake the next poll)."""
        if self.fd is None:
            return
        with contextlib.suppress(OSError):  # EAGAIN: nothing queued after all
            os.read(self.fd, 65536)


def _identity(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}"


def _pump(fd: int, offset: int) -> int:
    """Send the file from ``offset`` to its current end; returns the new offset.

    Reads what fstat says is there (a pread of a fixed 1 MiB would allocate and free
    1 MiB per appended line); an append after the fstat wakes the next round.
    """
    while True:
        left = os.fstat(fd).st_size - offset
        if left <= 0:
            return offset
        data = os.pread(fd, min(left, READ_SIZE), offset)
        if not data:
            return offset
        emit_data(offset, data)
        offset += len(data)


def _stdin_closed() -> bool:
    try:
        return not os.read(0, 65536)
    except OSError:
        return True


def op_follow(req: dict[str, Any]) -> int:
    """Stream ``run_dir/file`` from ``offset`` forever, like ``tail -F`` with offsets."""
    run_dir = resolve_run_dir(req.get("run_dir"))
    emit("resolved", run_dir=str(run_dir))
    check_run_dir(run_dir)
    path = run_dir / str(req.get("file") or "metrics.jsonl")
    offset = int(req.get("offset") or 0)
    want: str | None = req.get("identity")
    ino = Inotify()
    timeout_ms = int(1000 * (SAFETY_POLL_S if ino.fd is not None else POLL_S))
    poller = select.poll()
    poller.register(0, select.POLLIN)
    if ino.fd is not None:
        poller.register(ino.fd, select.POLLIN)
    ino.add(run_dir, DIR_MASK)
    fd: int | None = None
    file_wd: int | None = None
    announced = False
    while True:
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except FileNotFoundError:
                if not announced:
                    emit("waiting", path=str(path))
                    announced = True
            else:
                file_wd = ino.add(path, FILE_MASK)
                st = os.fstat(fd)
                ident = _identity(st)
                if want is not None and ident != want:
                    emit("restarted", reason="replaced", offset=0, expected=offset)
                    offset = 0
                elif st.st_size < offset:
                    emit("restarted", reason="truncated", offset=0, expected=offset)
                    offset = 0
                want = ident
                announced = False
                emit("opened", path=str(path), identity=ident, size=st.st_size, offset=offset)
        if fd is not None:
            offset = _pump(fd, offset)
            st = os.fstat(fd)
            if st.st_size < offset:
                emit("restarted", reason="truncated", offset=0, expected=offset)
                offset = 0
                continue
            try:
                current: str | None = _identity(os.stat(path))
            except FileNotFoundError:
                current = None
            if current != _identity(st):
                offset = _pump(fd, offset)  # what was appended to the old file before the swap
                os.close(fd)
                ino.remove(file_wd)
                fd, file_wd = None, None
                continue  # reopen: the identity differs, so it restarts at 0
        if _client_gone:
            return 0
        for fd_ready, _ in poller.poll(timeout_ms):
            if fd_ready == 0 and _stdin_closed():
                return 0  # the client went away
            if fd_ready == ino.fd:
                ino.drain()


def op_resolve(req: dict[str, Any]) -> int:
    """Which run directory a target means (the latest registered one when none is given)."""
    run_dir = resolve_run_dir(req.get("run_dir"))
    check_run_dir(run_dir)
    name = str(req.get("file") or "metrics.jsonl")
    emit(
        "result",
        op="resolve",
        run_dir=str(run_dir),
        has_file=(run_dir / name).exists(),
        has_manifest=(run_dir / MANIFEST).exists(),
        host=os.uname().nodename,
    )
    return 0


def op_read(req: dict[str, Any]) -> int:
    """Send ``run_dir/file`` from ``offset`` to its current end, then ``eof``."""
    run_dir = resolve_run_dir(req.get("run_dir"))
    emit("resolved", run_dir=str(run_dir))
    check_run_dir(run_dir)
    name = str(req.get("file") or "metrics.jsonl")
    path = run_dir / name
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise AgentError(
            "missing", f"{run_dir}: no {name} here (is telemetry attached to the trainer?)"
        ) from None
    except OSError as e:
        raise AgentError("missing", f"{path}: {e.strerror}") from None
    try:
        offset = _pump(fd, int(req.get("offset") or 0))
    finally:
        os.close(fd)
    emit("eof", size=offset, now=time.time())
    return 0


# ---- processes ---------------------------------------------------------------------


class Proc:
    """One line of ``/proc/PID/stat``: what identifies and relates a process."""

    __slots__ = ("comm", "pgrp", "pid", "ppid", "start", "state")

    def __init__(self, pid: int, comm: str, state: str, ppid: int, pgrp: int, start: int) -> None:
        self.pid = pid
        self.comm = comm
        self.state = state
        self.ppid = ppid
        self.pgrp = pgrp
        self.start = start

    @property
    def zombie(self) -> bool:
        return self.state in ("Z", "X")


def proc_stat(pid: int) -> Proc | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    close = raw.rfind(")")
    comm = raw[raw.find("(") + 1 : close]
    fields = raw[close + 2 :].split()
    try:
        return Proc(pid, comm, fields[0], int(fields[1]), int(fields[2]), int(fields[19]))
    except (IndexError, ValueError):
        return None


def boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def has_marker(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:
        return False


def all_procs() -> dict[int, Proc]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            p = proc_stat(int(entry))
            if p is not None:
                out[p.pid] = p
    return out


def _ancestors(pid: int, procs: dict[int, Proc]) -> set[int]:
    seen = set()
    while pid in procs and pid not in seen and pid > 1:
        seen.add(pid)
        pid = procs[pid].ppid
    return seen


def _descendants(root: int, procs: dict[int, Proc]) -> set[int]:
    kids: dict[int, list[int]] = {}
    for p in procs.values():
        kids.setdefault(p.ppid, []).append(p.pid)
    out: set[int] = set()
    todo = [root]
    while todo:
        for c in kids.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


class Member:
    """A process of the run: how it was found, what was done to it, how it ended."""

    def __init__(self, proc: Proc, role: str) -> None:
        self.pid = proc.pid
        self.start = proc.start
        self.comm = proc.comm
        self.role = role
        self.signals: list[str] = []
        self.outcome = "alive"

    def alive(self) -> bool:
        p = proc_stat(self.pid)
        return p is not None and p.start == self.start and not p.zombie

    def report(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "role": self.role,
            "comm": self.comm,
            "signals": self.signals,
            "outcome": self.outcome,
        }


def send_signal(pid: int, start: int, sig: signal.Signals) -> str:
    """Signal ``pid`` only if it is still the process that started at ``start``.

    With a pidfd the check and the signal refer to the same process: the pidfd is
    opened first, then the start time read, so a reuse in between is caught.
    Returns ``sent``, ``gone`` or ``reused``.
    """
    pidfd: int | None = None
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is not None:
        try:
            pidfd = pidfd_open(pid)
        except ProcessLookupError:
            return "gone"
        except OSError:
            pidfd = None
    try:
        p = proc_stat(pid)
        if p is None or p.zombie:
            return "gone"
        if p.start != start:
            return "reused"
        try:
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, sig)
            else:
                os.kill(pid, sig)
        except ProcessLookupError:
            return "gone"
        return "sent"
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _verify_trainer(m: dict[str, Any]) -> tuple[Proc | None, str | None]:
    """The trainer's live process, and a problem: with a process, a reason to refuse
    (its PID now belongs to another process, or cannot be verified); without one,
    a note on why it is gone."""
    pid = int(m["pid"])
    here = boot_id()
    if m.get("boot_id") and here and m["boot_id"] != here:
        return None, (
            f"the run's processes belong to an earlier boot and are gone (pid {pid}, if it "
            "exists, is another process now: not signalled)"
        )
    p = proc_stat(pid)
    if p is None or p.zombie:
        return None, None
    if m.get("start_ticks") is None:
        return p, f"pid {pid}: the manifest has no start time to verify it against: not signalled"
    if p.start != int(m["start_ticks"]):
        return p, (
            f"pid {pid} now belongs to another process ({p.comm}, started at tick {p.start}; "
            f"the run's trainer started at tick {m['start_ticks']}): not signalled"
        )
    return p, None


def find_members(m: dict[str, Any], trainer: Proc | None) -> dict[int, Member]:
    """Every live process of the run: the trainer and launcher, their descendants,
    and anything carrying the run's marker in its environment (escaped workers)."""
    procs = all_procs()
    mine = _ancestors(os.getpid(), procs)
    out: dict[int, Member] = {}

    def add(pid: int, role: str) -> None:
        p = procs.get(pid)
        if p is not None and not p.zombie and pid not in mine and pid not in out:
            out[pid] = Member(p, role)

    same_boot = not m.get("boot_id") or m.get("boot_id") == boot_id()
    if trainer is not None:
        add(trainer.pid, "trainer")
        launcher = m.get("launcher_pid")
        if isinstance(launcher, int) and trainer.ppid == launcher:
            add(launcher, "launcher")
            for pid in sorted(_descendants(launcher, procs)):
                add(pid, "child")
        for pid in sorted(_descendants(trainer.pid, procs)):
            add(pid, "child")
    run_id = m.get("run_id")
    if run_id and same_boot:
        marker = f"{RUN_ID_ENV}={run_id}".encode()
        since = m.get("start_ticks")
        for pid, p in sorted(procs.items()):
            if pid in out or pid in mine or p.zombie:
                continue
            if isinstance(since, int) and p.start < since:
                continue
            if has_marker(pid, marker):
                add(pid, "marked")
    return out


def _wait_gone(members: list[Member], timeout: float, tick: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if not any(mb.alive() for mb in members):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(tick)


def _settle(members: dict[int, Member]) -> None:
    for mb in members.values():
        if mb.outcome == "alive" and not mb.alive():
            mb.outcome = "killed" if "SIGKILL" in mb.signals else "exited"


def _signal(mb: Member, sig: signal.Signals) -> None:
    result = send_signal(mb.pid, mb.start, sig)
    if result == "sent":
        mb.signals.append(sig.name)
    emit("progress", step="signal", pid=mb.pid, role=mb.role, signal=sig.name, result=result)


def op_kill(req: dict[str, Any]) -> int:
    """Stop the run so that it saves its checkpoint, then make sure nothing of it remains.

    1. verify the trainer's PID (start time, boot id): refuse on a mismatch;
    2. SIGTERM the torchrun agent or the trainer, not the group: speculators'
       handler saves ``interrupted/`` and exits, its dataloader workers with it;
    3. wait up to ``grace_s`` for it; then find every process of the run
       (descendants, marker) and SIGTERM, then SIGKILL what remains;
    4. report each PID: signals sent, how it ended.
    """
    # Finish even if the client disconnects mid-way.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    grace = float(req.get("grace_s", 130.0))
    linger = float(req.get("linger_s", 3.0))
    run_dir = resolve_run_dir(req.get("run_dir"))
    emit("resolved", run_dir=str(run_dir))
    m = read_manifest(run_dir)
    trainer, problem = _verify_trainer(m)
    base: dict[str, Any] = {"run_dir": str(run_dir), "run_id": m.get("run_id")}
    if trainer is not None and problem is not None:  # the PID was reused
        others = find_members(m, None)
        emit(
            "result",
            op="kill",
            status="refused",
            message=problem,
            processes=[mb.report() for mb in others.values()],
            **base,
        )
        return 0
    members = find_members(m, trainer)
    if not members:
        note = problem or "the run is not running"
        emit("result", op="kill", status="not_running", message=note, processes=[], **base)
        return 0
    target = None
    if trainer is not None:
        launcher = [mb for mb in members.values() if mb.role == "launcher"]
        target = launcher[0] if launcher else members[trainer.pid]
        _signal(target, signal.SIGTERM)
        t0 = time.monotonic()
        while target.alive() and time.monotonic() - t0 < grace:
            _wait_gone([target], min(5.0, grace - (time.monotonic() - t0)))
            if target.alive():
                emit("progress", step="waiting", pid=target.pid, elapsed=time.monotonic() - t0)
        # workers and stragglers spawned meanwhile
        still = trainer if members[trainer.pid].alive() else None
        for pid, mb in find_members(m, still).items():
            members.setdefault(pid, mb)
        if target.alive():
            emit("progress", step="timeout", pid=target.pid, grace_s=grace)
            for mb in members.values():
                if mb.alive():
                    _signal(mb, signal.SIGKILL)
            _wait_gone(list(members.values()), 5.0)
        _wait_gone(list(members.values()), linger)
    _settle(members)
    rest = [mb for mb in members.values() if mb.alive()]
    if rest:  # escaped or stuck processes of the run: SIGTERM, then SIGKILL
        for mb in rest:
            if "SIGTERM" not in mb.signals:
                _signal(mb, signal.SIGTERM)
        _wait_gone(rest, linger)
        _settle(members)
        for mb in rest:
            if mb.alive():
                _signal(mb, signal.SIGKILL)
        _wait_gone(rest, 5.0)
    _settle(members)
    remaining = [mb for mb in members.values() if mb.alive()]
    status = "remaining" if remaining else "stopped"
    message = (
        f"{len(remaining)} process(es) of the run remain"
        if remaining
        else f"all {len(members)} process(es) of the run are gone"
    )
    emit(
        "result",
        op="kill",
        status=status,
        message=message,
        processes=[mb.report() for mb in members.values()],
        checkpoints=checkpoint_report(m, run_dir),
        **base,
    )
    return 0


# ---- checkpoints and resume ----------------------------------------------------------


def checkpoint_dir(m: dict[str, Any], run_dir: Path) -> Path | None:
    raw = m.get("checkpoint_dir")
    if not raw:
        return None
    path = Path(raw)
    if not path.is_absolute():
        path = Path(m.get("cwd") or run_dir) / path
    return path


def latest_numbered(ckpt: Path) -> Path | None:
    """The directory speculators resumes from: the highest integer name (symlinks skipped)."""
    best: tuple[int, Path] | None = None
    try:
        entries = list(ckpt.iterdir())
    except OSError:
        return None
    for d in entries:
        if d.is_symlink() or not d.is_dir():
            continue
        try:
            n = int(d.name)
        except ValueError:
            continue
        if best is None or n > best[0]:
            best = (n, d)
    return None if best is None else best[1]


def _safetensors_problem(path: Path) -> str | None:
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return "truncated header"
            n = int.from_bytes(head, "little")
            if n > size - 8:
                return "truncated header"
            header = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        return f"unreadable ({e})"
    end = 0
    for name, info in header.items():
        if name != "__metadata__" and isinstance(info, dict):
            end = max(end, int(info.get("data_offsets", [0, 0])[1]))
    if size != 8 + n + end:
        return f"truncated ({size} bytes, expected {8 + n + end})"
    return None


def _zip_problem(path: Path) -> str | None:
    try:
        with zipfile.ZipFile(path) as z:
            z.infolist()
    except (OSError, zipfile.BadZipFile) as e:
        return f"truncated or corrupt ({e})"
    return None


def checkpoint_problems(d: Path) -> list[str]:
    """Why ``d`` cannot be resumed from (empty when complete).

    speculators writes, in order: ``model.safetensors`` and ``config.json``,
    ``optimizer_state_dict.pt``, ``scheduler_state_dict.pt`` (optional), then
    ``training_state.json``; saves are not atomic and mid-epoch saves rewrite
    the directory in place. So: each file present and whole (safetensors length
    from its header, torch files' zip directory), and ``training_state.json``
    (when present) not older than the files written before it.
    """
    problems = []
    for name, check in (
        ("model.safetensors", _safetensors_problem),
        ("optimizer_state_dict.pt", _zip_problem),
    ):
        path = d / name
        if not path.exists():
            problems.append(f"{name} is missing")
        else:
            why = check(path)
            if why:
                problems.append(f"{name} is {why}")
    sched = d / "scheduler_state_dict.pt"
    if sched.exists():
        why = _zip_problem(sched)
        if why:
            problems.append(f"scheduler_state_dict.pt is {why}")
    state = d / "training_state.json"
    if state.exists():
        try:
            json.loads(state.read_text())
        except (OSError, ValueError):
            problems.append("training_state.json is unreadable")
        else:
            newest = max(
                (
                    p.stat().st_mtime_ns
                    for p in (d / "model.safetensors", d / "optimizer_state_dict.pt")
                    if p.exists()
                ),
                default=0,
            )
            if state.stat().st_mtime_ns < newest:
                problems.append("training_state.json is older than the weights (save interrupted)")
    return problems


def _checkpoint_info(d: Path) -> dict[str, Any]:
    info: dict[str, Any] = {"path": str(d), "problems": checkpoint_problems(d)}
    try:
        state = json.loads((d / "training_state.json").read_text())
        if isinstance(state, dict):
            info["global_step"] = state.get("global_step")
            info["epoch"] = state.get("epoch")
            info["local_step"] = state.get("local_step")
    except (OSError, ValueError):
        pass
    return info


def checkpoint_report(m: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    ckpt = checkpoint_dir(m, run_dir)
    if ckpt is None:
        return {}
    latest = latest_numbered(ckpt)
    interrupted = ckpt / "interrupted"
    return {
        "dir": str(ckpt),
        "latest": _checkpoint_info(latest) if latest is not None else None,
        "interrupted": _checkpoint_info(interrupted) if interrupted.is_dir() else None,
    }


def _tail(path: Path, lines: int = 15) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 8192))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


def op_resume(req: dict[str, Any]) -> int:
    """Relaunch the manifest's resume command, detached, from a complete checkpoint."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # inherited by the new run: nohup
    wait_s = float(req.get("wait_s", 30.0))
    run_dir = resolve_run_dir(req.get("run_dir"))
    emit("resolved", run_dir=str(run_dir))
    m = read_manifest(run_dir)
    trainer, problem = _verify_trainer(m)
    if trainer is not None and problem is None:
        raise AgentError("refused", f"the run is still running (pid {trainer.pid}); kill it first")
    alive = find_members(m, None)
    if alive:
        pids = ", ".join(str(p) for p in sorted(alive))
        raise AgentError(
            "refused", f"processes of the run are still alive (pids {pids}); kill it first"
        )
    ckpt = checkpoint_dir(m, run_dir)
    if ckpt is None:
        raise AgentError("refused", "the manifest names no checkpoint_dir")
    latest = latest_numbered(ckpt)
    if latest is None:
        raise AgentError(
            "refused",
            f"{ckpt}: no numbered checkpoint, resuming would start over from step 0 "
            "(speculators ignores interrupted/)",
        )
    problems = checkpoint_problems(latest)
    if problems:
        raise AgentError(
            "refused",
            f"{latest}: incomplete checkpoint ({'; '.join(problems)}); speculators would "
            "resume from it and crash",
        )
    cmd = m.get("resume_command")
    if not isinstance(cmd, list) or not cmd or not all(isinstance(a, str) for a in cmd):
        raise AgentError("refused", "the manifest has no resume_command")
    cmd = list(cmd)
    argv = m.get("argv") or []
    python = m.get("python")
    if not os.path.isabs(cmd[0]) and argv and cmd[0] == argv[0] and python:
        cmd[0] = str(python)  # "python" was found on the launching shell's PATH, maybe not ours
    cwd = str(m.get("cwd") or run_dir)
    if not os.path.isdir(cwd):
        raise AgentError("refused", f"{cwd}: the run's working directory is gone")
    env = dict(os.environ)
    for key, value in (m.get("env") or {}).items():
        env[str(key)] = str(value)
    log = run_dir / str(m.get("log_file") or "train.log")
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        os.write(fd, f"\n--- eagle3-tui resume at {stamp} from {latest} ---\n".encode())
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as e:
        raise AgentError("refused", f"cannot start {cmd[0]}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    info = _checkpoint_info(latest)
    confirmed = False
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        rc = proc.poll()
        if rc is not None:
            emit(
                "result",
                op="resume",
                status="failed",
                message=f"the resumed run exited at once with status {rc}",
                pid=proc.pid,
                log=str(log),
                log_tail=_tail(log),
                checkpoint=info,
                run_dir=str(run_dir),
            )
            return 0
        try:
            now = json.loads((run_dir / MANIFEST).read_text())
            confirmed = proc.pid in (now.get("pid"), now.get("launcher_pid"))
        except (OSError, ValueError, AttributeError):
            confirmed = False
        if confirmed:
            break
        time.sleep(0.1)
    proc.returncode = 0  # detached on purpose: do not warn that it still runs
    emit(
        "result",
        op="resume",
        status="started",
        message=f"resumed from {latest}",
        pid=proc.pid,
        confirmed=confirmed,
        log=str(log),
        command=cmd,
        checkpoint=info,
        run_dir=str(run_dir),
    )
    return 0


def op_runs(req: dict[str, Any]) -> int:
    """The runs registered on this host, newest first, with their state."""
    seen: dict[str, dict[str, Any]] = {}
    for entry in read_index():
        seen[str(entry.get("run_id") or entry["run_dir"])] = entry
    runs = []
    for entry in reversed(list(seen.values())):
        run_dir = Path(entry["run_dir"])
        row: dict[str, Any] = {
            "run_id": entry.get("run_id"),
            "run_dir": str(run_dir),
            "started_at": entry.get("started_at"),
            "exists": run_dir.is_dir(),
            "status": None,
            "pid": entry.get("pid"),
            "alive": False,
        }
        if row["exists"]:
            try:
                m = read_manifest(run_dir)
            except AgentError:
                pass
            else:
                trainer, problem = _verify_trainer(m)
                row["status"] = m.get("status")
                row["pid"] = m.get("pid")
                row["alive"] = trainer is not None and problem is None
        runs.append(row)
    emit("result", op="runs", runs=runs, index=str(index_path()), host=os.uname().nodename)
    return 0


def op_status(req: dict[str, Any]) -> int:
    """Whether the run's trainer is alive (PID, start time and boot id checked), and its
    manifest: what a monitor needs to tell a dead run from a silent one."""
    run_dir = resolve_run_dir(req.get("run_dir"))
    m = read_manifest(run_dir)
    trainer, problem = _verify_trainer(m)
    alive = trainer is not None and problem is None
    emit(
        "result",
        op="status",
        run_dir=str(run_dir),
        alive=alive,
        problem=problem,
        manifest=m,
        host=os.uname().nodename,
        now=time.time(),
    )
    return 0


OPS = {
    "follow": op_follow,
    "resolve": op_resolve,
    "read": op_read,
    "runs": op_runs,
    "kill": op_kill,
    "resume": op_resume,
    "status": op_status,
}


def main(stdin: IO[bytes] | None = None) -> NoReturn:
    stream = sys.stdin.buffer if stdin is None else stdin
    line = stream.readline()
    try:
        req = json.loads(line)
        if not isinstance(req, dict) or req.get("op") not in OPS:
            raise ValueError("unknown operation")
        if req.get("protocol", PROTOCOL) != PROTOCOL:
            raise ValueError(f"protocol {req.get('protocol')} (this agent speaks {PROTOCOL})")
    except ValueError as e:
        emit("error", kind="invalid", message=f"bad request: {e}")
        sys.exit(2)
    try:
        rc = OPS[req["op"]](req)
    except AgentError as e:
        emit("error", kind=e.kind, message=str(e))
        rc = 3
    except KeyboardInterrupt:
        rc = 130
    sys.exit(rc)


if __name__ == "__main__":
    main()
