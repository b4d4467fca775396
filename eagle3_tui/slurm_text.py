"""Slurm jobs for a person: the jobs ``runs`` lists (those that are speculators trainings,
a pending one's reason, an ended one's exit) and the scheduler's part of a kill or resume
report. No textual here."""

from __future__ import annotations

from eagle3_tui.model.inert import printable
from eagle3_tui.transport.replies import DiscoverReport, ResumeReport, SchedulerStep


def slurm_lines(result: DiscoverReport) -> list[str]:
    """The user's Slurm jobs that are speculators trainings (where the host has Slurm):
    each one's state (a pending one's reason, an ended one's exit), node and output."""
    if result.jobs_error:
        return ["", f"Slurm: {printable(result.jobs_error)}"]
    if result.jobs is None:
        return []
    trainings = [j for j in result.jobs if j.training]
    others = len(result.jobs) - len(trainings)
    head = f"Slurm jobs of {printable(result.user or '?')} that are speculators trainings"
    if not trainings:
        more = f" ({others} other job(s))" if others else ""
        return ["", f"{head}: none{more}"]
    rows = [("JOB", "NAME", "STATE", "OUTPUT")]
    for j in trainings:
        rows.append(
            (
                printable(j.array or j.id),
                printable((j.name or "-")[:24]),
                printable(j.state_text()),
                printable(j.stdout or "-"),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["", f"{head}:"]
    lines += [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {d}" for a, b, c, d in rows]
    if others:
        lines.append(f"({others} other job(s) of yours: not speculators trainings)")
    lines.append("(open one: eagle3-tui HOST:job/ID; summary, kill and resume take it too)")
    return lines


def scheduler_lines(step: SchedulerStep) -> list[str]:
    """The scheduler's part of a report, for a person."""
    name = printable(f"job {step.job}" + (f" ({step.name})" if step.name else ""))
    if step.action == "cancel":
        head = f"slurm    {name} cancelled through the scheduler (scancel)"
    elif step.action == "requeue":
        head = f"slurm    {name} requeued (scontrol requeue)"
    else:
        head = f"slurm    {name}"
    state = step.state or "?"
    if step.reason and state in ("PENDING", "REQUEUED"):
        state += f" ({step.reason})"
    elif step.exit_code is not None:
        code, sig = [*step.exit_code, 0, 0][:2]
        state += f" (signal {sig})" if sig else f" (exit {code})"
    lines = [f"{head}: now {state}"]
    if step.note:
        lines.append(f"         {step.note}")
    return lines


def with_scheduler(text: str, step: SchedulerStep) -> str:
    """A kill's report (its training's stop) with the scheduler's part after it."""
    return "\n".join([text, *scheduler_lines(step)])


def requeue_plan(step: SchedulerStep) -> str:
    """What ``r`` on a Slurm job will do, for the person who confirms it."""
    job = f"job {step.job}" + (f" ({step.name})" if step.name else "")
    return "\n".join(
        [
            f"requeue  {printable(job)} through Slurm (scontrol requeue; now {step.state})",
            "its batch script runs again, under Slurm, on the nodes it gives; the library "
            "continues from its newest numbered checkpoint (a stop saves one at its step)",
        ]
    )


def requeued(result: ResumeReport, step: SchedulerStep) -> str:
    """A Slurm job's resume: requeued, and its trainer once it runs."""
    lines = scheduler_lines(step)
    if result.pid is not None:
        lines.append(f"started: its trainer pid {result.pid}")
    else:
        lines.append(f"         {printable(result.message)}")
    if result.run_dir:
        lines.append(f"  metrics {printable(result.run_dir)}")
    return "\n".join(lines)
