"""What eagle3-tui saw of a training without telemetry, kept on its host: ``Timeline``.

Such a training writes nothing of its own, and once it exits ``/proc`` forgets it: a
``summary --pid`` a second later found "no such process". So from the first look
(the monitor, ``summary``, ``runs``, ``kill``) the agent keeps what it saw, as the
user it runs as, in that user's private state::

    ${XDG_STATE_HOME:-~/.local/state}/eagle3-tui/observed/       0700
      <boot id>-<pid>-<start ticks>/                               0700, one per process
        process.json      what discovery found: argv, cwd, log, checkpoint directory,
                          start, its handler's file, and every process of its tree
                          seen with its start time (for what outlives it)
        alive             its mtime: the last look that found it alive
        timeline.jsonl    records of the JSON-lines schema: ``proc`` (every 10 s at
                          most, and its end), ``gpu`` and ``io`` (as often),
                          ``progress``, ``ckpt``, ``val``, ``stack``; written by one
                          observer at a time (``flock`` of ``lock``)
        timeline.1.jsonl  the segment before (each at most 2 MiB: 4 MiB a run)
        log.tail          the last 64 KiB of its log (while it grows, every 10 s at
                          most; and when it ends)
        end.json          how it ended: when it was seen gone, its exit status where
                          the kernel said it (the observer held a pidfd), what of it was
                          still alive then
        held.json         its processes a look found held stopped (state T): when
                          a look first found each so, and its context switches then
                          (unchanged since: it has not run, the stop is the same one)
        lock

Every file is 0600, written without following links (``safefs``). A run's record is
kept :data:`KEEP_S` after its end; of more than :data:`MAX_RUNS` records the oldest
ended ones go first. Reading one never depends on the time: a post-mortem a minute or
a day later reads the same files.

Standard library only, Python 3.8+.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eagle3_tui.agent.runs import index_path
from eagle3_tui.telemetry import procs
from eagle3_tui.telemetry.parsing import parse_json
from eagle3_tui.telemetry.safefs import (
    open_append,
    private_dir,
    read_bounded,
    write_atomic,
)
from eagle3_tui.telemetry.schema import SCHEMA_VERSION, to_jsonable

KEEP_S = 7 * 24 * 3600.0
"""How long a record is kept after the run ended (found gone)."""
MAX_RUNS = 32
"""Records kept at most; beyond, the oldest ended ones are removed (a live one never)."""
SEGMENT_BYTES = 2 << 20
"""A timeline segment's size; two are kept (the current one and the one before)."""
LOG_TAIL_BYTES = 64 << 10
COPY_EVERY_S = 10.0
"""How often at most the log's tail is copied while it grows."""
SAMPLE_EVERY_S = 10.0
"""How often at most a ``proc``, ``gpu`` or ``io`` sample is kept (an end always is)."""
MEMBERS_KEPT = 256
PROCESS_LIMIT = 1 << 20
SAMPLED = frozenset({"proc", "gpu", "io"})
KEPT = SAMPLED | {"progress", "ckpt", "val", "stack"}
"""The kinds a timeline keeps: the log is kept as its tail, metric dicts stay where the
run wrote them (its log, its handler's file)."""
_ENVELOPE = ("v", "seq", "w", "ts", "rank")
_VOLATILE = ("members", "health", "health_reason", "cpu_pct", "gpus", "named_pid")
"""What of a discovery row changes from look to look: not a reason to rewrite it."""
CURRENT, PREVIOUS = "timeline.jsonl", "timeline.1.jsonl"
HELD = "held.json"
HELD_LIMIT = 1 << 16


def records_root() -> Path:
    """``${XDG_STATE_HOME:-~/.local/state}/eagle3-tui/observed`` (beside the index of runs)."""
    return index_path().parent / "observed"


def name_of(boot: str | None, pid: int, start_ticks: int) -> str:
    return f"{boot or 'boot'}-{pid}-{start_ticks}"


def _read_json(path: Path, limit: int = PROCESS_LIMIT) -> dict[str, Any] | None:
    try:
        obj = parse_json(read_bounded(path, limit, follow=False))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    data = json.dumps(to_jsonable(obj), separators=(",", ":"), sort_keys=True).encode()
    write_atomic(path, data, 0o600, fsync=False)


class Timeline:
    """The record of one observed process (a directory of :func:`records_root`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._process: dict[str, Any] | None = None

    # -- what it is -------------------------------------------------------------------
    @property
    def process(self) -> dict[str, Any]:
        """``process.json``: the discovered row and the processes of its tree."""
        if self._process is None:
            self._process = _read_json(self.path / "process.json") or {}
        return self._process

    @property
    def pid(self) -> int:
        return int(self.process.get("pid") or 0)

    @property
    def start_ticks(self) -> int | None:
        value = self.process.get("start_ticks")
        return value if isinstance(value, int) else None

    def alive(self) -> bool:
        """Whether its trainer still runs (same boot, same PID and start time)."""
        boot = self.process.get("boot_id")
        if boot and boot != procs.boot_id():
            return False
        return self.pid > 0 and procs.alive(self.pid, self.start_ticks)

    def last_alive(self) -> float | None:
        """When a look last found it alive (``alive``'s mtime)."""
        try:
            return os.lstat(self.path / "alive").st_mtime
        except OSError:
            return None

    def end(self) -> dict[str, Any] | None:
        """``end.json``: how it ended, once a look found it gone."""
        return _read_json(self.path / "end.json")

    def started(self) -> float:
        value = self.process.get("started")
        return float(value) if isinstance(value, (int, float)) else 0.0

    def row(self) -> dict[str, Any]:
        """Its discovery row as it was last seen, with how it ended (``alive`` false,
        ``ended_at``, ``last_alive``, ``exit_status``, ``leftovers``) once it has."""
        row = {k: v for k, v in self.process.items() if k not in ("v", "members")}
        end = self.end()
        row["alive"] = end is None
        row["record"] = str(self.path)
        if end is not None:
            for key in ("ended_at", "last_alive", "exit_status", "leftovers", "watched"):
                row[key] = end.get(key)
        return row

    def held(self) -> dict[str, Any]:
        """``held.json``: ``"PID-START"`` → ``{"since", "switches"}`` of its processes
        a look found held stopped (any observer's: the monitor's, an earlier summary's)."""
        return _read_json(self.path / HELD, HELD_LIMIT) or {}

    # -- written while it lives -------------------------------------------------------
    def note_held(self, held: dict[str, Any]) -> None:
        """Its processes held stopped now (``held.json`` rewritten whole: one that is
        not held any more goes)."""
        _write_json(self.path / HELD, held)

    def note(self, row: dict[str, Any], members: list[dict[str, Any]]) -> None:
        """It was seen alive now: its row (rewritten when it changed) and every process
        of its tree with its start time (kept, the newest :data:`MEMBERS_KEPT`)."""
        known = {(m.get("pid"), m.get("start_ticks")): m for m in self.process.get("members", [])}
        fresh = [m for m in members if (m.get("pid"), m.get("start_ticks")) not in known]
        found = {k: v for k, v in row.items() if k not in _VOLATILE}
        old = {k: v for k, v in self.process.items() if k not in ("v", "members")}
        if fresh or found != old or not self.process:
            merged = [*known.values(), *fresh][-MEMBERS_KEPT:]
            self._process = {**found, "v": 1, "members": merged}
            _write_json(self.path / "process.json", self._process)
        fd, _ = open_append(self.path / "alive", 0o600)
        try:
            os.utime(fd)
        finally:
            os.close(fd)

    def copy_log_tail(self, log: str | None) -> None:
        """The last :data:`LOG_TAIL_BYTES` of its log into ``log.tail``, with the log's
        mtime (what a post-mortem reads: the log may be gone, or written by another run
        since)."""
        if not log:
            return
        try:
            data = read_bounded(log, LOG_TAIL_BYTES, tail=True)
            mtime = os.stat(log).st_mtime
        except OSError:
            return
        target = self.path / "log.tail"
        write_atomic(target, data, 0o600, fsync=False)
        os.utime(target, (mtime, mtime), follow_symlinks=False)

    def log_tail(self) -> str | None:
        """The path of the log's copy, if one was made."""
        target = self.path / "log.tail"
        return str(target) if target.is_file() else None

    def ended(
        self,
        at: float,
        exit_status: int | None,
        leftovers: list[dict[str, Any]],
        watched: bool,
        log: str | None,
    ) -> dict[str, Any]:
        """Write how it ended (once: the first to write it wins): ``watched`` when an
        observer saw it go (``at`` is within a look's interval of its death), else it
        ended between ``last_alive`` and ``at``."""
        existing = self.end()
        if existing is not None:
            return existing
        self.copy_log_tail(log)
        end = {
            "ended_at": at,
            "last_alive": None if watched else self.last_alive(),
            "exit_status": exit_status,
            "leftovers": leftovers,
            "watched": watched,
        }
        _write_json(self.path / "end.json", end)
        return end

    # -- the timeline's records ---------------------------------------------------------
    def records(self) -> bytes:
        """Both segments' records, oldest first (whole lines only)."""
        out = []
        for name in (PREVIOUS, CURRENT):
            try:
                data = read_bounded(self.path / name, SEGMENT_BYTES * 2, follow=False)
            except OSError:
                continue
            cut = data.rfind(b"\n")
            out.append(data[: cut + 1])
        return b"".join(out)


class TimelineWriter:
    """An observer's copy of its records into the run's timeline, while it holds the
    timeline's lock (one writer at a time: another observer of the same run keeps its
    records to its own client, and takes over when the holder goes). Records carry this
    writer's own id and sequence numbers; a record another session kept already (the
    checkpoints and bars every look reads again) is not kept twice."""

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline
        self.w = f"tl-{uuid.uuid4().hex[:8]}"
        self.seq = 0
        self._lock: int | None = None
        self._keys: set[str] | None = None
        self._last: dict[str, float] = {}
        self._out: list[bytes] = []
        self.problem: str | None = None
        """Why nothing could be written (the state directory refused), once."""

    def holding(self) -> bool:
        """Whether this writer holds the timeline's lock (taken when free)."""
        if self._lock is not None:
            return True
        if self.problem is not None:
            return False
        try:
            fd, _ = open_append(self.timeline.path / "lock", 0o600)
        except OSError as e:
            self.problem = str(e)
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._lock = fd
        self._keys = _kept_keys(self.timeline.records())
        return True

    def write(
        self,
        kind: str,
        payload: dict[str, Any] | None = None,
        step: int | None = None,
        ts: float | None = None,
    ) -> None:
        """Offer one record (a ``FrameSink``'s tee): kept if it is of a kept kind, not
        a sample within :data:`SAMPLE_EVERY_S` of the last one kept, nor kept before."""
        if kind not in KEPT or self._lock is None or self._keys is None:
            return
        when = time.time() if ts is None else ts
        rec: dict[str, Any] = {"kind": kind, **(payload or {})}
        if step is not None:
            rec["step"] = step
        end = kind == "proc" and rec.get("alive") is False
        if kind in SAMPLED and not end:
            if when - self._last.get(kind, float("-inf")) < SAMPLE_EVERY_S:
                return
            self._last[kind] = when
        else:
            key = _key(rec)
            if key in self._keys:
                return
            self._keys.add(key)
        envelope = {"v": SCHEMA_VERSION, "seq": self.seq, "w": self.w, "ts": round(when, 6)}
        self.seq += 1
        line = json.dumps(to_jsonable({**envelope, "rank": 0, **rec}), separators=(",", ":"))
        self._out.append(line.encode() + b"\n")

    def flush(self) -> None:
        """Append what was kept since the last flush (one write; a segment over
        :data:`SEGMENT_BYTES` becomes the previous one first)."""
        if not self._out or self._lock is None:
            return
        data = b"".join(self._out)
        self._out.clear()
        current = self.timeline.path / CURRENT
        try:
            with contextlib.suppress(FileNotFoundError):
                if os.lstat(current).st_size + len(data) > SEGMENT_BYTES:
                    os.replace(current, self.timeline.path / PREVIOUS)
            fd, _ = open_append(current, 0o600)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as e:
            self.problem = self.problem or str(e)

    def close(self) -> None:
        self.flush()
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def _key(rec: dict[str, Any]) -> str:
    return json.dumps(
        to_jsonable({k: v for k, v in rec.items() if k not in _ENVELOPE}),
        separators=(",", ":"),
        sort_keys=True,
    )


def _kept_keys(data: bytes) -> set[str]:
    """The keys of the records a timeline holds that are kept once (not samples)."""
    keys = set()
    for line in data.splitlines():
        if b'"kind":"proc"' in line or b'"kind":"gpu"' in line or b'"kind":"io"' in line:
            continue
        try:
            rec = parse_json(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            keys.add(_key(rec))
    return keys


# ---- the records of this user ---------------------------------------------------------


def open_timeline(row: dict[str, Any]) -> Timeline | None:
    """The record of the training ``row`` (a discovery row), made when absent; None
    when the state directory cannot be used (its problem is the agent's to say)."""
    start = row.get("start_ticks")
    if not isinstance(start, int) or not isinstance(row.get("pid"), int):
        return None
    root = records_root()
    path = root / name_of(row.get("boot_id"), int(row["pid"]), start)
    try:
        new = not path.is_dir()
        if new:
            private_dir(root)
            os.chmod(root, 0o700)
            private_dir(path)
            os.chmod(path, 0o700)
            prune(time.time())
        else:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                return None
    except OSError:
        return None
    return Timeline(path)


def note_rows(rows: list[dict[str, Any]]) -> None:
    """Keep a record of every training in ``rows`` that has no telemetry (a look by
    ``runs``, a choice, a description): from now on it leaves one."""
    for row in rows:
        if row.get("run_dir"):
            continue  # eagle3-tui's telemetry writes its own records
        tl = open_timeline(row)
        if tl is not None:
            with contextlib.suppress(OSError):
                tl.note(row, list(row.get("members") or []))


def timelines() -> list[Timeline]:
    """Every record of this user (newest start first)."""
    root = records_root()
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    out = []
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False):
                out.append(Timeline(Path(e.path)))
        except OSError:
            continue
    out = [t for t in out if t.process.get("pid")]
    out.sort(key=lambda t: -t.started())
    return out


def settle(found_gone: Callable[[Timeline], list[dict[str, Any]]]) -> list[Timeline]:
    """Every record; one whose process is gone and whose end nobody wrote (no observer
    watched it go) gets its end now: found gone at this moment, alive at its last look,
    exit status unknown, and what of it is alive now (``found_gone(timeline)``: its
    leftovers)."""
    now = time.time()
    out = timelines()
    for tl in out:
        if tl.end() is None and not tl.alive():
            writer = TimelineWriter(tl)
            if not writer.holding():
                continue  # an observer is at it: it writes the end
            try:
                tl.ended(now, None, found_gone(tl), False, tl.process.get("log"))
            except OSError:
                pass
            finally:
                writer.close()
    return out


def find_ended(
    pid: int, start_ticks: int | None, found_gone: Callable[[Timeline], list[dict[str, Any]]]
) -> Timeline | None:
    """The newest record of the process ``pid`` (of that start time when given) that
    has ended: this boot's first."""
    boot = procs.boot_id()
    found = [
        t
        for t in settle(found_gone)
        if t.pid == pid
        and (start_ticks is None or t.start_ticks == start_ticks)
        and t.end() is not None
    ]
    found.sort(key=lambda t: (t.process.get("boot_id") == boot, t.started()), reverse=True)
    return found[0] if found else None


def prune(now: float) -> list[str]:
    """Remove the records of runs that ended more than :data:`KEEP_S` ago, then the
    oldest ended ones beyond :data:`MAX_RUNS`; returns what was removed."""
    ended = []
    count = 0
    for tl in timelines():
        count += 1
        end = tl.end()
        if end is None:
            continue
        at = end.get("ended_at")
        at = float(at) if isinstance(at, (int, float)) else 0.0
        ended.append((at, tl))
    ended.sort(key=lambda e: e[0])
    removed = []
    for at, tl in ended:
        if (now - at > KEEP_S or count > MAX_RUNS) and _remove(tl.path):
            removed.append(str(tl.path))
            count -= 1
    return removed


def _remove(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return False
    shutil.rmtree(path, ignore_errors=True)
    return not path.exists()
