"""speculators' metrics read from the local stores of its trackio and MLflow backends
(``--logger trackio``, ``--logger mlflow``), with the standard library only.

* **trackio** keeps a project's runs in one SQLite database,
  ``$TRACKIO_DIR/<project>.db`` (default ``$HF_HOME/trackio``, speculators' project
  ``speculators``): table ``metrics`` (``id``, ``run_id``, ``timestamp`` ISO-8601 UTC,
  ``step``, ``metrics`` one flattened dict as JSON). A row is one of the trainer's dicts.
* **MLflow** (3.x) keeps its runs in ``sqlite:///mlflow.db`` of the working directory
  unless ``MLFLOW_TRACKING_URI`` says otherwise, or a ``./mlruns`` file store already
  holds experiments: table ``metrics`` (``key``, ``value``, ``timestamp`` ms, ``step``,
  ``run_uuid``), one row per key; a dict is the rows one ``log_metrics`` wrote (one
  step, one timestamp). A file store keeps ``<exp>/<run>/metrics/<key>`` files of
  ``timestamp value step`` lines.

Which run of a store is the trainer's: the one that began, or wrote, after the trainer
started; several such runs (two trainings logging to one project) are ambiguous and
none is read: a wrong run's curves are worse than none.

Reads are bounded (:data:`ROWS_PER_READ`, :data:`MAX_JSON`) and read-only; a store is
opened per look and closed, never left holding a lock, and never makes a file in the
user's directory: a WAL database whose ``-wal`` file is absent (no writer has it open)
is read as immutable, since a read-only connection would leave ``-wal``/``-shm`` files
behind (root's, when the agent runs as root: the user's next writer could not open them).
"""

from __future__ import annotations

import math
import os
import pwd
import re
import time
from datetime import datetime, timezone
from typing import Any, Dict, Tuple  # noqa: UP035 (Python 3.8 on the host)
from urllib.parse import quote, unquote, urlparse

from eagle3_tui.agent.logparse import tracked_dict
from eagle3_tui.telemetry.parsing import parse_json
from eagle3_tui.telemetry.safefs import read_bounded, trust_problem

try:  # a Python built without SQLite: those stores are said to be unreadable
    import sqlite3
except ImportError:  # pragma: no cover - every CPython here has it
    sqlite3 = None  # type: ignore[assignment]

_UTC = timezone.utc  # noqa: UP017 (datetime.UTC is Python 3.11+)
ROWS_PER_READ = 20000
"""Rows read per look (a look of a long history reads on at the next)."""
MAX_JSON = 1 << 16
"""A trackio row longer than this is not one of the trainer's dicts: skipped, counted."""
MAX_KEY_FILE = 64 << 20
"""An MLflow file store's metric file is read up to this (64 MiB: 1.5M steps)."""
SETTLED_S = 2.0
"""A file store's newest dict is whole once its files have not changed for this long."""
RECENT_ROWS = 50000
"""A trackio store's newest rows looked at to find the runs written since a trainer began."""
MLRUNS_WALK = 2000
"""Entries of an MLflow file store looked at per search."""

Metric = Tuple[Dict[str, Any], float]  # noqa: UP006 (evaluated: Python 3.8 cannot subscript)
"""One of the trainer's metric dicts, with when it was logged (seconds since the epoch)."""


TRACKER_NAMES = {"mlflow": "MLflow", "trackio": "trackio", "wandb": "W&B"}
"""speculators' backends by ``--logger`` name, as they are called."""


class StoreError(Exception):
    """A store that cannot be read (gone, locked past a look, not SQLite, corrupt)."""


# ---- opening a SQLite store, leaving nothing behind -------------------------------


def _wal_mode(path: str) -> bool:
    """Whether the database's header says WAL (its read and write versions, bytes 18
    and 19, are 2; 1 is a rollback journal's)."""
    try:
        head = read_bounded(path, 100)
    except OSError:
        return False
    return len(head) >= 20 and head[18] == 2


def _connect(path: str) -> Any:
    """``path`` opened read-only for one look. A rollback-journal database (MLflow's) is
    read under a shared lock, as any reader; a WAL database (trackio's) whose ``-wal``
    and ``-shm`` files are there (a writer has it open) through them; one without them
    as immutable (nothing is writing it, and a read-only connection would make them,
    see the module's note)."""
    if sqlite3 is None:
        raise StoreError("this Python has no sqlite3 module")
    immutable = _wal_mode(path) and not (
        os.path.exists(path + "-wal") and os.path.exists(path + "-shm")
    )
    uri = f"file:{quote(path)}?mode=ro" + ("&immutable=1" if immutable else "")
    try:
        con = sqlite3.connect(uri, uri=True, timeout=0.2, check_same_thread=False)
        con.execute("PRAGMA query_only=1")
    except sqlite3.Error as e:
        raise StoreError(str(e)) from None
    return con


def _query(path: str, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    con = _connect(path)
    try:
        return list(con.execute(sql, args).fetchall())
    except sqlite3.Error as e:
        raise StoreError(str(e)) from None
    finally:
        con.close()


_NOT_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
"""How trackio keeps a non-finite value (JSON has none)."""
MLFLOW_MAX = 1.7976931348623157e308
"""What MLflow's database keeps for ±inf (a NaN is ``is_nan`` with 0)."""


def _number(value: Any) -> float | None:
    """A metric's value, non-finite ones too (a diverged loss is what is to be seen)."""
    if isinstance(value, str):
        return _NOT_FINITE.get(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _mlflow_value(value: Any, is_nan: Any) -> float | None:
    if is_nan:
        return math.nan
    v = _number(value) if not isinstance(value, str) else None
    if v is not None and abs(v) == MLFLOW_MAX:
        return math.copysign(math.inf, v)
    return v


def _iso_seconds(text: Any) -> float | None:
    """trackio's ISO-8601 timestamp in seconds since the epoch (None: not one)."""
    if not isinstance(text, str):
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=_UTC)
    return when.timestamp()


# ---- the stores ----------------------------------------------------------------------


class Store:
    """One run's metrics in a tracker's store: read after a position (:meth:`read`),
    what could not be read counted (:attr:`skipped`)."""

    kind = ""
    words = ""

    def __init__(self, path: str, run: str) -> None:
        self.path = path
        self.run = run
        self.skipped = 0
        """Rows that were not one of the trainer's dicts (too long, not JSON, no number)."""

    def read(self, after: int) -> tuple[list[Metric], int]:
        """The dicts logged after position ``after`` (at most a look's worth, in the
        order they were logged), and the position after the last of them."""
        raise NotImplementedError


class TrackioStore(Store):
    kind = "trackio"
    words = "trackio's database"

    def read(self, after: int) -> tuple[list[Metric], int]:
        rows = _query(
            self.path,
            "SELECT id, step, timestamp, CASE WHEN length(metrics) <= ? THEN metrics END"
            " FROM metrics WHERE run_id = ? AND id > ? ORDER BY id LIMIT ?",
            (MAX_JSON, self.run, after, ROWS_PER_READ),
        )
        out: list[Metric] = []
        for rid, step, stamp, text in rows:
            after = max(after, int(rid))
            d = self._dict(text, step)
            if d is None:
                self.skipped += 1
                continue
            out.append((d, _iso_seconds(stamp) or 0.0))
        return out, after

    @staticmethod
    def _dict(text: Any, step: Any) -> dict[str, Any] | None:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        if not isinstance(text, str):
            return None
        try:
            flat = parse_json(text)
        except ValueError:
            return None
        if not isinstance(flat, dict):
            return None
        pairs = [(str(k), n) for k, v in flat.items() if (n := _number(v)) is not None]
        return tracked_dict(pairs, step if isinstance(step, int) else None)


class MlflowStore(Store):
    """An MLflow SQLite store: a dict is a run of rows of one step and one timestamp
    (one ``log_metrics``); the position is the last row of a whole dict."""

    kind = "mlflow"
    words = "MLflow's database"

    def read(self, after: int) -> tuple[list[Metric], int]:
        rows = _query(
            self.path,
            "SELECT rowid, key, value, timestamp, step, is_nan FROM metrics"
            " WHERE run_uuid = ? AND rowid > ? ORDER BY rowid LIMIT ?",
            (self.run, after, ROWS_PER_READ),
        )
        out: list[Metric] = []
        group: list[tuple[str, Any]] = []
        at: tuple[Any, Any] | None = None
        done = after
        last = after
        for rid, key, value, stamp, step, is_nan in rows:
            if at is not None and (stamp, step) != at:
                self._emit(group, at, out)
                done = last
                group = []
            at = (stamp, step)
            last = int(rid)
            number = _mlflow_value(value, is_nan)
            if number is not None and isinstance(key, str):
                group.append((key, number))
        if at is not None and len(rows) < ROWS_PER_READ:  # a log_metrics commits whole
            self._emit(group, at, out)
            done = last
        return out, done

    def _emit(self, flat: list[tuple[str, Any]], at: tuple[Any, Any], out: list[Metric]) -> None:
        stamp, step = at
        d = tracked_dict(flat, step if isinstance(step, int) else None)
        if d is None:
            if not flat or not any(k.startswith(("train/", "val/")) for k, _ in flat):
                return  # the run's hyperparameters (speculators logs them as metrics)
            self.skipped += 1
            return
        out.append((d, stamp / 1000.0 if isinstance(stamp, (int, float)) else 0.0))


class MlrunsStore(Store):
    """An MLflow file store's run (``<exp>/<run>``): its per-key files read whole each
    look (bounded), the dicts put back together by (timestamp, step); the position is
    the last dict's (timestamp ms × 10⁷ + step): one still being written (its newest
    timestamp, files of it not all there yet) waits for the next look."""

    kind = "mlflow"
    words = "MLflow's file store"

    def read(self, after: int) -> tuple[list[Metric], int]:
        keys = _metric_files(os.path.join(self.path, "metrics"))
        groups: dict[tuple[int, int], list[tuple[str, float]]] = {}
        changed = 0.0
        for key, file in keys:
            try:
                changed = max(changed, os.stat(file).st_mtime)
                data = read_bounded(file, MAX_KEY_FILE)
            except OSError:
                continue
            for line in data.decode("utf-8", "replace").splitlines():
                parts = line.split()
                try:
                    stamp, value, step = int(parts[0]), float(parts[1]), int(parts[2])
                except (ValueError, IndexError):
                    self.skipped += 1
                    continue
                if 0 <= step < 10**7:  # nan and inf too: MLflow writes them as such
                    groups.setdefault((stamp, step), []).append((key, value))
        out: list[Metric] = []
        newest = max(groups, default=None) if time.time() - changed < SETTLED_S else None
        for stamp, step in sorted(groups):
            pos = stamp * 10**7 + step
            if pos <= after or (stamp, step) == newest:
                continue
            d = tracked_dict(groups[(stamp, step)], step)
            if d is not None:
                out.append((d, stamp / 1000.0))
            after = pos
        return out, after


def _metric_files(root: str) -> list[tuple[str, str]]:
    """``(key, file)`` of a file-store run's metrics (``train/loss`` is ``train/loss``
    under ``metrics/``), bounded; no symlink followed."""
    found: list[tuple[str, str]] = []
    todo = [("", root)]
    seen = 0
    while todo and seen < MLRUNS_WALK:
        prefix, path = todo.pop()
        try:
            entries = list(os.scandir(path))
        except OSError:
            continue
        for e in entries:
            seen += 1
            key = f"{prefix}{e.name}"
            if e.is_dir(follow_symlinks=False):
                todo.append((key + "/", e.path))
            elif e.is_file(follow_symlinks=False):
                found.append((key, e.path))
    return found


# ---- which store, which run ---------------------------------------------------------


def trackio_db(env: dict[str, str], home: str | None) -> str | None:
    """speculators' trackio project database for a process of environment ``env``."""
    base = env.get("TRACKIO_DIR")
    if not base:
        hf = env.get("HF_HOME")
        if not hf:
            cache = env.get("XDG_CACHE_HOME") or (os.path.join(home, ".cache") if home else None)
            if cache is None:
                return None
            hf = os.path.join(cache, "huggingface")
        base = os.path.join(hf, "trackio")
    return os.path.join(base, "speculators.db")


def mlflow_store(env: dict[str, str], cwd: str | None) -> tuple[str | None, str | None]:
    """Where MLflow keeps the runs of a process of environment ``env`` run in ``cwd``:
    ``(sqlite file, None)``, ``(None, file-store root)``, or ``(None, None)`` with the
    reason elsewhere (a server: its metrics are not on this host)."""
    uri = env.get("MLFLOW_TRACKING_URI", "")
    if not uri:
        if cwd is None:
            return None, None
        mlruns = os.path.join(cwd, "mlruns")
        if _has_experiments(mlruns):
            return None, mlruns
        return os.path.join(cwd, "mlflow.db"), None
    parsed = urlparse(uri)
    if parsed.scheme == "sqlite":
        path = unquote(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else ""
        if path and not path.startswith("/") and cwd:
            path = os.path.join(cwd, path)
        return (path or None), None
    if parsed.scheme in ("", "file"):
        root = unquote(parsed.path) if parsed.scheme == "file" else uri
        if not os.path.isabs(root) and cwd:
            root = os.path.join(cwd, root)
        return None, root
    return None, None


def _has_experiments(mlruns: str) -> bool:
    try:
        with os.scandir(mlruns) as entries:
            return any(e.name.isdigit() and e.is_dir(follow_symlinks=False) for e in entries)
    except OSError:
        return False


def find_store(
    backend: str, env: dict[str, str], cwd: str | None, home: str | None, uid: int, since: float
) -> tuple[Store | None, str | None]:
    """The trainer's run in ``backend``'s local store (``trackio`` or ``mlflow``): the
    store, or None and why (in a line: not there yet, ambiguous, not trusted)."""
    if backend == "trackio":
        path = trackio_db(env, home)
        if path is None or not _written_since(path, since):
            return None, None  # (a store nobody wrote since is not this training's)
        problem = trust_problem(path, uid)
        if problem is not None:
            return None, f"trackio's database is not read: {problem}"
        return _one_run(TrackioStore, path, _trackio_runs(path, since))
    db, mlruns = mlflow_store(env, cwd)
    if db is not None:
        if not _written_since(db, since):
            return None, None
        problem = trust_problem(db, uid)
        if problem is not None:
            return None, f"MLflow's database is not read: {problem}"
        return _one_run(MlflowStore, db, _mlflow_runs(db, since))
    if mlruns is not None:
        runs = _mlruns_runs(mlruns, since)
        trusted = [r for r in runs if trust_problem(os.path.join(r, "meta.yaml"), uid) is None]
        if len(trusted) < len(runs) and not trusted:
            return None, f"MLflow's file store {mlruns} is not read: another user may write it"
        return _one_run(MlrunsStore, "", trusted)
    uri = env.get("MLFLOW_TRACKING_URI", "")
    return None, f"its metrics go to MLflow at {uri[:200]}: not on this host"


def _one_run(cls: type[Store], path: str, runs: list[str] | str) -> tuple[Store | None, str | None]:
    if isinstance(runs, str):  # a store that cannot be read: why
        return None, runs
    if not runs:
        return None, None
    if len(runs) > 1:
        return None, (
            f"{len(runs)} runs of {cls.words} began since the training started:"
            " which is its own is not known, none is read"
        )
    if cls is MlrunsStore:
        return cls(runs[0], os.path.basename(runs[0])), None
    return cls(path, runs[0]), None


def _trackio_runs(path: str, since: float) -> list[str] | str:
    """Runs with rows since ``since``, among the store's newest rows (a project's
    years of history are not scanned at every look)."""
    after = datetime.fromtimestamp(since - 2, _UTC).isoformat()
    try:
        rows = _query(
            path,
            "SELECT DISTINCT run_id FROM (SELECT run_id, timestamp FROM metrics"
            " ORDER BY id DESC LIMIT ?) WHERE timestamp >= ? LIMIT 8",
            (RECENT_ROWS, after),
        )
    except StoreError as e:
        return f"trackio's database {path} cannot be read: {e}"
    return [str(r[0]) for r in rows]


def _mlflow_runs(path: str, since: float) -> list[str] | str:
    ms = int((since - 2) * 1000)
    try:
        rows = _query(
            path,
            "SELECT run_uuid FROM runs WHERE lifecycle_stage = 'active' AND (start_time >= ?"
            " OR run_uuid IN (SELECT run_uuid FROM latest_metrics WHERE timestamp >= ?))"
            " LIMIT 8",
            (ms, ms),
        )
    except StoreError as e:
        return f"MLflow's database {path} cannot be read: {e}"
    return [str(r[0]) for r in rows]


_META_START = re.compile(rb"^start_time: *(\d+)", re.M)


def _mlruns_runs(root: str, since: float) -> list[str]:
    """Run directories of a file store begun (or, resumed, ended) since ``since``."""
    ms = int((since - 2) * 1000)
    runs: list[str] = []
    seen = 0
    try:
        exps = [e for e in os.scandir(root) if e.name.isdigit() and e.is_dir(follow_symlinks=False)]
    except OSError:
        return []
    for exp in exps:
        try:
            entries = list(os.scandir(exp.path))
        except OSError:
            continue
        for e in entries:
            seen += 1
            if seen > MLRUNS_WALK:
                return runs
            if not e.is_dir(follow_symlinks=False):
                continue
            try:
                meta = read_bounded(os.path.join(e.path, "meta.yaml"), 1 << 16)
            except OSError:
                continue
            began = _META_START.search(meta)
            if (began is not None and int(began.group(1)) >= ms) or _changed_since(
                os.path.join(e.path, "meta.yaml"), since
            ):  # begun since, or resumed by name (its status rewritten)
                runs.append(e.path)
    return runs


def _written_since(db: str, since: float) -> bool:
    """Whether the database (or its WAL) changed since ``since``: else no run of it can
    be one begun since, and it is not opened at all."""
    return _changed_since(db, since) or _changed_since(db + "-wal", since)


def _changed_since(path: str, since: float) -> bool:
    try:
        return os.stat(path).st_mtime >= since - 2
    except OSError:
        return False


_MENTIONS = {b: re.compile(rf"\b{b}\b") for b in ("mlflow", "trackio")}


def backends_named(logger: str | None, texts: list[str]) -> set[str]:
    """The backends a training is seen to use: its ``--logger`` (the library CLI's, or
    its ``--config`` file's) and the names its script's code mentions
    (``setup_metric_logger("trackio", …)``)."""
    named = {b.strip() for b in (logger or "").split(",") if b.strip()}
    named |= {b for b, word in _MENTIONS.items() if any(word.search(t) for t in texts)}
    return named


def find_tracker(
    env: dict[str, str],
    cwd: str | None,
    uid: int | None,
    since: float | None,
    named: set[str],
    held: set[str],
) -> tuple[str, Store | None, str | None] | None:
    """The store of speculators' MLflow or trackio backend that a training of
    environment ``env`` in ``cwd``, user ``uid``, started at ``since``, writes: ``(backend,
    store, None)``; ``(backend, None, why)`` when it cannot be read; None when there is
    none. Only a backend the training is seen to use is looked for: one it names
    (``named``: :func:`backends_named`) or whose store it holds open (``held``, the paths
    its processes have open: MLflow keeps its database open); a store nearby that
    another training in the same directory writes is not its own."""
    if uid is None or since is None:
        return None
    try:
        home: str | None = pwd.getpwuid(uid).pw_dir
    except KeyError:
        home = None
    for backend in ("mlflow", "trackio"):
        where = mlflow_store(env, cwd)[0] if backend == "mlflow" else trackio_db(env, home)
        if backend not in named and (where is None or where not in held):
            continue
        store, why = find_store(backend, env, cwd, home, uid, since)
        if store is not None:
            return backend, store, None
        if why is not None:
            return backend, None, why
    return None


def store_for(backend: str | None, path: str | None, run: str | None) -> Store | None:
    """The store a discovery found (its ``handler``, ``metrics_file`` and
    ``metrics_run``), made again where the training is observed."""
    if not path or not run:
        return None
    if backend == "trackio":
        return TrackioStore(path, run)
    if backend == "mlflow":
        return MlrunsStore(path, run) if os.path.isdir(path) else MlflowStore(path, run)
    return None
