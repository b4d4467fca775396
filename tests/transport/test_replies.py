"""The agent's replies decoded once into typed values: the error kinds the agent raises
are the client's, a reply of the wrong shape is one clear error, and a status moves the
run state in one place."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

import eagle3_tui.agent
from eagle3_tui.agent import names
from eagle3_tui.model.health import Health, diagnose
from eagle3_tui.transport.channel import AgentAnswerError, LocalHost
from eagle3_tui.transport.control import exit_status_of, run_status
from eagle3_tui.transport.replies import (
    AgentProtocolError,
    ErrorKind,
    KillReport,
    RunEntry,
    RunsReport,
    Status,
    apply_status,
    decode,
)
from tests.model.test_health import state_of
from tests.records import Lines
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
        tree = ast.parse(path.read_text())
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
    found = first_arguments("AgentError")
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
        assert state.manifest["run_id"] == run_id and state.process_alive is False
        assert [x.pid for x in state.leftovers] == [worker.pid]
        assert status.now is not None and state.clock_offset == status.now - lines.ts
        d = diagnose(state, state.host_time(lines.ts))
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
