"""A Slurm job as a target (``LOGIN:job/ID``): where its training runs, and the
scheduler's part in stopping and resuming it.

The login host's Slurm says what the job is (``jobs``). A running job's training is
named on the node that runs its batch script: the login host itself when the job's
processes are there, else the node, reached through the login host (ssh's jump), whose
own Slurm names the job's trainer among its processes. A pending job has no training
yet: it is ``waiting``, with the scheduler's reason. An ended one is the run registered
as that job (its manifest keeps ``SLURM_JOB_ID``).

Stopping one (``kill``) stops its training as every stop does (at a step boundary, or
SIGTERM to the trainer alone: the library's save signal; then every process of it
verified gone), then ends what is left of the job through the scheduler (``scancel``: a
script that goes on after the training); a pending job is cancelled. Resuming one
(``resume``) requeues it (``scontrol requeue``): its script runs again, and the library
continues from the numbered checkpoint the stop saved.

No textual here.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace

import msgspec

from eagle3_tui.api.reading import pinned_to
from eagle3_tui.transport import calls
from eagle3_tui.transport.base import TargetError
from eagle3_tui.transport.replies import (
    JobControlReport,
    JobsReport,
    JobTraining,
    ResumeReport,
    SchedulerStep,
    SlurmJob,
)
from eagle3_tui.transport.slurm import job_control, slurm_jobs
from eagle3_tui.transport.target import LocalTarget, SshTarget, Target

REQUEUE_POLL_S = 1.0


class NoTrainingYetError(TargetError):
    """The job runs, but none of its processes is a speculators training yet (its
    interpreter still starting, importing torch), or none at all."""


@dataclass(frozen=True)
class JobPlace:
    """Where a job's training is, as of one look."""

    job: SlurmJob
    login: Target
    """Where Slurm answered (the target without its job)."""
    where: Target | None
    """The host of its training (the login host, or its node through it), pinned to its
    run directory where one is known; None: nothing to read (pending, or ended without
    a run)."""
    pid: int | None
    """Its trainer, while it runs."""
    telemetry: bool = False
    """``where`` is pinned to the run the trainer writes (read and stopped as a run
    directory, not watched from outside as a process)."""

    @property
    def note(self) -> str:
        said = f"Slurm {self.job.label}: {self.job.state_text()}"
        if self.pid is not None:
            said += f", its trainer pid {self.pid}"
        return said


def login_of(t: Target) -> Target:
    return replace(t, job=None)


def node_target(login: Target, node: str) -> SshTarget:
    """A node of the job, reached through the login host (ssh's jump), as the same user."""
    if isinstance(login, LocalTarget):
        return SshTarget(node)  # this machine is the login node: the node by its name
    hop = login.destination + (f":{login.options.port}" if login.options.port else "")
    jump = f"{login.options.jump},{hop}" if login.options.jump else hop
    return SshTarget(node, login.user, None, replace(login.options, port=None, jump=jump))


async def _one_job(at: Target, job_id: str, label: str) -> JobsReport:
    report = await calls.on_host(at, lambda h: slurm_jobs(h, job=job_id))
    if not report.slurm:
        why = f" ({report.note})" if report.note else ""
        raise TargetError(f"{label}: no Slurm on {report.host or at.label}{why}")
    return report


async def locate(t: Target, label: str | None = None) -> JobPlace:
    """Where the job ``t`` names has its training (see the module's rules)."""
    assert t.job is not None
    label = label or t.label
    login = login_of(t)
    report = await _one_job(login, t.job, label)
    if not report.jobs:
        raise TargetError(
            f"{label}: Slurm on {report.host} knows no job {t.job} (scontrol; sacct where "
            "accounting keeps ended jobs)"
        )
    job = report.jobs[0]
    if job.pending or (job.active and not job.running):
        return JobPlace(job, login, None, None)
    if job.running:
        if job.training_row is not None:
            return _running(job, login, login, job.training_row)
        if job.here:
            raise NoTrainingYetError(
                f"{label}: {job.label} runs on {report.host}, but none of its processes is a "
                "speculators training (yet: one still importing torch is not told apart)"
            )
        node = job.node
        if node is None:
            raise TargetError(f"{label}: Slurm names no node for {job.label}")
        at = node_target(login, node)
        there = await _one_job(at, job.id, label)
        found = there.jobs[0] if there.jobs else None
        if found is None or found.training_row is None:
            raise NoTrainingYetError(
                f"{label}: {job.label} runs on {node}, but none of its processes there is a "
                "speculators training (yet)"
            )
        return _running(job, login, at, found.training_row)
    if job.run_dir is not None:  # ended: the run registered as this job
        return JobPlace(job, login, pinned_to(login, job.run_dir), None)
    return JobPlace(job, login, None, None)


def _running(job: SlurmJob, login: Target, at: Target, row: JobTraining) -> JobPlace:
    if row.telemetry and row.run_dir:
        return JobPlace(job, login, pinned_to(at, row.run_dir), row.pid, telemetry=True)
    return JobPlace(job, login, at, row.pid)


def no_run_error(place: JobPlace, label: str) -> TargetError:
    job = place.job
    out = f" (its output: {job.stdout})" if job.stdout else ""
    return TargetError(
        f"{label}: {job.label} {job.state_text()}; no run with telemetry is registered as "
        f"this job{out}"
    )


def step_of(
    job: SlurmJob, action: str | None = None, ctl: JobControlReport | None = None
) -> SchedulerStep:
    after = ctl.job if ctl is not None and ctl.job is not None else job
    return SchedulerStep(
        job=job.array or job.id,
        name=job.name,
        action=action,
        state=after.state,
        reason=after.reason if after.pending else None,
        exit_code=after.exit_code if not after.active else None,
        said=ctl.said if ctl is not None else None,
        note=ctl.note if ctl is not None else None,
    )


async def cancel(place: JobPlace) -> SchedulerStep:
    """End what is left of the job through the scheduler (nothing where it has ended)."""
    job = place.job
    now = await _one_job(place.login, job.id, place.login.label)
    latest = now.jobs[0] if now.jobs else job
    if not latest.active:
        return step_of(latest)
    ctl = await calls.on_host(place.login, lambda h: job_control(h, job.id, "cancel"))
    return step_of(latest, "cancel", ctl)


async def requeue(t: Target, wait: float, label: str) -> tuple[SchedulerStep, JobPlace | None]:
    """Requeue the ended job ``t`` names, then wait up to ``wait`` s for its training to
    run again (its new place, or None)."""
    place = await locate(t, label)
    job = place.job
    if job.active:
        raise TargetError(
            f"{label}: {job.label} is {job.state_text()}: nothing to resume (stop it first: "
            f"eagle3-tui kill {label})"
        )
    if job.source != "scontrol" or not job.batch:
        raise TargetError(
            f"{label}: Slurm no longer keeps {job.label} ({job.state}): submit its script "
            "again (sbatch), the library continues from its newest numbered checkpoint"
        )
    ctl = await calls.on_host(place.login, lambda h: job_control(h, job.id, "requeue"))
    step = step_of(job, "requeue", ctl)
    deadline = time.monotonic() + max(0.0, wait)
    while True:
        try:
            again = await locate(t, label)
        except NoTrainingYetError:
            again = None  # running, its trainer still importing torch
        if again is not None:
            step = msgspec.structs.replace(step, state=again.job.state, reason=again.job.reason)
            if again.pid is not None or not again.job.active:
                return step, again
        if time.monotonic() >= deadline:
            return step, None
        await asyncio.sleep(REQUEUE_POLL_S)


async def requeue_report(
    t: Target, wait: float, label: str
) -> tuple[ResumeReport, JobPlace | None]:
    """:func:`requeue`, as the resume report ``resume`` and ``r`` show (and the job's new
    place, once its training runs)."""
    step, place = await requeue(t, wait, label)
    found = place is not None and place.pid is not None
    run_dir = None  # a training without telemetry writes no run
    if place is not None and place.telemetry and place.where is not None:
        run_dir = calls.run_dir_of(place.where)
    report = ResumeReport(
        status="started",
        message="" if found else "its training has not started yet",
        pid=place.pid if place is not None else None,
        confirmed=found,
        run_dir=run_dir,
        slurm=step,
    )
    return report, place
