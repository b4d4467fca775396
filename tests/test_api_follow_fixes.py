"""``api.follow`` and a run's ``metrics.jsonl`` deleted, recreated or cut under it: the
records read before are kept and the new file goes on as the same run's history, as the
monitor keeps them (the model's ``Run.file_changed``), never a look that starts over
(step 106 -> None -> 107, the checkpoints and GPUs gone); a look while the path has no
file goes on (it says so) rather than ending the follow; a file cut to nothing keeps
its history."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui import api
from eagle3_tui.api.reading import Feeder, new_run
from eagle3_tui.transport.channel import DataFrame, Event
from tests.records import Lines

RUN_ID = "r-follow"


def _start(run_dir: Path) -> Lines:
    """A live run's file: its start, ten steps, a checkpoint and a GPU sample."""
    run_dir.mkdir()
    lines = Lines(t0=time.time() - 10, dt=0.2)
    data = lines.event("start", run_id=RUN_ID)
    for step in range(10):
        data += lines.train(step, 2.0 - step * 0.01)
    data += lines.ckpt("save_finished", str(run_dir / "checkpoints" / "9"), bytes=100)
    data += lines.gpu(90.0)
    (run_dir / "metrics.jsonl").write_bytes(data)
    return lines


def _remade(run_dir: Path, lines: Lines, written_before: int, step: int) -> None:
    """The telemetry's own file made again: its ``file`` event first, then a step."""
    data = lines.event(
        "file",
        change="deleted",
        run_id=RUN_ID,
        file="metrics.jsonl",
        noticed=time.time(),
        written_before=written_before,
    )
    data += lines.train(step, 1.5)
    (run_dir / "metrics.jsonl").write_bytes(data)


def _said(summary: dict[str, Any]) -> list[str]:
    return [str(n["said"]) for n in summary["file_changes"]]


def test_a_file_deleted_and_made_again_goes_on_as_the_same_history(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    lines = _start(run_dir)
    looks = api.follow(run_dir, every=0.01)
    first = next(looks).summary()
    assert first["global_step"] == 9 and first["checkpoint"] is not None
    with (run_dir / "metrics.jsonl").open("ab") as f:
        f.write(lines.train(10, 1.9))  # written after the look, just before the delete
    (run_dir / "metrics.jsonl").unlink()
    _remade(run_dir, lines, written_before=lines.seq, step=11)
    after = next(looks).summary()
    assert after["global_step"] == 11, after["reason"]  # 9 -> 11, never None
    assert after["checkpoint"] is not None and after["gpus"]  # the history kept
    assert after["records"] == lines.seq and after["lost_records"] == 0  # step 10 too
    assert any("deleted" in s and "nothing lost" in s for s in _said(after)), _said(after)
    assert "No step logged" not in after["reason"]
    looks.close()


def test_a_look_while_the_file_is_gone_goes_on(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    lines = _start(run_dir)
    looks = api.follow(run_dir, every=0.01)
    next(looks)
    (run_dir / "metrics.jsonl").unlink()
    gone = next(looks).summary()  # not TargetError: "no metrics.jsonl here"
    assert gone["global_step"] == 9 and gone["checkpoint"] is not None
    assert any("no file there yet" in s for s in _said(gone)), _said(gone)
    assert next(looks).summary()["global_step"] == 9  # still waiting, said once
    _remade(run_dir, lines, written_before=lines.seq, step=10)
    back = next(looks).summary()
    assert back["global_step"] == 10 and back["lost_records"] == 0
    assert len(back["file_changes"]) == 1, _said(back)
    assert "nothing lost" in _said(back)[0]
    looks.close()


def test_a_file_cut_to_nothing_keeps_its_history(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    lines = _start(run_dir)
    looks = api.follow(run_dir, every=0.01)
    next(looks)
    (run_dir / "metrics.jsonl").write_bytes(b"")  # truncated to zero
    cut = next(looks)
    assert cut.health != "waiting", cut.reason  # not "Waiting for the first record."
    assert cut.summary()["global_step"] == 9
    assert any("truncated" in s and "kept" in s for s in _said(cut.summary()))
    with (run_dir / "metrics.jsonl").open("ab") as f:
        f.write(lines.train(10, 1.9))
    assert next(looks).summary()["global_step"] == 10
    looks.close()
    (run_dir / "metrics.jsonl").write_bytes(b"")  # a first look: nothing read before
    with pytest.raises(api.TargetError, match="is empty"):  # to keep, as open_run says
        next(api.follow(run_dir, every=0.01))


def test_a_file_a_host_says_restarted_goes_on_as_the_same_history() -> None:
    """Over SSH (and a target its host chooses the run of), the agent's ``restarted``:
    the frames after it are the same run's, as the monitor's SSH stream feeds them."""
    lines = Lines(t0=time.time() - 10, dt=0.2)
    old = lines.event("start", run_id=RUN_ID)
    for step in range(5):
        old += lines.train(step, 2.0)
    run = new_run()
    with Feeder(run) as feed:
        feed(DataFrame(0, old, -1))
    again = lines.event(
        "file", change="deleted", run_id=RUN_ID, file="metrics.jsonl", written_before=6
    )
    again += lines.train(5, 1.9)
    with Feeder(new_run()) as feed:
        feed.begin(run)  # a later look: read on from where it ended
        feed.event(Event("restarted", {"reason": "replaced", "expected": len(old), "size": 9}))
        feed(DataFrame(0, again, -1))
    assert feed.run is run
    state = run.state
    assert state.global_step == 5 and state.records == lines.seq


def test_a_chosen_run_whose_file_is_gone_is_followed_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over SSH: a look that finds the run's file gone (the agent's ``missing``) yields
    the run read so far, the file's deletion said to it, rather than ending the follow."""
    import eagle3_tui.api as api_module
    from eagle3_tui.api.reading import ReadTo
    from eagle3_tui.transport.channel import AgentAnswerError
    from eagle3_tui.transport.replies import ErrorKind

    lines = Lines(t0=time.time() - 10, dt=0.2)
    data = lines.event("start", run_id=RUN_ID) + lines.train(0, 2.0)
    run = new_run()
    run.feed(0, data)
    answers: list[Any] = [
        api.OpenedRun(
            "gpu:run",
            api.target("gpu:run"),
            run,
            time.time(),
            None,
            None,
            ReadTo(run, "/run", len(data), "1:2"),
        ),
        AgentAnswerError("/run: no metrics.jsonl here", ErrorKind.MISSING),
        AgentAnswerError("/run: no metrics.jsonl here", ErrorKind.MISSING),
    ]

    def chosen(*args: Any) -> api.OpenedRun:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[no-any-return]

    class NoHost:
        host = None

        def __init__(self, where: Any) -> None:
            pass

        def run(self, coro: Any) -> None:
            coro.close()

        def close(self) -> None:
            pass

    monkeypatch.setattr(api_module, "_chosen", chosen)
    monkeypatch.setattr(api_module, "Session", NoHost)
    looks = api.follow("gpu:run", every=0.01)
    assert next(looks).run is run
    gone = next(looks)  # not AgentAnswerError: the follow goes on
    assert gone.run is run and gone.summary()["global_step"] == 0
    assert any("no file there yet" in s for s in _said(gone.summary()))
    again = next(looks)
    assert len(again.summary()["file_changes"]) == 1  # said once
    looks.close()
