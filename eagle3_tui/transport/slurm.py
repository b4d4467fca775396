"""The client's calls of the agent's Slurm operations (``jobs``, ``job_control``; their
replies are typed in ``replies.py``). A job is a target (``HOST:job/ID``); where its
training runs is ``api/slurm.py``'s to find.

No textual here; asyncssh only when a host target is opened.
"""

from __future__ import annotations

from eagle3_tui.agent.names import OP_JOB_CONTROL, OP_JOBS
from eagle3_tui.transport.calls import python_of
from eagle3_tui.transport.channel import Host, call_agent
from eagle3_tui.transport.replies import JobControlReport, JobsReport, decode


async def slurm_jobs(host: Host, job: str | None = None, everyone: bool = False) -> JobsReport:
    """The user's jobs on ``host`` (its login node, or a node of the job: there the
    job's training is named), or the one job ``job``."""
    request: dict[str, object] = {"op": OP_JOBS, "all": everyone}
    if job is not None:
        request["job"] = job
    ev = await call_agent(host, request, python=python_of(host))
    return decode(JobsReport, ev.fields, host.label)


async def job_control(host: Host, job: str, action: str) -> JobControlReport:
    """``cancel`` or ``requeue`` the job through the scheduler on ``host``."""
    request = {"op": OP_JOB_CONTROL, "job": job, "action": action}
    ev = await call_agent(host, request, python=python_of(host))
    return decode(JobControlReport, ev.fields, host.label)
