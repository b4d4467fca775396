"""The agent's replies decoded once into typed values: the error kinds the agent raises
are the client's, a reply of the wrong shape is one clear error, and a status moves the
run state in one place."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

import eagle3_tui.agent
from eagle3_tui import reports, runs_text
from eagle3_tui.agent import names
from eagle3_tui.api.reading import apply_status
from eagle3_tui.model.health import diagnose
from eagle3_tui.model.verdict import Health
from eagle3_tui.reports import exit_status_of
from eagle3_tui.telemetry import manifest as mf
from eagle3_tui.transport import calls
from eagle3_tui.transport.calls import run_status
from eagle3_tui.transport.channel import AgentAnswerError, LocalHost, call_agent
from eagle3_tui.transport.replies import (
    AgentProtocolError,
    AttachPlan,
    AttachResult,
    Choice,
    ChooseReply,
    DiscoverReport,
    ErrorKind,
    KillReport,
    ProcessRow,
    RunEntry,
    RunsReport,
    Status,
    decode,
    decode_plan,
    to_json,
)
from tests.conftest import need_training
from tests.model.test_health import state_of
from tests.records import Lines
from tests.sources import parse
from tests.transport.fakes import dead_pid, fake_manifest

AGENT = Path(eagle3_tui.agent.__file__).parent


def test_the_clients_error_kinds_are_the_agents() -> None:
    assert {k.value for k in ErrorKind} - {ErrorKind.UNKNOWN} == set(names.ERROR_KINDS)
    assert ErrorKind.of("no such kind") is ErrorKind.UNKNOWN
    assert ErrorKind.of(names.ERR_NO_MANIFEST) is ErrorKind.NO_MANIFEST


def first_arguments(function: str) -> list[tuple[str, int, str]]:
    """The first argument of every call of ``function`` in the agent: (file, line, value),
    a name resolved through ``agent/names.py``."""
    out = []
    for path in sorted(AGENT.glob("*.py")):
        tree = parse(path.read_text())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") == function):
                continue
            first = node.args[0]
            if isinstance(first, ast.Name):
                value = getattr(names, first.id, f"<{first.id}>")
            elif isinstance(first, ast.Constant):
                value = str(first.value)
            else:
                value = f"<{ast.unparse(first)}>"
            out.append((path.name, node.lineno, value))
    return out


def test_every_error_the_agent_raises_has_a_known_kind() -> None:
    found = first_arguments("AgentError") + first_arguments("BadInputError")
    assert len(found) > 10  # the scan finds them
    assert [f for f in found if f[2] not in names.ERROR_KINDS] == []


def test_every_event_the_agent_emits_is_a_shared_name() -> None:
    events = {v for k, v in vars(names).items() if k.startswith("EV_")}
    found = first_arguments("emit")
    assert len(found) > 20
    assert [f for f in found if f[2] not in events] == []
    assert set(names.FINAL_EVENTS) <= events


def test_a_reply_of_the_wrong_shape_is_one_clear_error() -> None:
    with pytest.raises(AgentProtocolError) as e:
        decode(Status, {"op": "status", "alive": "yes"}, "gpu-box")
    message = str(e.value)
    assert message.startswith("gpu-box: the agent's status reply is not understood")
    assert "$.alive" in message and "\n" not in message
    with pytest.raises(AgentProtocolError, match=r"\$\.status"):
        decode(KillReport, {"op": "kill", "status": "exploded", "message": "?"})
    with pytest.raises(AgentProtocolError, match=r"`run_dir` - at `\$\.runs\[0\]`"):
        decode(RunsReport, {"op": "runs", "runs": [{"exists": True}]})
    # what a client does not read is ignored (a newer agent may say more)
    status = decode(Status, {"op": "status", "alive": True, "new_field": [1, 2]})
    assert status.alive is True and status.leftovers == []


def test_one_rule_says_gone_running_dead() -> None:
    def state(**fields: object) -> str:
        return decode(RunEntry, {"run_dir": "/r", **fields}).state

    assert state(exists=False, alive=True) == "gone"
    assert state(alive=True, status="running") == "running"
    assert state(alive=False, status="running") == "dead"
    assert state(alive=False, status="finished") == "finished"
    assert state(alive=False) == "unknown"


async def test_errors_carry_their_kind_not_only_their_text(tmp_path: Path) -> None:
    host = LocalHost()
    with pytest.raises(AgentAnswerError) as e:
        await run_status(host, str(tmp_path))  # a directory, no run.json
    assert e.value.kind is ErrorKind.NO_MANIFEST and "no run.json here" in str(e.value)
    (tmp_path / "run.json").write_text('{"pid": "not a pid"}')
    with pytest.raises(AgentAnswerError) as e:
        await run_status(host, str(tmp_path))
    assert e.value.kind is ErrorKind.NO_MANIFEST and "not a run manifest" in str(e.value)
    with pytest.raises(AgentAnswerError) as e:
        await run_status(host, str(tmp_path / "nowhere"))
    assert e.value.kind is ErrorKind.MISSING
    assert exit_status_of(e.value) == 2
    refused = AgentAnswerError("refused", ErrorKind.REFUSED)
    assert exit_status_of(refused) == 9


async def test_apply_status_moves_the_run_state_once(tmp_path: Path) -> None:
    """A real status of a dead trainer with a leftover process: the state is judged dead,
    names the leftover, and takes the host's clock."""
    run_dir = tmp_path / "run"
    run_id = f"apply-{os.getpid()}"
    env = dict(os.environ, **{names.RUN_ID_ENV: run_id})
    worker = subprocess.Popen(["sleep", "60"], env=env)  # noqa: ASYNC220 - started at once
    try:
        fake_manifest(run_dir, dead_pid(), run_id)
        status = await run_status(LocalHost(), str(run_dir))
        assert status.alive is False and [x.pid for x in status.leftovers] == [worker.pid]
        lines = Lines(t0=1_800_000_000.0)
        state = state_of(b"".join(lines.train(s, 1.0) for s in range(20)))
        apply_status(state, status, lines.ts)
        assert state.manifest["run_id"] == run_id and state.liveness.process_alive is False
        assert [x.pid for x in state.liveness.leftovers] == [worker.pid]
        assert status.now is not None and state.liveness.clock_offset == status.now - lines.ts
        d = diagnose(state, state.liveness.host_time(lines.ts))
        assert d.health == Health.DEAD and f"pid {worker.pid} sleep" in d.reason
    finally:
        worker.kill()
        worker.wait()


def test_summary_of_a_local_run_applies_the_agents_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``summary RUN_DIR`` on this machine: the same status (the agent's ``status_of``,
    decoded and applied as the app's probe is) says whether the trainer lives."""
    from eagle3_tui.cli import main

    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        lines = Lines(t0=time.time() - 12, dt=1.0)
        data = lines.event("start", pid=sleeper.pid, global_step=0)
        data += b"".join(lines.train(s, 1.0) for s in range(10))
        (tmp_path / "metrics.jsonl").write_bytes(data)
        fake_manifest(tmp_path, sleeper.pid, f"sum-{os.getpid()}")
        assert main(["summary", str(tmp_path), "--json"]) == 0, capsys.readouterr()
        assert json.loads(capsys.readouterr().out)["health"] == "running"
    finally:
        sleeper.kill()
        sleeper.wait()
    assert main(["summary", str(tmp_path), "--json"]) == 5  # the same PID, gone now
    assert json.loads(capsys.readouterr().out)["health"] == "dead"
    (tmp_path / "run.json").unlink()  # a user's own writer: judged on its records alone
    assert main(["summary", str(tmp_path), "--json"]) == 0


# ---- discover, choose, describe, attach: what the real agent sends ----------------------

SILENT = textwrap.dedent(
    """
    import sys, time
    import torch  # libtorch in the maps

    def train():
        import speculators  # what discovery reads in the script (never run here)

    if __name__ == "__main__":
        open(sys.argv[1], "w").write("ready")
        time.sleep(300)
    """
)


@pytest.fixture(scope="module")
def silent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int]]:
    """A training without telemetry as discovery sees one (torch loaded, its script
    imports speculators): its working directory and PID."""
    need_training()
    work = tmp_path_factory.mktemp("silent")
    (work / "silent_train.py").write_text(SILENT)
    ready = work / "ready"
    proc = subprocess.Popen(
        [sys.executable, "silent_train.py", str(ready)], cwd=work, start_new_session=True
    )
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert time.monotonic() < deadline and proc.poll() is None, "it did not start"
        time.sleep(0.1)
    time.sleep(0.3)
    yield work, proc.pid
    proc.kill()
    proc.wait()


def unread(fields: dict[str, Any], kind: type[msgspec.Struct]) -> set[str]:
    """The keys of a reply that ``kind`` has no field for (dropped by decoding, and from
    ``--json``)."""
    return set(fields) - set(kind.__struct_fields__)


async def raw(request: dict[str, Any]) -> dict[str, Any]:
    ev = await call_agent(LocalHost(), request, python=sys.executable)
    return ev.fields


async def test_discover_choose_and_describe_decode_what_the_agent_sends(
    silent: tuple[Path, int], tmp_path: Path
) -> None:
    work, pid = silent
    finished = fake_manifest(tmp_path / "old", dead_pid(), f"old-{os.getpid()}")
    mf.register_run(finished)
    fields = await raw({"op": names.OP_DISCOVER, "all": False})
    report = decode(DiscoverReport, fields)
    mine = [r for r in fields["live"] if r["pid"] == pid]
    assert len(mine) == 1, fields["live"]
    assert unread(fields, DiscoverReport) == set()
    assert unread(mine[0], ProcessRow) == set()  # every key the agent sends is read
    assert all(unread(r, RunEntry) == set() for r in fields["runs"]), fields["runs"]
    row = next(r for r in report.live if r.pid == pid)
    assert row.cwd == str(work) and row.telemetry is False and row.run_dir is None
    assert isinstance(row.start_ticks, int) and row.mine and row.health is not None
    assert [m.role for m in row.members if m.pid == pid] == ["trainer"]
    assert any("silent_train.py imports speculators" in e for e in row.evidence)
    entry = next(e for e in report.runs if e.run_dir == finished["run_dir"])
    assert entry.state == "dead"  # its manifest says running; its trainer is gone
    # the same through the client's own call, and what it shows
    report = await calls.discover(LocalHost())
    assert any(r.pid == pid for r in report.live)
    shown = runs_text.format_discovered(report)
    assert str(work) in shown and "silent_train.py" in shown and finished["run_dir"] in shown
    out = json.loads(to_json(report))  # runs --json: what the agent said, every key
    shown_row = next(r for r in out["live"] if r["pid"] == pid)
    # what only a record of an ended training has, at its live defaults
    ended = {"alive": True, "ended_at": None, "last_alive": None, "exit_status": None}
    assert set(shown_row) == set(mine[0]) | {"named_pid", "record", *ended}
    assert {k: shown_row[k] for k in ended} == ended and shown_row["record"] is None

    # choose: a work directory means its live training
    fields = await raw({"op": names.OP_CHOOSE, "run_dir": str(work)})
    assert unread(fields, ChooseReply) == set()
    assert fields["row"] is not None and unread(fields["row"], ProcessRow) == set()
    chosen = await calls.choose(LocalHost(), str(work))
    assert chosen.choice is Choice.PROCESS and chosen.chosen_row().pid == pid
    assert chosen.host == os.uname().nodename and f"pid {pid}" in chosen.note
    # a run directory means that run
    chosen = await calls.choose(LocalHost(), finished["run_dir"])
    assert chosen.choice is Choice.RUN and chosen.chosen_run_dir() == finished["run_dir"]

    # describe: the process now, with its row
    fields = await raw({"op": names.OP_DESCRIBE, "pid": pid, "start_ticks": row.start_ticks})
    assert unread(fields, Status) == set() and unread(fields["row"], ProcessRow) == set()
    status = await calls.describe(LocalHost(), row)
    assert status.alive is True and status.row is not None and status.row.pid == pid
    assert calls.describe_process(row) == f"pid {pid} silent_train.py in {work}"


async def test_attach_replies_decode_what_the_agent_sends(
    silent: tuple[Path, int], tmp_path: Path
) -> None:
    """The plan (every check passed) or the refusal that stands in for it, and a refusal
    of the inject step, each with every key read."""
    work, pid = silent
    request = calls.attach_request("plan", str(tmp_path / "run"), pid)
    fields = await raw(request)
    plan = decode_plan(fields)
    if isinstance(plan, AttachPlan):
        assert unread(fields, AttachPlan) == set()
        assert plan.pid == pid and plan.cwd == str(work) and plan.mechanism == "ptrace"
        assert plan.python.version is not None and plan.python.label.startswith("CPython")
        assert plan.run_dir == str(tmp_path / "run") and plan.argv[1:2] == ["silent_train.py"]
        assert reports.attach_exit_status(plan) == 0
        assert f"attach telemetry to pid {pid}" in reports.format_attach_plan(plan)
        confirmed = msgspec.structs.replace(plan, start_ticks=(plan.start_ticks or 0) + 1)
    else:  # ptrace is not allowed here: the refusal, typed too
        assert unread(fields, AttachResult) == set()
        assert plan.reason == "permission", plan
        confirmed = AttachPlan(pid=pid, start_ticks=1, run_dir=str(tmp_path / "run"))
    # the inject step of a process that is not the one confirmed: refused, nothing done
    fields = await raw(calls.attach_request("inject", None, None, confirmed))
    result = decode(AttachResult, fields)
    assert unread(fields, AttachResult) == set()
    assert result.status == "refused" and result.reason in ("reused", "permission"), result
    assert reports.attach_exit_status(result) in (21, 22)  # no such process / no permission
    assert not (tmp_path / "run").exists()


def test_replies_of_the_wrong_shape_name_the_field() -> None:
    """Each new reply: a mistyped or missing field is one AgentProtocolError line that
    names it, never a KeyError or a traceback further up."""
    cases: list[tuple[type[msgspec.Struct], dict[str, Any], str]] = [
        (DiscoverReport, {"op": "discover", "live": [{"pid": "4242"}]}, "$.live[0].pid"),
        (DiscoverReport, {"op": "discover", "live": [{"cwd": "/w"}]}, "`pid`"),
        (DiscoverReport, {"op": "discover", "runs": [{"run_dir": 7}]}, "$.runs[0].run_dir"),
        (ChooseReply, {"op": "choose", "choice": "maybe"}, "$.choice"),
        (ChooseReply, {"op": "choose", "choice": "process"}, "`row`"),
        (ChooseReply, {"op": "choose", "choice": "run"}, "`run_dir`"),
        (ChooseReply, {"op": "choose", "choice": "several", "runs": [{}]}, "$.runs[0]"),
        (Status, {"op": "describe", "alive": True, "row": {"pid": None}}, "$.row.pid"),
        (AttachPlan, {"op": "attach", "status": "plan", "argv": ["python"]}, "`pid`"),
        (AttachPlan, {"op": "attach", "pid": 1, "python": {"label": 3}}, "$.python.label"),
        (AttachResult, {"op": "attach", "message": "?"}, "`status`"),
        (AttachResult, {"op": "attach", "status": "refused", "candidates": [{}]}, "`pid`"),
    ]
    for kind, fields, field in cases:
        with pytest.raises(AgentProtocolError) as e:
            decode(kind, fields, "gpu-box")
        message = str(e.value)
        assert field in message and "\n" not in message, (kind, message)
        assert message.startswith(f"gpu-box: the agent's {fields['op']} reply is not understood")
    assert isinstance(decode_plan({"op": "attach", "status": "plan", "pid": 5}), AttachPlan)
    refused = decode_plan({"op": "attach", "status": "refused", "reason": "no_gdb"})
    assert isinstance(refused, AttachResult) and reports.attach_exit_status(refused) == 34


def test_a_manifests_nodes_are_read_as_node_places() -> None:
    """The other nodes a manifest names (not the one read, not an entry without a host),
    and the SSH target of each."""
    from eagle3_tui.transport.target import SshOptions, SshTarget

    manifest = {
        "node_rank": 0,
        "nodes": [
            {"node_rank": 0, "host": "n0", "run_dir": "/r0", "ranks": [0]},
            {"node_rank": 1, "host": "n1", "run_dir": "/r1", "ranks": [1], "launcher_pid": 9},
            {"node_rank": 2, "run_dir": "/r2"},  # no host: nothing to reach
            {"node_rank": 3, "host": 42},
            "not a node",
        ],
    }
    nodes = calls.other_nodes(manifest, "n0", "/r0")
    assert [(n.host, n.run_dir, n.node_rank, n.launcher_pid) for n in nodes] == [
        ("n1", "/r1", 1, 9)
    ]
    target = SshTarget("n0", user="alice", run_dir="/r0", options=SshOptions())
    other = calls.node_target(target, nodes[0])
    assert (other.host, other.run_dir, other.user) == ("n1", "/r1", "alice")
    assert calls.other_nodes({"nodes": "?"}, "n0", "/r0") == []


def test_json_of_a_reply_counts_epochs_and_last_steps_from_1() -> None:
    """``kill --json`` said ``"latest": {"epoch": 0}`` and ``"redo": {"last_step": 21}``
    where its text says "epoch 1" and "step 22" (the README: every JSON field named
    ``epoch`` or ``last_step`` counts from 1); ``global_step`` stays speculators'."""
    from eagle3_tui.transport.replies import CheckpointInfo, Checkpoints, Redo, to_json

    info = CheckpointInfo(path="/c/0", epoch=0, global_step=24, local_step=0)
    out = json.loads(to_json(Checkpoints(dir="/c", latest=info)))
    assert out["latest"]["epoch"] == 1 and out["latest"]["global_step"] == 24, out
    redo = json.loads(to_json(Redo(checkpoint_step=48, steps=21, last_step=68)))
    assert redo["last_step"] == 69 and redo["steps"] == 21, redo
    assert json.loads(to_json(CheckpointInfo(path="/c/i")))["epoch"] is None
