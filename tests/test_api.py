"""The Python API under the CLI (issue 29): the README's example run exactly as printed
on two real tiny trainings, the same answers as the commands, following a run that
grows (and is replaced), errors as the CLI's, and calls from inside an event loop (a
notebook's)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import shutil
import time
from pathlib import Path

import pytest

from eagle3_tui import api
from eagle3_tui.cli import main
from eagle3_tui.model.compare import comparison_json
from eagle3_tui.transport.target import Target
from tests.test_second_hour_cli import a_run

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example() -> str:
    text = README.read_text()
    section = text[text.index("## Python API\n") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def cli_json(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:  # type: ignore[type-arg]
    capsys.readouterr()
    rc = main([*argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


@pytest.fixture
def two_runs(tiny_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """runs/exp7 and runs/exp6 in the working directory, as the README names them: the
    finished tiny run, and the same run cut at its 30th step record (a previous run
    that got less far)."""
    runs = tmp_path / "runs"
    shutil.copytree(tiny_run, runs / "exp7", symlinks=True)
    (runs / "exp6").mkdir()
    kept, train = [], 0
    for line in (tiny_run / "metrics.jsonl").read_text().splitlines(keepends=True):
        train += json.loads(line).get("kind") == "train"
        if train > 30:
            break
        kept.append(line)
    (runs / "exp6" / "metrics.jsonl").write_text("".join(kept))
    monkeypatch.chdir(tmp_path)
    return runs


def test_the_readme_example_runs_as_printed(
    two_runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = readme_example()
    assert 'api.open_run("runs/exp7")' in code and "api.compare(" in code
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines
    rc, summary = cli_json("summary", "runs/exp7", capsys=capsys)
    assert lines[0] == f"{summary['health']} - {summary['reason']}"
    assert lines[0].startswith("finished - ")
    assert lines[1] == f"{summary['global_step']} {summary['loss']}"
    rc, compared = cli_json("compare", "runs/exp7", "runs/exp6", capsys=capsys)
    assert rc == 0 and lines[2] == compared["verdict"]
    assert "at step 30" in lines[2], lines[2]  # exp6 reached step 30


def test_the_api_answers_as_the_commands_do(
    two_runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = api.open_run("runs/exp6")
    rc, summary = cli_json("summary", "runs/exp6", capsys=capsys)
    mine = run.summary()
    for key in ("health", "reason", "global_step", "step", "epoch", "loss", "ttt", "tau"):
        assert mine[key] == summary[key], key
    assert run.exit_status == rc
    assert run.snapshot(columns=40).progress.global_step == mine["global_step"]
    result = api.compare(two_runs / "exp7", "runs/exp6", axis="step")
    rc, compared = cli_json("compare", "runs/exp7", "runs/exp6", capsys=capsys)
    mine_c = comparison_json(result)
    assert {k: mine_c[k] for k in ("verdict", "at", "rows")} == {
        k: compared[k] for k in ("verdict", "at", "rows")
    }


def test_follow_reads_on_from_where_it_was(two_runs: Path) -> None:
    live = two_runs / "live"
    live.mkdir()
    lines = (two_runs / "exp7" / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    half = len(lines) // 2
    (live / "metrics.jsonl").write_bytes(b"".join(lines[:half]) + lines[half][:7])  # torn
    looks = api.follow(live, every=0.01)
    first = next(looks)
    with (live / "metrics.jsonl").open("ab") as f:
        f.write(lines[half][7:] + b"".join(lines[half + 1 :]))
    second = next(looks)
    whole = api.open_run("runs/exp7").summary()
    assert first.summary()["global_step"] < second.summary()["global_step"]
    assert second.summary()["global_step"] == whole["global_step"]
    assert second.state.malformed_count == 0  # the torn line was joined, not dropped
    trains = [
        i for i, line in enumerate(lines) if b'"kind": "train"' in line or b'"kind":"train"' in line
    ]
    replaced = live / "metrics.new"
    # a new, shorter file: the same run's first 10 steps (its writer's records, read
    # before): the same history, as the monitor keeps it, not a run read anew from step 9
    replaced.write_bytes(b"".join(lines[: trains[9] + 1]))
    replaced.rename(live / "metrics.jsonl")
    third = next(looks)
    assert third.summary()["global_step"] == whole["global_step"]
    changes = third.summary()["file_changes"]
    assert changes and changes[-1]["change"] == "replaced", changes


def test_errors_are_one_line_with_the_commands_status(tmp_path: Path) -> None:
    with pytest.raises(api.TargetError) as missing:
        api.open_run(tmp_path / "nothing-here")
    assert "\n" not in str(missing.value) and api.exit_status(missing.value) == 2
    (tmp_path / "file").write_text("x")
    with pytest.raises(api.TargetError) as wrong:
        api.open_run(tmp_path / "file")
    assert api.exit_status(wrong.value) == 25
    with pytest.raises(api.TargetError, match="a TARGET is needed"):
        api.open_run()
    with pytest.raises(api.TargetError, match="the same run"):
        api.compare(tmp_path, f"{tmp_path}/.")


@pytest.mark.parametrize("pid", ["abc", "", "4242", 3.7, True, 0, -1])
@pytest.mark.parametrize("call", ["open_run", "follow", "kill", "resume", "attach"])
def test_a_pid_that_is_not_a_process_id_is_refused_not_another_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pid: object, call: str
) -> None:
    """``api.open_run(pid="abc")`` opened whatever run the working directory held (a
    finished one, unrelated); ``pid=True`` raised the agent's error. Each is one line,
    exit 2, before any host is asked."""
    a_run(tmp_path / "run")
    monkeypatch.chdir(tmp_path / "run")
    with pytest.raises(api.TargetError) as e:
        _called(call, pid=pid)
    assert "a process ID is a whole number from 1" in str(e.value), e.value
    assert api.exit_status(e.value) == 2


@pytest.mark.parametrize("where", [123, 4.5, ["run"], b"run"])
@pytest.mark.parametrize("call", ["open_run", "follow", "kill", "resume", "attach", "compare"])
def test_a_target_that_is_no_target_is_refused_in_one_line(where: object, call: str) -> None:
    """``api.open_run(123)`` raised ``AttributeError: 'int' object has no attribute
    'startswith'`` from deep inside: a TargetError now, exit 2."""
    args = (where, where) if call == "compare" else (where,)
    with pytest.raises(api.TargetError) as e:
        _called(call, *args)
    assert f"target={where!r}" in str(e.value) and api.exit_status(e.value) == 2


@pytest.mark.parametrize(
    ("call", "durations"),
    [
        ("kill", {"grace": -1}),
        ("kill", {"save_wait": float("nan")}),
        ("kill", {"stop_wait": float("inf")}),
        ("resume", {"wait": -0.5}),
        ("attach", {"wait": float("nan")}),
        ("follow", {"every": -5}),
    ],
)
def test_a_duration_that_is_not_one_is_refused_before_anything_is_done(
    tmp_path: Path, call: str, durations: dict[str, float]
) -> None:
    a_run(tmp_path / "run")
    with pytest.raises(api.TargetError, match="a number of seconds, 0 or more"):
        _called(call, tmp_path / "run", **durations)


def _called(call: str, *args: object, **kwargs: object) -> object:
    """``api.CALL(...)``'s answer (``follow``'s first look)."""
    out = getattr(api, call)(*args, **kwargs)
    return next(out) if call == "follow" else out


def test_calls_work_inside_a_running_event_loop(tiny_run: Path) -> None:
    """A notebook runs an event loop: ``asyncio.run`` would refuse there."""

    async def in_a_notebook() -> list[str]:
        found = api.runs()  # this machine's agent, over its asyncio channel
        return [str(r.run_dir) for r in found.runs]

    assert str(tiny_run.resolve()) in {str(Path(d).resolve()) for d in asyncio.run(in_a_notebook())}


def test_follow_of_a_slurm_job_asks_the_scheduler_again_each_look(
    tiny_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``job/ID`` on this machine is a job, never the working directory's file: each
    look asks where the job's training is now (it may move: a requeue)."""
    monkeypatch.chdir(tmp_path)
    asked: list[str | None] = []
    run = api.open_run(tiny_run).run

    def located(t: Target, label: str, on_note: object, whole_history: bool) -> api.OpenedRun:
        asked.append(t.job)
        return api.OpenedRun(label, t, run, time.time())

    monkeypatch.setattr(api, "_open_job", located)
    looks = api.follow("job/1234", every=0.01)
    steps = [next(looks).summary()["global_step"] for _ in range(3)]
    assert asked == ["1234"] * 3 and len(set(steps)) == 1


def test_runs_of_localhost_is_this_machine_as_watch_and_fleet_take_it() -> None:
    """``runs localhost`` went over SSH ("connection refused" where no sshd listens)
    while ``watch localhost`` and ``fleet localhost`` mean this machine, without SSH."""

    def answer(host: str | None) -> str:
        try:
            return f"host {api.runs(host).host}"
        except api.TargetError as e:  # none here: said of this machine, not a refused SSH
            return str(e)

    assert answer("localhost") == answer(None)
