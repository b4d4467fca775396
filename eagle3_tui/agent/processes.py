"""The run's processes as ``/proc`` shows them, and signals that hit only the process
that was checked (start time, boot id, pidfd)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

from eagle3_tui.agent.frames import emit
from eagle3_tui.agent.names import EV_PROGRESS, NVML_FIXTURE_ENV, RUN_ID_ENV
from eagle3_tui.telemetry import procs
from eagle3_tui.telemetry.procs import cmdline, describe_exit, exit_status, open_pidfd

# /proc is read in one place (telemetry/procs.py); these are its names here.
Proc = procs.ProcStat
proc_stat = procs.stat
boot_id = procs.boot_id
has_marker = procs.has_env
all_procs = procs.all_stats


def ancestors(pid: int, table: dict[int, Proc]) -> set[int]:
    seen = set()
    while pid in table and pid not in seen and pid > 1:
        seen.add(pid)
        pid = table[pid].ppid
    return seen


def descendants(root: int, table: dict[int, Proc]) -> set[int]:
    kids: dict[int, list[int]] = {}
    for p in table.values():
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
        self.ppid = proc.ppid
        self.start = proc.start
        self.comm = proc.comm
        self.role = role
        self.label = ""
        """What it is, where known: ``rank 1``, ``sidecar``, ``torchrun agent``."""
        self.signals: list[str] = []
        self.outcome = "alive"
        self.exit_status: int | None = None
        # held while it lives: how it ended is readable after its parent reaped it
        self.pidfd = open_pidfd(proc.pid)

    def alive(self) -> bool:
        p = proc_stat(self.pid)
        return p is not None and p.start == self.start and not p.zombie

    def ended(self) -> None:
        """It is gone: read how it ended, let go of its pidfd."""
        if self.exit_status is None:
            self.exit_status = exit_status(self.pid, self.pidfd)
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = None

    def release(self) -> None:
        """Let go of its pidfd (a look at the run, not a kill: nothing to read later)."""
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = None

    def report(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "role": self.role,
            "label": self.label,
            "comm": self.comm,
            "signals": self.signals,
            "outcome": self.outcome,
            "exit_status": self.exit_status,
            "ended": describe_exit(self.exit_status) if self.outcome != "alive" else None,
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


def verify_trainer(m: dict[str, Any]) -> tuple[Proc | None, str | None]:
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


def verify_launcher(m: dict[str, Any]) -> Proc | None:
    """The run's torchrun agent, when the manifest names one and it is still that process
    (its start time recorded; same boot). Anchors the node's ranks even after rank 0
    is gone."""
    launcher = m.get("launcher")
    if not isinstance(launcher, dict) or not isinstance(launcher.get("pid"), int):
        return None
    if m.get("boot_id") and m.get("boot_id") != boot_id():
        return None
    p = proc_stat(int(launcher["pid"]))
    if p is None or p.zombie or p.start != launcher.get("start_ticks"):
        return None
    return p


def _labels(m: dict[str, Any]) -> dict[tuple[int, int], str]:
    """(pid, start) -> ``rank N`` for the node's ranks the manifest lists."""
    out = {}
    for r in m.get("ranks") or []:
        if isinstance(r, dict) and isinstance(r.get("pid"), int):
            out[(r["pid"], r.get("start_ticks") or -1)] = f"rank {r.get('rank')}"
    return out


def label_member(mb: Member, labels: dict[tuple[int, int], str]) -> None:
    label = labels.get((mb.pid, mb.start))
    if label is None and mb.role == "launcher":
        label = "torchrun agent"
    if label is None:
        cmd = " ".join(cmdline(mb.pid))
        if "eagle3_tui.telemetry.sidecar" in cmd:
            label = "sidecar"
        elif "eagle3_tui.train.tee" in cmd:
            label = "log copier"
        elif "multiprocessing.resource_tracker" in cmd:
            label = "resource tracker"
        elif mb.comm == "pt_data_worker":  # torch names its dataloader workers so
            label = "worker"
    mb.label = label or ""


def find_members(
    m: dict[str, Any], trainer: Proc | None, uid: int | None = None
) -> dict[int, Member]:
    """Every live process of the run: the trainer and launcher, their descendants,
    and anything carrying the run's marker in its environment (escaped workers);
    with ``uid``, only processes of that user (``trust.signal_owner``)."""
    table = all_procs()
    mine = ancestors(os.getpid(), table)
    out: dict[int, Member] = {}

    def add(pid: int, role: str) -> None:
        p = table.get(pid)
        if p is None or p.zombie or pid in mine or pid in out:
            return
        if uid is None or procs.owner(pid) == uid:
            out[pid] = Member(p, role)

    same_boot = not m.get("boot_id") or m.get("boot_id") == boot_id()
    agent = verify_launcher(m)
    if agent is not None:  # torchrun: the agent and every rank of this node under it
        add(agent.pid, "launcher")
        for pid in sorted(descendants(agent.pid, table)):
            add(pid, "trainer" if trainer is not None and pid == trainer.pid else "child")
    if trainer is not None:
        add(trainer.pid, "trainer")
        launcher = m.get("launcher_pid")
        if isinstance(launcher, int) and trainer.ppid == launcher:
            add(launcher, "launcher")
            for pid in sorted(descendants(launcher, table)):
                add(pid, "child")
        for pid in sorted(descendants(trainer.pid, table)):
            add(pid, "child")
    run_id = m.get("run_id")
    if run_id and same_boot:
        marker = f"{RUN_ID_ENV}={run_id}".encode()
        since = m.get("start_ticks")
        for pid, p in sorted(table.items()):
            if pid in out or pid in mine or p.zombie:
                continue
            if isinstance(since, int) and p.start < since:
                continue
            if has_marker(pid, marker):
                add(pid, "marked")
    labels = _labels(m)
    for mb in out.values():
        label_member(mb, labels)
    for mb in out.values():  # a rank's dataloader workers and sidecar say whose they are
        parent = out.get(table[mb.pid].ppid) if mb.pid in table else None
        if parent is not None and parent.label.startswith("rank ") and mb.role == "child":
            mb.label = f"{mb.label or 'worker'}, {parent.label}"  # "worker, rank 0"
    return out


def sigterm_targets(
    members: dict[int, Member], trainer: Proc | None
) -> tuple[list[Member], list[Member]]:
    """The torchrun agent (if any) and the processes that get a kill's first SIGTERM:
    under torchrun the agent's children, this node's ranks (rank 0 gone or not), else
    the agent itself; else the trainer; none when the trainer is gone and no agent is."""
    launcher = [mb for mb in members.values() if mb.role == "launcher"]
    if launcher:
        return launcher, [mb for mb in members.values() if mb.ppid == launcher[0].pid] or launcher
    if trainer is not None:
        return launcher, [members[trainer.pid]]
    return launcher, []


def kill_plan(m: dict[str, Any], trainer: Proc | None) -> list[dict[str, Any]]:
    """What a kill of the run would act on now, for the person who confirms it: every
    process of the run as the kill finds it (``find_members``), labelled as the kill's
    report labels it (``rank 1``, ``worker, rank 0``, ``sidecar``, ``torchrun agent``),
    ``first`` on those the first SIGTERM goes to (:func:`sigterm_targets`)."""
    members = find_members(m, trainer)
    _, targets = sigterm_targets(members, trainer)
    first = {t.pid for t in targets}
    rows = []
    for pid, mb in members.items():
        mb.release()
        rows.append(
            {"pid": pid, "role": mb.role, "label": mb.label, "comm": mb.comm, "first": pid in first}
        )
    return rows


def wait_gone(members: list[Member], timeout: float, tick: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if not any(mb.alive() for mb in members):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(tick)


def settle(members: dict[int, Member]) -> None:
    for mb in members.values():
        if mb.outcome == "alive" and not mb.alive():
            mb.outcome = "killed" if "SIGKILL" in mb.signals else "exited"
            mb.ended()


def signal_member(mb: Member, sig: signal.Signals) -> None:
    result = send_signal(mb.pid, mb.start, sig)
    if result == "sent":
        mb.signals.append(sig.name)
    emit(
        EV_PROGRESS,
        step="signal",
        pid=mb.pid,
        role=mb.label or mb.role,
        signal=sig.name,
        result=result,
    )


def rss_bytes(pid: int) -> int | None:
    """Resident memory of ``pid`` (``VmRSS``), None when gone or unreadable."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def gpu_memory(pids: set[int]) -> dict[int, tuple[int, list[int]]] | None:
    """GPU memory NVML says each of ``pids`` holds: pid -> (bytes, device indexes);
    None when NVML cannot say (no driver, no pynvml)."""
    from eagle3_tui.telemetry.nvml import Nvml, NvmlUnavailable, PynvmlApi, RecordedNvml

    fixture = os.environ.get(NVML_FIXTURE_ENV)
    nvml: Nvml = RecordedNvml(fixture) if fixture else PynvmlApi()
    try:
        nvml.init()
    except (NvmlUnavailable, OSError, ValueError):
        return None
    out: dict[int, tuple[int, list[int]]] = {}
    try:
        for index in range(nvml.device_count()):
            try:
                reading = nvml.read(index)
            except Exception:  # a lost device: the others still say
                continue
            for proc in reading.processes:
                if proc.pid in pids:
                    held, devices = out.get(proc.pid, (0, []))
                    out[proc.pid] = (held + (proc.used_memory or 0), [*devices, index])
    finally:
        nvml.shutdown()
    return out


_FOUND_AS = ("child", "marked")
""":func:`find_members`' roles of a process known only by where it was found."""


def leftover_role(mb: Member) -> str:
    """A leftover's role as the monitor names it (model/liveness.py's ``process_role``,
    observe.py's roles): ``worker`` for a dataloader worker, by the name torch gives
    it (a SIGKILLed trainer's workers are found by the run's marker, as ``marked``)."""
    if mb.comm == "pt_data_worker" and mb.role in _FOUND_AS:
        return "worker"
    return mb.role


def leftovers(m: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's processes that are alive though its trainer is not (dataloader
    workers of a SIGKILLed trainer...): PID, name, role (:func:`leftover_role`),
    memory, GPU memory."""
    members = find_members(m, None)
    if not members:
        return []
    gpus = gpu_memory(set(members))
    out = []
    for pid, mb in sorted(members.items()):
        held, devices = (gpus or {}).get(pid, (None, []))
        mb.release()
        out.append(
            {
                "pid": pid,
                "comm": mb.comm,
                "role": leftover_role(mb),
                "label": mb.label,
                "rss_bytes": rss_bytes(pid),
                "gpu_bytes": held if gpus is not None else None,
                "gpus": devices,
            }
        )
    return out
