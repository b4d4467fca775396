"""attach() writes run.json and the per-user index; a second attach is a resume."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from eagle3_tui.telemetry import Telemetry, attach, procs
from eagle3_tui.telemetry import manifest as mf
from tests.conftest import read_jsonl


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private index and no inherited run marker; attach() exports one, undone after."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    names = (mf.RUN_ID_ENV, mf.RUN_DIR_ENV, "RANK", "LOCAL_RANK", "TORCHELASTIC_RUN_ID")
    saved = {name: os.environ.pop(name, None) for name in names}
    yield tmp_path
    for name, value in saved.items():
        os.environ.pop(name, None)
        if value is not None:
            os.environ[name] = value


def _attach(run_dir: Path, **kw: object) -> Telemetry:
    return attach(run_dir, samplers=False, **kw)  # type: ignore[arg-type]


def test_attach_writes_a_manifest_of_this_process_and_registers_it(isolated: Path) -> None:
    run_dir = isolated / "run"
    t = _attach(run_dir, checkpoint_dir=run_dir / "ckpt", epochs=3, resume_command=["x", "y"])
    try:
        m = mf.read_manifest(run_dir / "run.json")
        assert m["pid"] == os.getpid() and m["pgid"] == os.getpgid(0) and m["sid"] == os.getsid(0)
        assert m["start_ticks"] == procs.start_ticks(os.getpid()) is not None
        assert m["boot_id"] == procs.boot_id()
        assert m["run_id"] == t.run_id == os.environ[mf.RUN_ID_ENV]
        assert m["env"][mf.RUN_ID_ENV] == t.run_id
        assert m["checkpoint_dir"] == str((run_dir / "ckpt").resolve())
        assert m["epochs"] == 3 and m["resume_command"] == ["x", "y"]
        assert m["status"] == "running" and m["resumes"] == 0
        index = read_jsonl(mf.index_path())
        assert index[-1]["run_id"] == t.run_id and index[-1]["run_dir"] == str(run_dir.resolve())
        t.finish()
        assert mf.read_manifest(run_dir / "run.json")["status"] == "finished"
    finally:
        t.detach()
    events = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "lifecycle"]
    assert [e["event"] for e in events] == ["start", "finish"]


def test_a_run_first_started_when_its_process_did(isolated: Path) -> None:
    """Telemetry attached to a training mid-way (a live attach, a kill that attaches
    first) began long after the process: the run "ran 1 s" of a process that had trained
    for minutes. Its first start is the process's own (the kernel's), the telemetry's
    start stays ``started_at``."""
    st = procs.stat(os.getpid())
    assert st is not None
    began = procs.started_at(st)
    assert began is not None
    t = _attach(isolated / "run")
    try:
        m = mf.read_manifest(isolated / "run" / "run.json")
    finally:
        t.detach()
    assert m["first_started_at"] == began <= m["started_at"]


def test_a_second_attach_is_a_resume_that_keeps_the_run_id(isolated: Path) -> None:
    run_dir = isolated / "run"
    ckpt = run_dir / "ckpt"
    t1 = _attach(run_dir, checkpoint_dir=ckpt)
    t1.finish("interrupt")
    t1.detach()
    assert mf.read_manifest(run_dir / "run.json")["status"] == "interrupted"
    (ckpt / "1").mkdir(parents=True)
    (ckpt / "1" / "training_state.json").write_text(
        json.dumps({"epoch": 1, "local_step": 0, "global_step": 40})
    )
    (ckpt / "0").mkdir()
    os.environ.pop(mf.RUN_ID_ENV)  # a new process would not carry it either
    t2 = _attach(run_dir)
    try:
        m = mf.read_manifest(run_dir / "run.json")
        assert m["run_id"] == t1.run_id and m["resumes"] == 1 and m["status"] == "running"
        assert m["checkpoint_dir"] == str(ckpt.resolve())  # kept from the first manifest
    finally:
        t2.finish()
        t2.detach()
    events = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "lifecycle"]
    resume = events[2]
    assert resume["event"] == "resume" and resume["global_step"] == 40
    assert resume["checkpoint"] == str((ckpt / "1").resolve())
    assert len(read_jsonl(mf.index_path())) == 2


def test_a_launcher_marker_for_another_directory_is_not_reused(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(mf.RUN_ID_ENV, "someone-else")
    monkeypatch.setenv(mf.RUN_DIR_ENV, str(isolated / "other"))
    assert mf.resolve_run_id(isolated / "run") != "someone-else"
    env = mf.launch_env(isolated / "run")
    monkeypatch.setenv(mf.RUN_ID_ENV, env[mf.RUN_ID_ENV])
    monkeypatch.setenv(mf.RUN_DIR_ENV, env[mf.RUN_DIR_ENV])
    assert mf.resolve_run_id(isolated / "run") == env[mf.RUN_ID_ENV]


def test_only_rank_zero_writes_the_manifest(isolated: Path) -> None:
    run_dir = isolated / "run"
    t = _attach(run_dir, rank=3)
    try:
        assert not (run_dir / "run.json").exists()
    finally:
        t.detach()
