"""What a command and the app say of a control report: the kill, resume, attach and
discover reports (``transport/replies.py``) written for a person, the progress lines of
a kill, and each report's and error's exit status (``eagle3_tui/exits.py``). The
transport does the I/O and the decoding; this module only reads what it decoded.
"""

from __future__ import annotations

import time
from typing import Any

from msgspec.structs import replace

from eagle3_tui import exits
from eagle3_tui.slurm_text import requeue_plan, requeued, with_scheduler
from eagle3_tui.transport.base import (
    NoPermissionError,
    SeveralRunsError,
    TargetError,
    UnreadableRunError,
    WrongKindError,
    printable,
)
from eagle3_tui.transport.channel import (
    AgentAnswerError,
    Event,
)
from eagle3_tui.transport.replies import (
    AttachedFirst,
    AttachPlan,
    AttachResult,
    CheckpointInfo,
    ErrorKind,
    KillReport,
    Redo,
    RestartRecord,
    ResumeReport,
    SaveWait,
    StopReport,
)

KILL_EXIT = {
    "stopped": exits.OK,
    "not_running": exits.OK,
    "refused": exits.REFUSED,
    "error": exits.ERROR,
}


EXIT_BY_KIND = {
    ErrorKind.NOT_TRAINING: exits.NOT_TRAINING,
    ErrorKind.PERMISSION: exits.PERMISSION,
    ErrorKind.GONE: exits.GONE,
    ErrorKind.NOT_NAMED: exits.NOT_NAMED,
    ErrorKind.REFUSED: exits.REFUSED,
    ErrorKind.WRONG_KIND: exits.WRONG_KIND,
}


def exit_status_of(error: TargetError) -> int:
    """The exit status an error stands for: by the agent's kind, else the generic one."""
    if isinstance(error, SeveralRunsError):
        return exits.SEVERAL
    if isinstance(error, NoPermissionError):
        return exits.PERMISSION
    if isinstance(error, WrongKindError):
        return exits.WRONG_KIND
    if isinstance(error, UnreadableRunError):
        return exits.UNREADABLE
    if isinstance(error, AgentAnswerError):
        return EXIT_BY_KIND.get(error.kind, exits.ERROR)
    return exits.ERROR


def kill_exit_status(result: KillReport) -> int:
    return KILL_EXIT.get(result.status, exits.INCOMPLETE)


def resume_exit_status(result: ResumeReport) -> int:
    if result.status == "started":
        return exits.OK
    return {"refused": exits.REFUSED, "error": exits.ERROR}.get(result.status, exits.INCOMPLETE)


def format_progress(ev: Event) -> str | None:
    step = ev.get("step")
    if step == "signal":
        result = ev.get("result")
        what = "sent" if result == "sent" else f"not sent: {result}"
        return f"{ev.get('signal')} -> pid {ev.get('pid')} ({ev.get('role')}): {what}"
    if step == "waiting":
        return (
            f"waiting for pid {ev.get('pid')} to save its checkpoint and exit "
            f"({float(ev.get('elapsed', 0)):.0f} s)"
        )
    if step == "timeout":
        return f"pid {ev.get('pid')} still alive after {ev.get('grace_s')} s: SIGKILL"
    if step == "joined":
        return (
            "another kill of this run is running: waiting for it, sending no signal "
            f"({float(ev.get('elapsed', 0)):.0f} s)"
        )
    if step == "stop":
        phase = ev.get("phase")
        if phase == "asked":
            return (
                "asked the trainer to stop at its next step boundary (SIGTERM after "
                f"{float(ev.get('wait_s', 0)):.0f} s without one)"
            )
        if phase in ("accepted", "scheduled"):
            return f"the ranks agree on the step to stop at ({phase})"
        if phase == "step_boundary":
            return "stopped at a step boundary: speculators saves interrupted/"
        if phase == "sigterm":
            if _while_starting(ev.get("reason")):
                return (
                    "it has logged no step since it started (still starting up): SIGTERM, "
                    "nothing of its own to save yet"
                )
            return "no stop at a step boundary: SIGTERM"
        return None
    if step == "attach_first":
        first = ev.get("first")
        if isinstance(first, AttachedFirst):  # the kill goes on to signal it, as before
            return attached_first_line(first, signalled_trainer=True)
        return f"attaching telemetry first ({ev.get('plan')}), so that it stops at a step boundary"
    if step == "save":
        return (
            f"a checkpoint save is in progress ({printable(str(ev.get('path')))}): waiting "
            f"for it to finish before the first signal ({float(ev.get('elapsed', 0)):.0f} s, "
            f"at most {float(ev.get('wait_s', 0)):.0f} s)"
        )
    return None


def _checkpoint_line(name: str, info: CheckpointInfo | None) -> str:
    if info is None:
        return f"  {name}: none"
    state = "complete" if not info.problems else "INCOMPLETE: " + "; ".join(info.problems)
    return (
        f"  {name}: {printable(info.path)}{_checkpoint_at(info.global_step, info.epoch)}, {state}"
    )


def _shown_step(global_step: object) -> object:
    """A record's 0-based ``step`` as every view numbers it (1-based)."""
    return global_step + 1 if isinstance(global_step, int) else global_step


def _checkpoint_at(global_step: int | None, epoch: int | None) -> str:
    """ " (step 48, epoch 2)": numbered as every view numbers them (1-based). A checkpoint's
    ``global_step`` is the steps done, so the last step's number; its ``epoch`` is
    speculators' 0-based index of the epoch it was saved in."""
    if global_step is None:
        return ""
    return f" (step {global_step}" + (f", epoch {epoch + 1})" if epoch is not None else ")")


STATUS_WORDS = {
    "not_running": "nothing to stop",
    "remaining": "not all gone",
    "already": "nothing to do",
}
"""A result's status in words where the agent's code is not one (the others, ``stopped``,
``refused``, ``started``, ``attached``, ``queued``, ``failed``, read as they are)."""


def status_line(status: str, message: str) -> str:
    """A report's first line, as the CLI prints it and the app's dialogs show it: the
    result's status in words, then what the host said (``nothing to stop: the run is
    not running``, never ``not_running: …``)."""
    words = STATUS_WORDS.get(status, status.replace("_", " "))
    return f"{words}: {printable(message)}"


def format_kill(result: KillReport) -> str:
    if result.slurm is not None:  # a Slurm job: the scheduler's part after the stop's
        return with_scheduler(format_kill(replace(result, slurm=None)), result.slurm)
    if result.nodes is not None:  # several nodes: each one's report under its name
        said = any(n.save_wait is not None for n in result.nodes)
        wait = result.save_wait if not said else None  # the first step's, on no node's own
        first = [save_wait_line(wait)] if wait is not None else []
        nodes = [f"== {printable(str(n.where))}\n{format_kill(n)}" for n in result.nodes]
        return "\n".join(first + nodes)
    lines = [status_line(result.status, result.message)]
    if result.attached_first is not None:
        lines.append(attached_first_line(result.attached_first, result.signalled_trainer))
    if result.save_wait is not None:
        lines.append(save_wait_line(result.save_wait))
    if result.processes:
        lines.append(f"  {'PID':>8}  {'ROLE':<18} {'COMMAND':<16} {'SIGNALS':<16} OUTCOME")
        for p in result.processes:
            signals = ",".join(p.signals) or "-"
            role = printable(p.label or p.role)[:18]
            ended = f" ({p.ended})" if p.ended else ""
            lines.append(
                f"  {p.pid:>8}  {role:<18} {printable(str(p.comm))[:16]:<16} "
                f"{signals:<16} {p.outcome}{ended}"
            )
    ckpt = result.checkpoints
    if ckpt.dir is not None:
        lines.append("checkpoints:")
        moved = result.stop.checkpoint if result.stop is not None else None
        if moved is not None:  # this stop's interrupted/, renamed: no longer at its path
            lines.append(f"  interrupted: written by this stop, now {printable(moved.path)}")
        else:
            lines.append(_interrupted_line(ckpt.interrupted, result))
        lines.append(_checkpoint_line("resume from", ckpt.latest))
    if result.stop is not None:
        lines.extend(stop_lines(result.stop))
    if result.restart is not None:
        lines.extend(restart_lines(result.restart, result.pid))
    return "\n".join(lines)


def attached_first_line(first: AttachedFirst, signalled_trainer: bool) -> str:
    """What the kill's attach-first step did; where it did not attach, whether the kill
    then SIGTERM'd the trainer as it would have without the step (``signalled_trainer``:
    False where no trainer was left to signal)."""
    if first.status == "attached":
        stopped = f", the trainer held {first.stopped_ms:.0f} ms" if first.stopped_ms else ""
        return (
            f"attached telemetry first ({first.mechanism}{stopped}, {first.took_s:.1f} s): "
            f"its metrics in {printable(str(first.run_dir))}"
        )
    said = f"not attached first ({status_line(first.status, first.message)})"
    return f"{said}: SIGTERM as before" if signalled_trainer else said


def _while_starting(reason: object) -> bool:
    """A kill's reason for its SIGTERM says the trainer was still starting up (it had
    logged no step since its process started: ``stopping.ask_for_stop`` asks nothing)."""
    from eagle3_tui.agent.stopping import NOT_STARTED  # (the agent's modules: when needed)

    return isinstance(reason, str) and reason.startswith(NOT_STARTED)


def stop_lines(stop: StopReport) -> list[str]:
    """How the kill stopped a run with telemetry, what its save holds (steps and epochs
    numbered from 1, as everywhere), and where a restart continues."""
    if stop.how == "step_boundary" and stop.global_step is not None:
        within = ""
        if stop.epoch is not None and stop.local_step is not None:
            within = f" (epoch {stop.epoch + 1}, step {stop.local_step} of the epoch)"
        lines = [
            f"stopped at a step boundary: the save holds global step {stop.global_step}"
            f"{within}; a restart continues at step {stop.global_step + 1}"
        ]
        if stop.checkpoint is not None:
            moved = stop.checkpoint.moved_aside
            lines.append(
                f"  interrupted/ is now {printable(stop.checkpoint.path)}, the checkpoint "
                "speculators resumes from mid-epoch"
                + (f"; the one that was there is kept as {printable(moved)}" if moved else "")
            )
        else:
            why = "; ".join(stop.not_converted) or "?"
            lines.append(f"  but its save did not become the numbered checkpoint: {printable(why)}")
    elif stop.how == "sigterm" and _while_starting(stop.reason):
        lines = [  # the trainer was loading: no step boundary would have come
            "SIGTERM'd during start-up, before its first step (none logged since the "
            "process started): nothing of its own to save yet"
        ]
    elif stop.how == "sigterm":
        lines = [f"SIGTERM'd mid-step: {printable(str(stop.reason))}"]
    elif stop.how in ("exited", "finished"):
        lines = [f"not stopped by the kill: {printable(str(stop.reason))}"]
    else:
        lines = ["its ranks stopped with node 0's, at the same step"]
    if stop.redo is not None and stop.how != "node0":
        redo = stop.redo
        from_step = _shown_step(redo.checkpoint_step)
        lines.append(
            f"  a restart redoes nothing: it continues at step {from_step}"
            if redo.steps == 0
            else f"  a restart redoes from step {from_step}: {redo.steps} step(s) (the "
            f"records reached step {_shown_step(redo.last_step)})"
        )
    return lines


def restart_lines(record: RestartRecord, pid: int | None) -> list[str]:
    """Where a kill recorded the restart of a training without telemetry, and what
    ``resume`` (``r``) will do with it."""
    if record.problem is not None or record.run_dir is None:
        return [f"restart: {printable(str(record.problem))}"]
    where = printable(record.run_dir)
    log = printable(record.log_file) if record.log_file else f"{where}/train.log"
    how = (
        "with telemetry, its metrics written there"
        if record.telemetry
        else f"WITHOUT telemetry ({printable(str(record.note))})"
    )
    recorded = (
        f"restart: recorded in {where} (its command line, working directory, all "
        f"{record.env_vars} environment variables, readable by its user only)"
    )
    if record.checkpoint_dir is None:  # resume refuses: it would start over
        return [
            recorded,
            "  no checkpoint directory of it was found (its working directory and the "
            "directories its command line names were looked in): a resume is refused; "
            "start your script again",
        ]
    return [
        recorded,
        f"  r, or eagle3-tui resume --pid {pid}: relaunches it from its latest complete "
        f"checkpoint in {printable(record.checkpoint_dir)} {how}; output appended to {log}",
    ]


def shown_command(cmd: list[str]) -> str:
    """A command line for a person: the telemetry bootstrap's code (telemetry/rerun.py)
    named, not quoted."""
    from eagle3_tui.telemetry.rerun import BOOTSTRAP

    return " ".join("<eagle3-tui telemetry>" if a == BOOTSTRAP else a for a in cmd)


REDO_SOURCES = {
    "metrics": "metrics.jsonl's last training step",
    "log": "its log's last metric line",
    "bar": "its log's progress bar",
}
"""Where a redo's last step was read (its ``source``), as the plan names it: the number
shown is the one that source gave (``stopping.redo_from_records``: metrics.jsonl;
``restart.redo``: the log)."""


def redo_line(redo: Redo | None) -> str:
    """The steps a resume will do again, and how that is known."""
    if redo is None:
        return "redo     not known (nothing records how far the run got after its checkpoint)"
    at = f"the checkpoint holds step {redo.checkpoint_step}"
    if redo.exact:
        last = _shown_step(redo.last_step)
        seen = REDO_SOURCES.get(redo.source, "its records")
        return f"redo     {redo.steps} step(s): {at}, the run's last was {last} ({seen})"
    since = f"{redo.since_s:.0f} s" if redo.since_s is not None else "?"
    pace = f"{redo.pace:.2f}" if redo.pace is not None else "?"
    return (
        f"redo     about {redo.steps} step(s): {at}; the run was stopped {since} after "
        f"that save, at {pace} steps/s (its checkpoints' pace)"
    )


def format_resume_plan(plan: ResumeReport) -> str:
    """What ``resume`` will launch (its ``plan``), for the person who confirms it."""
    if plan.slurm is not None:
        return requeue_plan(plan.slurm)
    ck = plan.checkpoint
    at = "" if ck is None else _checkpoint_at(ck.global_step, ck.epoch)
    lines = []
    if plan.restart:
        lines.append(
            "restart with telemetry (its command line, directory and environment, as its "
            "kill took them from the process)"
        )
    lines += [
        f"run      {printable(shown_command(plan.command))}",
        f"in       {printable(str(plan.cwd))}  (its whole environment: {plan.env_vars} variables)",
        f"log      {printable(str(plan.log))}  (appended, after a banner)",
        f"from     {printable(ck.path if ck is not None else '?')}{at}",
        redo_line(plan.redo),
    ]
    if plan.restart:
        lines.append(f"metrics  {printable(str(plan.run_dir))}  (the monitor follows it there)")
    lines.append("detached (new session, no hang-up)")
    return "\n".join(lines)


def save_wait_line(wait: SaveWait) -> str:
    """What a kill did about a checkpoint save it found in progress."""
    path = printable(wait.path)
    if wait.finished:
        return f"waited {wait.waited_s:.0f} s for the checkpoint save of {path} to finish first"
    return (
        f"the checkpoint save of {path} was still in progress after {wait.waited_s:.0f} s: "
        "signalled regardless (that checkpoint may be left incomplete)"
    )


def _interrupted_line(info: CheckpointInfo | None, result: KillReport) -> str:
    """What this kill saved: an ``interrupted/`` it did not write is not its result."""
    if info is not None and info.new:
        return _checkpoint_line("interrupted", info)
    if result.stop is not None and result.stop.how == "finished":
        why = "the training finished first"
    elif result.signalled_trainer:
        why = "the trainer exited without saving (it was still starting, or its save failed)"
    else:
        why = "no trainer was running to save it"
    line = f"  interrupted: nothing written by this kill: {why}"
    if info is not None:
        when = info.written_at
        at = (
            time.strftime(" from %Y-%m-%d %H:%M:%S", time.localtime(when))
            if when is not None
            else ""
        )
        line += f"; {printable(info.path)}{at} is an earlier stop's"
    return line


def format_resume(result: ResumeReport) -> str:
    if result.nodes is not None:
        return "\n".join(f"== {printable(str(n.where))}\n{format_resume(n)}" for n in result.nodes)
    if result.status in ("refused", "error"):  # one node's, in a multi-node report
        return status_line(result.status, result.message)
    if result.slurm is not None:  # a Slurm job: requeued, and its training once it runs
        return requeued(result, result.slurm)
    if result.status != "started":
        lines = [f"failed: {printable(result.message)} (pid {result.pid})"]
        if result.log_tail:
            lines.append(f"last lines of {printable(str(result.log))}:")
            lines.extend("  " + printable(line) for line in result.log_tail.splitlines())
        return "\n".join(lines)
    ck = result.checkpoint
    confirmed = "" if result.confirmed else " (its manifest has not been updated yet)"
    at = "" if ck is None else _checkpoint_at(ck.global_step, ck.epoch)
    lines = [
        f"started: pid {result.pid}{confirmed}",
        f"  from {printable(ck.path if ck is not None else 'None')}{at}",
        f"  log  {printable(str(result.log))}",
    ]
    if result.restart:  # a run that had no telemetry has it now
        lines.append(f"  with telemetry: its metrics in {printable(str(result.run_dir))}")
    if result.redo is not None:
        lines.append("  " + redo_line(result.redo))
    return "\n".join(lines)


def _when(ts: object) -> str:
    if not isinstance(ts, int | float):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(ts)))


# Exit statuses of `attach` by the agent's status or reason (eagle3_tui/exits.py).
ATTACH_EXIT = {
    "gone": exits.GONE,
    "reused": exits.GONE,
    "permission": exits.PERMISSION,
    "traced": exits.PERMISSION,
    "not_python": exits.NOT_ATTACHABLE,
    "unsupported": exits.NOT_ATTACHABLE,
    "not_trainer": exits.NOT_ATTACHABLE,
    "no_gdb": exits.NO_WAY_IN,
    "gdb_unusable": exits.NO_WAY_IN,
    "remote_debug_off": exits.NO_WAY_IN,
    "already": exits.ALREADY,
    "queued": exits.QUEUED,
    "run_dir": exits.ERROR,
    "choose": exits.WHICH_PROCESS,
    "failed": exits.ATTACH_FAILED,
}


def attach_exit_status(result: AttachPlan | AttachResult) -> int:
    status = result.status
    if status in ("attached", "plan"):
        return exits.OK
    if status in ("already", "queued"):
        return ATTACH_EXIT[status]
    reason = result.reason if isinstance(result, AttachResult) else None
    return ATTACH_EXIT.get(str(reason), exits.ATTACH_FAILED)


def _ms(value: Any) -> str:
    if not isinstance(value, int | float):
        return "?"
    return f"{float(value):.1f} ms" if value < 10 else f"{float(value):.0f} ms"


MECHANISMS = {
    "ptrace": "eagle3-tui's injector (ptrace): Py_AddPendingCall, at the next safe point "
    "of its main thread (only that thread is stopped, for milliseconds; every register, "
    "AMX included, given back)",
    "gdb": "gdb: Py_AddPendingCall, at the next safe point of its main thread (the process "
    "is stopped while gdb is attached: a few hundred ms)",
    "remote_exec": "sys.remote_exec (PEP 768), at the next safe point of its main thread",
}
"""The plan's ``how``, by mechanism."""


def format_attach_plan(plan: AttachPlan) -> str:
    """What attach will do, for the person who confirms it."""
    how = MECHANISMS.get(plan.mechanism, printable(plan.mechanism))
    if plan.mechanism == "gdb" and plan.injector_problem:
        how += f"; not eagle3-tui's injector: {printable(plan.injector_problem)}"
    argv = " ".join(plan.argv)
    lines = [
        f"attach telemetry to pid {plan.pid} on {printable(str(plan.host))} "
        f"(user {printable(plan.user)})",
        f"  command  {printable(argv)[:300]}",
        f"  python   {printable(plan.python.label)}",
        f"  how      {how}",
        f"  trainer  {printable(plan.evidence)}",
        f"  metrics  {printable(str(plan.run_dir))}  (metrics.jsonl, run.json)",
    ]
    if plan.log_file:
        lines.append(f"  log      {printable(plan.log_file)}")
    lines.append(
        f"  files    {printable(str(plan.files))}  (the telemetry package, private to "
        f"{printable(plan.user)}; nothing is installed)"
    )
    if plan.torchrun:
        lines.append("  note     under torchrun only this rank is attached now; resume relaunches")
        lines.append("           torchrun's own command with telemetry in every rank")
    return "\n".join(lines)


def _stopped(result: AttachResult) -> str:
    """How long the injection held the trainer, and by what."""
    mechanism = result.plan.mechanism if result.plan is not None else ""
    if mechanism == "ptrace":
        checked = ", registers given back and checked" if result.registers == "verified" else ""
        if result.registers == "differs":
            checked = ", registers read back DIFFERENT from the saved ones"
        return f"main thread stopped {_ms(result.stopped_ms)} by eagle3-tui's injector{checked}"
    if mechanism == "gdb":
        return f"process stopped {_ms(result.stopped_ms)} by gdb"
    return f"stopped {_ms(result.stopped_ms)}"


def format_attach(result: AttachResult) -> str:
    status = result.status
    lines = [status_line(status, result.message)]
    if status == "attached":
        run_dir = printable(str(result.run_dir))
        bounds = ""
        if result.total_steps:
            bounds = f" of {result.total_steps} ({result.epochs} epochs)"
        lines.append(f"  step     {result.global_step}{bounds}")
        lines.append(f"  run      {run_dir}")
        if result.checkpoint_dir:
            lines.append(f"  ckpts    {printable(result.checkpoint_dir)}")
    pause = []
    if result.stopped_ms is not None:
        pause.append(_stopped(result))
    if result.pause_ms is not None:
        pause.append(f"main thread ran the attach for {_ms(result.pause_ms)}")
    if pause:
        lines.append("  pause    " + "; ".join(pause))
    if result.first_metric_s is not None:
        lines.append(
            f"  first    metrics of step {_shown_step(result.first_step)} "
            f"{result.first_metric_s:.1f} s after the attach"
        )
    elif status == "attached":
        lines.append("  first    no step logged yet (the next one brings the first metrics)")
    if result.traceback:
        lines.append("  traceback (in the trainer, caught there):")
        lines.extend("    " + printable(t) for t in result.traceback.splitlines()[-12:])
    if status == "queued" and result.result_file:
        lines.append("  ask again with the same command to see when it ran")
    return "\n".join(lines)
