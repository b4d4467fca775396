"""``k`` then ``r`` on a training that had no telemetry: it runs again WITH telemetry, as
the user started it (issue 26).

The user's script below trains the real tiny speculators draft with no monitoring
library and finds its data where the user's environment says (``SCENARIO_DIR``): a
restart that loses the environment dies at once with ``KeyError: 'SCENARIO_DIR'``. It is
launched as in the story, ``nohup python train.py … > train.log 2>&1 &`` over SSH, on a
host of its own (sshd in its own PID namespace: "HOST" alone means this training).
The kill records what a restart needs; the resume relaunches the same command line in
the same directory and environment under the telemetry bootstrap, its output appended
to the user's own ``train.log``; the monitor follows the new process by itself. Then
the same under torchrun (2 ranks: ``torchrun`` relaunched as ``torchrun``, every rank
with telemetry), and the README's one-liner run, which keeps its environment and log.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.agent.process_facts import is_torchrun
from eagle3_tui.telemetry import procs
from eagle3_tui.telemetry.rerun import BOOTSTRAP
from eagle3_tui.transport.replies import KillReport, RestartRecord, ResumeReport
from tests.conftest import need, need_training, read_jsonl, wait_until
from tests.transport.conftest import cli
from tests.transport.sshd import ALIAS, Sshd, have_pid_namespaces, have_sshd
from tests.transport.test_replies import unread

pytestmark = pytest.mark.slow

TRAIN_PY = textwrap.dedent(
    '''
    """My EAGLE-3 draft training: my own script, no monitoring library. Its data is
    where my scheduler says (SCENARIO_DIR)."""
    import os
    import sys
    from pathlib import Path

    import speculators  # noqa: F401  (what it trains with)

    from eagle3_tui.train.tiny import TinyConfig, build_trainer


    def main():
        scenario = Path(os.environ["SCENARIO_DIR"])
        epochs, delay = int(sys.argv[1]), float(sys.argv[2])
        print("training starts", flush=True)
        cfg = TinyConfig(epochs=epochs, step_delay=delay, workers=1)
        build_trainer(scenario, cfg).run_training()


    if __name__ == "__main__":
        main()
    '''
)

ONE_LINER_PY = textwrap.dedent(
    '''
    """My training with the README's one line of telemetry."""
    import os
    import sys
    from pathlib import Path

    from eagle3_tui.telemetry import attach
    from eagle3_tui.train.tiny import TinyConfig, build_trainer


    def main():
        scenario = Path(os.environ["SCENARIO_DIR"])
        telemetry = attach("runs/r1")
        cfg = TinyConfig(epochs=int(sys.argv[1]), step_delay=float(sys.argv[2]), workers=1)
        trainer = build_trainer(scenario, cfg)
        telemetry.watch_trainer(trainer)
        trainer.run_training()
        telemetry.finish()


    if __name__ == "__main__":
        main()
    '''
)

BANNER = re.compile(rb"\n--- eagle3-tui resume at [^\n]* ---\n")


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    need(have_sshd(), "OpenSSH sshd is not installed (apt-get install openssh-server)")
    need(os.geteuid() == 0, "the sshd fixture runs as root (privilege separation)")
    need(have_pid_namespaces(), "unshare --pid --mount-proc is not permitted here")
    need(shutil.which("ssh") is not None, "the OpenSSH client is not installed")
    server = Sshd(tmp_path_factory.mktemp("restart-host"), private=True)
    server.start()
    yield server
    server.stop()  # ends every process of the host (its PID namespace)


def experiment(root: Path) -> Path:
    """The user's work directory: the script, and its data where SCENARIO_DIR will say."""
    need_training()
    from eagle3_tui.train.tiny import TinyConfig, make_tiny_data

    work = root / "my-experiment"
    work.mkdir()
    make_tiny_data(work / "scenario" / "tiny", TinyConfig())
    (work / "train.py").write_text(TRAIN_PY)
    return work


def launch(host: Sshd, work: Path, *command: str) -> None:
    """``SCENARIO_DIR=… nohup COMMAND > train.log 2>&1 &`` in ``work``, over SSH."""
    line = (
        f"cd {shlex.quote(str(work))} || exit 1; "
        f"SCENARIO_DIR={shlex.quote(str(work / 'scenario'))} "
        f"nohup {shlex.join(command)} > train.log 2>&1 < /dev/null &"
    )
    proc = host.ssh(line)
    assert proc.returncode == 0, proc.stderr


def log_of(work: Path) -> str:
    return (work / "train.log").read_text(errors="replace")[-4000:]


def checkpoint0(work: Path) -> bool:
    return (work / "scenario" / "checkpoints" / "0" / "training_state.json").exists()


def pids_of(work: Path, *needles: str) -> list[int]:
    """Live processes (as this PID namespace numbers them) working in ``work`` whose
    command line holds every needle; not dataloader workers or multiprocessing helpers."""
    out = []
    for st in procs.all_stats().values():
        if st.zombie or st.comm == "pt_data_worker" or procs.cwd(st.pid) != str(work):
            continue
        argv = procs.cmdline(st.pid)
        joined = " ".join(argv)
        if "multiprocessing" in joined or not all(n in argv for n in needles):
            continue
        out.append(st.pid)
    return sorted(out)


def kill_everything_in(work: Path) -> None:
    """A failed test's cleanup: SIGKILL whatever still works in ``work``."""
    for st in procs.all_stats().values():
        if procs.cwd(st.pid) == str(work):
            with contextlib.suppress(ProcessLookupError):
                os.kill(st.pid, signal.SIGKILL)


def metrics_after_restart(run_dir: Path) -> list[dict[str, Any]]:
    try:
        return [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    except (OSError, ValueError):
        return []


def steps_since_resume(run_dir: Path) -> list[dict[str, Any]]:
    """The train records written after the run's (first) resume event."""
    try:
        recs = read_jsonl(run_dir / "metrics.jsonl")
    except (OSError, ValueError):
        return []
    marks = [i for i, r in enumerate(recs) if r["kind"] == "lifecycle" and r["event"] == "resume"]
    return [r for r in recs[marks[0] :] if r["kind"] == "train"] if marks else []


def flat(screen: str) -> str:
    """A screen's words on one line, a dialog's borders left out (its lines wrap)."""
    return " ".join(re.sub(r"[│┃║▌▐█]", " ", screen).split())


def appended_after_banner(work: Path, before: int) -> bytes:
    """What ``train.log`` got after its first ``before`` bytes: the banner, then the
    restarted run's own output."""
    data = (work / "train.log").read_bytes()[before:]
    found = BANNER.search(data)
    assert found is not None, data[-2000:]
    assert found.start() == 0, data[:300]  # appended: the old output is untouched
    return data[found.end() :]


# ---- the monitor: k, r, and it follows the new process ---------------------------------


def test_k_then_r_in_the_monitor_restarts_it_with_telemetry_and_follows_it(
    host: Sshd, tmp_path: Path
) -> None:
    need(shutil.which("tmux") is not None, "tmux is not installed (apt-get install tmux)")
    from tests.app.test_tmux import Tmux

    work = experiment(tmp_path)
    launch(host, work, sys.executable, "train.py", "1000", "0.1")
    tmux = Tmux(tmp_path / "tmux.sock")
    try:
        wait_until(lambda: checkpoint0(work), 300, lambda: f"a checkpoint:\n{log_of(work)}", 0.5)
        (old,) = pids_of(work, "train.py")
        monitor = [sys.executable, "-m", "eagle3_tui", *host.args(), ALIAS]  # HOST alone
        command = "env -u COLUMNS -u LINES TZ=UTC TERM=xterm-256color " + shlex.join(monitor)
        tmux.run("new-session", "-d", "-x", "240", "-y", "50", command)
        tmux.wait(lambda s: "(no telemetry)" in s.splitlines()[0], 120, "the process view")
        tmux.keys("k")
        tmux.wait(lambda s: "SIGTERM the trainer, pid" in s, 60, "the kill plan")
        tmux.keys("y")
        # attached first, so that it too stops at a step boundary: nothing to redo
        done = ("stopped: all", "attached telemetry first (ptrace", "interrupted: written by this")
        killed = tmux.wait(lambda s: all(d in flat(s) for d in done), 300, "the kill's result")
        assert not procs.alive(old), killed
        (record,) = (work / "eagle3-runs").iterdir()
        assert record.name.startswith("attached-")  # its PID in the host's namespace
        events = [r for r in read_jsonl(record / "metrics.jsonl") if r["kind"] == "lifecycle"]
        stopped_at = next(e["global_step"] for e in events if e["event"] == "stop")
        tmux.keys("Escape")
        tmux.wait(lambda s: "stopped: all" not in flat(s), 30, "the dialog to close")
        before = (work / "train.log").stat().st_size

        tmux.keys("r")
        plan = tmux.wait(lambda s: "detached (new session" in s, 120, "the restart plan")
        said = flat(plan)
        assert "restart with telemetry" in said and "<eagle3-tui telemetry>" in said, plan
        assert "train.py 1000 0.1" in said and "(appended, after a banner)" in said, plan
        assert re.search(r"redo 0 step\(s\): the checkpoint holds step", said), plan
        confirmed_at = time.time()
        tmux.keys("y")
        started = tmux.wait(
            lambda s: "with telemetry: its metrics in" in flat(s), 120, "the new pid"
        )
        assert "started: pid" in started, started
        tmux.keys("Escape")
        # the monitor follows the restarted run: its header says so, its steps arrive
        followed = tmux.wait(
            lambda s: (
                "restarted with telemetry: pid" in s.splitlines()[0]
                and re.search(r"\bstep \d+", s.splitlines()[0]) is not None
                and ("RUNNING" in s.splitlines()[0] or "WAITING" in s.splitlines()[0])
            ),
            300,
            "the monitor to follow the restarted run",
        )
        header = followed.splitlines()[0]
        assert "(no telemetry)" not in header and record.name in header, header
    finally:
        tmux.run("kill-server")
    try:
        # from outside: the same command line, directory and environment, with telemetry
        (new,) = wait_until(lambda: pids_of(work, "train.py", BOOTSTRAP), 60, "the new trainer")
        env = procs.environ(new) or {}
        assert env.get("SCENARIO_DIR") == str(work / "scenario")
        argv = procs.cmdline(new)
        assert argv[argv.index("--") + 1 :] == ["train.py", "1000", "0.1"]
        steps = wait_until(lambda: steps_since_resume(record), 120, "train records")
        first = float(steps[0]["ts"]) - confirmed_at
        print(f"\nr confirmed -> first new step's metrics: {first:.1f} s")
        assert steps[0]["step"] == stopped_at  # the next step: none redone, none skipped
        wait_until(lambda: len(steps_since_resume(record)) > 3, 120, "more steps")
        logged = [r["step"] for r in metrics_after_restart(record)]
        assert logged == list(range(logged[0], logged[0] + len(logged))), logged  # once each
        assert b"training starts" in appended_after_banner(work, before)
        m = json.loads((record / "run.json").read_text())
        assert m["log_file"] == str(work / "train.log") and m["resumes"] == 1
        assert stat.S_IMODE((record / "resume-env.json").stat().st_mode) == 0o600
    finally:
        kill_everything_in(work)


# ---- torchrun: relaunched as torchrun, every rank with telemetry --------------------


def test_torchrun_kill_then_resume_host_relaunches_torchrun_with_every_rank_watched(
    host: Sshd, tmp_path: Path
) -> None:
    work = experiment(tmp_path)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    launch(host, work, *torchrun, "--nproc-per-node", "2", "train.py", "1000", "0.1")
    try:
        wait_until(lambda: checkpoint0(work), 300, lambda: f"a checkpoint:\n{log_of(work)}", 0.5)
        (agent,) = pids_of(work, "torch.distributed.run")
        ranks = sorted(c for c in procs.children(agent) if "train.py" in procs.cmdline(c))
        assert len(ranks) == 2, ranks
        killed = cli("kill", *host.args(), f"{ALIAS}:{work}", "--json", timeout=300)
        assert killed.returncode == 0, killed.stdout + killed.stderr
        report = json.loads(killed.stdout)
        assert unread(report, KillReport) == set()
        assert unread(report["restart"], RestartRecord) == set()
        restart = report["restart"]
        assert restart["telemetry"] is True and restart["problem"] is None, restart
        command = restart["resume_command"]
        assert command[: len(torchrun)] == torchrun and is_torchrun(command)
        assert not procs.alive(agent) and not any(procs.alive(r) for r in ranks)
        before = (work / "train.log").stat().st_size

        resumed = cli("resume", *host.args(), ALIAS, "--json", timeout=180)  # HOST alone
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        out = json.loads(resumed.stdout)
        assert unread(out, ResumeReport) == set()
        assert out["status"] == "started" and out["restart"] and out["confirmed"], out
        assert "latest stopped run" in resumed.stderr and restart["run_dir"] in resumed.stderr
        record = Path(restart["run_dir"])

        # torchrun as torchrun: its own options, each rank's program under the bootstrap
        (new_agent,) = wait_until(
            lambda: pids_of(work, "torch.distributed.run"), 60, "the new agent"
        )
        argv = procs.cmdline(new_agent)
        assert argv[:6] == [*torchrun, "--nproc-per-node", "2"] and "--no-python" in argv
        new_ranks = wait_until(
            lambda: (
                [c for c in procs.children(new_agent) if BOOTSTRAP in procs.cmdline(c)]
                if len(procs.children(new_agent)) >= 2
                else None
            ),
            120,
            "two ranks under the bootstrap",
        )
        assert len(new_ranks) == 2, [procs.cmdline(c) for c in procs.children(new_agent)]
        for rank in new_ranks:
            assert (procs.environ(rank) or {}).get("SCENARIO_DIR") == str(work / "scenario")

        def every_rank_reports() -> bool:
            metrics = record / "metrics.jsonl"
            recs = read_jsonl(metrics) if metrics.exists() else []
            kinds = {(r["kind"], r.get("rank")) for r in recs}
            ranks = json.loads((record / "run.json").read_text()).get("ranks") or []
            return {("train", 0), ("heartbeat", 0), ("heartbeat", 1)} <= kinds and len(ranks) == 2

        wait_until(every_rank_reports, 300, lambda: f"every rank's telemetry:\n{log_of(work)}")
        m = json.loads((record / "run.json").read_text())
        assert m["launcher_pid"] == out["pid"]
        assert m["resume_command"] == command  # the next resume keeps every rank watched
        assert appended_after_banner(work, before)
    finally:
        kill_everything_in(work)


# ---- the README's one-liner: its environment and its log -------------------------------


def test_a_one_liner_run_resumes_with_its_whole_environment_into_its_own_log(
    tmp_path: Path,
) -> None:
    work = experiment(tmp_path)
    (work / "train.py").write_text(ONE_LINER_PY)
    run_dir = work / "runs" / "r1"
    env = dict(os.environ, SCENARIO_DIR=str(work / "scenario"), PYTHONUNBUFFERED="1")
    with open(work / "train.log", "ab") as log:  # nohup python train.py > train.log 2>&1 &
        first = subprocess.Popen(
            [sys.executable, "train.py", "1000", "0.1"],
            cwd=work,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    started: list[int] = [first.pid]
    try:
        wait_until(lambda: checkpoint0(work), 300, lambda: f"a checkpoint:\n{log_of(work)}", 0.5)
        m = json.loads((run_dir / "run.json").read_text())
        assert m["log_file"] == str(work / "train.log")  # where its output goes
        saved = run_dir / m["resume_env_file"]
        assert stat.S_IMODE(saved.stat().st_mode) == 0o600
        assert json.loads(saved.read_text())["SCENARIO_DIR"] == str(work / "scenario")

        killed = cli("kill", str(run_dir), "--json", timeout=300)
        assert killed.returncode == 0, killed.stdout + killed.stderr
        first.wait(30)
        before = (work / "train.log").stat().st_size
        resumed = cli("resume", str(run_dir), "--json", timeout=180)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr + log_of(work)
        out = json.loads(resumed.stdout)
        assert out["status"] == "started" and out["log"] == str(work / "train.log"), out
        pid = out["pid"]
        started.append(pid)
        assert (procs.environ(pid) or {}).get("SCENARIO_DIR") == str(work / "scenario")

        def resumed_steps() -> list[dict[str, Any]]:
            assert procs.alive(pid), log_of(work)  # KeyError: 'SCENARIO_DIR' ends it at once
            recs = read_jsonl(run_dir / "metrics.jsonl")
            marks = [
                i for i, r in enumerate(recs)
                if r["kind"] == "lifecycle" and r.get("event") == "resume" and r.get("pid") == pid
            ]  # fmt: skip
            return [r for r in recs[marks[0] :] if r["kind"] == "train"] if marks else []

        wait_until(resumed_steps, 240, lambda: f"steps after the resume:\n{log_of(work)}")
        assert appended_after_banner(work, before).strip()  # its output, in its own log
        assert not (run_dir / "train.log").exists()
    finally:
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                if procs.alive(pid) and os.getsid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
        first.wait(30)
        kill_everything_in(work)
