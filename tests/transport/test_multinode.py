"""Two nodes × one rank: ``torchrun --nnodes 2`` launched over SSH on two sshd "hosts" of
this machine, rendezvous on 127.0.0.1, one view of the one run.

Each host is an sshd in a UTS namespace of its own (``Sshd(hostname=...)``): what runs
in its sessions sees its own host name, which is what telemetry records in the
manifest and what the monitor then connects to (the test's ssh config has the same
names as aliases). The filesystem is shared, as on a cluster with shared storage
(speculators needs one for multi-node checkpoints: rank 0 writes them, every rank
loads them): node 1's telemetry lives in ``RUN_DIR/node1``. The network is shared:
the rendezvous and gloo run over loopback. Why not network namespaces: loopback is
per network namespace, so a rendezvous on 127.0.0.1 could not reach the other node,
and nothing here needs separate addresses.

One training carries every assertion (two torchrun launches per node in all).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from eagle3_tui.api.reading import load_remote
from eagle3_tui.model.health import diagnose
from eagle3_tui.model.state import RunState
from eagle3_tui.model.verdict import HEARTBEAT_DEAD_S, Health
from eagle3_tui.transport.target import SshOptions, SshTarget
from tests.conftest import need, need_training
from tests.torchrun import (
    FIXTURE,
    TORCHRUN,
    checkpointed,
    free_port,
    kill_leftovers,
    leftovers,
    manifest,
    quiet_later,
    rank_pids,
    records,
    tiny_args,
    train_steps,
    wait_until,
)
from tests.transport.sshd import Sshd, have_sshd

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Cluster:
    root: Path
    nodes: list[Sshd]

    @property
    def config(self) -> Path:
        return self.root / "ssh_config"

    def names(self) -> list[str]:
        return [n.alias for n in self.nodes]

    def ssh(self, node: int, command: str, timeout: float = 60) -> None:
        proc = subprocess.run(
            ["ssh", "-F", str(self.config), "-o", "BatchMode=yes", self.names()[node], command],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "eagle3_tui", *args, "-F", str(self.config)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def state(self, run_dir: Path) -> tuple[RunState, float]:
        """What the monitor reads from node 0 alone: every node, found in its manifest."""
        import asyncio

        target = SshTarget(
            self.names()[0], None, str(run_dir), SshOptions(config=(str(self.config),))
        )
        run, now = asyncio.run(load_remote(target))
        return run.state, now


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    need(have_sshd(), "OpenSSH sshd is not installed (apt-get install openssh-server)")
    need(os.geteuid() == 0, "the sshd fixture runs as root (privilege separation)")
    need(shutil.which("unshare") is not None, "unshare (util-linux) is not installed")
    need(shutil.which("ssh") is not None, "the OpenSSH client is not installed")
    root = tmp_path_factory.mktemp("cluster")
    tag = f"e3n{os.getpid() % 10000}"  # host names of this test only
    env = {"EAGLE3_TUI_NVML_FIXTURE": FIXTURE, "GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1"}
    nodes: list[Sshd] = []
    try:
        for k in range(2):
            name = f"{tag}-node{k}"
            nodes.append(Sshd(root / name, alias=name, hostname=name, set_env=env).start())
        (root / "ssh_config").write_text("".join(n.ssh_config.read_text() for n in nodes))
        yield Cluster(root, nodes)
    finally:
        for n in nodes:
            n.stop()


def launch(cluster: Cluster, run_dir: Path, control: Path, port: int) -> list[str]:
    """torchrun on each node, started over SSH as a person would (detached)."""
    commands = []
    for k in range(2):
        cmd = [
            *TORCHRUN,
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--node-rank",
            str(k),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            *tiny_args(run_dir, control),
        ]
        log = run_dir.parent / f"node{k}.log"
        cluster.ssh(
            k,
            f"cd {shlex.quote(str(REPO))} && setsid -f {shlex.join(cmd)} "
            f"> {shlex.quote(str(log))} 2>&1 < /dev/null",
        )
        commands.append(shlex.join(cmd))
    return commands


def test_two_nodes_one_view_kill_resume_faults(cluster: Cluster, tmp_path: Path) -> None:
    need_training()
    run_dir, control, log = tmp_path / "run", tmp_path / "control", tmp_path / "node0.log"
    run_dir.mkdir()
    node0, node1 = cluster.names()
    node1_dir = run_dir / "node1"
    try:
        launch(cluster, run_dir, control, free_port())

        # ---- each node's telemetry, and one view from node 0 alone -------------------
        def started() -> bool:
            """A checkpoint, each node's manifest knows its ranks (node 1's run.json is
            written at start, its ranks once the ranks' exchange is done: a kill before that
            could not name node 1's rank), and steps after the checkpoint."""
            nodes = manifest(run_dir).get("nodes") or []
            if not (checkpointed(run_dir) and len(nodes) == 2):
                return False
            if not ((node1_dir / "run.json").exists() and manifest(node1_dir).get("ranks")):
                return False
            # and training has gone on past that checkpoint: a SIGTERM during its save ends
            # the ranks once the numbered checkpoint is written, with no interrupted/ of its own
            saved = json.loads((run_dir / "checkpoints" / "0" / "training_state.json").read_text())
            steps = train_steps(records(run_dir / "metrics.jsonl"))
            return bool(steps) and max(steps) > int(saved.get("global_step") or 0) + 1

        wait_until(started, 360, "both nodes, a checkpoint", log)
        recs0, recs1 = records(run_dir / "metrics.jsonl"), records(node1_dir / "metrics.jsonl")
        assert {r["rank"] for r in recs0 if r["kind"] == "train"} == {0}
        assert not [r for r in recs1 if r["kind"] in ("train", "val")], "metrics once"
        assert {r["host"] for r in recs0 if r["kind"] == "gpu"} == {node0}
        assert {r["host"] for r in recs1 if r["kind"] == "gpu"} == {node1}
        assert {(r["rank"], r["host"]) for r in recs1 if r["kind"] == "io"} == {(1, node1)}
        m0, m1 = manifest(run_dir), manifest(node1_dir)
        assert [(n["host"], n["ranks"], n["run_dir"]) for n in m0["nodes"]] == [
            (node0, [0], str(run_dir)),
            (node1, [1], str(node1_dir)),
        ]
        assert m1["nodes"] == m0["nodes"] and m1["node_rank"] == 1 and m1["host"] == node1
        assert "--node-rank" in m1["resume_command"] and m1["world_size"] == 2

        st, now = cluster.state(run_dir)
        assert {host for host, _ in st.samplers.gpu_devices} == {node0, node1}  # GPUs of every node
        assert {r: hb.host for r, hb in st.samplers.rank_heartbeats.items()} == {0: node0, 1: node1}
        assert {(w.host, w.rank) for w in st.samplers.io_workers.values()} >= {
            (node0, 0),
            (node1, 1),
        }
        assert diagnose(st, now).health is Health.RUNNING

        # ---- kill from node 0: every node, checkpoint saved, nothing left anywhere ------
        killed = cluster.cli("kill", f"{node0}:{run_dir}", "--json")
        assert killed.returncode == 0, killed.stdout + killed.stderr
        result = json.loads(killed.stdout)
        assert [n["host"] for n in result["nodes"]] == [node0, node1]
        assert all(n["status"] == "stopped" for n in result["nodes"]), killed.stdout
        labels = {p["label"] for n in result["nodes"] for p in n["processes"]}
        assert {"rank 0", "rank 1", "torchrun agent"} <= labels, killed.stdout
        # Node 0's kill asks rank 0's telemetry to stop at a step boundary; the ranks agree
        # on the step through the job's store, and node 1's kill waits for its rank to end
        # with them (``node0``): no rank of any node is signalled (a rank signalled alone
        # leaves the others' interrupt save waiting for it in a collective).
        stop0, stop1 = (n["stop"] for n in result["nodes"])
        assert (stop0["how"], stop1["how"]) == ("step_boundary", "node0"), killed.stdout
        ranks = [
            p for n in result["nodes"] for p in n["processes"] if p["label"] in ("rank 0", "rank 1")
        ]
        assert len(ranks) == 2 and all(p["signals"] == [] for p in ranks), killed.stdout
        assert not any(n["signalled_trainer"] for n in result["nodes"]), killed.stdout
        # the stop's save, gathered from both ranks, is the numbered checkpoint of its epoch
        g, epoch = stop0["global_step"], stop0["epoch"] - 1  # (--json counts epochs from 1)
        ckpt = run_dir / "checkpoints"
        assert stop0["checkpoint"]["path"] == str(ckpt / str(epoch)), killed.stdout
        state = json.loads((ckpt / str(epoch) / "training_state.json").read_text())
        assert state == {"epoch": epoch, "local_step": stop0["local_step"], "global_step": g}
        assert not (ckpt / "interrupted").exists() and stop0["redo"]["steps"] == 0
        latest = result["nodes"][0]["checkpoints"]["latest"]
        assert latest["problems"] == [] and latest["global_step"] == g, killed.stdout
        assert not leftovers(run_dir), leftovers(run_dir)
        assert max(train_steps(records(run_dir / "metrics.jsonl"))) == g - 1

        # ---- resume from node 1 alone (its latest run): every node, the run continues ---
        resumed = cluster.cli("resume", node1, "--json")
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        result = json.loads(resumed.stdout)
        assert sorted(n["where"].split(":")[0] for n in result["nodes"]) == [node0, node1]
        assert all(n["status"] == "started" for n in result["nodes"]), resumed.stdout

        def continued() -> bool:
            recs = records(run_dir / "metrics.jsonl")
            resumes = [r for r in recs if r["kind"] == "lifecycle" and r["event"] == "resume"]
            after = [r for r in recs[recs.index(resumes[-1]) :]] if resumes else []
            return (
                len([r for r in after if r["kind"] == "train"]) >= 2
                and len(manifest(node1_dir).get("nodes") or []) == 2
                and manifest(node1_dir).get("resumes") == 1
            )

        wait_until(continued, 360, "the resumed run's steps on both nodes", run_dir / "train.log")
        recs = records(run_dir / "metrics.jsonl")
        resume = [r for r in recs if r["kind"] == "lifecycle" and r["event"] == "resume"][-1]
        assert resume["global_step"] == g  # at the stop's step: none redone, none skipped
        steps = train_steps(recs)
        assert steps == list(range(len(steps))), steps  # every step once, in order
        st, now = cluster.state(run_dir)
        assert diagnose(st, now).health is Health.RUNNING

        # ---- rank 1 (node 1) hangs: stalled, naming it and its node -----------------------
        control.write_text("hang 1\n")

        def hung_view() -> RunState | None:
            st, _ = cluster.state(run_dir)
            hb = st.samplers.rank_heartbeats
            if not ({0, 1} <= hb.keys() and st.last_train_ts):
                return None
            if (hb[1].where or {}).get("collective") or not (hb[0].where or {}).get("collective"):
                return None
            fresh = min(h.ts for h in hb.values()) >= quiet_later(st) - HEARTBEAT_DEAD_S + 1
            return st if fresh else None

        st = wait_until(hung_view, 180, "rank 1 blocked, rank 0 waiting", log)
        d = diagnose(st, quiet_later(st))
        assert d.health is Health.STALLED, d
        last = st.samplers.rank_heartbeats[1].last_step
        assert last is not None
        step = last + 1
        assert f"rank 1 on {node1} stopped at step {step}" in d.reason, d.reason
        assert "rank 0 waits for it in a collective" in d.reason, d.reason

        # ---- rank 1 is killed: dead, naming it; torchrun ends every node ---------------
        pid1 = rank_pids(manifest(node1_dir))[1]
        os.kill(pid1, signal.SIGKILL)
        wait_until(lambda: not leftovers(run_dir), 120, "every node's processes to end", log)
        st, now = cluster.state(run_dir)
        d = diagnose(st, now)
        assert d.health is Health.DEAD, d
        assert d.reason.startswith(f"Rank 1 (pid {pid1} on {node1}) died"), d.reason
        assert "killed by SIGKILL" in d.reason, d.reason
    finally:
        kill_leftovers(run_dir)
        with contextlib.suppress(Exception):
            cluster.cli("kill", f"{node0}:{run_dir}", timeout=60)
