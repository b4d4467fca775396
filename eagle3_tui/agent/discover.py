"""Live trainings on this host, found from outside: the ``discover`` operation, and the
scan that ``choose`` and ``describe`` (``choose.py``) build on.

A training started by a user's own script (``nohup python train.py > train.log 2>&1 &``)
is registered nowhere and writes no metric. What tells it from ``/proc``, without its
cooperation, for a script never seen before:

* a Python process with torch loaded (``libtorch*`` in ``/proc/PID/maps``);
* speculators: named in its argv (the library's CLI, ``-m speculators…``), imported by
  the script its argv names (or by a module beside that script), present in its output
  (the library's log lines, its ``Epoch N …%`` progress bars) or in a checkpoint
  directory shaped as speculators writes one (``<epoch>/training_state.json``,
  ``epoch<e>_end`` links);
* eagle3-tui's telemetry: the run marker in its environment, or ``metrics.jsonl`` open.

A torchrun agent (``torchrun``, ``-m torch.distributed.run``) and its ranks are one
training (signalled through the agent); dataloader workers (``pt_data_worker``,
multiprocessing spawn children), ``resource_tracker``, the telemetry sidecar, the log
copier and this agent itself are never trainings of their own.

What one process is (its entry point, output, handler, options) is ``process_facts.py``.
Over 600 lines: the scan, the :class:`Training` it builds (one pass over
``/proc``, ~260 lines), a row's quick health and what outlives a trainer share the
scan's tables (its family, its helpers' marks): apart, each would take them as arguments.

Standard library only, Python 3.8+.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from eagle3_tui.agent import tfevents, trackers, wandbfile
from eagle3_tui.agent.frames import AgentError, emit
from eagle3_tui.agent.names import (
    ERR_GONE,
    ERR_NOT_TRAINING,
    ERR_PERMISSION,
    EV_RESULT,
    OP_DISCOVER,
    RUN_ID_ENV,
    RUNS_FOLDER,
)
from eagle3_tui.agent.process_facts import (
    arg_value,
    eagle3_metrics,
    find_checkpoint_dir,
    is_python,
    is_torchrun,
    load_manifest,
    own_handler,
    read_log_tail,
    read_script,
    source_files,
    speculators_layout,
    stdout_file,
    train_options,
    user_name,
)
from eagle3_tui.agent.runs import (
    index_path,
    owned_by_me,
    prune_index,
    read_index,
    registered_rows,
)
from eagle3_tui.agent.timeline import Timeline, find_ended, note_rows, settle
from eagle3_tui.agent.trackers import TRACKER_NAMES
from eagle3_tui.telemetry import procs
from eagle3_tui.telemetry.isolation import as_module
from eagle3_tui.telemetry.nvml import NvmlUnavailable, nvml_from_env
from eagle3_tui.telemetry.schema import CHECKPOINT_SAVED, SAVING_CHECKPOINT
from eagle3_tui.telemetry.thresholds import BUSY_CPU_PCT, SILENT_FROM_START_S

RUN_DIR_ENV = "EAGLE3_TUI_RUN_DIR"
_IMPORTS_SPECULATORS = re.compile(r"^\s*(?:from|import)\s+speculators\b", re.M)
_OUTPUT_SIGNS = re.compile(
    rf"speculators[./:]|^Epoch \d+:?\s+\d+%|{SAVING_CHECKPOINT}|Training epoch \d+/\d+", re.M
)
_SAVE_PATH_LITERAL = re.compile(
    r"""\bsave_path\s*[=:]\s*(?:str\(\s*)?(?:Path\(\s*)?["']([^"'\n]+)["']"""
)
_EPOCHS_LITERAL = re.compile(r"\bnum_epochs\s*[=:]\s*(\d+)\b")
_SAVING_MESSAGE = re.compile(rf"(?:{SAVING_CHECKPOINT}|{CHECKPOINT_SAVED})(\S+)")
_HELPERS = (
    "eagle3_tui.telemetry.sidecar",
    "eagle3_tui.train.tee",
    "multiprocessing.resource_tracker",
    "multiprocessing.semaphore_tracker",
    "torch._inductor.compile_worker",
    "eagle3-tui-agent",
)
_WORKER_MARKS = ("multiprocessing.spawn", "multiprocessing.forkserver", "--multiprocessing-fork")
START_GRACE_S = 30.0
"""A training younger than this is still starting (imports, data, workers)."""
WEAK_SIGNS_S = SILENT_FROM_START_S
"""CPU or a growing log alone say "silent" only past this age (start-up looks alike)."""


# ---- the scan ------------------------------------------------------------------------


class Seen:
    """A Python process as ``/proc`` shows it."""

    def __init__(self, st: procs.ProcStat, argv: list[str]) -> None:
        self.st = st
        self.pid = st.pid
        self.argv = argv
        self.uid = procs.owner(st.pid)
        self.torch = procs.maps_mention(st.pid, "libtorch")
        self.readable = self.torch is not None
        self._env: dict[str, str] | None = None

    @property
    def env(self) -> dict[str, str]:
        if self._env is None:
            self._env = procs.environ(self.pid) or {}
        return self._env

    @property
    def worker(self) -> bool:
        joined = " ".join(self.argv[:6])
        return self.st.comm == "pt_data_worker" or any(m in joined for m in _WORKER_MARKS)

    @property
    def helper(self) -> bool:
        joined = " ".join(self.argv[:6])
        return any(h in joined for h in _HELPERS)


def own_family(table: dict[int, procs.ProcStat]) -> set[int]:
    """This agent and what started it (the SSH session, a shell, the client)."""
    me = os.getpid()
    out = {me}
    pid = me
    while pid in table and pid > 1:
        pid = table[pid].ppid
        out.add(pid)
    return out


class Training:
    """One training found on the host: a trainer (or torchrun agent and ranks) and its
    processes, with what was found about it."""

    def __init__(
        self,
        root: Seen,
        table: dict[int, procs.ProcStat],
        kids: dict[int, list[int]],
        seen: dict[int, Seen],
    ) -> None:
        self.root = root
        self.launcher: Seen | None = root if is_torchrun(root.argv) else None
        self.ranks: list[Seen] = []
        if self.launcher is not None:
            for c in sorted(kids.get(root.pid, [])):
                s = seen.get(c)
                if s is not None and not s.worker and not s.helper:
                    self.ranks.append(s)

            def rank_of(s: Seen) -> int:
                try:
                    return int(s.env.get("RANK", s.env.get("LOCAL_RANK", "999999")))
                except ValueError:
                    return 999999

            self.ranks.sort(key=lambda s: (rank_of(s), s.pid))
        self.trainer = self.ranks[0] if self.ranks else root
        self.members: list[dict[str, Any]] = []
        todo = [root.pid]
        order: list[int] = []
        while todo:
            pid = todo.pop(0)
            order.append(pid)
            todo.extend(sorted(kids.get(pid, [])))
        rank_pids = {s.pid for s in self.ranks}
        for pid in order:
            st = table.get(pid)
            if st is None or st.zombie:
                continue
            s = seen.get(pid)
            if self.launcher is not None and pid == self.launcher.pid:
                role = "launcher"
            elif pid == self.trainer.pid:
                role = "trainer"
            elif pid in rank_pids:
                role = "rank"
            elif s is not None and s.helper:
                role = "helper"
            elif st.comm == "pt_data_worker":  # torch names its dataloader workers so
                role = "worker"
            elif s is not None and s.worker:
                role = "spawned"  # a multiprocessing child: a worker still starting, or other
            else:
                role = "child"
            self.members.append(
                {"pid": pid, "role": role, "comm": st.comm, "start_ticks": st.start_ticks}
            )
        self.evidence: list[str] = []
        self.cwd = procs.cwd(self.trainer.pid)
        fds = procs.fd_targets(self.trainer.pid)
        self.fds = fds or {}
        self.log = stdout_file(self.trainer.pid, fds, self.trainer.st.pgrp)
        self.sources = source_files(self.trainer.argv, self.cwd) if self.trainer.readable else []
        self.run_dir: str | None = None
        self.run_id: str | None = None
        self.manifest: dict[str, Any] = {}
        self.checkpoint_dir: str | None = None
        self.epochs: int | None = None
        self.handler: str | None = None
        """``json`` or ``printed``: a handler of the user's own writes its metric dicts
        (to :attr:`metrics_file`), as JSON lines or as printed dicts."""
        self.metrics_file: str | None = None
        self.metrics_run: str | None = None
        """The trainer's run in its tracker's store (``handler`` ``mlflow``, ``trackio``)."""
        self.metrics_note: str | None = None
        """Why its tracker's store cannot be read (ambiguous, not trusted, elsewhere)."""
        self.speculators = False
        self.health: tuple[str, str] | None = None
        self.cpu_pct = 0.0
        self._judge()

    # -- what it is -------------------------------------------------------------------
    def _judge(self) -> None:
        t = self.trainer
        ev = self.evidence
        if t.torch:
            ev.append("torch loaded (libtorch in its memory maps)")
        joined = " ".join(t.argv)
        if "speculators" in joined:
            self.speculators = True
            ev.append("speculators in its command line")
        texts = []
        for path in self.sources:
            text = read_script(path) or ""
            texts.append(text)
            if _IMPORTS_SPECULATORS.search(text):
                self.speculators = True
                ev.append(f"{path} imports speculators")
                break
        env = {} if not t.readable else t.env
        marker_dir = env.get(RUN_DIR_ENV) if env.get(RUN_ID_ENV) else None
        metrics_open = [
            p
            for p in self.fds.values()
            if p.endswith("/metrics.jsonl") and p.startswith("/") and eagle3_metrics(p)
        ]
        run_dir = marker_dir or (os.path.dirname(metrics_open[0]) if metrics_open else None)
        if run_dir:
            self.run_dir = run_dir
            self.speculators = True
            ev.append(
                "eagle3-tui telemetry: "
                + ("the run marker in its environment" if marker_dir else "metrics.jsonl open")
            )
            self._read_manifest(run_dir)
        if self.launcher is not None:
            ev.append(f"torchrun agent pid {self.launcher.pid} with {len(self.ranks)} rank(s)")
        workers = [m for m in self.members if m["role"] == "worker"]
        if workers:
            ev.append(f"{len(workers)} dataloader worker(s)")
        log_tail = read_log_tail(self.log) if self.log else ""
        if self.log and _OUTPUT_SIGNS.search(log_tail):
            self.speculators = True
            ev.append("its log shows speculators' output")
        self.options = train_options(t.argv, self.cwd)
        self.backends = trackers.backends_named(self.options.get("logger"), texts)
        """speculators' metric backends it is seen to use (its --logger, its script)."""
        self.log_dir = self.options.get("log_dir")
        if self.log_dir is not None and self.cwd and not os.path.isabs(self.log_dir):
            self.log_dir = os.path.join(self.cwd, self.log_dir)
        if run_dir is None:
            self.handler, self.metrics_file = own_handler(t.pid, self.fds, self.log, log_tail)
            if self.handler is not None:
                self.speculators = True  # the dicts are speculators' metrics
                how = "JSON lines" if self.handler == "json" else "printed dicts"
                ev.append(
                    f"its own handler writes speculators' metrics ({how}) to {self.metrics_file}"
                )
            if self.handler in (None, "printed"):  # its event files have more digits
                roots = [r for r in (self.log_dir, self.cwd) if r]
                pids = {t.pid, *(int(m["pid"]) for m in self.members)}
                since = procs.started_at(t.st)
                events = tfevents.find_event_files(roots, pids, t.uid, since)
                runs = [] if events else wandbfile.find_run_files(roots, pids, t.uid, since)
                if events:
                    self.handler, self.metrics_file = "tensorboard", events[0]
                    ev.append(f"speculators' TensorBoard backend writes its events to {events[0]}")
                elif runs:
                    self.handler, self.metrics_file = "wandb", runs[0]
                    ev.append(f"speculators' W&B backend writes its run file {runs[0]}")
                else:
                    self._find_tracker(since)
        # where checkpoints go, and how many epochs
        argv = t.argv
        save = self.options.get("save_path") or arg_value(argv, ("--output-dir", "--output_dir"))
        epochs = self.options.get("epochs") or arg_value(argv, ("--num-epochs", "--num_epochs"))
        for text in texts:
            if save is None:
                m = _SAVE_PATH_LITERAL.search(text)
                save = m.group(1) if m else None
            if epochs is None:
                m = _EPOCHS_LITERAL.search(text)
                epochs = m.group(1) if m else None
        if save is None:
            found = [m.group(1) for m in _SAVING_MESSAGE.finditer(log_tail)]
            if found:
                save = os.path.dirname(found[-1].rstrip("/"))
        if save is None and self.manifest.get("checkpoint_dir"):
            save = str(self.manifest["checkpoint_dir"])
        if save is not None:
            self.checkpoint_dir = os.path.normpath(os.path.join(self.cwd or "/", save))
        else:
            self.checkpoint_dir = find_checkpoint_dir(
                self.cwd, command=list(argv), pid=t.pid, since=procs.started_at(t.st)
            )
        if self.checkpoint_dir and speculators_layout(self.checkpoint_dir):
            self.speculators = True
            ev.append("speculators checkpoints in " + self.checkpoint_dir)
        try:
            self.epochs = int(epochs) if epochs is not None else None
        except ValueError:
            self.epochs = None
        if self.epochs is None and isinstance(self.manifest.get("epochs"), int):
            self.epochs = self.manifest["epochs"]

    def _read_manifest(self, run_dir: str) -> None:
        m = load_manifest(run_dir)
        if m is not None and m.get("pid") == self.trainer.pid:
            self.manifest = m
            self.run_id = m.get("run_id") if isinstance(m.get("run_id"), str) else None
            if not self.log and m.get("log_file"):
                self.log = os.path.join(run_dir, str(m["log_file"]))

    # -- what a client sees -------------------------------------------------------------
    def _find_tracker(self, since: float | None) -> None:
        """speculators' MLflow or trackio backend's store of this training (by its
        environment and working directory: :func:`trackers.find_tracker`)."""
        t = self.trainer
        held = set(self.fds.values())
        for m in self.members:
            held.update((procs.fd_targets(int(m["pid"])) or {}).values())
        found = trackers.find_tracker(t.env, self.cwd, t.uid, since, self.backends, held)
        if found is None:
            return
        backend, store, why = found
        if store is not None:
            self.handler, self.metrics_file, self.metrics_run = backend, store.path, store.run
            self.evidence.append(
                f"speculators' {TRACKER_NAMES[backend]} backend writes its metrics to "
                f"{store.path} (run {store.run})"
            )
        elif why is not None:
            self.evidence.append(f"speculators' {TRACKER_NAMES[backend]} backend: {why}")
            if self.handler is None:  # it writes them, where they cannot be read
                self.handler, self.metrics_note = backend, why

    @property
    def pids(self) -> list[int]:
        return [m["pid"] for m in self.members]

    def row(self, btime: float | None, boot: str | None) -> dict[str, Any]:
        t = self.trainer
        uid = t.uid
        return {
            "pid": t.pid,
            "start_ticks": t.st.start_ticks,
            "boot_id": boot,
            "pgid": t.st.pgrp,
            "sid": t.st.session,
            "launcher_pid": self.launcher.pid if self.launcher is not None else None,
            "uid": uid,
            "user": user_name(uid),
            "mine": uid == os.geteuid(),
            "readable": t.readable,
            "started": procs.started_at(t.st, btime),
            "command": as_module((self.launcher or t).argv),
            "cwd": self.cwd,
            "log": self.log,
            "telemetry": self.run_dir is not None,
            "handler": self.handler,
            "metrics_file": self.metrics_file,
            "metrics_run": self.metrics_run,
            "metrics_note": self.metrics_note,
            "backends": sorted(self.backends),
            "log_dir": self.log_dir,
            "run_dir": self.run_dir,
            "run_id": self.run_id,
            "checkpoint_dir": self.checkpoint_dir,
            "epochs": self.epochs,
            "ranks": [
                {
                    "pid": s.pid,
                    "start_ticks": s.st.start_ticks,
                    "rank": s.env.get("RANK"),
                    "local_rank": s.env.get("LOCAL_RANK"),
                }
                for s in self.ranks
            ],
            "workers": [m["pid"] for m in self.members if m["role"] == "worker"],
            "members": self.members,
            "evidence": self.evidence,
        }


def scan() -> tuple[list[Training], dict[int, Seen]]:
    """Every speculators training on this host (newest first), and every Python process
    seen (to explain why a PID is not one)."""
    table = procs.all_stats()
    family = own_family(table)
    seen: dict[int, Seen] = {}
    for pid, st in table.items():
        if st.zombie or pid in family or st.ppid == 2 or pid <= 2:
            continue
        argv = procs.cmdline(pid)
        if not argv or not is_python(argv, st.comm):
            continue
        seen[pid] = Seen(st, argv)
    kids: dict[int, list[int]] = {}
    for p in table.values():
        kids.setdefault(p.ppid, []).append(p.pid)

    def candidate(s: Seen) -> bool:
        if s.worker or s.helper:
            return False
        if s.torch:
            return True
        joined = " ".join(s.argv)
        return s.torch is None and ("speculators" in joined or is_torchrun(s.argv))

    cands = {pid for pid, s in seen.items() if candidate(s)}

    def nearest_candidate(pid: int) -> int | None:
        up = table[pid].ppid
        while up in table and up > 1:
            if up in cands:
                return up
            up = table[up].ppid
        return None

    # A candidate under another one belongs to its training (a rank, a worker)... unless
    # the one above is no training itself (a notebook kernel with torch that launched it).
    parent = {pid: nearest_candidate(pid) for pid in cands}
    below: dict[int | None, list[int]] = {}
    for pid, up in parent.items():
        below.setdefault(up, []).append(pid)
    found: list[Training] = []
    todo = sorted(below.get(None, []))
    while todo:
        pid = todo.pop()
        t = Training(seen[pid], table, kids, seen)
        if t.speculators:
            found.append(t)
        else:
            todo.extend(below.get(pid, []))
    found.sort(key=lambda t: -t.trainer.st.start_ticks)
    return found, seen


# ---- a quick look at each training's health ---------------------------------------------


def quick_health(trainings: list[Training], now: float, btime: float | None) -> None:
    """A first verdict per training from one short look (0.5 s of CPU time, the log's
    age, the GPU): ``summary`` (or the monitor) judges it fully."""
    before = {pid: procs.stat(pid) for t in trainings for pid in t.pids}
    workers = {m["pid"] for t in trainings for m in t.members if m["role"] == "worker"}
    io_before = {pid: procs.io_counters(pid) for pid in workers}
    time.sleep(0.5)
    for t in trainings:
        cpu = 0.0
        read = 0
        for pid in t.pids:
            a, b = before.get(pid), procs.stat(pid)
            if a is not None and b is not None and a.start_ticks == b.start_ticks:
                cpu += max(0.0, b.cpu_s - a.cpu_s) / 0.5 * 100.0
            io_a, io_b = io_before.get(pid), procs.io_counters(pid) if pid in workers else None
            if io_a is not None and io_b is not None:
                read += max(0, io_b.get("rchar", 0) - io_a.get("rchar", 0))
        started = procs.started_at(t.trainer.st, btime) or now
        age = now - started
        try:
            log_age = now - os.stat(t.log).st_mtime if t.log else None
        except OSError:
            log_age = None
        t.cpu_pct = cpu
        if t.run_dir is not None:
            # its records say its health (summary, the monitor): not judged from outside
            # here, where a held, hung or diverged run looked "running"
            health, why = "live", "telemetry: its health is in its records (see summary)"
        elif age < START_GRACE_S:
            health, why = "waiting", f"started {age:.0f} s ago"
        elif t.handler is not None and t.metrics_file:
            health, why = _handler_verdict(now, t.metrics_file, cpu, read)
        else:
            health, why = _quick_verdict(age, cpu, read, log_age)
        t.health = (health, why)


def _handler_verdict(now: float, metrics_file: str, cpu: float, read: int) -> tuple[str, str]:
    """The first verdict on a training whose own handler writes its metrics: by when it
    last wrote (within :data:`START_GRACE_S`: running), else as the model's quiet run
    (working: silent; nothing moves: stalled)."""
    try:
        quiet = now - os.stat(metrics_file).st_mtime
    except OSError:
        return "waiting", f"its own handler's file {metrics_file} cannot be read"
    if quiet <= START_GRACE_S:
        return "running", f"its own JSON handler wrote a metric {quiet:.0f} s ago"
    if cpu >= BUSY_CPU_PCT or read > 0:
        return "silent", f"busy ({cpu:.0f}% CPU), no metric from its own handler for {quiet:.0f} s"
    return "stalled", f"no CPU ({cpu:.0f}%), no data read, no metric for {quiet:.0f} s"


def _quick_verdict(age: float, cpu: float, read: int, log_age: float | None) -> tuple[str, str]:
    """The first verdict on a training without telemetry, by the model's rules
    (``model/observed_health.py``): data read by its workers says the training loop
    runs; CPU or a log written within :data:`START_GRACE_S` say it works, which
    start-up does too (so only past :data:`WEAK_SIGNS_S`); none of them, stalled."""
    signs = []
    if cpu >= BUSY_CPU_PCT:
        signs.append(f"{cpu:.0f}% CPU")
    if read > 0:
        signs.append(f"its workers read {read} B in 0.5 s")
    if log_age is not None and log_age < START_GRACE_S:
        signs.append(f"its log written {log_age:.0f} s ago")
    if not signs:
        quiet = f"{log_age:.0f} s" if log_age is not None else "a while"
        return "stalled", f"no CPU ({cpu:.0f}%), no data read, no output for {quiet}"
    if read == 0 and age < WEAK_SIGNS_S:  # start-up looks like this too
        return "waiting", f"started {age:.0f} s ago, working ({', '.join(signs)})"
    return (
        "silent",
        f"busy ({', '.join(signs)}), no metric logged: no handler on speculators.metrics",
    )


def _rows(trainings: list[Training]) -> list[dict[str, Any]]:
    btime, boot = procs.boot_time(), procs.boot_id()
    out = []
    for t in trainings:
        row = t.row(btime, boot)
        if t.health is not None:
            row["health"], row["health_reason"] = t.health
            row["cpu_pct"] = round(t.cpu_pct, 1)
        out.append(row)
    return out


def gpu_users(pids: list[int]) -> dict[int, list[int]]:
    """Which of ``pids`` use which GPU (NVML's per-device process lists; the recorded
    fixture of ``EAGLE3_TUI_NVML_FIXTURE`` in tests)."""
    out: dict[int, list[int]] = {}
    try:
        nvml = nvml_from_env()
        nvml.init()
    except (NvmlUnavailable, OSError, ValueError):
        return out
    try:
        wanted = set(pids)
        for i in range(nvml.device_count()):
            try:
                reading = nvml.read(i)
            except Exception:  # a lost device: the others still count
                continue
            users = sorted(p.pid for p in reading.processes if p.pid in wanted)
            if users:
                out[i] = users
    finally:
        nvml.shutdown()
    return out


def live_rows(health: bool = True) -> list[dict[str, Any]]:
    """Every live training's row (``health``: with a first verdict); each one without
    telemetry leaves a record from now on (:mod:`timeline`)."""
    trainings, _ = scan()
    now = time.time()
    if health and trainings:
        quick_health(trainings, now, procs.boot_time())
    rows = _rows(trainings)
    note_rows(rows)
    users = gpu_users([p for r in rows for p in (m["pid"] for m in r["members"])])
    for r in rows:
        mine = {m["pid"] for m in r["members"]}
        r["gpus"] = [
            {"index": i, "pids": [p for p in ps if p in mine]}
            for i, ps in sorted(users.items())
            if any(p in mine for p in ps)
        ]
        if r["gpus"]:
            r["evidence"].append("uses GPU " + ",".join(str(g["index"]) for g in r["gpus"]))
    return rows


# ---- what outlives a trainer -----------------------------------------------------------


def left_behind(process: dict[str, Any]) -> list[dict[str, Any]]:
    """What of a training is alive though its trainer is not: the processes of its tree
    that a look recorded while it lived (same PID and start time) and their
    descendants, and the dataloader workers and helpers of its process group or
    session started after it (reparented when the trainer was SIGKILLed, they live
    on for seconds: a worker notices its parent's death every 5 s). Its PID, start time,
    role, name and memory each; eagle3-tui's own agents are never one."""
    if process.get("boot_id") and process.get("boot_id") != procs.boot_id():
        return []
    table = procs.all_stats()
    family = own_family(table)
    trainer, since = process.get("pid"), process.get("start_ticks") or 0
    recorded = {
        (m.get("pid"), m.get("start_ticks")): str(m.get("role") or "child")
        for m in process.get("members") or []
        if isinstance(m, dict)
    }
    group, session, uid = process.get("pgid"), process.get("sid"), process.get("uid")
    found: dict[int, str] = {}
    for pid, st in table.items():
        if st.zombie or pid in family or pid == trainer:
            continue
        role = recorded.get((pid, st.start_ticks))
        joined = ""
        kin = st.pgrp == group or st.session == session
        if role is None and kin and st.start_ticks >= since and procs.owner(pid) == uid:
            joined = " ".join(procs.cmdline(pid)[:6])
            role = _orphan_role(st, joined)
        if role is not None and "eagle3-tui-agent" not in joined:
            found[pid] = role
    kids: dict[int, list[int]] = {}
    for st in table.values():
        kids.setdefault(st.ppid, []).append(st.pid)
    todo = list(found)
    while todo:
        for kid in kids.get(todo.pop(), []):
            if kid not in found and kid not in family and not table[kid].zombie:
                found[kid] = "child"
                todo.append(kid)
    return [
        {
            "pid": pid,
            "start_ticks": table[pid].start_ticks,
            "role": role,
            "comm": table[pid].comm,
            "rss_bytes": procs.rss_bytes(pid),
        }
        for pid, role in sorted(found.items())
    ]


def _orphan_role(st: procs.ProcStat, joined: str) -> str | None:
    """A dataloader worker or a helper by its name or command line; None for anything
    else of the same group or session (a shell, another program: not the run's)."""
    if st.comm == "pt_data_worker" or any(m in joined for m in _WORKER_MARKS):
        return "worker"
    if any(h in joined for h in _HELPERS):
        return "helper"
    return None


def left_behind_of(tl: Timeline) -> list[dict[str, Any]]:
    """:func:`left_behind` of a recorded training (what its record says of it)."""
    return left_behind(tl.process)


# ---- one PID ---------------------------------------------------------------------------


STILL_STARTING_S = 120.0
"""A Python process younger than this may still be importing torch and speculators."""
WAIT_FOR_START_S = 20.0
"""How long :func:`describe` looks again at such a process before it says what it is."""


def _pid_max() -> int:
    """The host's highest PID (``/proc/sys/kernel/pid_max``; Linux's ceiling where
    unreadable)."""
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 1 << 22


def describe(pid: int, start_ticks: int | None = None) -> dict[str, Any]:
    """The training ``pid`` belongs to (a worker or rank names its training), or an
    :class:`AgentError`: ``gone``, ``permission`` or ``not_training``."""
    st = procs.stat(pid)
    if st is None or st.zombie:
        # "it has exited" of a PID this host never gives (above its pid_max) is not true
        gone = " (it has exited)" if st is not None or pid <= _pid_max() else ""
        raise AgentError(ERR_GONE, f"pid {pid}: no such process{gone}")
    if start_ticks is not None and st.start_ticks != start_ticks:
        raise AgentError(
            ERR_GONE, f"pid {pid} has exited (the PID now belongs to another process: {st.comm})"
        )
    argv = procs.cmdline(pid)
    uid = procs.owner(pid)
    me = os.geteuid()
    if uid is not None and uid != me and me != 0 and procs.environ(pid) is None:
        cmd = " ".join(argv)[:80] or st.comm
        who = user_name(uid)
        connect = who if uid == 0 else f"{who}, or as root"
        raise AgentError(
            ERR_PERMISSION,
            f"pid {pid} ({cmd}) belongs to user {who}: eagle3-tui runs as "
            f"{user_name(me)} and cannot read it (connect as {connect})",
        )
    python = bool(argv) and is_python(argv, st.comm)
    up = procs.uptime()
    age = None if up is None else up - st.start_ticks / procs.CLK_TCK
    # a Python process in its first seconds may not have imported speculators yet (the
    # user opened the monitor right after launching it): looked at again for a while
    began = time.monotonic()
    until = began + (
        min(WAIT_FOR_START_S, STILL_STARTING_S - age)
        if python and age is not None and age < STILL_STARTING_S
        else 0.0
    )
    while True:
        trainings, seen = scan()
        for t in trainings:
            if pid in t.pids:
                row = _rows([t])[0]
                note_rows([row])
                role = next(m["role"] for m in t.members if m["pid"] == pid)
                if pid != t.trainer.pid:
                    row["named_pid"] = {"pid": pid, "role": role}
                return row
        if time.monotonic() >= until or not procs.alive(pid, st.start_ticks):
            break
        time.sleep(1.0)
    if not python:
        raise AgentError(
            ERR_NOT_TRAINING, f"pid {pid} ({st.comm}) is not a Python process, not a training"
        )
    young = ""
    if age is not None and age < STILL_STARTING_S:
        young = (
            f" (it started {age + time.monotonic() - began:.0f} s ago: a training still "
            "importing its libraries is not known as one yet; try again shortly)"
        )
    s = seen.get(pid)
    if s is not None and s.torch is False:
        why = "torch is not loaded in it"
    else:
        why = (
            "torch is loaded, but nothing says it trains with speculators (its command line, "
            "script, output and checkpoints)"
        )
    raise AgentError(
        ERR_NOT_TRAINING,
        f"pid {pid} ({' '.join(argv)[:80]}) is not a speculators training: {why}{young}",
    )


def live_or_ended(pid: int, start: int | None) -> tuple[dict[str, Any], Timeline | None]:
    """The training ``pid`` (started at ``start`` ticks) described live, or, gone, the
    record of it kept while it lived (its row, and the record); :class:`AgentError`
    when it is neither."""
    try:
        return describe(pid, start), None
    except AgentError as e:
        ended = find_ended(pid, start, left_behind_of) if e.kind == ERR_GONE else None
        if ended is None:
            raise
        row = ended.row()
        run_dir, _ = _attached(row)
        return (row if run_dir is None else given_telemetry(row, run_dir)), ended


def given_telemetry(row: dict[str, Any], run_dir: str) -> dict[str, Any]:
    """The row of an ended training that telemetry was attached to while it lived:
    its record began before (``telemetry`` false), its metrics are in ``run_dir``."""
    return dict(row, telemetry=True, run_dir=run_dir)


def manifest_of(row: dict[str, Any], host: str) -> dict[str, Any]:
    """A manifest-like identity of a discovered training, for ``kill``: the trainer's PID,
    start time and boot id (checked again before any signal), the torchrun agent."""
    return {
        "pid": row["pid"],
        "pgid": row.get("pgid"),
        "start_ticks": row["start_ticks"],
        "boot_id": row.get("boot_id"),
        "launcher_pid": row.get("launcher_pid"),
        "started_at": row.get("started"),
        "host": host,
        "cwd": row.get("cwd"),
        "argv": row.get("command"),
        "checkpoint_dir": row.get("checkpoint_dir"),
        "log_file": row.get("log"),
        "run_id": row.get("run_id"),
        "run_dir": row.get("run_dir"),
        "ranks": row.get("ranks") or [],
        "observed": True,
    }


# ---- the discover operation ----------------------------------------------------------


def ended_rows() -> list[dict[str, Any]]:
    """The trainings without telemetry this user's agent observed that have ended
    (their records, :mod:`timeline`), newest first; not one that had telemetry attached
    before it ended (a kill attaches first) whose run this user's index lists: that
    run is listed, and says how it ended. One whose attached run the index does not list
    (attached as root to another user's trainer, or under another ``XDG_STATE_HOME``)
    is, with its run (:func:`given_telemetry`)."""
    out = []
    for tl in settle(left_behind_of):
        if tl.end() is None:
            continue
        row = tl.row()
        run_dir, registered = _attached(row)
        if run_dir is None:
            out.append(row)
        elif not registered:
            out.append(given_telemetry(row, run_dir))
    return out


def op_discover(req: dict[str, Any]) -> int:
    """The live trainings (with or without telemetry), the ended ones observed without
    telemetry (``ended``) and the registered runs (this user's; ``all``: every user's)."""
    live = live_rows()
    pruned = prune_index() if req.get("prune") else None
    registered, others = registered_rows(bool(req.get("all")))
    for r in registered:
        if r.get("alive"):
            match = [x for x in live if x["pid"] == r.get("pid")]
            r["live_pid"] = match[0]["pid"] if match else None
            if match and not match[0].get("run_dir"):
                match[0]["run_dir"] = r["run_dir"]
                match[0]["run_id"] = r.get("run_id")
    emit(
        EV_RESULT,
        op=OP_DISCOVER,
        live=live,
        ended=ended_rows(),
        runs=registered,
        others=others,
        pruned=pruned,
        index=str(index_path()),
        host=os.uname().nodename,
        user=user_name(os.geteuid()),
        uid=os.geteuid(),
        now=time.time(),
    )
    return 0


def attached_run(row: dict[str, Any]) -> str | None:
    """The run directory of this user's run registered for the ended training ``row``
    while it lived (its PID, registered between its start and the look that found it
    gone): a live attach gave it telemetry (a kill attaches first), whose records say how
    it ended (stopped at a step boundary, its save a numbered checkpoint), where the
    outside record knows only that it went. None when it ran without telemetry to its
    end."""
    return _attached(row)[0]


def _attached(row: dict[str, Any]) -> tuple[str | None, bool]:
    """:func:`attached_run`, and whether this user's index lists that run: there first,
    else where attach puts a run by default (``CWD/eagle3-runs/attached-PID``, a
    manifest naming that very process and its attach, owned by its user: the
    telemetry registered the run in the index of the trainer's environment, which
    need not be the one read here)."""
    started, ended = row.get("started"), row.get("ended_at")
    if not isinstance(started, (int, float)) or not isinstance(ended, (int, float)):
        return None, False
    # every registration, not each run's latest: a run resumed since is registered
    # again under its new trainer's PID
    for entry in reversed(read_index()):  # newest first
        at, run_dir = entry.get("started_at"), entry.get("run_dir")
        if entry.get("pid") != row.get("pid") or not isinstance(run_dir, str):
            continue
        if isinstance(at, (int, float)) and started <= at <= ended:
            path = Path(run_dir)
            if path.is_dir() and owned_by_me(path):
                return run_dir, True
    cwd, pid = row.get("cwd"), row.get("pid")
    if not isinstance(cwd, str) or not cwd or not isinstance(pid, int):
        return None, False
    run_dir = os.path.join(cwd, RUNS_FOLDER, f"attached-{pid}")
    m = load_manifest(run_dir)
    if m is None or not isinstance(m.get("attached"), dict):
        return None, False
    same = (m.get("pid"), m.get("start_ticks")) == (pid, row.get("start_ticks"))
    if not same or m.get("boot_id") != (row.get("boot_id") or procs.boot_id()):
        return None, False
    uid = row.get("uid")
    try:
        if isinstance(uid, int) and os.lstat(run_dir).st_uid != uid:
            return None, False  # not written by the trainer's telemetry (a link: its maker's)
    except OSError:
        return None, False
    return run_dir, False
