"""A shared GPU box (issue 24): root runs eagle3-tui where a second, real user can plant
files and processes. Nothing planted runs, hangs a command or is signalled; nothing is
written through a planted link. Each test makes its user (``other_user``) and leaves
no process behind."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.telemetry import manifest as mf
from tests.conftest import SYSTEM_PYTHON, OtherUser, need, read_jsonl, wait_until
from tests.records import Lines
from tests.transport.fakes import (
    RESUMED,
    alive,
    dead_pid,
    fake_manifest,
    marker_processes,
    start_fake_trainer,
    write_checkpoint,
)

EAGLE3_TUI = str(Path(sys.executable).parent / "eagle3-tui")
"""The console script a user runs (``python -m`` would put the directory on sys.path)."""

PLANTED = (
    "json",
    "zlib",
    "struct",
    "select",
    "subprocess",
    "pathlib",
    "threading",
    "tempfile",
    "hashlib",
    "base64",
    "uuid",
    "runpy",
    "signal",
    "socket",
)
"""Standard modules the agent, the sidecar and the log copier import after start-up."""


TEE = ("--epochs", "1", "--log", "tee")
"""A one-epoch tiny training whose output is copied to train.log by the log copier."""


TAG = f"E3_TEST_TAG={os.getpid()}-{time.time_ns()}"
"""In the environment of every command these tests run (and so of its agents): the
agents this file started are found by it, not another test file's running meanwhile."""


def as_root_in(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``eagle3-tui ARGS`` run by root from ``cwd``."""
    key, value = TAG.split("=")
    return subprocess.run(
        [EAGLE3_TUI, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=dict(os.environ, **{key: value}),
    )


def plant_modules(where: Path, user: OtherUser) -> Path:
    """The user's ``json.py`` & co. in ``where``: each leaves a mark when imported."""
    marks = where / "marks"
    marks.mkdir(mode=0o777)
    marks.chmod(0o777)
    for name in PLANTED:
        path = where / f"{name}.py"
        path.write_text(
            f"import os\nopen({str(marks)!r} + '/{name}-uid' + str(os.getuid()), 'w').close()\n"
        )
        os.chown(path, user.uid, user.gid)
    return marks


def test_modules_planted_in_the_working_directory_never_run_as_root(
    other_user: OtherUser, shared_dir: Path, tmp_path: Path
) -> None:
    """Item 1: the local agent ran as ``python -c`` from the caller's directory, so a
    ``json.py`` there ran as root (``runs``, ``kill --pid 1``, ``summary``)."""
    marks = plant_modules(shared_dir, other_user)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lines = Lines()
    data = lines.event("start") + b"".join(lines.train(step, 2.0 - step / 10) for step in range(5))
    (run_dir / "metrics.jsonl").write_bytes(data)
    for args in (
        ("runs",),
        ("kill", "--pid", "1", "--json"),
        ("summary", "--pid", "1"),
        ("summary", str(run_dir)),
        ("runs", "--all", "--json"),
    ):
        proc = as_root_in(shared_dir, *args)
        assert "Traceback" not in proc.stderr, (args, proc.stderr)
        assert sorted(os.listdir(marks)) == [], (args, proc.stdout, proc.stderr)
    summary = as_root_in(shared_dir, "summary", str(run_dir), "--json")
    assert json.loads(summary.stdout)["records"] == 6, summary.stdout  # it did its work


@pytest.mark.slow
def test_a_root_training_started_in_a_shared_directory_imports_nothing_from_it(
    other_user: OtherUser, shared_dir: Path, tmp_path: Path
) -> None:
    """Item 1: the sampler sidecar and the log copier were ``python -m`` children of the
    trainer: its working directory first on their path."""
    from tests.conftest import need_training

    need_training()
    marks = plant_modules(shared_dir, other_user)
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-I", "-m", "eagle3_tui.train.tiny", "--run-dir", str(run_dir), *TEE],
        cwd=shared_dir,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert any(r["kind"] == "heartbeat" for r in records)  # the sidecar ran
    assert (run_dir / "train.log").stat().st_size > 0  # the copier ran
    assert sorted(os.listdir(marks)) == []


# ---- resume ------------------------------------------------------------------------------


def _stopped_run(run_dir: Path, script: Path, proof: Path, **fields: Any) -> None:
    """A run stopped with a complete checkpoint, whose resume command writes ``proof``."""
    script.write_text(
        RESUMED.replace("import json, os", f"open({str(proof)!r}, 'w').close()\nimport json, os")
    )
    fake_manifest(
        run_dir,
        dead_pid(),
        f"shared-{time.time_ns()}",
        checkpoint_dir=str(run_dir / "checkpoints"),
        resume_command=[sys.executable, str(script), str(run_dir)],
        cwd=str(run_dir),
        **fields,
    )
    write_checkpoint(run_dir / "checkpoints" / "0", global_step=20)


def _resume(cwd: Path, run_dir: Path) -> subprocess.CompletedProcess[str]:
    return as_root_in(cwd, "resume", str(run_dir), timeout=120)


def _chown_tree(path: Path, user: OtherUser) -> None:
    for p in [path, *path.rglob("*")]:
        os.chown(p, user.uid, user.gid, follow_symlinks=False)


def test_resume_refuses_a_run_another_user_could_have_changed(
    other_user: OtherUser, shared_dir: Path
) -> None:
    """Item 2: a manifest another user wrote (``resume_command: sh -c 'id > …'``) ran as
    root. Each link of the chain is checked before anything starts."""
    proof = shared_dir / "proof"
    who = other_user.name

    # (a) the run directory and its run.json are the other user's
    theirs = shared_dir / "theirs"
    _stopped_run(theirs, shared_dir / "theirs.py", proof)
    m = json.loads((theirs / "run.json").read_text())
    m["resume_command"] = ["/bin/sh", "-c", f"id > {proof}"]
    (theirs / "run.json").write_text(json.dumps(m))
    _chown_tree(theirs, other_user)
    proc = _resume(shared_dir, theirs)
    assert proc.returncode == 9, proc.stdout + proc.stderr
    assert f"belongs to {who}" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not proof.exists()

    # (b) root's own run, in a directory the other user owns (they can swap it)
    parent = shared_dir / "their-dir"
    parent.mkdir()
    os.chown(parent, other_user.uid, other_user.gid)
    inside = parent / "run"
    _stopped_run(inside, shared_dir / "inside.py", proof)
    proc = _resume(shared_dir, inside)
    assert proc.returncode == 9 and f"{parent} belongs to {who}" in proc.stderr, proc.stderr
    assert not proof.exists()

    # (c) root's run in root's directory, but its checkpoint is writable by everyone
    mine = shared_dir / "mine"
    mine.mkdir(mode=0o755)
    run = mine / "run"
    _stopped_run(run, mine / "mine.py", proof)
    ckpt = run / "checkpoints" / "0"
    (ckpt / "optimizer_state_dict.pt").chmod(0o666)
    proc = _resume(shared_dir, run)
    assert proc.returncode == 9 and "writable by every user" in proc.stderr, proc.stderr
    assert "optimizer_state_dict.pt" in proc.stderr and not proof.exists()
    (ckpt / "optimizer_state_dict.pt").chmod(0o644)

    # (d) ... and its script belongs to the other user
    os.chown(mine / "mine.py", other_user.uid, other_user.gid)
    proc = _resume(shared_dir, run)
    assert proc.returncode == 9 and "the script" in proc.stderr, proc.stderr
    assert f"belongs to {who}" in proc.stderr and not proof.exists()

    # the same run, every link root's: resumed (the check refuses only what it must)
    os.chown(mine / "mine.py", 0, 0)
    proc = _resume(shared_dir, run)
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        wait_until(proof.exists, 20, "the resumed run")
    finally:
        pid = json.loads((run / "run.json").read_text())["pid"]
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# ---- planted processes ---------------------------------------------------------------------

PLANTED_TRAINING = textwrap.dedent(
    """
    # a process of another user that looks like a training with telemetry to discovery:
    # "torch" mapped, the run marker in its environment, a run.json naming it
    import ctypes, json, os, sys, time
    lib, run_dir, log = sys.argv[1], sys.argv[2], sys.argv[3]
    ctypes.CDLL(lib)
    with open(os.path.join(run_dir, "run.json"), "w") as f:
        json.dump({"pid": os.getpid(), "run_id": "planted", "log_file": log,
                   "checkpoint_dir": log, "status": "running"}, f)
    open(os.path.join(run_dir, "ready"), "w").close()
    time.sleep(600)  # speculators
    """
)


@contextlib.contextmanager
def planted_training(user: OtherUser, shared_dir: Path, log: str) -> Iterator[int]:
    """The other user's planted process (its run.json's ``log_file`` = ``log``)."""
    libdir = shared_dir / "lib"
    libdir.mkdir(exist_ok=True)
    lib = libdir / "libtorch_cpu.so"
    if not lib.exists():
        shutil.copy("/usr/lib/x86_64-linux-gnu/libz.so.1", lib)
    run_dir = shared_dir / f"planted-{len(list(shared_dir.iterdir()))}"
    run_dir.mkdir()
    os.chown(run_dir, user.uid, user.gid)
    script = shared_dir / "planted.py"
    script.write_text(PLANTED_TRAINING)
    env = dict(
        PATH="/usr/bin:/bin",
        EAGLE3_TUI_RUN_ID="planted",
        EAGLE3_TUI_RUN_DIR=str(run_dir),
    )
    proc = user.popen(
        "env",
        *(f"{k}={v}" for k, v in env.items()),
        SYSTEM_PYTHON,
        str(script),
        str(lib),
        str(run_dir),
        log,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(lambda: (run_dir / "ready").exists(), 30, "the planted process")
        pid = json.loads((run_dir / "run.json").read_text())["pid"]
        yield pid
    finally:
        proc.kill()
        subprocess.run(["pkill", "-KILL", "-u", user.name], check=False)
        proc.wait(10)


def _agents() -> list[int]:
    """The live agents started by this file's commands."""
    out = subprocess.run(["pgrep", "-f", "eagle3-tui-agent"], capture_output=True, text=True)
    mine = []
    for pid in map(int, out.stdout.split()):
        with contextlib.suppress(OSError):
            if TAG.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                mine.append(pid)
    return mine


@pytest.mark.parametrize("log", ["fifo", "/dev/zero"])
def test_a_planted_process_costs_one_row_never_a_hang(
    other_user: OtherUser, shared_dir: Path, tmp_path: Path, log: str
) -> None:
    """Item 4: its run.json named ``log_file`` = a FIFO (``runs``, ``summary --pid`` and
    the monitor hung, leaving a root agent blocked for good) or ``/dev/zero``
    (MemoryError after 8 s)."""
    need(shutil.which("pgrep") is not None, "pgrep")
    if log == "fifo":
        fifo = shared_dir / "train.log"
        os.mkfifo(fifo)
        os.chown(fifo, other_user.uid, other_user.gid)
        log = str(fifo)
    before = set(_agents())
    with planted_training(other_user, shared_dir, log) as pid:
        for args in (("runs", "--json"), ("summary", "--pid", str(pid), "--json")):
            t0 = time.monotonic()
            proc = as_root_in(tmp_path, *args, timeout=60)
            took = time.monotonic() - t0
            assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr, proc.stderr
            assert took < 30, (args, took)
            if args[0] == "runs":
                rows = json.loads(proc.stdout)["live"]
                assert [r for r in rows if r["pid"] == pid], rows  # listed: one row
        assert set(_agents()) - before == set()  # no agent left blocked


# ---- kill ----------------------------------------------------------------------------------


def test_another_users_manifest_cannot_make_root_signal_roots_processes(
    other_user: OtherUser, shared_dir: Path
) -> None:
    """Item 2's sibling: a run.json of another user naming a process of root (its real
    start time, readable in /proc) is refused; root's process is never signalled."""
    victim = subprocess.Popen(["sleep", "300"])
    try:
        run_dir = shared_dir / "bait"
        fake_manifest(run_dir, victim.pid, f"bait-{time.time_ns()}")
        _chown_tree(run_dir, other_user)
        proc = as_root_in(shared_dir, "kill", str(run_dir), "--json")
        assert proc.returncode == 9, proc.stdout + proc.stderr
        report = json.loads(proc.stdout)
        assert report["status"] == "refused" and other_user.name in report["message"]
        assert victim.poll() is None  # never signalled
    finally:
        victim.kill()
        victim.wait()


def _two_kills(run_dir: Path, grace: str = "60") -> list[dict[str, Any]]:
    """Two ``kill``s of ``run_dir`` started at once; their reports."""
    out: list[dict[str, Any]] = []
    errors: list[str] = []

    def one() -> None:
        proc = as_root_in(
            run_dir.parent, "kill", str(run_dir), "--json", "--grace", grace, timeout=300
        )
        try:
            out.append(json.loads(proc.stdout))
        except ValueError:
            errors.append(proc.stdout + proc.stderr)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return out


def _sigterms(report: dict[str, Any]) -> int:
    return sum(p["signals"].count("SIGTERM") for p in report["processes"])


def test_two_kills_at_once_send_one_signal_and_say_the_same(tmp_path: Path) -> None:
    """Item 8: both SIGTERMed the trainer (a second SIGTERM inside speculators' save
    handler ends the run without its interrupt); the reports contradicted each other."""
    run_dir = tmp_path / "run"
    env = dict(os.environ)
    trainer = start_fake_trainer(run_dir, env)
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    try:
        reports = _two_kills(run_dir)
        assert [r["status"] for r in reports] == ["stopped", "stopped"], reports
        assert sorted(bool(r.get("joined")) for r in reports) == [False, True], reports
        assert sum(_sigterms(r) for r in reports) == 1 + sum(  # one to the trainer, and
            _sigterms(r) - 1
            for r in reports
            if not r.get("joined")  # the leftovers'
        )
        joined = next(r for r in reports if r.get("joined"))
        assert _sigterms(joined) == 0 and "sent no signal" in joined["message"]
        first = next(r for r in reports if not r.get("joined"))
        assert {p["pid"] for p in joined["processes"]} <= {p["pid"] for p in first["processes"]}
        assert all(p["outcome"] != "alive" for r in reports for p in r["processes"])
        assert (run_dir / "saved").read_text() == "ok"  # the one SIGTERM's save, whole
        assert trainer.wait(10) == 0
    finally:
        for pid in marker_processes(run_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        trainer.kill()
        trainer.wait()


@pytest.mark.slow
def test_two_kills_of_a_real_training_end_it_interrupted(tmp_path: Path) -> None:
    """Item 8 on the real tiny training: one kill acts, the other joins it; the trainer
    is stopped once, at a step boundary (issue 26: asked, not signalled), and both
    reports say so; no process is signalled twice; the run's last lifecycle event is
    its interrupt (not a crash, not DEAD)."""
    from tests.conftest import live_training, wait_for_a_training_step

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    args = ("--epochs", "50", "--step-delay", "0.1", "--workers", "2")
    with live_training(tmp_path / "run", args, env) as run:
        wait_for_a_training_step(run.run_dir, run.proc, 240)
        reports = _two_kills(run.run_dir, grace="120")
        assert sorted(bool(r.get("joined")) for r in reports) == [False, True], reports
        assert all(r["status"] == "stopped" for r in reports), reports
        acted, joined = sorted(reports, key=lambda r: bool(r.get("joined")))
        assert acted["stop"]["how"] == "step_boundary", acted
        assert acted["stop"]["checkpoint"] is not None, acted  # its save, numbered
        where = ("how", "epoch", "local_step", "global_step")
        assert {k: joined["stop"][k] for k in where} == {k: acted["stop"][k] for k in where}
        assert not acted["signalled_trainer"] and not joined["signalled_trainer"], reports
        trainers = [p for r in reports for p in r["processes"] if p["role"] == "trainer"]
        assert [p["pid"] for p in trainers] == [run.proc.pid] * 2, reports
        assert all(p["signals"] == [] for p in trainers), reports
        sigterms: collections.Counter[int] = collections.Counter()
        for r in reports:  # the sidecar or a worker that outlived the trainer, once
            for p in r["processes"]:
                sigterms[p["pid"]] += p["signals"].count("SIGTERM")
        assert max(sigterms.values(), default=0) <= 1, reports  # nothing signalled twice
        assert run.proc.wait(30) == 0
        events = [r for r in read_jsonl(run.run_dir / "metrics.jsonl") if r["kind"] == "lifecycle"]
        assert events[-1]["event"] == "interrupt", events[-3:]
        stops = [e for e in events if e["event"] == "stop"]
        assert [e["global_step"] for e in stops] == [acted["stop"]["global_step"]], events[-3:]
        summary = as_root_in(tmp_path, "summary", str(run.run_dir), "--json")
        assert json.loads(summary.stdout)["health"] == "stopped", summary.stdout
        assert not [p for p in marker_processes(run.manifest()["run_id"]) if alive(p)]


# ---- telemetry never writes through a planted link ------------------------------------------


@pytest.mark.slow
def test_a_root_training_writes_through_no_planted_link(
    other_user: OtherUser, shared_dir: Path, tmp_path: Path
) -> None:
    """Item 3: ``metrics.jsonl`` a link (planted by another user) to a root-only file:
    a root training appended 265 lines to it in 20 s; ``train.log``, ``metrics.cols``
    and the manifest were open to the same."""
    from tests.conftest import need_training

    need_training()
    secrets = {}
    for name in ("metrics.jsonl", "metrics.cols", "train.log", "run.json"):
        secret = tmp_path / f"secret-{name}"
        secret.write_text("root only\n")
        secret.chmod(0o600)
        secrets[name] = secret
        link = shared_dir / name
        other_user.run("ln", "-s", str(secret), str(link))
        assert link.is_symlink()
    proc = subprocess.run(
        [sys.executable, "-m", "eagle3_tui.train.tiny", "--run-dir", str(shared_dir), *TEE],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for secret in secrets.values():
        assert secret.read_text() == "root only\n", secret
    for name in ("metrics.jsonl", "train.log", "run.json"):
        path = shared_dir / name
        assert not path.is_symlink() and path.stat().st_uid == 0, name
    records = read_jsonl(shared_dir / "metrics.jsonl")
    assert any(r["kind"] == "train" for r in records)
    assert mf.read_manifest(shared_dir / "run.json")["status"] == "finished"


@pytest.mark.parametrize("what", ["fifo", "link to /dev/zero"])
def test_a_planted_metrics_file_of_a_local_run_is_one_line(
    other_user: OtherUser, shared_dir: Path, what: str
) -> None:
    """Item 4 on this machine: ``summary`` and the monitor of a run directory whose
    ``metrics.jsonl`` another user made a FIFO (it hung) or a link to ``/dev/zero``
    (it read forever): one line, exit 25 (not what it should be), at once."""
    run_dir = shared_dir / "run"
    run_dir.mkdir()
    path = run_dir / "metrics.jsonl"
    if what == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    os.chown(path, other_user.uid, other_user.gid, follow_symlinks=False)
    for args in (("summary", str(run_dir)), (str(run_dir),)):
        t0 = time.monotonic()
        proc = as_root_in(shared_dir, *args, timeout=30)
        assert time.monotonic() - t0 < 15, args
        assert proc.returncode == 25 and "not a regular file" in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1, proc.stderr
