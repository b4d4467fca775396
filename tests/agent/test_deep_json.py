"""JSON nested past the parser's stack, wherever a run, a process or another user may
write it: a manifest, a state file, a checkpoint's header, a metrics line. Each is bad
input like any other (not a manifest, a checkpoint with a problem, a malformed line),
never a ``RecursionError`` out of the agent's operation or the monitor's read: both
``json.loads`` and msgspec raise that, not a ValueError, for ``[`` 100,000 times."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from eagle3_tui.agent.checkpoints import checkpoint_info, checkpoint_problems
from eagle3_tui.agent.frames import AgentError
from eagle3_tui.agent.process_facts import eagle3_metrics, load_manifest
from eagle3_tui.agent.runs import read_manifest
from eagle3_tui.agent.stopping import step_pace
from eagle3_tui.model.run import Run
from eagle3_tui.telemetry.column_log import index_file
from eagle3_tui.telemetry.parsing import parse_json
from tests.records import Lines

DEEP = b"[" * 100_000 + b"]" * 100_000
"""200 KB: inside every bound a reader sets, far past any parser's stack."""


def deep_line(kind: str, seq: int) -> bytes:
    head = b'{"v":1,"seq":%d,"w":"rank0","ts":%d.5,"kind":"%s",' % (seq, 1000 + seq, kind.encode())
    return head + b'"train":' + DEEP + b"}\n"


def test_parse_json_says_a_document_too_deep_is_not_json() -> None:
    with pytest.raises(RecursionError):
        json.loads(DEEP)  # (what every reader caught as ValueError did not catch)
    with pytest.raises(ValueError, match="nested deeper"):
        parse_json(DEEP)
    assert parse_json(b'{"a": [[1]]}') == {"a": [[1]]}


def test_a_deep_manifest_is_no_manifest(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_bytes(b'{"pid": ' + DEEP + b"}")
    assert load_manifest(str(tmp_path)) is None
    with pytest.raises(AgentError, match="unreadable manifest"):
        read_manifest(tmp_path)
    (tmp_path / "metrics.jsonl").write_bytes(DEEP + b"\n")
    (tmp_path / "run.json").unlink()
    assert eagle3_metrics(str(tmp_path / "metrics.jsonl")) is False


def test_a_checkpoint_with_deep_headers_has_problems(tmp_path: Path) -> None:
    header = b'{"w": ' + DEEP + b"}"
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    (tmp_path / "training_state.json").write_bytes(DEEP)
    problems = checkpoint_problems(tmp_path)
    assert any(p.startswith("model.safetensors is") for p in problems), problems
    assert "training_state.json is unreadable" in problems
    info = checkpoint_info(tmp_path)
    assert info["problems"] == problems


def test_deep_metrics_lines_are_skipped_by_the_agent_and_malformed_in_the_monitor(
    tmp_path: Path,
) -> None:
    lines = Lines()
    good = [lines.train(s, 1.0) for s in range(300)]
    data = b"".join([*good[:100], deep_line("train", 100), *good[100:200]])
    data += deep_line("gpu", 201) + b"".join(good[200:])
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(data)
    assert index_file(str(path)) >= 1  # the deep lines marked as events, not rows
    step_pace(path)  # (bad lines skipped)
    whole = Run()
    whole.feed(0, data)
    one_by_one = Run()
    offset = 0
    for line in data.splitlines(keepends=True):
        one_by_one.feed(offset, line)
        offset += len(line)
    for run in (whole, one_by_one):
        assert run.state.malformed_count == 2
        assert list(run.state.table.steps) == list(range(300))
