"""The agent on this machine (``LocalHost``: the same script and protocol as over SSH).

Follow semantics (waiting, truncation, replacement, resumption at an offset),
checkpoint completeness, and process control against small fake runs whose
processes behave like a trainer, its workers and an escaped worker.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest

from eagle3_tui.agent import checkpoints, names, processes, runs
from eagle3_tui.telemetry import manifest as mf
from eagle3_tui.telemetry import procs
from eagle3_tui.transport.base import TargetError
from eagle3_tui.transport.calls import kill_run, resume_run
from eagle3_tui.transport.channel import (
    AgentAnswerError,
    DataFrame,
    Event,
    Frame,
    FrameParser,
    LocalHost,
    call_agent,
)
from eagle3_tui.transport.replies import ErrorKind
from tests.transport.conftest import cli
from tests.transport.fakes import (
    RESUMED,
    alive,
    dead_pid,
    fake_manifest,
    marker_processes,
    start_fake_trainer,
    write_checkpoint,
)

# ---- helpers ---------------------------------------------------------------------------


async def next_frames(
    frames: AsyncIterator[Frame], until: Any, timeout: float = 20.0
) -> list[Frame]:
    """Frames up to and including the first for which ``until(frame)`` holds."""
    out: list[Frame] = []
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"timed out; got {out}")
        frame = await asyncio.wait_for(anext(frames), left)
        out.append(frame)
        if until(frame):
            return out


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def is_event(name: str) -> Any:
    return lambda f: isinstance(f, Event) and f.event == name


def data_upto(end: int) -> Any:
    return lambda f: isinstance(f, DataFrame) and f.offset + len(f.data) >= end


def events(frames: list[Frame]) -> list[str]:
    return [f.event for f in frames if isinstance(f, Event)]


def joined(frames: list[Frame]) -> bytes:
    return b"".join(f.data for f in frames if isinstance(f, DataFrame))


# ---- framing -----------------------------------------------------------------------------


def test_frames_survive_any_split() -> None:
    stream = b"hello from .bashrc\n" + b"J " + json.dumps({"event": "opened", "size": 3}).encode()
    stream += b"\nD 0 5\nab\ncdD 5 2\nef"
    for cut in range(1, len(stream)):
        p = FrameParser()
        got = p.feed(stream[:cut]) + p.feed(stream[cut:])
        assert [type(f).__name__ for f in got] == ["Event", "DataFrame", "DataFrame"]
        assert got[1] == DataFrame(0, b"ab\ncd") and got[2] == DataFrame(5, b"ef")
        assert not p.partial


def test_agent_imports_only_the_standard_library() -> None:
    code = (
        "import sys; before = set(sys.modules); import eagle3_tui.agent.main; "
        "print(','.join(sorted(m for m in set(sys.modules) - before if m.split('.')[0] not in "
        "sys.stdlib_module_names and not m.startswith('eagle3_tui'))))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert proc.stdout.strip() == ""


def test_the_entry_point_imports_an_operation_only_when_asked() -> None:
    """Every call is a new process: the 60 s status probe must not import follow,
    observe, discover and control as well. Each operation still names a real function."""
    code = (
        "import sys, eagle3_tui.agent.main; "
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('eagle3_tui.agent.'))))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert proc.stdout.split() == [
        "eagle3_tui.agent.frames",
        "eagle3_tui.agent.main",
        "eagle3_tui.agent.names",
    ]
    from eagle3_tui.agent.main import OPS

    assert set(OPS) == {v for k, v in vars(names).items() if k.startswith("OP_")}
    for module, function in OPS.values():
        assert callable(getattr(importlib.import_module(f"eagle3_tui.agent.{module}"), function))


def test_the_bundle_runs_on_a_bare_interpreter(tmp_path: Path) -> None:
    """The host has no eagle3-tui: the agent and telemetry modules come from the bundle
    (``-I -S``: no site-packages, no editable install, no current directory)."""
    from eagle3_tui.agent import BOOTSTRAP
    from eagle3_tui.transport.channel import agent_payload

    code = "import sys; print(sorted(m for m in sys.modules if m.startswith('eagle3_tui')))"
    payload = agent_payload({"op": "status", "run_dir": str(tmp_path / "nope")})
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", BOOTSTRAP],
        input=payload,
        capture_output=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    frames = FrameParser().feed(proc.stdout)
    assert [f.event for f in frames if isinstance(f, Event)] == ["error"], proc.stderr
    assert "no such run directory" in str(frames[0].fields["message"])  # type: ignore[union-attr]
    assert proc.returncode == 3
    bare = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path
    )
    assert bare.stdout.strip() == "[]"  # nothing of ours importable without the bundle


def test_agent_agrees_with_the_manifest_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert runs.index_path() == mf.index_path()
    assert names.RUN_ID_ENV == mf.RUN_ID_ENV
    me = processes.proc_stat(os.getpid())
    assert me is not None and me.start == procs.start_ticks(os.getpid())


# ---- follow ---------------------------------------------------------------------------------


async def test_follow_waits_then_streams_and_notices_truncation_and_replacement(
    tmp_path: Path,
) -> None:
    path = tmp_path / "metrics.jsonl"
    ch = await LocalHost().start_agent({"op": "follow", "run_dir": str(tmp_path), "offset": 0})
    frames = ch.frames()
    try:
        got = await next_frames(frames, is_event("waiting"))
        assert events(got) == ["resolved", "disk", "waiting"]  # the room on its filesystem
        st = os.statvfs(tmp_path)
        disk = cast("Event", got[1]).fields
        fields = {"avail", "free", "total", "room", "writer_uid", "read_only", "at"}
        assert set(disk) - {"event"} == fields
        assert disk["total"] == st.f_blocks * st.f_frsize and disk["writer_uid"] == os.getuid()
        assert disk["room"] == (disk["free"] if os.getuid() == 0 else disk["avail"])
        path.write_bytes(b"a\nb\n")
        got = await next_frames(frames, data_upto(4))
        assert "opened" in events(got) and joined(got) == b"a\nb\n"
        append(path, b"c")  # a torn line, then its end
        got = await next_frames(frames, data_upto(5))
        assert joined(got) == b"c"  # raw bytes: the model's reader keeps a torn line
        append(path, b"c\n")
        got = await next_frames(frames, data_upto(7))
        assert [(x.offset, x.data) for x in got if isinstance(x, DataFrame)] == [(5, b"c\n")]
        path.write_bytes(b"x\n")  # truncated (O_TRUNC) and rewritten
        got = await next_frames(frames, data_upto(2))
        assert "restarted" in events(got) and joined(got).endswith(b"x\n")
        new = tmp_path / "new.jsonl"
        new.write_bytes(b"new-1\nnew-2\n")
        os.replace(new, path)
        got = await next_frames(frames, lambda f: isinstance(f, DataFrame) and b"new-2" in f.data)
        restarted = [f for f in got if isinstance(f, Event) and f.event == "restarted"]
        assert restarted and restarted[0].get("reason") == "replaced"
        assert restarted[0].get("size") == 12 and restarted[0].get("expected") == 2
        assert abs(restarted[0].get("now") - time.time()) < 60  # the host's clock, when noticed
        assert joined(got).endswith(b"new-1\nnew-2\n")
    finally:
        ch.close()
        await ch.finish()


async def test_follow_resumes_at_an_offset_only_for_the_same_file(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"one\ntwo\nthree\n")
    ident = f"{path.stat().st_dev}:{path.stat().st_ino}"
    host = LocalHost()
    req = {"op": "follow", "run_dir": str(tmp_path), "offset": 4, "identity": ident}
    ch = await host.start_agent(req)
    try:
        got = await next_frames(ch.frames(), data_upto(14))
        assert "restarted" not in events(got)
        assert [(f.offset, f.data) for f in got if isinstance(f, DataFrame)] == [
            (4, b"two\nthree\n")
        ]
    finally:
        ch.close()
        await ch.finish()
    ch = await host.start_agent({**req, "identity": "1:1"})  # another file now
    try:
        got = await next_frames(ch.frames(), data_upto(14))
        assert "restarted" in events(got)
        assert joined(got) == b"one\ntwo\nthree\n"
    finally:
        ch.close()
        await ch.finish()


async def test_follow_with_batch_s_sends_a_burst_of_appends_as_one_frame(tmp_path: Path) -> None:
    """``watch`` asks for ``batch_s``: appends within it go out together (a frame per
    write would cost both ends for a reader that looks every few seconds); without it,
    each append is its own frame (the monitor's latency)."""
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"0\n")

    async def frames_of_five_appends(batch_s: float) -> int:
        req: dict[str, object] = {"op": "follow", "run_dir": str(tmp_path), "offset": 2}
        if batch_s:
            req["batch_s"] = batch_s
        ch = await LocalHost().start_agent(req)
        frames = ch.frames()
        try:
            await next_frames(frames, is_event("opened"))
            start = path.stat().st_size
            for i in range(5):
                append(path, b"%d\n" % i)
                await asyncio.sleep(0.1)
            got = await next_frames(frames, data_upto(start + 10))
            return sum(isinstance(f, DataFrame) for f in got)
        finally:
            ch.close()
            await ch.finish()

    assert await frames_of_five_appends(0.0) >= 4
    assert await frames_of_five_appends(1.5) <= 2


async def test_read_errors_are_one_line(tmp_path: Path) -> None:
    from eagle3_tui.transport.calls import read_file

    with pytest.raises(TargetError, match="no such run directory"):
        await read_file(LocalHost(), str(tmp_path / "nope"), lambda f: None)
    with pytest.raises(TargetError, match=r"no metrics\.jsonl here"):
        await read_file(LocalHost(), str(tmp_path), lambda f: None)


async def test_a_read_goes_on_from_an_earlier_ones_end_or_says_the_file_changed(
    tmp_path: Path,
) -> None:
    """``read`` from the offset and identity an earlier read's ``eof`` named: only the
    bytes since; a file replaced, or truncated below the offset, is said (``restarted``)
    and sent from 0; a bad offset is refused in one line."""
    from eagle3_tui.transport.calls import read_file

    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": ')

    async def read(offset: int = 0, identity: str | None = None) -> tuple[bytes, list, Any]:  # type: ignore[type-arg]
        got: list[DataFrame] = []
        said: list[Any] = []
        eof = await read_file(
            LocalHost(), str(tmp_path), got.append, offset=offset, identity=identity,
            on_event=said.append,
        )  # fmt: skip
        assert all(f.span < 0 for f in got)  # (no companion: lines)
        data = b"".join(f.data for f in got)
        said = [(e.event, e.get("reason"), e.get("expected")) for e in said]
        said = [x for x in said if x[0] != "resolved"]
        assert not got or got[0].offset == (0 if said else offset)
        return data, said, eof

    data, said, eof = await read()
    assert data == b'{"a": 1}\n{"b": ' and said == [] and eof.get("size") == len(data)
    ident = eof.get("identity")
    st = path.stat()
    assert ident == f"{st.st_dev}:{st.st_ino}"
    append(path, b'2}\n{"c": 3}\n')
    data, said, eof = await read(15, ident)
    assert data == b'2}\n{"c": 3}\n' and said == [] and eof.get("size") == 27
    data, said, eof = await read(27, ident)
    assert data == b"" and said == [] and eof.get("size") == 27
    os.truncate(path, 9)  # truncated below the offset: the same file, shorter
    data, said, eof = await read(27, ident)
    assert said == [("restarted", "truncated", 27)] and data == b'{"a": 1}\n'
    new = tmp_path / "metrics.new"
    new.write_bytes(b'{"z": 0}\n{"y": 1}\n')
    new.rename(path)  # another file under the name, longer than the offset
    data, said, eof = await read(9, ident)
    assert said == [("restarted", "replaced", 9)] and data == b'{"z": 0}\n{"y": 1}\n'
    assert eof.get("identity") != ident
    for bad in (-1, "9", True):
        with pytest.raises(TargetError, match="not a number of bytes"):
            await read_file(LocalHost(), str(tmp_path), lambda f: None, offset=bad)  # type: ignore[arg-type]


async def test_a_look_chooses_reads_on_and_says_the_status_in_one_agent(tmp_path: Path) -> None:
    """``look``: what ``choose``, ``read`` and ``status`` say one after the other, from one
    agent process: the choice (``chosen``, naming the directory read) before the first
    frame, the file read on from an earlier look's end only where that look read the
    same run directory, and the run's status in the ``eof`` (null, with why, for a run
    without a manifest); a choice that is not a run's file is the answer as it is."""
    from eagle3_tui.transport.calls import look, look_status, run_status
    from eagle3_tui.transport.replies import Choice

    run = tmp_path / "run"
    fake_manifest(run, dead_pid(), f"look-{os.getpid()}")
    (run / "metrics.jsonl").write_bytes(b'{"a": 1}\n')
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "metrics.jsonl").write_bytes(b'{"b": 2}\n{"c": 3}\n')

    async def at(where: Path, since: tuple[str, int, str] | None = None) -> Any:
        order: list[str] = []
        got: list[bytes] = []

        def data(f: DataFrame) -> None:
            order.append("data")
            got.append(f.data)

        def event(e: Event) -> None:
            order.append(e.event)

        chosen, eof = await look(LocalHost(), str(where), None, data, event, None, since)
        assert eof is not None and chosen.choice is Choice.RUN
        assert order.index("chosen") < order.index("data") if "data" in order else True
        return chosen, eof, b"".join(got), [x for x in order if x == "restarted"]

    chosen, eof, data, restarted = await at(run)
    assert chosen.chosen_run_dir() == str(run) and chosen.host == os.uname().nodename
    assert data == b'{"a": 1}\n' and eof.get("size") == 9 and restarted == []
    status = look_status(eof, "here")
    said = await run_status(LocalHost(), str(run))  # what ``status`` says of it
    assert status is not None and status.alive is False
    assert (status.problem, status.manifest, status.run_dir, status.host) == (
        said.problem, said.manifest, said.run_dir, said.host
    )  # fmt: skip
    assert status.manifest.get("run_id") == f"look-{os.getpid()}"
    odd = Event("eof", {"status": {"op": "status", "alive": "yes"}})
    assert look_status(odd, "here") is None  # not understood: judged from the records
    ident = eof.get("identity")
    append(run / "metrics.jsonl", b'{"a": 2}\n')
    _, eof, data, restarted = await at(run, (str(run), 9, ident))
    assert data == b'{"a": 2}\n' and eof.get("size") == 18 and restarted == []
    # an earlier look at another directory: this one is read from 0
    _, eof, data, restarted = await at(bare, (str(run), 18, ident))
    assert data == b'{"b": 2}\n{"c": 3}\n' and restarted == []
    assert look_status(eof, "here") is None and "run.json" in str(eof.get("status_problem"))
    # the same directory, another file: said and sent whole
    _, eof, data, restarted = await at(run, (str(run), 18, "0:0"))
    assert restarted == ["restarted"] and data == b'{"a": 1}\n{"a": 2}\n'
    with pytest.raises(TargetError, match="not a number of bytes"):
        await at(run, (str(run), "18", ident))  # type: ignore[arg-type]
    with pytest.raises(TargetError, match="no such run directory"):
        await at(tmp_path / "nope")


# ---- checkpoints ---------------------------------------------------------------------------------


def test_checkpoint_completeness(tmp_path: Path) -> None:
    good = tmp_path / "0"
    write_checkpoint(good)
    assert checkpoints.checkpoint_problems(good) == []
    cut = tmp_path / "1"
    write_checkpoint(cut)
    model = cut / "model.safetensors"
    model.write_bytes(model.read_bytes()[:-5])
    assert any("model.safetensors is truncated" in p for p in checkpoints.checkpoint_problems(cut))
    half = tmp_path / "2"
    write_checkpoint(half)
    opt = half / "optimizer_state_dict.pt"
    opt.write_bytes(opt.read_bytes()[:50])
    assert any("optimizer_state_dict.pt" in p for p in checkpoints.checkpoint_problems(half))
    stale = tmp_path / "3"
    write_checkpoint(stale)
    old = time.time() - 100
    os.utime(stale / "training_state.json", (old, old))
    assert any("older than the weights" in p for p in checkpoints.checkpoint_problems(stale))
    missing = tmp_path / "4"
    write_checkpoint(missing)
    (missing / "optimizer_state_dict.pt").unlink()
    assert checkpoints.checkpoint_problems(missing) == ["optimizer_state_dict.pt is missing"]
    (tmp_path / "interrupted").mkdir()
    (tmp_path / "epoch4_end").symlink_to("4")
    assert checkpoints.latest_numbered(tmp_path) == missing


# ---- fake runs ----------------------------------------------------------------------------


async def test_kill_signals_the_trainer_then_sweeps_escaped_workers(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    trainer = start_fake_trainer(run_dir, env)
    worker = int((run_dir / "ready").read_text())
    escaped = int((tmp_path / "escaped.pid").read_text())
    try:
        assert processes.proc_stat(escaped) is not None and os.getsid(escaped) == escaped
        progress: list[Event] = []
        result = await kill_run(LocalHost(), str(run_dir), 20.0, on_progress=progress.append)
        trainer.wait(10)
        by_pid = {p.pid: p for p in result.processes}
        assert result.status == "stopped", result
        assert by_pid[trainer.pid].role == "trainer"
        assert by_pid[trainer.pid].signals == ["SIGTERM"]
        assert by_pid[trainer.pid].outcome == "exited"
        assert by_pid[worker].signals == [] and by_pid[worker].outcome == "exited"
        assert by_pid[escaped].role == "marked"
        assert by_pid[escaped].signals == ["SIGTERM", "SIGKILL"]
        assert by_pid[escaped].outcome == "killed"
        assert (run_dir / "saved").read_text() == "ok"  # SIGTERM, not SIGKILL, reached it
        assert not alive(worker) and not alive(escaped)
        run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
        assert marker_processes(run_id) == []
        assert any(e.get("step") == "signal" and e.get("pid") == trainer.pid for e in progress)
        again = await kill_run(LocalHost(), str(run_dir), 5.0)
        assert again.status == "not_running" and again.processes == []
    finally:
        for pid in (trainer.pid, worker, escaped):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        trainer.wait(10)


def test_kill_refuses_a_reused_pid(tmp_path: Path) -> None:
    other = subprocess.Popen(["sleep", "300"])
    try:
        run_dir = tmp_path / "run"
        ticks = procs.start_ticks(other.pid)
        assert ticks is not None
        fake_manifest(run_dir, other.pid, f"reused-{os.getpid()}")
        mf.update_manifest(run_dir / "run.json", start_ticks=ticks - 1)  # the trainer was older
        proc = cli("kill", str(run_dir))
        assert proc.returncode == 9, proc.stdout + proc.stderr
        assert "now belongs to another process" in proc.stdout
        assert other.poll() is None  # never signalled
    finally:
        other.kill()
        other.wait()


async def test_resume_refuses_without_a_complete_checkpoint_then_launches_detached(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    dead = dead_pid()
    script = tmp_path / "resumed.py"
    script.write_text(RESUMED)
    cwd = tmp_path / "work dir"
    cwd.mkdir()
    run_id = f"resume-{os.getpid()}-{time.time_ns()}"
    fake_manifest(
        run_dir,
        dead,
        run_id,
        checkpoint_dir=str(run_dir / "checkpoints"),
        resume_command=[sys.executable, str(script), str(run_dir)],
        cwd=str(cwd),
        env={mf.RUN_ID_ENV: run_id, "FLAG": "from-manifest"},
    )
    host = LocalHost()
    with pytest.raises(AgentAnswerError, match="no numbered checkpoint") as refused:
        await resume_run(host, str(run_dir), 5.0)
    assert refused.value.kind is ErrorKind.REFUSED
    write_checkpoint(run_dir / "checkpoints" / "0", global_step=20)
    write_checkpoint(run_dir / "checkpoints" / "1", global_step=40)
    model = run_dir / "checkpoints" / "1" / "model.safetensors"
    model.write_bytes(model.read_bytes()[:-1])
    proc = cli("resume", str(run_dir))
    assert proc.returncode == 9 and "incomplete checkpoint" in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1
    (run_dir / "checkpoints" / "1").rename(run_dir / "checkpoints" / "broken")
    result = await resume_run(host, str(run_dir), 20.0)
    try:
        assert result.status == "started" and result.confirmed is True, result
        assert result.checkpoint is not None and result.checkpoint.global_step == 20
        seen = json.loads((run_dir / "resumed.json").read_text())
        assert seen["pid"] == result.pid and seen["sid"] == result.pid  # setsid
        assert seen["cwd"] == str(cwd) and seen["flag"] == "from-manifest"
        assert seen["marker"] == run_id
        with pytest.raises(AgentAnswerError, match="still alive") as refused:
            await resume_run(host, str(run_dir), 5.0)
        assert refused.value.kind is ErrorKind.REFUSED
    finally:
        assert result.pid is not None
        os.kill(result.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while b"resumed output" not in (run_dir / "train.log").read_bytes():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    assert b"--- eagle3-tui resume at" in (run_dir / "train.log").read_bytes()


def test_resume_of_a_finished_run_is_refused_and_starts_nothing(tmp_path: Path) -> None:
    """A run that finished, with its checkpoints complete: ``resume`` said "started" and
    relaunched it (its last epoch again; stopped, it then read as stopped, not
    finished). Refused, exit 9, as the monitor's ``r`` refuses it."""
    run_dir = tmp_path / "run"
    script = tmp_path / "resumed.py"
    script.write_text(RESUMED)
    fake_manifest(
        run_dir,
        dead_pid(),
        f"finished-{os.getpid()}-{time.time_ns()}",
        status="finished",
        checkpoint_dir=str(run_dir / "checkpoints"),
        resume_command=[sys.executable, str(script), str(run_dir)],
        cwd=str(tmp_path),
    )
    write_checkpoint(run_dir / "checkpoints" / "0", global_step=20)
    proc = cli("resume", str(run_dir))
    assert proc.returncode == 9, proc.stdout + proc.stderr
    assert "the run finished: nothing to resume" in proc.stderr and proc.stderr.count("\n") == 1
    time.sleep(0.5)
    assert not (run_dir / "resumed.json").exists()


def test_kill_after_a_reboot_signals_nothing(tmp_path: Path) -> None:
    other = subprocess.Popen(["sleep", "300"])
    try:
        run_dir = tmp_path / "run"
        fake_manifest(run_dir, other.pid, f"reboot-{os.getpid()}", boot_id="an-earlier-boot")
        proc = cli("kill", str(run_dir), "--json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        result = json.loads(proc.stdout)
        assert result["status"] == "not_running" and "earlier boot" in result["message"]
        assert result["processes"] == []
        assert other.poll() is None  # never signalled
    finally:
        other.kill()
        other.wait()


def test_runs_lists_the_login_users_runs_unless_all(tmp_path: Path) -> None:
    """A run directory another user owns (registered in this user's index, e.g. by a
    run started with sudo) is not offered by default; ``--all`` lists it."""
    state = tmp_path / "state"
    env = dict(os.environ, XDG_STATE_HOME=str(state))
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    index = state / "eagle3-tui" / "runs.jsonl"
    index.parent.mkdir(parents=True)
    for n, run_dir in enumerate((mine, theirs)):
        run_dir.mkdir()
        entry = {"run_id": f"r{n}", "run_dir": str(run_dir), "pid": 1, "started_at": 1.0 + n}
        with index.open("a") as f:
            f.write(json.dumps(entry) + "\n")
    os.chown(theirs, os.getuid() + 1 if os.getuid() else 65534, -1)

    def listed(*args: str) -> tuple[list[str], str]:
        proc = cli("runs", *args, env=env)
        assert proc.returncode == 0, proc.stderr
        if "--json" in args:
            return [r["run_dir"] for r in json.loads(proc.stdout)["runs"]], proc.stdout
        return [], proc.stdout

    assert listed("--json")[0] == [str(mine)]
    assert listed("--all", "--json")[0] == [str(theirs), str(mine)]
    assert "1 run(s) of other users not shown: --all" in listed()[1]


async def test_a_finished_local_agent_is_reaped_once(caplog: pytest.LogCaptureFixture) -> None:
    """A call that has its answer closes the agent without racing asyncio's child watcher:
    an immediate terminate() reaped the exited agent first, and asyncio printed "Unknown
    child process pid N" on the user's terminal (about every other `eagle3-tui runs`)."""
    caplog.set_level(logging.WARNING, logger="asyncio")
    for _ in range(10):
        await call_agent(LocalHost(), {"op": "discover", "all": False}, python=sys.executable)
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


def test_runs_prune_forgets_gone_directories_and_nothing_else(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = dict(os.environ, XDG_STATE_HOME=str(state))
    index = state / "eagle3-tui" / "runs.jsonl"
    kept, deleted, moved = tmp_path / "kept", tmp_path / "deleted", tmp_path / "moved"
    for d in (kept, deleted, moved):
        d.mkdir()
    for n, d in enumerate((kept, deleted, moved)):
        mf.register_run(
            {"run_id": f"r{n}", "run_dir": str(d), "host": "h", "pid": 1, "started_at": 1.0 + n},
            index,
        )
    with index.open("ab") as f:
        f.write(b"not json\n")  # a malformed line: not ours to judge, kept
    deleted.rmdir()
    moved.rename(tmp_path / "moved-away")

    plain = cli("runs", env=env)
    assert plain.returncode == 0, plain.stderr
    assert "--prune forgets them" in plain.stdout and str(deleted) in plain.stdout

    pruned = cli("runs", "--prune", "--json", env=env)
    assert pruned.returncode == 0, pruned.stderr
    result = json.loads(pruned.stdout)
    assert sorted(result["pruned"]) == sorted([str(deleted), str(moved)])
    assert [r["run_dir"] for r in result["runs"]] == [str(kept)]
    assert [json.loads(x)["run_dir"] for x in index.read_text().splitlines()[:-1]] == [str(kept)]
    assert index.read_text().splitlines()[-1] == "not json"
    again = cli("runs", "--prune", env=env)
    assert again.returncode == 0 and "(forgot" not in again.stdout
    assert "--prune forgets" not in again.stdout


def test_a_run_registered_during_a_prune_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """register_run (the telemetry, at a run's start) and prune_index (``runs --prune``)
    hold the same lock (runs.jsonl.lock), so no append lands in a file that prune is
    about to replace. Without it this test loses lines in every run here."""
    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    index = state / "eagle3-tui" / "runs.jsonl"
    gone = {"run_id": "g", "run_dir": str(tmp_path / "g"), "host": "h", "pid": 1, "started_at": 1}
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from eagle3_tui.telemetry import manifest as mf
        base = int(sys.argv[1])
        for n in range(base, base + 150):
            mf.register_run({{"run_id": f"live{{n}}", "run_dir": {str(tmp_path)!r},
                              "host": "h", "pid": 1, "started_at": 1.0}}, Path({str(index)!r}))
        """
    )
    mf.register_run(gone, index)
    writers = [subprocess.Popen([sys.executable, "-c", script, str(k * 1000)]) for k in range(3)]
    forgotten: list[str] = []
    prunes = 0
    while prunes < 3 or any(w.poll() is None for w in writers):
        mf.register_run(gone, index)
        forgotten += runs.prune_index()
        prunes += 1
    assert all(w.wait() == 0 for w in writers)
    ids = [json.loads(x)["run_id"] for x in index.read_text().splitlines()]
    assert sorted(i for i in ids if i.startswith("live")) == sorted(
        f"live{k * 1000 + n}" for k in range(3) for n in range(150)
    )
    assert set(forgotten) == {str(tmp_path / "g")}


async def test_a_resume_whose_program_fails_after_its_telemetry_began_is_failed(
    tmp_path: Path,
) -> None:
    """The relaunch's telemetry writes its PID into the manifest first; the program it
    then runs may fail at its first import (a relaunch through another interpreter than
    the run's). ``resume`` said "started", exit 0; it watches a moment longer now: failed,
    exit 8, its log's tail printed."""
    run_dir = tmp_path / "run"
    script = tmp_path / "resumed.py"
    script.write_text(
        RESUMED.replace(
            'print("resumed output")',
            'print("resumed output", flush=True)\ntime.sleep(0.6)\nimport no_such_mod',
        )
    )
    run_id = f"resume-{os.getpid()}-{time.time_ns()}"
    fake_manifest(
        run_dir,
        dead_pid(),
        run_id,
        checkpoint_dir=str(run_dir / "checkpoints"),
        resume_command=[sys.executable, str(script), str(run_dir)],
        cwd=str(tmp_path),
        env={mf.RUN_ID_ENV: run_id},
    )
    write_checkpoint(run_dir / "checkpoints" / "0", global_step=20)
    proc = cli("resume", str(run_dir))
    assert proc.returncode == 8, proc.stdout + proc.stderr
    assert "no_such_mod" in proc.stdout + proc.stderr


async def test_a_copy_of_a_stopped_run_is_not_resumed(tmp_path: Path) -> None:
    """``cp -r run copy; resume copy``: the copy's manifest names the first run's command
    and directories, so its resume relaunched the first run, into its directory. Refused
    now, nothing started; the first run itself resumes."""
    run_dir = tmp_path / "run"
    script = tmp_path / "resumed.py"
    script.write_text(RESUMED)
    run_id = f"resume-{os.getpid()}-{time.time_ns()}"
    fake_manifest(
        run_dir,
        dead_pid(),
        run_id,
        checkpoint_dir=str(run_dir / "checkpoints"),
        resume_command=[sys.executable, str(script), str(run_dir)],
        cwd=str(tmp_path),
        env={mf.RUN_ID_ENV: run_id},
    )
    write_checkpoint(run_dir / "checkpoints" / "0", global_step=20)
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    proc = cli("resume", str(copy))
    assert proc.returncode == 9, proc.stdout + proc.stderr
    assert f"is a copy of the run in {run_dir}" in proc.stderr
    assert not (run_dir / "resumed.json").exists()  # nothing was started
