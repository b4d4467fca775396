"""A real Slurm of one node on this machine for tests: Debian's munged, slurmctld and
slurmd, each with its own socket, ports, state and logs in one temporary directory (no
file of /etc is read or written: clients find it through ``SLURM_CONF``).

The node is this machine under its own host name, with every CPU; jobs run as root.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.transport.sshd import free_port

DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd")


def have_slurm() -> bool:
    return all(os.access(d, os.X_OK) for d in DAEMONS) and shutil.which("sbatch") is not None


@dataclass
class Slurm:
    root: Path
    node: str = field(default_factory=lambda: os.uname().nodename.split(".")[0])

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return dict(os.environ, SLURM_CONF=str(self.conf))

    def start(self) -> Slurm:
        for d in ("state", "spool", "munge", "log"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        munge = self.root / "munge"
        munge.chmod(0o700)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        subprocess.run(
            [
                DAEMONS[0],
                "--force",
                f"--socket={munge / 'sock'}",
                f"--key-file={key}",
                f"--pid-file={munge / 'pid'}",
                f"--log-file={munge / 'log'}",
                f"--seed-file={munge / 'seed'}",
            ],
            check=True,
            timeout=30,
        )
        cpus = os.cpu_count() or 1
        r = self.root
        self.conf.write_text(
            f"ClusterName=e3test\nSlurmctldHost={self.node}(127.0.0.1)\n"
            f"SlurmctldPort={free_port()}\nSlurmdPort={free_port()}\n"
            f"AuthType=auth/munge\nAuthInfo=socket={munge / 'sock'}\nCredType=cred/munge\n"
            "SlurmUser=root\nSlurmdUser=root\n"
            f"StateSaveLocation={r / 'state'}\nSlurmdSpoolDir={r / 'spool'}\n"
            f"SlurmctldPidFile={r / 'ctld.pid'}\nSlurmdPidFile={r / 'd.pid'}\n"
            f"SlurmctldLogFile={r / 'log/ctld.log'}\nSlurmdLogFile={r / 'log/d.log'}\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
            "JobCompType=jobcomp/none\nMpiDefault=none\nSchedulerType=sched/backfill\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\nReturnToService=2\n"
            "SlurmctldTimeout=30\nSlurmdTimeout=30\nKillWait=30\nMinJobAge=600\n"
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 State=UNKNOWN\n"
            f"PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP\n"
        )
        env = self.env
        subprocess.run([DAEMONS[1], "-i"], env=env, check=True, timeout=30)
        subprocess.run([DAEMONS[2]], env=env, check=True, timeout=30)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.run("sinfo", "-h", "-o", "%T").stdout.strip() == "idle":
                return self
            time.sleep(0.3)
        logs = "".join(p.read_text()[-1500:] for p in (r / "log").glob("*.log"))
        raise RuntimeError(f"Slurm's node did not come up: {logs}")

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def sbatch(self, script: Path, *options: str, env: dict[str, str] | None = None) -> str:
        """Submit ``script`` (its environment: ``env`` over this one); the job's id."""
        proc = subprocess.run(
            ["sbatch", "--parsable", *options, str(script)],
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return proc.stdout.strip().split(";")[0]

    def state(self, job: str) -> str:
        out = self.run("scontrol", "show", "job", "-o", job).stdout
        for part in out.split():
            if part.startswith("JobState="):
                return part.split("=", 1)[1]
        return "?"

    def stop(self) -> None:
        """Every job cancelled (its processes ended by slurmstepd), then the daemons; what
        of this Slurm still runs after that (a slurmstepd left without its controller) is
        SIGKILLed: the processes whose environment names this configuration."""
        self.run("scancel", "--user", "root")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.run("squeue", "-h").stdout.strip():
            time.sleep(0.3)
        for name in ("d.pid", "ctld.pid", "munge/pid"):
            path = self.root / name
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(path.read_text().strip()), signal.SIGTERM)
        time.sleep(1.0)
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def processes(self) -> list[int]:
        mark = f"SLURM_CONF={self.conf}".encode()
        out = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                if mark in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    out.append(int(entry))
        return out
