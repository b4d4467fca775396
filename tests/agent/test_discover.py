"""The agent's view of trainings without telemetry, on this machine: the output parser,
the observe cursor, and discovery against real processes (a torch process whose
script imports speculators, its spawn child, a pipe into ``tee``)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import eagle3_tui
from eagle3_tui.agent import choose as choosing
from eagle3_tui.agent import discover, logparse, observe, process_facts
from eagle3_tui.agent.frames import AgentError
from eagle3_tui.model.run import Run
from eagle3_tui.reports import EXIT_BY_KIND
from eagle3_tui.telemetry import procs
from eagle3_tui.transport.calls import choose, describe, observe_once
from eagle3_tui.transport.channel import AgentAnswerError, LocalHost
from eagle3_tui.transport.replies import Choice, ErrorKind, ProcessRow, decode
from tests.conftest import need_training
from tests.sources import parse

RICH = "Epoch 3 100% ━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 24/24  [ 0:00:33 < 0:00:00 , 2 it/s ]"


# ---- the output parser ---------------------------------------------------------------------


def test_epoch_bars_of_both_progress_libraries() -> None:
    p = logparse.LineParser()
    (kind, payload, _), log = p.parse(RICH)
    assert kind == "progress" and log[0] == "log"
    assert payload["bar"] == {
        "n": 24,
        "total": 24,
        "elapsed_s": 33.0,
        "remaining_s": 0.0,
        "rate": pytest.approx(24 / 33),
        "epoch": 3,
        "phase": "train",
        "done": True,
    }
    assert p.parse(RICH.replace("24/24", "6/6"))[0][1]["bar"]["phase"] == "val"  # the second
    tqdm = "\r\x1b[2KEpoch 7:  40%|████      | 4/10 [00:08<00:12,  2.00s/it]"
    bar = p.parse(tqdm)[0][1]["bar"]
    assert (bar["epoch"], bar["n"], bar["total"], bar["done"]) == (7, 4, 10, False)
    assert bar["elapsed_s"] == 8.0 and bar["rate"] == pytest.approx(0.5)
    assert p.parse("Writing model shards: 100%|███| 1/1 [00:00<00:00, 9.1it/s]")[0][0] == "log"


def test_a_bar_drawn_at_a_thousand_steps_a_second_or_more_is_read() -> None:
    """rich writes a rate of a thousand or more with a separator ("1,716 it/s"), tqdm
    with a prefix where it scales ("1.23kit/s"): such drawings were not bars, so the
    progress stood one drawing behind (the redrawn-bar test's flake on a fast machine)."""
    for line, rate in [
        ("Epoch 0  40% ━━━━╸━━━━━ 2/5  [ 0:00:00 < 0:00:01 , 1,716 it/s ]", 1716.0),
        ("Epoch 0:  40%|####      | 2/5 [00:00<00:01, 1.23kit/s]", 1230.0),
        ("Epoch 0:  40%|####      | 2/5 [00:01<00:01, 1.50s/it]", 2.0),
    ]:
        got = logparse.bar(line)
        assert got is not None, line
        assert (got["n"], got["total"]) == (2, 5)
        assert got["rate"] == pytest.approx(rate), line


def test_metric_dicts_printed_by_a_handler_become_records() -> None:
    p = logparse.LineParser()
    line = (
        "INFO:speculators.metrics:{'train': {'loss': nan, 'full_acc_0': 0.5, 'loss_0': inf}, "
        "'profile': {'step_ms': 81.0}, 'epoch': 1, 'lr': 0.001, 'global_step': 41}"
    )
    [(kind, payload, _)] = p.parse(line)
    assert kind == "train" and payload["step"] == 41 and payload["epoch"] == 1
    assert payload["train"] == {"loss": "NaN", "full_acc_0": 0.5, "loss_0": "Infinity"}
    as_json = json.dumps(
        {"t": 1.0, "logger": "speculators.metrics", "msg": {"val": {"loss_epoch": 1.5}, "epoch": 2}}
    )
    [(kind, payload, _)] = p.parse(as_json)
    assert kind == "val" and payload == {"val": {"loss_epoch": 1.5}, "epoch": 2}
    # never code: a dict-looking line that is not a literal stays a log line
    assert p.parse("{'train': __import__('os').system('x')}")[0][0] == "log"


# What the library's own CLI prints for a train dict and a val dict (setup_root_logger:
# rich, no terminal, FormatDictFilter's three digits), verbatim from a CPU run.
CLI_TRAIN = """\
[14:20:57] INFO     train/loss_0=0.025, train/full_acc_0=0.032,   trainer.py:587
                    train/cond_acc_0=0.032, train/loss_1=0.025,
                    train/full_acc_1=0.011,
                    train/cond_acc_1=0.333, train/loss_2=0.025,
                    train/full_acc_2=0.00e+00,
                    train/cond_acc_2=0.00e+00, train/loss=0.075,
                    train/error_records=0.00e+00,
                    profile/fetch_ms=6.915,
                    profile/step_ms=54.628,
                    profile/tokens_per_s=1.72e+03,
                    profile/clip_ms=0.849, epoch=0,
                    lr/Muon=0.001, lr/AdamW=0.001, global_step=1
"""
CLI_VAL = """\
           INFO     val/loss_0_epoch=0.021,                       trainer.py:671
                    val/full_acc_0_epoch=0.00e+00,
                    val/loss_epoch=0.064, epoch=0
           INFO     Validation epoch 1/1 completed                trainer.py:756
"""


def test_metric_dicts_as_the_librarys_cli_prints_them_become_records() -> None:
    p = logparse.LineParser()
    out = [r for line in (CLI_TRAIN + CLI_VAL).splitlines() for r in p.parse(line)]
    assert [k for k, _, _ in out] == ["train", "val", "log"]
    train, val = out[0][1], out[1][1]
    assert train["step"] == train["global_step"] == 1 and train["epoch"] == 0
    assert train["train"]["loss"] == 0.075 and train["train"]["cond_acc_1"] == 0.333
    assert train["train"]["full_acc_2"] == 0.0 and train["profile"]["tokens_per_s"] == 1720.0
    assert train["lr"] == {"Muon": 0.001, "AdamW": 0.001}
    assert val == {"val": {"loss_0_epoch": 0.021, "full_acc_0_epoch": 0.0, "loss_epoch": 0.064},
                   "epoch": 0}  # fmt: skip
    assert out[2][1]["msg"].endswith("Validation epoch 1/1 completed                trainer.py:756")
    # one line (a plain formatter)
    plain = "INFO:speculators.metrics:train/loss=nan, train/full_acc_0=0.5, epoch=2, global_step=7"
    [(kind, payload, _)] = p.parse(plain)
    assert (kind, payload["step"], payload["train"]["loss"]) == ("train", 7, "NaN")
    # another process's lines inside a printed dict (torchrun's ranks share the log): they
    # are theirs, and the dict goes on after them, whole. A dict cut short (a new one
    # began) was a record of its own, without its loss and step: it read as one more step
    # (the loss null at it), and the dict after it as that step done again. Never now.
    lines = CLI_TRAIN.splitlines()
    foreign = "[rank1]:[W1207 10:01:02] UserWarning: something"
    out = [r for line in (*lines[:3], foreign, *lines[3:]) for r in p.parse(line)]
    assert [k for k, _, _ in out] == ["log", "train"], out
    assert out[1][1]["step"] == 1 and out[1][1]["train"]["loss"] == 0.075
    cut = [r for line in (*lines[:4], *lines) for r in p.parse(line)]
    assert [(k, d["step"]) for k, d, _ in cut] == [("train", 1)], cut
    # a dict under way when the metrics begin to come from a file of their own: dropped
    p.parse(lines[0])
    p.key_values = False
    assert {k for line in lines[1:] for k, _, _ in p.parse(line)} == {"log"}
    p.key_values = True
    # not metrics: a key=value line of another kind, a line after words, off when told
    assert p.parse("INFO     lr=0.001, warmup=10")[0][0] == "log"
    assert p.parse("INFO     the loss train/loss=0.5 is fine")[0][0] == "log"
    off = logparse.LineParser(key_values=False)
    assert {k for line in CLI_TRAIN.splitlines() for k, _, _ in off.parse(line)} == {"log"}
    assert process_facts.metric_lines(CLI_TRAIN) == "printed"


def test_levels_and_times_read_from_the_lines() -> None:
    level = logparse.level_of
    loguru = "2026-12-01 05:02:24.187 | WARNING  | speculators.utils.loading:f:115 - no index"
    lv, logger, msg, ts = level(loguru)
    assert (lv, logger, msg) == ("WARNING", "speculators.utils.loading", "no index") and ts
    assert level("/x/dataloader.py:1102: UserWarning: pin_memory")[0] == "WARNING"
    assert level("Traceback (most recent call last):")[0] == "ERROR"
    assert level("torch.OutOfMemoryError: CUDA out of memory")[0] == "ERROR"
    assert level("WARNING:root:low disk")[:2] == ("WARNING", "root")
    assert level("plain text")[0] == "INFO"


def test_the_log_resumes_at_the_cursor_without_loss_or_duplicates(tmp_path: Path) -> None:
    """A reconnect passes back the last cursor; a cut before the cursor arrived repeats
    records with the same writer sequence, which the reader drops."""
    log = tmp_path / "train.log"
    lines = [f"line {i}" if i % 7 else RICH.replace("Epoch 3", f"Epoch {i}") for i in range(60)]
    log.write_text("\n".join(lines[:30]) + "\n")

    def session(cursor: dict[str, Any]) -> tuple[bytes, dict[str, Any], observe.LogFollower]:
        out: list[bytes] = []
        sink = observe.FrameSink("log-1-2", out, int(cursor.get("seq") or 0))
        parser = logparse.LineParser(cursor.get("parser"))
        f = observe.LogFollower(
            str(log), sink, parser, cursor.get("log_offset", 0), cursor.get("log_identity")
        )
        f.poll(time.time())
        return (
            b"".join(out),
            {
                "seq": sink.seq,
                "log_offset": f.offset,
                "log_identity": f.identity,
                "parser": parser.state,
            },
            f,
        )

    first, cursor, _ = session({})
    with open(log, "a") as out:
        out.write("\n".join(lines[30:45]) + "\n" + "torn li")  # a line being written
    second, cursor2, follower = session(cursor)
    assert follower.offset == log.stat().st_size - len("torn li")
    with open(log, "a") as out:
        out.write("ne\n" + "\n".join(lines[45:]) + "\n")
    third, _, _ = session(cursor2)
    again, _, _ = session(cursor)  # a reconnect with a lagging cursor: repeats 30..44
    run = Run()
    offset = 0
    for chunk in (first, second, again, third):
        run.feed(offset, chunk)
        offset += len(chunk)
    state = run.state
    msgs = [line.msg for line in state.logs]
    assert msgs == [*lines[:45], "torn line", *lines[45:]]
    assert state.duplicate_records > 0 and state.lost_records == 0
    assert [b.bar.epoch for b in state.bars] == [i for i in range(60) if i % 7 == 0]


def test_a_bar_redrawn_on_its_line_moves_the_progress_at_every_step(tmp_path: Path) -> None:
    """A bar the library draws as on a terminal (rich told it is one: ``TTY_COMPATIBLE``,
    ``FORCE_COLOR``; under ``script``/tmux with ``tee``): each step redraws it after a
    ``\\r`` and the line ends only with the epoch. Progress moved only then; now each
    drawing is a progress record as it comes, once, and the model's step follows it."""
    import warnings

    from rich.console import Console
    from tqdm.rich import tqdm  # type: ignore[import-untyped]  # speculators' bar

    from eagle3_tui.model.observed import bar_progress

    log = tmp_path / "train.log"
    out: list[bytes] = []
    follower = observe.LogFollower(
        str(log), observe.FrameSink("log-1-2", out, 0), logparse.LineParser()
    )
    run = Run()
    fed = 0
    steps: list[int | None] = []
    sent: list[int] = []  # bars sent per look

    def look() -> None:
        nonlocal fed
        follower.poll(time.time())
        data = b"".join(out)
        out.clear()
        sent.append(data.count(b'"bar":'))
        run.feed(fed, data)
        fed += len(data)

    with open(log, "w") as f, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tqdm.rich is "experimental"
        console = Console(file=f, force_terminal=True, width=120)
        for epoch in (0, 1):
            options = {"console": console, "auto_refresh": False}
            bar = tqdm(total=5, desc=f"Epoch {epoch}", options=options)
            for _ in range(5):
                bar.update(1)
                bar.refresh()
                bar._prog.refresh()  # the drawing rich's thread makes ten times a second
                f.flush()
                look()
                look()  # a second look at the same drawing sends nothing
                progress = bar_progress(run.state.bars, run.state.epochs_total)
                steps.append(None if progress is None else progress.step)
            bar.close()  # the line ends: the epoch's bar, done
            f.write("a log line\n")
            f.flush()
            look()
    # each step seen as it is drawn (the fifth is the done bar, whole when the line ends)
    assert steps == [0, 1, 2, 3, 3, 5, 6, 7, 8, 8], steps
    # once per drawing; the second look at it, nothing; the line's end, the done bar
    assert sent == ([1, 0] * 4 + [0, 0, 1]) * 2, sent
    drawn = [(b.bar.epoch, b.bar.n, b.bar.done) for b in run.state.bars]
    assert drawn == [(0, 5, True), (1, 5, True)], drawn  # the drawings of a bar, its last
    final = bar_progress(run.state.bars, run.state.epochs_total)
    assert final is not None and final.step == 9


def test_agent_modules_parse_as_python_3_8() -> None:
    """The agent runs on whatever python3 the host has (3.8 and later)."""
    root = Path(eagle3_tui.__file__).parent
    for path in [
        *sorted((root / "agent").glob("*.py")),
        *sorted((root / "telemetry").glob("*.py")),
    ]:
        parse(path.read_text(), str(path), feature_version=(3, 8))


# ---- discovery against real processes ------------------------------------------------------

TRAINING = textwrap.dedent(
    """
    import sys, time
    import torch  # libtorch in the maps

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 10**6

        def __getitem__(self, i):
            time.sleep(0.05)
            return i

    def train():
        import speculators  # (the real work would start here)

    if __name__ == "__main__":
        loader = torch.utils.data.DataLoader(
            Slow(), num_workers=1, multiprocessing_context="spawn"
        )
        batches = iter(loader)  # a dataloader worker (spawned, then named pt_data_worker)
        next(batches)
        print("Epoch 0 100% ━━━━ 3/3 [ 0:00:01 < 0:00:00 , 3 it/s ]", flush=True)
        open(sys.argv[1], "w").write("ready")
        time.sleep(120)
    """
)


@pytest.fixture(scope="module")
def fake_training(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A torch process whose script imports speculators, a spawn child, its output piped
    into ``tee train.log``, and a speculators-shaped checkpoint directory."""
    need_training()
    work = tmp_path_factory.mktemp("work")
    (work / "my_train.py").write_text(TRAINING)
    ckpt = work / "out" / "checkpoints" / "0"
    ckpt.mkdir(parents=True)
    (ckpt / "training_state.json").write_text('{"global_step": 3}')
    ready = work / "ready"
    shell = subprocess.Popen(
        f"{sys.executable} my_train.py {ready} | tee train.log > /dev/null",
        shell=True,
        cwd=work,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert time.monotonic() < deadline and shell.poll() is None, "the fake did not start"
        time.sleep(0.1)
    time.sleep(0.5)
    trainer = next(
        t for t in discover.scan()[0] if t.cwd == str(work)
    )  # (found by its directory: other tests' trainings run here too)
    yield {"work": work, "trainer": trainer, "shell": shell}
    os.killpg(shell.pid, 9)
    shell.wait()


def test_a_training_is_found_from_outside(fake_training: dict[str, Any]) -> None:
    work = fake_training["work"]
    t: discover.Training = fake_training["trainer"]
    row = discover.describe(t.trainer.pid)
    assert row["pid"] == t.trainer.pid and row["telemetry"] is False
    assert row["log"] == str(work / "train.log")  # through the pipe into tee
    assert row["checkpoint_dir"] == str(work / "out" / "checkpoints")  # found below the cwd
    roles = sorted(m["role"] for m in row["members"])
    assert roles.count("trainer") == 1 and "worker" in roles
    evidence = " | ".join(row["evidence"])
    assert "torch loaded" in evidence and "my_train.py imports speculators" in evidence
    assert "speculators' output" in evidence
    worker = next(m["pid"] for m in row["members"] if m["role"] == "worker")
    named = discover.describe(worker)  # a worker's PID names its training
    assert named["pid"] == row["pid"] and named["named_pid"] == {"pid": worker, "role": "worker"}
    assert choosing.names(row, str(work)) and not choosing.names(row, "/usr")
    # a directory above its own names it not: it is below it
    assert not choosing.names(row, str(work.parent)) and choosing.works_below(row, str(work.parent))
    assert choosing.names(row, str(work / "out" / "checkpoints"))  # its checkpoint directory
    assert not choosing.names(row, str(work / "out"))


def test_what_is_not_a_training(tmp_path: Path) -> None:
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.3)
        with pytest.raises(AgentError) as e:
            discover.describe(plain.pid)
        assert e.value.kind == "not_training" and "torch is not loaded" in str(e.value)
        sleeper = subprocess.Popen(["sleep", "60"])
        with pytest.raises(AgentError) as e:
            discover.describe(sleeper.pid)
        assert e.value.kind == "not_training" and "not a Python process" in str(e.value)
        sleeper.kill()
        sleeper.wait()
        with pytest.raises(AgentError) as e:
            discover.describe(sleeper.pid)
        assert e.value.kind == "gone"
        plain_stat = procs.stat(plain.pid)
        assert plain_stat is not None
        start = plain_stat.start_ticks
        with pytest.raises(AgentError) as e:
            discover.describe(plain.pid, start + 1)  # the PID is another process now
        assert e.value.kind == "gone"
    finally:
        plain.kill()
        plain.wait()


async def test_choose_describe_and_observe_through_the_agent(
    fake_training: dict[str, Any],
) -> None:
    work = fake_training["work"]
    pid = fake_training["trainer"].trainer.pid
    host = LocalHost()
    chosen = await choose(host, str(work), None)  # a work directory: its live training
    assert chosen.choice is Choice.PROCESS and chosen.chosen_row().pid == pid
    assert f"pid {pid}" in chosen.note
    chosen = await choose(host, None, pid)
    assert chosen.choice is Choice.PROCESS and chosen.short == f"pid {pid}"
    row = chosen.chosen_row()
    status = await describe(host, row)
    assert status.alive is True and status.manifest["start_ticks"] == row.start_ticks
    assert status.row is not None and status.row.pid == pid  # describe's row, typed
    run = Run()
    end = await observe_once(host, row, lambda f: run.feed(f.offset, f.data), 1.5)
    assert end.event == "eof"
    state = run.state
    assert state.observed is not None and state.observed.alive
    assert [m.role for m in state.observed.members].count("worker") == 1
    assert any("Epoch 0 100%" in line.msg for line in state.logs)
    assert [b.bar.epoch for b in state.bars] == [0]
    assert state.malformed_count == 0
    with pytest.raises(AgentAnswerError) as e:
        await choose(host, None, 999_999_999)
    assert e.value.kind is ErrorKind.GONE and EXIT_BY_KIND[e.value.kind] == 22


def test_observe_stream_survives_nothing_but_reports_the_end(
    fake_training: dict[str, Any], tmp_path: Path
) -> None:
    """The observed stream ends (``ended``) when the trainer exits."""
    script = tmp_path / "short.py"
    script.write_text("import sys, time\nimport torch\nimport speculators.version\ntime.sleep(8)\n")
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path)
    try:
        row = None
        deadline = time.monotonic() + 60
        while row is None:
            assert time.monotonic() < deadline
            found = [t for t in discover.scan()[0] if t.trainer.pid == proc.pid]
            row = decode(ProcessRow, discover._rows(found)[0]) if found else None
            time.sleep(0.2)
        run = Run()
        # the window only bounds a run that never ends: its end cuts it short (under two
        # test workers, importing speculators after torch took most of a 30 s window)
        end = asyncio.run(
            observe_once(LocalHost(), row, lambda f: run.feed(f.offset, f.data), 120.0)
        )
        assert end.event == "ended"
        assert run.state.observed is not None and run.state.observed.alive is False
    finally:
        proc.kill()
        proc.wait()


TORCHRUN_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import torch

    def train():
        import speculators  # (the real work would start here)

    open(sys.argv[1] + os.environ["RANK"], "w").write("ready")
    time.sleep(120)
    """
)


def test_a_torchrun_agent_and_its_ranks_are_one_training_killed_through_the_agent(
    tmp_path: Path,
) -> None:
    need_training()
    (tmp_path / "dist.py").write_text(TORCHRUN_SCRIPT)
    ready = tmp_path / "ready-"
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            "0",
            "dist.py",
            str(ready),
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not all(Path(f"{ready}{r}").exists() for r in (0, 1)):
            assert time.monotonic() < deadline and launcher.poll() is None, "torchrun failed"
            time.sleep(0.2)
        found = [t for t in discover.scan()[0] if t.cwd == str(tmp_path)]
        assert len(found) == 1, [t.trainer.pid for t in found]  # one training, not three
        row = discover._rows(found)[0]
        assert row["launcher_pid"] == launcher.pid
        assert [r["rank"] for r in row["ranks"]] == ["0", "1"]
        assert row["pid"] == next(r["pid"] for r in row["ranks"] if r["rank"] == "0")
        roles = sorted(m["role"] for m in row["members"])
        assert roles.count("launcher") == 1 and roles.count("trainer") == 1
        assert roles.count("rank") == 1
        assert any("torchrun agent" in e for e in row["evidence"])
        assert discover.describe(row["ranks"][1]["pid"])["pid"] == row["pid"]  # a rank: its run
        from eagle3_tui.transport.calls import kill_run

        process = decode(ProcessRow, row)  # as discover sends it
        report = asyncio.run(kill_run(LocalHost(), None, 30.0, process=process))
        assert report.status == "stopped", report
        # SIGTERM to every rank at once, not to the agent (it kills each rank's whole
        # group, the dataloader workers and the interrupted/ save with them)
        first = {p.pid for p in report.processes if p.signals[:1] == ["SIGTERM"]}
        assert {r["pid"] for r in row["ranks"]} <= first
        agent = next(p for p in report.processes if p.pid == launcher.pid)
        assert agent.role == "launcher" and "SIGKILL" not in agent.signals
        assert launcher.wait(30) is not None
        for m in row["members"]:
            st = procs.stat(m["pid"])
            assert st is None or st.zombie, f"{m} remains"
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, 9)
            launcher.wait()


async def test_a_work_directory_means_its_latest_stopped_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no live training in it, a work directory means the newest run whose trainer
    worked there: `kill WORKDIR` after a live attach, then `resume WORKDIR`, act on the
    same run (its run directory is WORKDIR/eagle3-runs/attached-PID)."""
    from eagle3_tui.telemetry import manifest as mf
    from tests.transport.fakes import fake_manifest

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    elsewhere.mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])  # noqa: ASYNC220 - exits at once
    gone.wait()
    older = fake_manifest(
        work / "eagle3-runs" / "attached-1", gone.pid, "r1", cwd=str(work), status="interrupted"
    )
    newer = fake_manifest(
        tmp_path / "runs" / "r2", gone.pid, "r2", cwd=str(work), status="finished"
    )
    other = fake_manifest(tmp_path / "runs" / "r3", gone.pid, "r3", cwd=str(elsewhere))
    host = LocalHost()
    mf.register_run(older)
    chosen = await choose(host, str(work), None)
    assert chosen.choice is Choice.RUN and chosen.run_dir == older["run_dir"]
    assert "no live training works in" in chosen.note and "(interrupted)" in chosen.note
    mf.register_run(newer)
    mf.register_run(other)  # newest of all, but it worked elsewhere
    chosen = await choose(host, str(work), None)
    assert chosen.run_dir == newer["run_dir"] and "(finished)" in chosen.note
    (tmp_path / "empty").mkdir()
    with pytest.raises(AgentAnswerError) as e:  # nothing ever worked here
        await choose(host, str(tmp_path / "empty"), None)
    assert e.value.kind == "missing" and "no live training works" in str(e.value)


async def test_resume_of_a_host_means_its_latest_stopped_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`resume HOST`: a live run cannot be resumed, so the host alone means its newest
    stopped run (said in the note), never the newer live one; with none stopped it
    chooses as kill does."""
    from eagle3_tui.agent.names import PURPOSE_RESUME
    from eagle3_tui.telemetry import manifest as mf
    from tests.transport.fakes import fake_manifest

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])  # noqa: ASYNC220 - exits at once
    gone.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # noqa: ASYNC220
    try:
        host = LocalHost()
        running = fake_manifest(tmp_path / "runs" / "live", live.pid, "r-live", status="running")
        mf.register_run(running)
        # only a live run registered: no stopped run is made up (the choice is kill's:
        # the live training(s) here, or that run, which resume refuses: kill it first)
        chosen = await choose(host, None, None, purpose=PURPOSE_RESUME)
        assert "stopped run" not in chosen.note and chosen.run_dir in (None, running["run_dir"])
        stopped = fake_manifest(tmp_path / "runs" / "old", gone.pid, "r-old", status="interrupted")
        mf.register_run(stopped)
        mf.register_run(running)  # registered again: the newest entry of the index
        chosen = await choose(host, None, None, purpose=PURPOSE_RESUME)
        assert chosen.choice is Choice.RUN and chosen.run_dir == stopped["run_dir"]
        assert "latest stopped run" in chosen.note and "(interrupted)" in chosen.note
    finally:
        live.kill()
        live.wait()


def test_a_training_still_importing_is_waited_for_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opened right after ``nohup python train.py &`` (issue 28, the second-hour script):
    the training had not imported speculators yet and was refused, exit 20, "not a
    speculators training". A young Python process is looked at again until it is known;
    one that never becomes a training is refused saying how young it is."""
    need_training()
    monkeypatch.setattr(discover, "WAIT_FOR_START_S", 90.0)  # returns once it is known
    script = tmp_path / "train.py"
    script.write_text(
        "import time\ntime.sleep(3)\nimport torch\nimport speculators.version\ntime.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        row = discover.describe(proc.pid)
        assert row["pid"] == proc.pid, row
        monkeypatch.setattr(discover, "WAIT_FOR_START_S", 2.0)
        started = time.monotonic()
        with pytest.raises(AgentError) as e:
            discover.describe(other.pid)
        assert time.monotonic() - started >= 2.0
        assert "not a speculators training" in str(e.value)
        assert "s ago: a training still importing its libraries" in str(e.value), e.value
    finally:
        for p in (proc, other):
            p.kill()
            p.wait()


def test_another_runs_checkpoints_below_the_working_directory_are_not_its_own(
    tmp_path: Path,
) -> None:
    """A process started in a directory above an earlier run's directory (``A/run.json``,
    ``A/checkpoints``) was credited with A's checkpoints: "ckpts A/checkpoints", A's
    step and epoch as its progress. A run's directory is that run's; a directory of
    checkpoints no run claims is still found."""
    work = tmp_path / "work"
    ckpt = work / "A" / "checkpoints"
    (ckpt / "0").mkdir(parents=True)
    (ckpt / "0" / "training_state.json").write_text("{}")
    (work / "A" / "run.json").write_text(json.dumps({"pid": 4622, "run_id": "a"}))
    assert process_facts.find_checkpoint_dir(str(work), pid=777) is None
    assert process_facts.find_checkpoint_dir(str(work), pid=4622) == str(ckpt)  # its own run
    (work / "A" / "run.json").unlink()
    assert process_facts.find_checkpoint_dir(str(work), pid=777) == str(ckpt)
    # nothing saved there since the process started: an earlier run's (no run.json: a
    # run without telemetry's, another attach's); found once it saves there
    os.utime(ckpt, (1_000_000.0, 1_000_000.0))
    assert process_facts.find_checkpoint_dir(str(work), pid=777, since=2_000_000.0) is None
    (ckpt / "1").mkdir()
    assert process_facts.find_checkpoint_dir(str(work), since=time.time() - 60) == str(ckpt)


def test_a_checkpoint_directory_its_command_line_names_is_found(tmp_path: Path) -> None:
    """A training run from one directory whose checkpoints are under a directory its
    command line names (``--run-dir /data/exp7``, ``--save-path=...``): "ckpts not found
    yet" while it saved epoch after epoch, and its kill's restart record had no
    checkpoint directory (resume: "the manifest names no checkpoint_dir")."""
    work, run = tmp_path / "work", tmp_path / "data" / "exp7"
    work.mkdir()
    ckpt = run / "checkpoints"
    (ckpt / "0").mkdir(parents=True)
    (ckpt / "0" / "training_state.json").write_text("{}")
    argv = ["python", "-m", "train.tiny", "--run-dir", str(run)]
    assert process_facts.find_checkpoint_dir(str(work)) is None
    assert process_facts.find_checkpoint_dir(str(work), command=argv) == str(ckpt)
    by_eq = ["python", "train.py", f"--save-path={os.path.relpath(ckpt, work)}"]
    assert process_facts.find_checkpoint_dir(str(work), command=by_eq) == str(ckpt)
    elsewhere = ["python", "train.py", "--run-dir", str(tmp_path / "missing"), "--lr", "1e-3"]
    assert process_facts.find_checkpoint_dir(str(work), command=elsewhere) is None


def test_a_pid_no_process_ever_had_is_not_said_to_have_exited() -> None:
    """``kill --pid 99999999999999999999`` said "no such process (it has exited)": a PID
    above the host's pid_max never named a process. A PID that may have is still said
    to have exited."""
    from eagle3_tui.agent.frames import AgentError

    with pytest.raises(AgentError) as never:
        discover.describe(10**20)
    assert str(never.value).endswith("no such process"), never.value
    gone = subprocess.Popen(["true"])
    gone.wait()
    with pytest.raises(AgentError) as exited:
        discover.describe(gone.pid)
    assert str(exited.value).endswith("no such process (it has exited)"), exited.value


def test_a_live_run_below_a_directory_is_listed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``summary /tmp`` listed each live run with telemetry twice, as its live process
    and as its registered run ("5 training(s) work below it" for 3), and counted a run
    that ended as working there."""
    from eagle3_tui.agent.frames import AgentError

    run = tmp_path / "work" / "run1"
    run.mkdir(parents=True)
    live = [{"pid": 11, "run_dir": str(run), "cwd": str(run.parent), "command": ["python"]}]
    registered = [{"pid": 11, "run_dir": str(run), "status": "running"}]
    other = [{"pid": 12, "run_dir": str(tmp_path / "work" / "run0"), "status": "finished"}]
    monkeypatch.setattr(choosing, "registered_in", lambda path: ([], registered + other))
    monkeypatch.setattr(choosing, "ended_rows", lambda: [])
    with pytest.raises(AgentError) as refused:
        choosing._choose_stopped(str(tmp_path), live, False, {})
    said = str(refused.value)
    # (the registered run0 ended: not said to work there)
    assert "2 training(s) or run(s) lie below it, 1 of them live" in said, said
    assert said.count(str(run)) == 1, said


def test_an_attached_training_is_found_in_its_run_after_the_run_was_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``kill --pid P`` attached telemetry and stopped it; ``resume`` relaunched the run
    (registered again, under its new trainer's PID). ``summary --pid P`` then found no
    run for P (each run's latest registration only) and judged P from outside: DEAD,
    "exit status unknown", the resumed process's steps in its log as P's."""
    from eagle3_tui.agent.discover import attached_run

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    run_dir = tmp_path / "eagle3-runs" / "attached-111"
    run_dir.mkdir(parents=True)
    index = tmp_path / "state" / "eagle3-tui" / "runs.jsonl"
    index.parent.mkdir(parents=True)
    t0 = 1_800_000_000.0
    entries = [
        {"run_id": "r1", "run_dir": str(run_dir), "host": "h", "pid": 111, "started_at": t0 + 5},
        {"run_id": "r1", "run_dir": str(run_dir), "host": "h", "pid": 222, "started_at": t0 + 90},
    ]
    index.write_text("".join(json.dumps(e) + "\n" for e in entries))
    assert attached_run({"pid": 111, "started": t0, "ended_at": t0 + 50}) == str(run_dir)
    assert attached_run({"pid": 111, "started": t0 + 60, "ended_at": t0 + 80}) is None
    assert attached_run({"pid": 333, "started": t0, "ended_at": t0 + 50}) is None


def test_runs_are_listed_newest_start_first_a_resume_included(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run resumed after another started kept its first place: "newest first" read
    10:11, 10:10, 10:16 (the resumed run's new start, listed below an older one)."""
    from eagle3_tui.agent.runs import registered_rows

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    index = tmp_path / "state" / "eagle3-tui" / "runs.jsonl"
    index.parent.mkdir(parents=True)
    t0 = 1_800_000_000.0
    dirs = {name: tmp_path / name for name in ("a", "b")}
    for d in dirs.values():
        d.mkdir()
    entries = [
        {"run_id": "a", "run_dir": str(dirs["a"]), "pid": 1, "started_at": t0},
        {"run_id": "b", "run_dir": str(dirs["b"]), "pid": 2, "started_at": t0 + 10},
        {"run_id": "a", "run_dir": str(dirs["a"]), "pid": 3, "started_at": t0 + 20},
    ]
    index.write_text("".join(json.dumps(e) + "\n" for e in entries))
    rows, _ = registered_rows()
    assert [(r["run_id"], r["started_at"]) for r in rows] == [("a", t0 + 20), ("b", t0 + 10)]


def test_a_directory_a_trainings_command_line_names_names_the_training(tmp_path: Path) -> None:
    """``eagle3-tui RUN`` of a training without telemetry started as ``--run-dir RUN``
    from the directory above: "no live training works in this directory" (its working
    directory is above, its checkpoints not there yet). The directory its command line
    names after an option names it; a bare argument (a script) or its working directory's
    parent does not."""
    from eagle3_tui.agent.choose import names, works_below

    work = tmp_path / "work"
    (work / "E").mkdir(parents=True)
    (work / "data").mkdir()
    row = {
        "pid": 5,
        "cwd": str(work),
        "command": ["python", "-m", "train.tiny", "--run-dir", "E", "--data=data", "--epochs", "3"],
    }
    assert names(row, str(work / "E")) and not names(row, str(work / "data"))  # what it reads
    assert names(row, str(work))  # its working directory, as before
    assert not names(row, str(tmp_path)) and works_below(row, str(tmp_path))
    bare = {"pid": 6, "cwd": str(work), "command": ["python", "E"]}
    assert not names(bare, str(work / "E"))
