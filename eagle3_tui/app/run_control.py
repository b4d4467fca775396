"""The run's host as the app drives it: status probes, kill, resume, the runs there.

A thin holder of a transport ``Host`` (this machine or an SSH host, shared with
the stream) and the run directory; every call is one agent operation, awaited
from an async worker, never on the UI thread's critical path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from eagle3_tui.agent.names import KILL_GRACE_S, SAVE_WAIT_S
from eagle3_tui.api import slurm
from eagle3_tui.api.slurm import JobPlace
from eagle3_tui.transport import calls
from eagle3_tui.transport.base import TargetError
from eagle3_tui.transport.channel import Host, LocalHost, ProgressCallback
from eagle3_tui.transport.replies import (
    AttachPlan,
    AttachResult,
    KillReport,
    ProcessRow,
    ResumeReport,
    RunsReport,
    SaveWaitReport,
    SlurmJob,
    Status,
)
from eagle3_tui.transport.target import LocalTarget, Target


@dataclass
class RunControl:
    """Process control of one run (local or over SSH)."""

    host: Host
    run_dir: str | None
    where: str
    """``host:run_dir`` (or the local path), for dialogs."""
    kill_grace_s: float = KILL_GRACE_S
    save_wait_s: float = SAVE_WAIT_S
    """How long a kill waits for a checkpoint save in progress before its first signal."""
    resume_wait_s: float = 30.0
    process: ProcessRow | None = None
    """A training without telemetry (its discovery row): acted on by PID, start time and
    boot id instead of a manifest."""
    nodes: list[RunControl] = field(default_factory=list)
    """The run's other nodes (a multi-node torchrun job): kill and resume act on all."""
    job: SlurmJob | None = None
    """A Slurm job's run: a kill then ends the job through the scheduler, and a resume
    requeues it (its script runs again, under Slurm), asked of ``login``."""
    login: Target | None = None
    kills_under_way: int = field(default=0, init=False, compare=False)
    """This monitor's kills of the run not ended yet (a second ``k`` says so: the agent
    makes it wait for the first and send no signal)."""

    @classmethod
    def for_target(cls, target: Target, host: Host | None = None) -> RunControl:
        run_dir = calls.run_dir_of(target)
        if host is None:
            host = LocalHost() if isinstance(target, LocalTarget) else calls.open_host(target)
        return cls(host, run_dir, calls.where(target, run_dir))

    @classmethod
    def for_process(cls, target: Target, host: Host, row: ProcessRow) -> RunControl:
        from eagle3_tui.transport.observed import describe_row

        prefix = getattr(host, "prefix", "")
        return cls(host, None, f"{prefix}{describe_row(row)}", process=row)

    @property
    def observed(self) -> bool:
        """A run without telemetry: its records say whether it lives (no probes needed)."""
        return self.process is not None

    @property
    def host_is_local(self) -> bool:
        """This machine's run: its directory can be written here (an export)."""
        return isinstance(self.host, LocalHost)

    @classmethod
    def for_source(cls, source: object) -> RunControl | None:
        """The host of a run being streamed (the run compared with), to read its manifest:
        a local directory, or a directory over an SSH connection; None for other sources."""
        from eagle3_tui.transport.local import LocalTransport
        from eagle3_tui.transport.ssh import SshHost, SshTransport

        if isinstance(source, LocalTransport):
            run_dir = str(source.run_dir)
            return cls(LocalHost(), run_dir, run_dir)
        if isinstance(source, SshTransport) and isinstance(source.host, SshHost):
            return cls(source.host, source.run_dir, source.label)
        return None

    async def status(self, plan: bool = False) -> Status:
        """Whether the trainer lives, the manifest, the host and its clock (see
        calls.run_status; for a process, calls.describe); ``plan``: with what a kill
        would act on now (a process's description always has it)."""
        if self.process is not None:
            return await calls.describe(self.host, self.process)
        return await calls.run_status(self.host, self.run_dir, plan)

    async def kill(self, on_progress: ProgressCallback | None = None) -> KillReport:
        self.kills_under_way += 1
        try:
            report = await self._kill(on_progress)
            stopped = report.status in ("stopped", "not_running")
            if self.job is not None and self.login is not None and stopped:
                report.slurm = await slurm.cancel(JobPlace(self.job, self.login, None, None))
            return report
        finally:
            self.kills_under_way -= 1

    async def _kill(self, on_progress: ProgressCallback | None = None) -> KillReport:
        if not self.nodes:
            return await calls.kill_run(
                self.host,
                self.run_dir,
                self.kill_grace_s,
                on_progress,
                process=self.process,
                save_wait_s=self.save_wait_s,
            )

        async def kill(c: RunControl) -> KillReport:
            return await calls.kill_run(
                c.host, c.run_dir, c.kill_grace_s, on_progress, save_wait_s=c.save_wait_s
            )

        def save_wait(c: RunControl) -> Callable[[], Awaitable[SaveWaitReport]]:
            return lambda: calls.wait_for_save(c.host, c.run_dir, c.save_wait_s, on_progress)

        # no node is signalled while any node's records show a checkpoint save
        waited = await calls.saves_done([save_wait(c) for c in [self, *self.nodes]])
        return calls.with_save_wait(await self._every_node("kill", kill, KillReport), waited)

    async def resume_plan(self) -> ResumeReport:
        """What ``resume`` would launch, every check done on the host and nothing started
        (for a training without telemetry: the restart its kill recorded; for a Slurm job:
        its requeue)."""
        if self.job is not None:
            return ResumeReport(
                status="plan",
                message=f"requeue {self.job.label} through Slurm",
                slurm=slurm.step_of(self.job, "requeue"),
            )
        return await calls.resume_run(
            self.host, self.run_dir, self.resume_wait_s, process=self.process, plan=True
        )

    def of_run(self, run_dir: str) -> RunControl:
        """The control of another run directory of the same host (where a restarted
        training, which had no telemetry, now writes its metrics)."""
        where = f"{getattr(self.host, 'prefix', '')}{run_dir}"
        return RunControl(
            self.host, run_dir, where, self.kill_grace_s, self.save_wait_s, self.resume_wait_s
        )

    async def resume(self) -> ResumeReport:
        if self.job is not None and self.login is not None:
            target = replace(self.login, job=self.job.id)
            report, _ = await slurm.requeue_report(target, self.resume_wait_s, target.label)
            return report
        if not self.nodes:
            return await calls.resume_run(
                self.host, self.run_dir, self.resume_wait_s, process=self.process
            )

        async def resume(c: RunControl) -> ResumeReport:
            return await calls.resume_run(c.host, c.run_dir, c.resume_wait_s)

        return await self._every_node("resume", resume, ResumeReport)

    async def _every_node(
        self,
        op: str,
        call: Callable[[RunControl], Awaitable[calls.Report]],
        kind: type[calls.Report],
    ) -> calls.Report:
        """At once on every node (see calls.on_nodes); one merged report."""
        every = [self, *self.nodes]

        async def one(c: RunControl) -> tuple[str, calls.Report]:
            try:
                return c.where, await call(c)
            except TargetError as e:
                return c.where, calls.failure(e, kind)

        return calls.merge_results(op, list(await asyncio.gather(*(one(c) for c in every))))

    async def runs(self, all_users: bool = False) -> RunsReport:
        return await calls.list_runs(self.host, all_users)

    async def attach_plan(self, pid: int | None) -> AttachPlan | AttachResult:
        """What attaching ``pid`` would do, metrics written into this run directory (see
        calls.attach_plan). None: the training without telemetry this control watches,
        never another process of the host (another user's job, another directory's
        training); for a run directory, the host's only training."""
        if pid is None and self.process is not None:
            pid = self.process.pid
        return await calls.attach_plan(self.host, self.run_dir, pid)

    async def attach(self, plan: AttachPlan) -> AttachResult:
        return await calls.attach_run(self.host, plan)
