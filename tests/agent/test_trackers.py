"""The stores of speculators' MLflow and trackio backends read on the host
(``agent/trackers.py``), standard library only: written by the real backends through
speculators' own handlers (``setup_metric_logger``), read back as the trainer's
metric dicts with the same values the backend's own reader gives; hostile stores
(not SQLite, corrupt, rows that are not dicts, another user's, two runs at once) read
nothing wrong and crash nothing; nothing is left behind in the user's directory."""

from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.agent import trackers
from eagle3_tui.agent.observe import StoreFollower
from eagle3_tui.telemetry.schema import Kind
from tests.conftest import OtherUser, skip_module_without

skip_module_without("speculators")

WRITER = textwrap.dedent(
    """
    import logging, sys
    from speculators.train.logger import setup_metric_logger

    backend, steps, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    setup_metric_logger(backend, name, "logs")
    log = logging.getLogger("speculators.metrics")
    log.info({"lr": 1e-4, "epochs": 2, "model": {"hidden": 64}}, extra={"hparams": True})
    diverged = {3: float("nan"), 4: float("inf")}  # kept by each backend its own way
    for s in range(steps):
        log.info(
            {"train": {"loss": diverged.get(s, 2.0 - s / 7), "full_acc_0": s / 10,
                       "cond_acc_1": 0.25},
             "profile": {"step_ms": 12.5}, "epoch": s // 4, "lr": 1e-4, "global_step": s},
            extra={"step": s},
        )
    log.info({"val": {"loss": 1.5, "full_acc_0": 0.5}, "epoch": 0}, extra={"step": steps})
    logging.shutdown()
    """
)


def environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "TRACKIO_"))}
    env.update(HF_HOME=str(tmp_path / "hf"), HOME=str(tmp_path), **extra)
    return env


def write(
    tmp_path: Path, backend: str, steps: int = 6, name: str = "run_{rank}", **extra: str
) -> dict[str, str]:
    """A run of ``steps`` train dicts and one validation dict, written by the real
    ``backend`` through speculators' handler, in ``tmp_path``."""
    env = environment(tmp_path, **extra)
    (tmp_path / "writer.py").write_text(WRITER)
    done = subprocess.run(
        [sys.executable, "writer.py", backend, str(steps), name],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return env


THEIR_READER = textwrap.dedent(
    """
    import json, sys
    backend, where, key = sys.argv[1], sys.argv[2], sys.argv[3]
    if backend == "mlflow":
        from mlflow.tracking import MlflowClient
        client = MlflowClient(where)
        [exp] = [e for e in client.search_experiments() if e.name == "speculators"]
        [run] = client.search_runs([exp.experiment_id])
        got = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
    else:
        from trackio.sqlite_storage import SQLiteStorage
        [run] = SQLiteStorage.get_runs("speculators")
        got = {r["step"]: r[key] for r in SQLiteStorage.get_logs("speculators", run) if key in r}
    print(json.dumps(got))
    """
)


def theirs(
    tmp_path: Path, env: dict[str, str], backend: str, where: str, key: str
) -> dict[int, float]:
    """``key`` per step as the backend's own reader gives it."""
    (tmp_path / "reader.py").write_text(THEIR_READER)
    done = subprocess.run(
        [sys.executable, "reader.py", backend, where, key],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return {int(k): v for k, v in json.loads(done.stdout.splitlines()[-1]).items()}


def as_logged(values: dict[int, float]) -> dict[int, float]:
    """MLflow's database keeps an infinite value as the largest float, and its reader
    gives that back: it was logged as infinite (what ours reads)."""
    return {
        k: math.copysign(math.inf, v) if abs(v) == trackers.MLFLOW_MAX else v
        for k, v in values.items()
    }


def read_all(store: trackers.Store) -> list[tuple[dict[str, Any], float]]:
    out: list[tuple[dict[str, Any], float]] = []
    after = 0
    while True:
        got, nxt = store.read(after)
        out.extend(got)
        if nxt == after:
            return out
        after = nxt


def found(backend: str, env: dict[str, str], cwd: Path, since: float) -> trackers.Store:
    hit = trackers.find_tracker(env, str(cwd), os.geteuid(), since, {backend}, set())
    assert hit is not None and hit[2] is None, hit
    assert hit[0] == backend and hit[1] is not None
    return hit[1]


def files_of(path: Path) -> set[str]:
    return {p.name for p in path.iterdir()}


@pytest.mark.parametrize("backend", ["mlflow", "trackio"])
def test_a_backends_store_reads_as_its_own_reader_does(tmp_path: Path, backend: str) -> None:
    pytest.importorskip(backend)
    since = time.time()
    env = write(tmp_path, backend)
    store = found(backend, env, tmp_path, since)
    where = f"sqlite:///{tmp_path / 'mlflow.db'}" if backend == "mlflow" else ""
    left = files_of(Path(store.path).parent)
    dicts = read_all(store)
    assert files_of(Path(store.path).parent) == left  # no -wal, -shm made by reading
    train = [d for d, _ in dicts if "train" in d]
    val = [d for d, _ in dicts if "val" in d]
    assert [d["global_step"] for d in train] == list(range(6))
    assert val == [{"val": {"loss": 1.5, "full_acc_0": 0.5}, "epoch": 0, "global_step": 6}]
    assert train[2]["profile"] == {"step_ms": 12.5} and train[5]["epoch"] == 1
    for key in ("train/loss", "train/full_acc_0"):
        mine = {d["global_step"]: d["train"][key.split("/")[1]] for d in train}
        assert mine == pytest.approx(
            as_logged(theirs(tmp_path, env, backend, where, key)), rel=1e-9, nan_ok=True
        )
    # a diverged loss is kept, not dropped (a NaN/inf stretch is what is to be seen)
    assert math.isnan(train[3]["train"]["loss"]) and train[4]["train"]["loss"] == math.inf
    assert all(abs(ts - time.time()) < 300 for _, ts in dicts)
    assert store.skipped == 0
    # a training that is not seen to use it (another one in the same directory does)
    assert trackers.find_tracker(env, str(tmp_path), os.geteuid(), since, set(), set()) is None
    # MLflow holds its database open: that is enough, named or not
    if backend == "mlflow":
        held = {store.path}
        hit = trackers.find_tracker(env, str(tmp_path), os.geteuid(), since, set(), held)
        assert hit is not None and hit[1] is not None and hit[1].run == store.run
    # a run begun before the training started is not its own
    later = time.time() + 60
    assert trackers.find_tracker(env, str(tmp_path), os.geteuid(), later, {backend}, set()) is None


def test_an_mlflow_file_store_is_read(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    since = time.time()
    uri = f"file:{tmp_path / 'mlruns'}"  # kept by MLflow 3 on request (maintenance mode)
    env = write(tmp_path, "mlflow", MLFLOW_TRACKING_URI=uri, MLFLOW_ALLOW_FILE_STORE="true")
    store = found("mlflow", env, tmp_path, since)
    assert isinstance(store, trackers.MlrunsStore)
    time.sleep(trackers.SETTLED_S)  # the newest dict is whole once its files settle
    dicts = read_all(store)
    steps = [d["global_step"] for d, _ in dicts if "train" in d]
    assert steps == list(range(6))
    where = f"file:{tmp_path / 'mlruns'}"
    mine = {d["global_step"]: d["train"]["loss"] for d, _ in dicts if "train" in d}
    assert math.isnan(mine[3]) and mine[4] == math.inf  # as logged, as MLflow's reader gives
    assert mine == pytest.approx(theirs(tmp_path, env, "mlflow", where, "train/loss"), nan_ok=True)
    # a second read from its position: nothing again
    got, _ = store.read(trackers.MlrunsStore(store.path, store.run).read(0)[1])
    assert got == []


def test_a_follower_resumes_where_it_left_and_says_what_it_skipped(tmp_path: Path) -> None:
    pytest.importorskip("trackio")
    since = time.time()
    env = write(tmp_path, "trackio", steps=5)
    store = found("trackio", env, tmp_path, since)
    # rows that are not one of its dicts: skipped, counted, nothing moved
    con = sqlite3.connect(store.path)
    rows = [
        "not json",
        json.dumps([1, 2]),
        json.dumps({"train/loss": "high"}),
        json.dumps({"train/loss": 1.0, "pad": "x" * (trackers.MAX_JSON + 10)}),
    ]
    for text in rows:
        con.execute(
            "INSERT INTO metrics (run_id, timestamp, run_name, step, metrics) VALUES (?,?,?,?,?)",
            (store.run, "2026-12-03T10:00:00+00:00", "run_0", 99, text),
        )
    con.commit()
    con.close()

    class Sink:
        def __init__(self) -> None:
            self.records: list[tuple[str, dict[str, Any]]] = []

        def write(self, kind: str, payload: dict[str, Any], ts: float | None = None) -> None:
            self.records.append((kind, payload))

    sink = Sink()
    follower = StoreFollower(store, sink)  # type: ignore[arg-type]
    follower.poll(time.time())
    kinds = [k for k, _ in sink.records]
    assert kinds == [Kind.TRAIN] * 5 + [Kind.VAL]
    assert store.skipped == 4 and "4 row(s) skipped" in (follower.problem or "")
    # a new follower from the cursor: nothing twice; of another run: from the start
    again = Sink()
    StoreFollower(store, again, follower.offset, follower.identity).poll(time.time())  # type: ignore[arg-type]
    assert again.records == []
    other = Sink()
    StoreFollower(store, other, follower.offset, "trackio:another").poll(time.time())  # type: ignore[arg-type]
    assert len(other.records) == 6


def test_backends_named_by_its_logger_or_its_script() -> None:
    script = 'setup_metric_logger("trackio", name, "logs")  # my script'
    assert trackers.backends_named("tensorboard, mlflow", []) == {"tensorboard", "mlflow"}
    assert trackers.backends_named(None, [script]) == {"trackio"}
    assert trackers.backends_named("", ["import mlflowish", "# no backend"]) == set()


def test_hostile_stores_read_nothing_wrong(tmp_path: Path) -> None:
    since = time.time() - 5
    env = environment(tmp_path)
    # not SQLite at all: no crash, said
    (tmp_path / "mlflow.db").write_bytes(b"SQLite format 3\0" + os.urandom(4000))
    hit = trackers.find_tracker(env, str(tmp_path), os.geteuid(), since, {"mlflow"}, set())
    assert hit is not None and hit[1] is None and "cannot be read" in str(hit[2]), hit
    assert files_of(tmp_path) == {"mlflow.db"}
    # not named on its command line: a store nearby it cannot read is not called its own
    assert trackers.find_tracker(env, str(tmp_path), os.geteuid(), since, set(), set()) is None
    # a store that vanished under a follower: its error said, then read again
    (tmp_path / "mlflow.db").unlink()
    follower = StoreFollower(trackers.MlflowStore(str(tmp_path / "mlflow.db"), "r"), None)  # type: ignore[arg-type]
    follower.poll(time.time())
    assert follower.problem is not None and "cannot be read" in follower.problem
    assert not (tmp_path / "mlflow.db").exists()  # read-only: nothing made


def test_two_runs_at_once_are_ambiguous(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    since = time.time()
    env = write(tmp_path, "mlflow", steps=2, name="first")
    write(tmp_path, "mlflow", steps=2, name="second")  # another training, the same store
    hit = trackers.find_tracker(env, str(tmp_path), os.geteuid(), since, {"mlflow"}, set())
    assert hit is not None and hit[1] is None
    assert "2 runs of MLflow's database began since the training started" in str(hit[2])


def test_another_users_store_is_not_read(other_user: OtherUser, shared_dir: Path) -> None:
    """A database the trainer's user does not own, or in a directory another user may
    write, could say anything: not read, and said."""
    work = shared_dir / "work"
    work.mkdir()
    db = work / "mlflow.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE metrics (key TEXT)")
    con.close()
    os.chown(db, other_user.uid, other_user.gid)
    hit = trackers.find_tracker({}, str(work), os.geteuid(), time.time(), {"mlflow"}, set())
    assert hit is not None and hit[1] is None
    assert f"belongs to {other_user.name}" in str(hit[2])
    os.chown(db, 0, 0)
    work.chmod(0o777)
    hit = trackers.find_tracker({}, str(work), os.geteuid(), time.time(), {"mlflow"}, set())
    assert hit is not None and "writable by every user" in str(hit[2])


def test_a_live_wal_store_is_read_through_its_wal_and_a_closed_one_leaves_no_file(
    tmp_path: Path,
) -> None:
    """trackio's database is WAL: rows a live writer committed sit in its ``-wal`` until
    a checkpoint, and are read there; once the writer closed it (no ``-wal``), it is read
    without making ``-wal``/``-shm`` files (root's, in the user's directory)."""
    db = tmp_path / "speculators.db"
    writer = sqlite3.connect(db)
    writer.execute("PRAGMA journal_mode=wal")
    writer.execute("PRAGMA wal_autocheckpoint=0")  # the rows stay in the WAL
    writer.execute(
        "CREATE TABLE metrics (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT,"
        " timestamp TEXT, run_name TEXT, step INTEGER, metrics TEXT)"
    )
    for step in range(3):
        row = json.dumps({"train/loss": 1.0 / (step + 1), "epoch": 0})
        writer.execute(
            "INSERT INTO metrics (run_id, timestamp, run_name, step, metrics) VALUES (?,?,?,?,?)",
            ("r1", "2026-12-03T10:00:00+00:00", "run", step, row),
        )
    writer.commit()
    assert (tmp_path / "speculators.db-wal").stat().st_size > 0
    store = trackers.TrackioStore(str(db), "r1")
    got = read_all(store)
    assert [d["global_step"] for d, _ in got] == [0, 1, 2]  # from the WAL
    writer.close()
    assert files_of(tmp_path) == {"speculators.db"}
    assert [d["global_step"] for d, _ in read_all(store)] == [0, 1, 2]
    assert files_of(tmp_path) == {"speculators.db"}  # nothing left behind
