"""A training started by a user's own script, without eagle3-tui: found, shown, diagnosed.

The script below is written here, as a user would write it: the speculators Trainer on
a tiny Llama verifier (the CPU shims inline), no telemetry, no logging configured, so
``speculators.metrics`` has no handler. It is launched exactly as in the story —
``nohup python train.py > train.log 2>&1 &`` over SSH — on a host of its own (sshd in
its own PID namespace: other tests' trainings run on this machine at the same time,
and "the SSH user's live training" must mean this one). The tests run in order on one
training, which the last one kills.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.telemetry import procs
from tests.conftest import need, need_training, read_jsonl, useradd, wait_until
from tests.transport.conftest import cli
from tests.transport.sshd import ALIAS, Sshd, have_pid_namespaces, have_sshd

pytestmark = pytest.mark.slow

TRAIN_PY = textwrap.dedent(
    '''
    """Train an EAGLE-3 draft for my verifier (my own script: no monitoring library)."""
    import sys
    import time
    from pathlib import Path

    import torch
    import speculators.train.checkpointer as checkpointer
    import speculators.train.trainer as trainer_module
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.dataloader import create_train_val_loaders
    from speculators.train.trainer import Trainer, TrainerConfig
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution
    from transformers import AutoConfig


    class CpuTrainer(Trainer):
        """No GPU on this box: the Trainer's device is the CPU."""

        def setup_trainer(self):
            self.local_rank = "cpu"
            self.device_type = "cpu"
            super().setup_trainer()


    def cpu_only():
        def mark(self, name):
            if self.enabled:
                self._marks[name] = time.perf_counter()

        trainer_module._StepTimer.mark = mark
        trainer_module._StepTimer.now = lambda self: time.perf_counter() if self.enabled else None
        checkpointer.get_current_device = lambda: "cpu"


    def main():
        data_root, epochs, delay = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
        cpu_only()
        verifier, data = data_root / "verifier", data_root / "data"
        d2t, t2d = build_vocab_mappings_from_distribution({t: 1 for t in range(256)}, 64, 256)
        model = Eagle3DraftModel.from_training_args(
            verifier_config=AutoConfig.from_pretrained(verifier),
            t2d=t2d,
            d2t=d2t,
            verifier_name_or_path=str(verifier),
            draft_vocab_size=64,
            norm_before_residual=True,
            ttt_steps=3,
            target_layer_ids=[0, 1, 2],
            draft_attn_impl="sdpa",
        )
        model.register_forward_pre_hook(lambda *_: time.sleep(delay))
        train_kwargs, val_kwargs = Eagle3DraftModel.get_trainer_kwargs(
            loss_fn="kl_div", loss_implementation="eager", ttt_steps=3, ttt_step_loss_decay=1.0
        )
        train_loader, val_loader = create_train_val_loaders(
            data_path=str(data),
            total_seq_len=128,
            hidden_states_dtype=torch.float32,
            vllm_endpoint="http://127.0.0.1:9/v1",
            on_missing="raise",
            verifier_name_or_path=str(verifier),
            request_timeout=1.0,
            max_retries=0,
            generation_validation_retries=0,
            max_consecutive_generation_failures=1,
            hidden_size=64,
            num_target_layers=3,
            num_workers=2,
            prefetch_factor=2,
            preprocess=shift_batch,
            train_data_ratio=0.8,
            seed=0,
        )
        config = TrainerConfig(
            lr=3e-3,
            num_epochs=epochs,
            save_path="checkpoints",
            resume_from_checkpoint=True,
            train_call_kwargs=train_kwargs,
            val_call_kwargs=val_kwargs,
            hidden_states_dtype=torch.float32,
            scheduler_type="none",
        )
        print("training starts", flush=True)
        CpuTrainer(model, config, train_loader, val_loader).run_training()


    if __name__ == "__main__":
        main()
    '''
)

SLACK_S = 12.0
"""What a summary over SSH adds after the model decides: its observation (2.5 s),
interpreter start-ups and connections on this loaded machine."""


@dataclass
class Training:
    work: Path
    launched: float
    outside_pid: int = 0
    seen: dict[str, float] = field(default_factory=dict)
    """When the test first saw evidence: ``workers`` (dataloader workers reading),
    ``checkpoint`` (checkpoints/0), ``bar`` (an epoch bar in the log)."""
    stop: threading.Event = field(default_factory=threading.Event)

    def log(self) -> str:
        return (self.work / "train.log").read_text(errors="replace")[-3000:]


def tree(pid: int) -> list[int]:
    return [pid, *procs.descendants(pid)]


def find_outside(work: Path, script: str = "train.py") -> int:
    """The trainer's PID as this (outer) PID namespace sees it."""
    for st in procs.all_stats().values():
        if procs.cwd(st.pid) == str(work) and script in " ".join(procs.cmdline(st.pid)):
            return st.pid
    return 0


def watch(t: Training) -> None:
    """Note when each piece of evidence first appears (from outside the host)."""
    while not t.stop.is_set():
        now = time.time()
        if not t.outside_pid:
            t.outside_pid = find_outside(t.work)
        if t.outside_pid and "workers" not in t.seen:
            comms = [st.comm for p in tree(t.outside_pid) if (st := procs.stat(p))]
            if comms.count("pt_data_worker") >= 2:
                t.seen["workers"] = now
        if "checkpoint" not in t.seen and (t.work / "checkpoints" / "0").is_dir():
            t.seen["checkpoint"] = now
        if "bar" not in t.seen and "Epoch 0 100%" in t.log():
            t.seen["bar"] = now
        time.sleep(0.2)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    need(have_sshd(), "OpenSSH sshd is not installed (apt-get install openssh-server)")
    need(os.geteuid() == 0, "the sshd fixture runs as root (privilege separation)")
    need(have_pid_namespaces(), "unshare --pid --mount-proc is not permitted here")
    need(shutil.which("ssh") is not None, "the OpenSSH client is not installed")
    import tempfile

    keys = Path(tempfile.mkdtemp(prefix="e3i11-keys-"))  # readable by a second user
    server = Sshd(tmp_path_factory.mktemp("observed-host"), private=True, public_keys=keys)
    server.start()
    yield server
    server.stop()  # ends every process of the host (its PID namespace)
    shutil.rmtree(keys, ignore_errors=True)


def launch(host: Sshd, work: Path, *args: str) -> None:
    """``nohup python train.py … > train.log 2>&1 &`` in ``work``, over SSH."""
    command = shlex.join([sys.executable, "train.py", *args])
    line = f"cd {shlex.quote(str(work))} || exit 1; nohup {command} > train.log 2>&1 < /dev/null &"
    proc = host.ssh(line)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def training(host: Sshd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Training]:
    need_training()
    from eagle3_tui.train.tiny import TinyConfig, make_tiny_data

    work = tmp_path_factory.mktemp("my-experiment")
    make_tiny_data(work / "tiny", TinyConfig())
    (work / "train.py").write_text(TRAIN_PY)
    t = Training(work, time.time())
    launch(host, work, str(work / "tiny"), "1000", "0.2")
    watcher = threading.Thread(target=watch, args=(t,), daemon=True)
    watcher.start()
    wait_until(lambda: t.outside_pid, 60, lambda: f"the training to start:\n{t.log()}", 0.2)
    yield t
    t.stop.set()
    for pid in reversed(tree(t.outside_pid)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def runs_json(host: Sshd, *extra: str) -> dict[str, Any]:
    proc = cli("runs", *host.args(), *extra, ALIAS, "--json")
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def live_row(host: Sshd, t: Training, until: Any, timeout: float, what: str) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []

    def row() -> dict[str, Any] | None:
        rows[:] = [r for r in runs_json(host)["live"] if r.get("cwd") == str(t.work)]
        return rows[0] if rows and until(rows[0]) else None

    found = wait_until(row, timeout, lambda: f"{what}: {rows}\n{t.log()}", 1.0)
    assert found is not None
    return found


# ---- discovery -------------------------------------------------------------------------


def test_summary_of_the_host_picks_it_and_says_silent_within_the_bound(
    host: Sshd, training: Training, tmp_path: Path
) -> None:
    # a finished registered run on the same host, registered after the live one started
    finished = finished_run(host, tmp_path / "old-run")
    polls: list[tuple[float, float, int, dict[str, Any], str]] = []
    deadline = time.monotonic() + 300
    while True:
        start = time.time()
        proc = cli("summary", *host.args(), ALIAS, "--json")
        end = time.time()
        out = json.loads(proc.stdout) if proc.stdout.strip() else {}
        polls.append((start, end, proc.returncode, out, proc.stderr))
        if proc.returncode == 3:
            break
        assert proc.returncode == 0, (proc.returncode, proc.stderr, training.log())
        assert out["health"] == "waiting", out  # no false alarm before the verdict
        assert time.monotonic() < deadline, f"never silent: {out}\n{training.log()}"
        time.sleep(1.0)
    start, end, _, out, stderr = polls[-1]
    row = live_row(host, training, lambda r: True, 10, "the row")
    # HOST alone: the live training of the SSH user, not the newer finished run; said so
    assert "the live training" in stderr and f"pid {row['pid']}" in stderr, stderr
    assert str(finished) not in stderr
    assert out["observed"]["pid"] == row["pid"] and out["telemetry"] is False
    assert "speculators.metrics logger has no handler, or its level is above INFO" in out["reason"]
    assert out["loss"] is None and out["ttt"] == []  # not available without telemetry
    # flagged within max(30 s, 5 x step time) of the evidence
    if not training.seen:  # a busy CPU alone: called silent 90 s after the start
        assert end - training.launched >= 90.0, (end - training.launched, out["reason"])
        return
    evidence = min(training.seen.values())
    steps_per_s = out["steps_per_s"]
    bound = max(30.0, 5.0 / steps_per_s) if isinstance(steps_per_s, float) else 30.0
    late = [p for p in polls if p[0] >= evidence + bound]
    assert all(p[2] == 3 for p in late), [(p[0] - evidence, p[2]) for p in polls]
    if polls[0][0] < evidence + bound:  # watched from before the bound: measure the delay
        assert end - evidence <= bound + SLACK_S, (end - evidence, bound, training.seen)
    print(
        f"\nsilent after {end - evidence:.1f} s from the first evidence "
        f"({min(training.seen, key=training.seen.__getitem__)}), bound {bound:.0f} s; "
        f"trainer started {end - training.launched:.0f} s before; seen {training.seen}"
    )
    while True:  # the same for a person, by the same bound: waiting before it, silent after
        asked = time.time()
        text = cli("summary", *host.args(), ALIAS)
        if text.returncode == 3:
            break
        assert text.returncode == 0 and "health   waiting: " in text.stdout, text.stdout
        # one look of 2.5 s may see no read yet (the prefetched batches last): never late
        assert asked < evidence + bound, (asked - evidence, bound, text.stdout)
        time.sleep(1.0)
    assert "silent: No metric has been logged" in text.stdout
    assert f"process  pid {row['pid']} (root), no telemetry" in text.stdout


def test_runs_lists_the_training_live_without_telemetry(host: Sshd, training: Training) -> None:
    row = live_row(host, training, lambda r: len(r["workers"]) >= 2, 240, "its workers")
    assert row["telemetry"] is False and row["run_dir"] is None
    assert row["mine"] and row["user"] == "root" and row["launcher_pid"] is None
    assert row["cwd"] == str(training.work) and row["log"] == str(training.work / "train.log")
    assert row["command"][1:] == ["train.py", str(training.work / "tiny"), "1000", "0.2"]
    assert row["checkpoint_dir"] == str(training.work / "checkpoints")  # save_path="…"
    evidence = " | ".join(row["evidence"])
    assert "torch loaded" in evidence and "train.py imports speculators" in evidence
    roles = {m["pid"]: m["role"] for m in row["members"]}
    assert roles[row["pid"]] == "trainer" and set(row["workers"]) <= set(roles)
    assert "helper" in roles.values()  # multiprocessing's resource_tracker: not a worker
    text = cli("runs", *host.args(), ALIAS)
    assert text.returncode == 0, text.stderr
    line = next(x for x in text.stdout.splitlines() if f" {row['pid']} " in x)
    assert " no " in line and str(training.work) in line and "train.py" in line


def finished_run(host: Sshd, run_dir: Path) -> Path:
    """A finished run registered on the host (metrics, manifest, index entry)."""
    run_dir.mkdir(parents=True)
    now = time.time()
    lines = [
        {"v": 1, "seq": 0, "w": "old", "ts": now - 60, "kind": "train", "step": 0,
         "train": {"loss": 2.0}},
        {"v": 1, "seq": 1, "w": "old", "ts": now - 59, "kind": "lifecycle", "event": "finish",
         "step": 1},
    ]  # fmt: skip
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    manifest = {"run_id": "old-1", "run_dir": str(run_dir), "pid": 1, "status": "finished"}
    (run_dir / "run.json").write_text(json.dumps(manifest))
    index = host.state_home / "eagle3-tui" / "runs.jsonl"
    index.parent.mkdir(parents=True, exist_ok=True)
    with open(index, "a") as out:
        entry = {"run_id": "old-1", "run_dir": str(run_dir), "started_at": now, "pid": 1}
        out.write(json.dumps(entry) + "\n")
    return run_dir


# ---- the monitor -------------------------------------------------------------------------

# A checkpoint row of the progress panel: which one depends on how far the module's
# training has gone when this test runs (epoch 20 and more on a loaded CI machine).
CHECKPOINT_ROW = re.compile(r"ckpt .*checkpoints/\d+")


def test_the_monitor_shows_silent_the_log_and_the_checkpoints(
    host: Sshd, training: Training, tmp_path: Path
) -> None:
    need(shutil.which("tmux") is not None, "tmux is not installed (apt-get install tmux)")
    from tests.app.test_tmux import Tmux

    deadline = time.monotonic() + 240
    while "checkpoint" not in training.seen:
        assert time.monotonic() < deadline, f"no checkpoint yet:\n{training.log()}"
        time.sleep(0.5)
    tmux = Tmux(tmp_path / "tmux.sock")
    try:
        monitor = [sys.executable, "-m", "eagle3_tui", *host.args(), ALIAS]  # HOST alone
        command = "env -u COLUMNS -u LINES TZ=UTC TERM=xterm-256color " + shlex.join(monitor)
        tmux.run("new-session", "-d", "-x", "140", "-y", "45", command)
        shown = tmux.wait(
            lambda s: "SILENT" in s and CHECKPOINT_ROW.search(s) is not None and "val loss" in s,
            120,
            "SILENT",
        )
        # the banner's sentence wraps where the width puts it (its CPU % varies)
        assert "speculators.metrics logger has no handler" in " ".join(shown.split()), shown
        header = shown.splitlines()[0]
        assert "the live training of root: " in header and "(no telemetry)" in header
        assert "not available without telemetry" in shown  # loss, acceptance
        assert "UserWarning" in shown or "Epoch " in shown  # the log's tail
        assert "val loss" in shown  # the last validation, from the checkpoints
        tmux.keys("q")
        tmux.wait(lambda s: "SILENT" not in s, 30, "the app to quit")
    finally:
        tmux.run("kill-server")


# ---- bad targets -------------------------------------------------------------------------


def test_bad_process_targets_are_one_line_with_their_own_status(
    host: Sshd, training: Training, tmp_path: Path
) -> None:
    row = live_row(host, training, lambda r: True, 60, "the row")

    def one_line(proc: subprocess.CompletedProcess[str], status: int) -> str:
        assert proc.returncode == status, (proc.returncode, proc.stdout, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stdout == ""
        return proc.stderr

    # not a training: the host's init (Python, no torch), its sshd (not Python)
    err = one_line(cli("summary", *host.args(), ALIAS, "--pid", "1"), 20)
    assert "pid 1" in err and "not a speculators training" in err
    err = one_line(cli("kill", *host.args(), ALIAS, "--pid", "2"), 20)
    assert "not a Python process" in err
    # gone: no such process
    err = one_line(cli("summary", *host.args(), ALIAS, "--pid", "999999"), 22)
    assert "no such process" in err
    # another user's training, unreadable to the SSH user
    with other_user() as user:
        args = (*host.args(), "-l", user, "--remote-python", "/usr/bin/python3", ALIAS)
        err = one_line(cli("summary", *args, "--pid", str(row["pid"])), 21)
        assert "belongs to user root" in err and user in err
        err = one_line(cli("kill", *args, "--pid", str(row["pid"])), 21)
    assert procs.alive(training.outside_pid)  # nothing was signalled
    # two live trainings and no --pid
    other = tmp_path / "second"
    other.mkdir()
    (other / "train.py").write_text(
        "import time\nimport torch\n\n\ndef train():\n    import speculators  # later\n\n\n"
        "time.sleep(600)\n"
    )
    launch(host, other)
    second = live_row_in(host, other, 120)
    err = one_line(cli("summary", *host.args(), ALIAS, "--json"), 23)
    assert "2 live trainings" in err and str(row["pid"]) in err and str(second["pid"]) in err
    assert "--pid" in err
    killed = cli("kill", *host.args(), ALIAS, "--pid", str(second["pid"]), "--json")
    assert killed.returncode == 0, killed.stdout + killed.stderr
    report = json.loads(killed.stdout)
    assert report["status"] == "stopped" and report["pid"] == second["pid"]


def live_row_in(host: Sshd, work: Path, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        rows: list[dict[str, Any]] = [
            r for r in runs_json(host)["live"] if r.get("cwd") == str(work)
        ]
        if rows:
            return rows[0]
        assert time.monotonic() < deadline, f"no live training in {work}"
        time.sleep(1.0)


@contextlib.contextmanager
def other_user() -> Iterator[str]:
    """A user made for the test (it can log in over SSH: the fixture's authorized_keys)."""
    need(shutil.which("useradd") is not None, "useradd is not installed")
    name = f"e3i11u{os.getpid() % 100000}"
    made = useradd("-M", "-N", "-s", "/bin/bash", "-p", "*", name)  # "*": not locked
    need(made.returncode in (0, 9), f"cannot create a user: {made.stderr!r}")
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], capture_output=True, check=False)


# ---- kill ------------------------------------------------------------------------------


def test_kill_of_the_discovered_training_attaches_it_stops_at_a_step_and_leaves_nothing(
    host: Sshd, training: Training
) -> None:
    """The kill attaches telemetry to it first, then stops it at a step boundary: no
    signal, its save the numbered checkpoint a restart continues from."""
    row = live_row(host, training, lambda r: True, 60, "the row")
    deadline = time.monotonic() + 240
    while "checkpoint" not in training.seen:  # (this test alone: a save to resume from)
        assert time.monotonic() < deadline, training.log()
        time.sleep(0.5)
    family = {p: st.start_ticks for p in tree(training.outside_pid) if (st := procs.stat(p))}
    assert len(family) >= 4, family  # trainer, resource tracker, 2 workers
    work = training.work
    proc = cli("kill", *host.args(), f"{ALIAS}:{work}", "--json", timeout=240)  # a work dir
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["status"] == "stopped", report
    first = report["attached_first"]
    run_dir = work / "eagle3-runs" / f"attached-{row['pid']}"
    assert first["status"] == "attached" and first["run_dir"] == str(run_dir), first
    assert report["run_dir"] == str(run_dir)  # the attached run is the one stopped
    assert json.loads((run_dir / "run.json").read_text())["pid"] == row["pid"]
    trainer = next(p for p in report["processes"] if p["role"] == "trainer")
    assert trainer["pid"] == row["pid"] and trainer["signals"] == [], report
    assert trainer["outcome"] == "exited" and not report["signalled_trainer"]
    stop = report["stop"]
    assert stop["how"] == "step_boundary", stop
    g, epoch = stop["global_step"], stop["epoch"] - 1  # (--json counts epochs from 1)
    assert epoch >= 1 and 0 < stop["local_step"] <= g  # after the save of epoch 0
    # its interrupted/ became the numbered checkpoint the library resumes from mid-epoch
    saved = work / "checkpoints" / str(epoch)
    assert stop["checkpoint"]["path"] == str(saved), stop
    state = json.loads((saved / "training_state.json").read_text())
    assert state == {"epoch": epoch, "local_step": stop["local_step"], "global_step": g}
    assert (saved / "model.safetensors").is_file()
    assert not (work / "checkpoints" / "interrupted").exists()
    assert stop["redo"]["steps"] == 0 and stop["redo"]["exact"], stop
    events = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "lifecycle"]
    assert events[-1]["event"] == "interrupt" and events[-1]["step"] == g, events[-3:]
    for pid, start in family.items():
        st = procs.stat(pid)
        assert st is None or st.start_ticks != start or st.zombie, f"{pid} remains"
    after = runs_json(host)  # nothing live; the attached run, stopped
    assert after["live"] == [], after["live"]
    assert [r["status"] for r in after["runs"] if r["run_dir"] == str(run_dir)] == ["interrupted"]
    assert [r for r in after["ended"] if r["pid"] == row["pid"]] == []  # listed once: its run
    # the PID names what it was: its telemetry's records say it stopped (not "dead")
    proc = cli("summary", *host.args(), ALIAS, "--pid", str(row["pid"]), "--json")
    assert proc.returncode == 7, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["health"] == "stopped"
    assert f"its run {run_dir}" in proc.stderr, proc.stderr
