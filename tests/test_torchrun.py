"""The 8-GPU case on a CPU: the real tiny speculators training under
``torchrun --nproc-per-node 2`` (gloo, FSDP2), its telemetry per node and rank, a rank
that hangs (stalled, naming it), a rank that is killed (dead, naming it), a resume
with the same torchrun arguments, and a kill whose wedged rank ignores SIGTERM.

One training carries every assertion (each phase starts where the last one left it):
two torchrun launches in all, as the CI budget asks.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from eagle3_tui.model.health import diagnose
from eagle3_tui.model.verdict import Health
from tests.conftest import need_training
from tests.torchrun import (
    FIXTURE,
    TORCHRUN,
    checkpointed,
    hung,
    kill_leftovers,
    leftovers,
    manifest,
    quiet_later,
    rank_pids,
    records,
    state_of,
    tiny_args,
    train_steps,
    wait_until,
)
from tests.transport.conftest import cli

pytestmark = pytest.mark.slow


def test_two_ranks_on_one_node(tmp_path: Path) -> None:
    need_training()
    run_dir, control, log = tmp_path / "run", tmp_path / "control", tmp_path / "torchrun.log"
    env = dict(
        os.environ,
        EAGLE3_TUI_NVML_FIXTURE=FIXTURE,
        XDG_STATE_HOME=str(tmp_path / "state"),
        PYTHONUNBUFFERED="1",
    )
    cmd = [*TORCHRUN, "--standalone", "--nproc-per-node", "2", *tiny_args(run_dir, control)]
    with open(log, "ab") as out:
        agent = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    metrics = run_dir / "metrics.jsonl"
    try:
        # ---- telemetry per node and rank --------------------------------------------
        every = {("gpu", 0), ("io", 0), ("io", 1), ("heartbeat", 0), ("heartbeat", 1)}

        def telemetry_complete() -> bool:
            recs = records(metrics)
            kinds = {(r["kind"], r["rank"]) for r in recs}
            ranks = manifest(run_dir).get("ranks") or []
            # each rank's latest heartbeat past its first step (one may come before it)
            hb = {r["rank"]: r for r in recs if r["kind"] == "heartbeat" and r.get("where")}
            stepped = set(hb) == {0, 1} and all(
                isinstance(h.get("last_step"), int) for h in hb.values()
            )
            return checkpointed(run_dir) and every <= kinds and len(ranks) == 2 and stepped

        wait_until(telemetry_complete, 300, "a checkpoint and every rank's samples", log)
        recs = records(metrics)
        train = [r for r in recs if r["kind"] == "train"]
        assert {r["rank"] for r in train} == {0} and len({r["w"] for r in train}) == 1
        assert train_steps(recs) == sorted(set(train_steps(recs))), "metrics once per step"
        gpu = [r for r in recs if r["kind"] == "gpu"]
        # once per node: one writer (local rank 0's sidecar) reads both ranks' devices
        assert {(r["rank"], r["w"]) for r in gpu} == {(0, gpu[0]["w"])}
        assert [d.get("local_rank") for d in gpu[-1]["devices"]] == [0, 1]
        assert gpu[-1]["host"] == socket.gethostname()
        hb = {r["rank"]: r for r in recs if r["kind"] == "heartbeat" and r.get("where")}
        assert set(hb) == {0, 1} and all(isinstance(h["last_step"], int) for h in hb.values())
        io_ranks = {r["rank"]: {w["role"] for w in r["workers"]} for r in recs if r["kind"] == "io"}
        assert io_ranks.keys() == {0, 1} and all("main" in roles for roles in io_ranks.values())
        m = manifest(run_dir)
        launcher = m["launcher"]
        assert launcher["argv"] == cmd and m["resume_command"] == cmd  # the same torchrun
        assert launcher["pid"] == agent.pid and m["world_size"] == 2 and m["nnodes"] == 1
        assert [r["rank"] for r in m["ranks"]] == [0, 1]
        assert [n["ranks"] for n in m["nodes"]] == [[0, 1]]

        # ---- rank 1 hangs: stalled, naming it -----------------------------------------
        control.write_text("hang 1\n")

        st = wait_until(lambda: hung(run_dir), 180, "rank 1 blocked, rank 0 waiting", log)
        last = st.samplers.rank_heartbeats[1].last_step
        assert last is not None
        step = last + 1
        d = diagnose(st, quiet_later(st))
        assert d.health is Health.STALLED, d
        assert f"rank 1 stopped at step {step} (in tiny.py" in d.reason, d.reason
        assert "rank 0 waits for it in a collective" in d.reason, d.reason

        # ---- rank 1 is killed: torchrun ends the rest; dead, naming it ---------------
        pids = rank_pids(m)
        os.kill(pids[1], signal.SIGKILL)
        assert agent.wait(timeout=180) != 0
        wait_until(lambda: not leftovers(run_dir), 60, "torchrun to end every rank", log)
        st = state_of(run_dir)
        d = diagnose(st, st.last_ts or 0.0)
        assert d.health is Health.DEAD, d
        assert d.reason.startswith(f"Rank 1 (pid {pids[1]} on {socket.gethostname()}) died"), d
        assert "killed by SIGKILL" in d.reason and f"after step {step}" in d.reason, d  # steps done

        # ---- resume with the same torchrun arguments: world size 2, steps continue --------
        control.write_text("")
        resumed = cli("resume", str(run_dir), "--json", env=env, timeout=240)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        new_agent = json.loads(resumed.stdout)["pid"]
        ckpt_step = json.loads(resumed.stdout)["checkpoint"]["global_step"]

        def continued() -> bool:
            recs = records(metrics)
            events = [r for r in recs if r["kind"] == "lifecycle" and r["event"] == "resume"]
            if not events:
                return False
            after = [r for r in recs[recs.index(events[-1]) :] if r["kind"] == "train"]
            return len(after) >= 2 and len(manifest(run_dir).get("ranks") or []) == 2

        wait_until(continued, 300, "the resumed run's steps", log)
        m = manifest(run_dir)
        assert m["launcher"]["pid"] == new_agent and m["world_size"] == 2 and m["resumes"] == 1
        recs = records(metrics)
        resume = [r for r in recs if r["kind"] == "lifecycle" and r["event"] == "resume"][-1]
        assert resume["global_step"] == ckpt_step > 0
        first_after = next(r for r in recs[recs.index(resume) :] if r["kind"] == "train")
        assert first_after["step"] == ckpt_step  # continues from the checkpoint, not step 0
        st = state_of(run_dir)
        assert diagnose(st, st.last_ts or 0.0).health is Health.RUNNING

        # ---- a kill while rank 1 is wedged and ignores SIGTERM: escalated, nothing left ---
        # (a rank that ignores SIGTERM but trains on would only break rank 0's save with
        # a collective mismatch, and torchrun ends both: measured here)
        control.write_text("ignore_sigterm 1\nhang 1\n")
        wait_until(lambda: hung(run_dir), 180, "rank 1 wedged, ignoring SIGTERM", log)
        pids = rank_pids(m)
        killed = cli("kill", str(run_dir), "--grace", "10", "--json", env=env, timeout=240)
        assert killed.returncode == 0, killed.stdout + killed.stderr
        result = json.loads(killed.stdout)
        by_pid = {p["pid"]: p for p in result["processes"]}
        assert by_pid[pids[1]]["label"] == "rank 1", killed.stdout
        assert by_pid[pids[1]]["outcome"] == "killed", (killed.stdout, killed.stderr)
        assert by_pid[pids[1]]["signals"] == ["SIGTERM", "SIGKILL"]
        assert by_pid[pids[1]]["ended"] == "killed by SIGKILL"
        assert by_pid[pids[0]]["label"] == "rank 0" and "SIGTERM" in by_pid[pids[0]]["signals"]
        assert any(p["label"] == "torchrun agent" for p in result["processes"])
        assert any(p["label"].startswith("worker, rank 1") for p in result["processes"])
        assert result["status"] == "stopped" and not leftovers(run_dir)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(agent.pid, signal.SIGKILL)
        kill_leftovers(run_dir)
