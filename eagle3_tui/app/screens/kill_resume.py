"""``k`` and ``r``: what will be done to the run, a confirmation, then what happened.

The dialog first asks the run's host (through the agent, local or over SSH) for
the manifest and whether its trainer lives, and says exactly what will be
signalled or launched; after the confirmation it shows the agent's report: each
PID and how it ended, or the new PID. Refusals and errors are shown here.
"""

from __future__ import annotations

import time

from rich.console import Group, RenderableType
from rich.text import Text
from textual import work
from textual.message import Message
from textual.widgets import Static

from eagle3_tui.app.run_control import RunControl
from eagle3_tui.app.screens.dialog import ConfirmDialog, headed
from eagle3_tui.app.text import duration, inert, size
from eagle3_tui.model.snapshot import EMPTY
from eagle3_tui.reports import format_kill, format_progress, format_resume, format_resume_plan
from eagle3_tui.transport.channel import Event
from eagle3_tui.transport.replies import KillReport, ResumeReport, Status

STOP_WAITS = ("asked", "accepted", "scheduled")
"""The phases of a step-boundary stop that wait (their progress lines say no time)."""


def _when(ts: object) -> str:
    if not isinstance(ts, int | float):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(ts)))


def started_line(status: Status) -> str:
    """When the trainer started, as the host knows it: the process's own start (the
    kernel's: boot time plus its start ticks), never when telemetry was attached to it
    mid-way (the manifest's ``started_at`` then); where only the telemetry's start is
    known (a resumed run's manifest keeps its first run's start), said as that."""
    m = status.manifest
    row = status.row
    first = m.get("first_started_at")
    if row is not None and row.started is not None:  # describe: the agent's /proc read
        own: object = row.started
    elif m.get("observed"):  # a discovered training's identity: its row's start
        own = m.get("started_at")
    elif isinstance(first, int | float) and not m.get("resumes"):
        own = first  # the telemetry's read of its process's start (boot time + ticks)
    else:
        return f"its telemetry started {_when(m.get('started_at'))}"
    return f"started {_when(own)}"


STARTING, STEPPING = "starting", "stepping"
"""What the records say of the trainer since its process began (:func:`since_start`)."""


def since_start(app: object, pid: object) -> str | None:
    """What the monitor's records say of the trainer ``pid`` since its process began, as
    a kill decides on it (``stopping.ask_for_stop``): :data:`STARTING` (its start or
    resume record and no step since: a kill sends it SIGTERM at once, asking nothing),
    :data:`STEPPING` (a step logged since, or its telemetry attached to it live: asked to
    stop at a step boundary); None where the records read so far do not show that
    process (not yet read, no telemetry, another view)."""
    if not isinstance(pid, int) or isinstance(pid, bool):
        return None
    pipeline = getattr(app, "pipeline", None)
    run = getattr(pipeline, "run", None)
    starting = getattr(getattr(run, "unsettled", None), "starting", None)
    if starting is not None:  # a process that has logged no step yet: this trainer?
        return STARTING if starting.pid == pid else None
    snap = getattr(app, "snapshot", EMPTY)
    for event in reversed(snap.events):
        if event.event == "attach" and event.pid == pid:
            return STEPPING  # attached live: it trained before; a kill asks it
        if event.event in ("start", "resume"):  # the newest process the records know
            return STEPPING if event.pid == pid and run is not None else None
    return None


def kill_plan(
    status: Status,
    control: RunControl,
    saving: str | None = None,
    since: str | None = None,
) -> RenderableType:
    """What ``k`` will signal, from the host's answer to ``status`` (``saving``: the
    checkpoint the records show being written now, if any; ``since``: what the records
    say of the trainer since its process began, :func:`since_start`)."""
    m = status.manifest
    lines: list[Text] = []
    if control.kills_under_way:  # this monitor's earlier k, not ended yet
        lines.append(
            Text(
                "A kill of this run from this monitor is still under way (its result is "
                "shown when it ends): confirmed now, this one waits for it to end and sends "
                "no signal of its own.",
                style="bold #ffd75f",
            )
        )
    if not status.alive:
        why = status.problem or "its trainer is not running"
        left = status.leftovers
        if not left:
            lines.append(inert(f"Nothing to stop: {why}.", style="bold #d7af5f", wrap=True))
            lines.append(
                Text(
                    "Kill still looks for processes of the run that outlived its trainer (by "
                    "its marker, or what a look at it recorded) and ends them."
                )
            )
            return Group(*lines)
        lines.append(
            inert(
                f"The trainer is gone ({why}), but {len(left)} process(es) of the run remain: "
                "SIGTERM, then SIGKILL after 3 s:",
                style="bold #d7af5f",
                wrap=True,
            )
        )
        for x in left[:12]:
            mem = f"  {size(x.rss_bytes)} RAM" if x.rss_bytes is not None else ""
            mem += f"  {size(x.gpu_bytes)} GPU" if x.gpu_bytes else ""
            lines.append(inert(f"  pid {x.pid}  {x.comm}{mem}"))
        return Group(*lines)
    pid, pgid = m.get("pid"), m.get("pgid")
    launcher = m.get("launcher_pid")
    held = status.state == "T"  # SIGSTOP, Ctrl-Z: the kill continues it first
    if held:
        lines.append(
            inert(
                f"The trainer (pid {pid}) is held stopped (state T: a SIGSTOP or Ctrl-Z): "
                "it is continued first (SIGCONT), as is every held process of the run; a "
                "stopped process takes no stop request and acts on no SIGTERM.",
                style="bold #d7af5f",
                wrap=True,
            )
        )
    starting = since == STARTING
    if isinstance(m.get("stop"), dict) and starting:  # stopping.ask_for_stop: not asked
        lines.append(
            inert(
                f"The trainer (pid {pid}) has logged no step since it started (still "
                "starting up: no step boundary comes while it loads): it is sent SIGTERM, "
                "not asked to stop at a step boundary; nothing of its own to save yet. "
                "Should it log a step before the kill begins, it is asked to stop at that "
                "step boundary instead.",
                style="bold #d7af5f",
                wrap=True,
            )
        )
    elif isinstance(m.get("stop"), dict):  # its telemetry stops at a step boundary when asked
        asked = (
            "is continued (SIGCONT), then asked to stop, not sent SIGTERM"
            if held
            else "is asked, not signalled"
        )
        # the records do not show this trainer's start: the kill's rule said too
        unseen = (
            ""
            if since == STEPPING
            else " A trainer that has logged no step since it started (still starting up) "
            "is sent SIGTERM at once instead: nothing of its own to save yet."
        )
        lines.append(
            inert(
                f"Stop at the next step boundary: the trainer (pid {pid}) {asked}; right "
                "after a step it saves checkpoints/interrupted/ and exits, "
                f"and that save becomes the checkpoint a resume continues from (no step "
                f"redone).{unseen} Only if no step boundary comes in time (max(60 s, 5 "
                "median steps, 1.5 × its longest gap)):",
                style="bold #5fd75f",
                wrap=True,
            )
        )
    elif control.observed and not isinstance(launcher, int):  # no telemetry: attached first
        lines.append(
            inert(
                f"Attach telemetry first (as a does: milliseconds of the trainer's main "
                f"thread), then stop at the next step boundary: the trainer (pid {pid}) saves "
                "checkpoints/interrupted/ right after a step and that save becomes the "
                "checkpoint a restart continues from (no step redone). Where attach is "
                "refused, or no step boundary comes in time:",
                style="bold #5fd75f",
                wrap=True,
            )
        )
    head = Text()
    head.append("SIGTERM ", style="bold #ff5f5f")
    ranks = sorted(p.pid for p in status.processes if p.first and p.pid != launcher)
    if isinstance(launcher, int) and ranks:  # what the kill does under torchrun
        head.append_text(
            inert(f"each rank at once (pids {', '.join(map(str, ranks))}) ", style="bold")
        )
        head.append_text(inert(f"not the torchrun agent (pid {launcher}): it exits by itself; "))
    elif isinstance(launcher, int):  # pid, pgid: what the run's manifest says, inert
        head.append(f"the torchrun agent, pid {launcher} ", style="bold")
        head.append_text(inert(f"(trainer pid {pid}), "))
    else:
        head.append_text(inert(f"the trainer, pid {pid} ", style="bold"))
        head.append_text(inert(f"(group {pgid}: not the whole group), "))
    head.append("on ")
    head.append_text(inert(status.host or m.get("host") or "?", style="bold"))
    lines.append(head)
    lines.append(
        inert(
            f"{started_line(status)}; its start time (tick {m.get('start_ticks')}) "
            "and boot id are checked again before the signal",
            wrap=True,
        )
    )
    lines.append(inert(f"run  {status.run_dir or control.where}", style="dim"))
    lines.extend(_planned(status))
    if saving:
        now = Text(style="bold #ffd75f")
        now.append("The run is writing ")
        now.append_text(inert(saving))
        now.append(
            f" now: the signal waits for that save to finish (up to "
            f"{duration(control.save_wait_s)}; Esc then closes this, the kill goes on)."
        )
        lines.append(now)
    else:
        lines.append(
            Text(
                f"If the run is writing a checkpoint, the signal waits for that save to finish "
                f"(up to {duration(control.save_wait_s)}): a SIGTERM in the middle of a save "
                "leaves that checkpoint incomplete."
            )
        )
    saves = (
        "speculators then saves checkpoints/interrupted/ and exits"
        if not starting
        else "before its training loop a SIGTERM ends it at once, nothing saved; in the "
        "loop, speculators saves checkpoints/interrupted/ and exits"
    )
    lines.append(
        Text(
            f"{saves}; after {duration(control.kill_grace_s)} whatever of the run remains "
            "(dataloader workers, escaped processes) gets SIGTERM, then SIGKILL."
        )
    )
    if control.job is not None:  # what the scheduler is then asked
        lines.append(
            inert(
                f"Then Slurm: {control.job.label} is cancelled (scancel) if its script goes on "
                "after the training; not scancel --signal, which would reach its dataloader "
                "workers too and break the save.",
                wrap=True,
            )
        )
    return Group(*lines)


def _planned(status: Status) -> list[Text]:
    """Every process the kill would act on now, one row each (all of them: the dialog's
    body scrolls), labelled as the kill's report labels it (``rank 1``, ``worker, rank
    0``, ``sidecar``, ``torchrun agent``), those the first SIGTERM goes to first."""
    if not status.processes:
        return []
    rows = [Text(f"{len(status.processes)} process(es) of the run now:", style="bold")]
    for p in sorted(status.processes, key=lambda p: (not p.first, p.pid)):
        row = Text("  ")
        row.append("SIGTERM  " if p.first else "then     ", style="bold #ff5f5f" if p.first else "")
        row.append_text(inert(f"pid {p.pid:<8} {p.label or p.role:<18} {p.comm}"))
        rows.append(row)
    return rows


def resume_plan(status: Status, control: RunControl) -> RenderableType:
    """What ``r`` will launch."""
    m = status.manifest
    lines: list[Text] = []
    if status.alive:
        lines.append(
            inert(
                f"The run's trainer is still alive (pid {m.get('pid')}"
                f"{', held stopped' if status.state in ('T', 't') else ''}): resume will be "
                "refused (k stops it first).",
                style="bold #d7af5f",
            )
        )
    cmd = m.get("resume_command")
    shown = " ".join(str(a) for a in cmd) if isinstance(cmd, list) else "(no resume_command)"
    t = Text()
    t.append("run ", style="bold")
    t.append_text(inert(shown, wrap=True))
    lines.append(t)
    lines.append(inert(f"in   {m.get('cwd') or status.run_dir}", style="dim"))
    lines.append(inert(f"on   {status.host or m.get('host') or '?'}", style="dim"))
    lines.append(
        Text(
            "detached (new session, no hang-up), output appended to the run's log, only if the "
            "latest numbered checkpoint is complete (checked on the host)."
        )
    )
    return Group(*lines)


def report_text(result: KillReport | ResumeReport) -> tuple[str, bool]:
    """The report as text, and whether it went as asked."""
    text = format_kill(result) if isinstance(result, KillReport) else format_resume(result)
    return text, result.status in ("stopped", "not_running", "started")


def report(result: KillReport | ResumeReport) -> RenderableType:
    text, ok = report_text(result)
    return headed(text, "bold #5fd75f" if ok else "bold #ff5f5f")


class ControlDialog(ConfirmDialog):
    """Kill or resume: the plan, a confirmation, the verified result."""

    class Finished(Message):
        """A kill or resume ran to its end (whatever it found)."""

        def __init__(self, op: str, result: KillReport | ResumeReport) -> None:
            super().__init__()
            self.op = op
            self.result = result

    def __init__(self, op: str, control: RunControl) -> None:
        title = "kill the run" if op == "kill" else "resume the run"
        super().__init__(
            control,
            box_id="control",
            title=f"{title} · {control.where}",
            asking="Asking the host about the run…",
            confirm="Kill (y)" if op == "kill" else "Resume (y)",
            variant="error",
        )
        self.op = op
        self.progress: list[str] = []
        self._progress_key: tuple[object, ...] | None = None

    @work(exclusive=True, group="control", exit_on_error=False)
    async def load(self) -> None:
        if self.op == "resume" and not self.control.nodes:  # (a multi-node run: each node's)
            await self._load_restart()
            return
        try:
            status = await self.control.status(plan=self.op == "kill")
        except Exception as e:  # shown: no manifest, unreachable host, refused key...
            if not self.is_attached:
                return  # closed meanwhile
            self.failed(inert(f"Cannot {self.op}: {e}", style="bold #ff5f5f", wrap=True))
            return
        if not self.is_attached:
            return
        if self.op == "kill":
            saving = getattr(self.app, "snapshot", EMPTY).saving
            since = since_start(self.app, status.manifest.get("pid"))
            self.ready(kill_plan(status, self.control, saving, since))
        else:
            self.ready(resume_plan(status, self.control))

    async def _load_restart(self) -> None:
        """``r``: the host's plan, every check made there (a refusal shown before any
        question): the command, directory, environment, log, the checkpoint and the
        steps it will redo; for a training without telemetry the restart its kill
        recorded, for a Slurm job its requeue."""
        try:
            plan = await self.control.resume_plan()
        except Exception as e:  # shown: not killed yet, no record, no complete checkpoint
            if self.is_attached:
                self.failed(inert(f"Cannot resume: {e}", style="bold #ff5f5f", wrap=True))
            return
        if self.is_attached:
            lines = format_resume_plan(plan).splitlines()
            self.ready(Group(*(inert(line, wrap=True) for line in lines)))

    def _on_progress(self, ev: Event) -> None:
        line = format_progress(ev)
        if line is not None:
            # a wait told again (every few seconds): one line, its time counting
            key = (ev.get("step"), ev.get("phase"), ev.get("pid"))
            elapsed = ev.get("elapsed")
            waiting = ev.get("step") == "stop" and ev.get("phase") in STOP_WAITS
            if waiting and isinstance(elapsed, int | float) and elapsed >= 1:
                line = f"{line} · {elapsed:.0f} s so far"
            if self.progress and key == self._progress_key:
                self.progress[-1] = line
            else:
                self.progress.append(line)
            self._progress_key = key
            if self.is_attached:
                self.query_one("#outcome", Static).update(
                    Group(*(inert(p, style="dim") for p in self.progress[-8:]))
                )

    def execute(self) -> None:
        """The kill or resume, as a worker of the app, not of this dialog: the dialog may
        be closed while it works (a kill that waits for a checkpoint save can take
        minutes), and the result is then said in a notification."""
        outcome = self.query_one("#outcome", Static)
        outcome.update(Text("Stopping the run…" if self.op == "kill" else "Launching…"))
        self.app.run_worker(self._execute(), name=self.op, group="control-op", exit_on_error=False)

    async def _execute(self) -> None:
        result: KillReport | ResumeReport
        try:
            if self.op == "kill":
                result = await self.control.kill(on_progress=self._on_progress)
            else:
                result = await self.control.resume()
        except Exception as e:  # shown: a refusal (still running, no checkpoint), a lost link
            self.state = "failed"
            if not self.is_attached:
                self.app.notify(f"{self.op} failed: {e}", severity="error", timeout=20)
                return
            self.show_outcome(inert(f"{self.op} failed: {e}", style="bold #ff5f5f", wrap=True))
        else:
            self.state = "done"
            self.app.post_message(self.Finished(self.op, result))
            if not self.is_attached:
                text, ok = report_text(result)
                self.app.notify(
                    text.splitlines()[0],
                    title=self.op,
                    severity="information" if ok else "error",
                    timeout=20,
                )
                return
            self.show_outcome(report(result))
        self.closing(focus=True)

    def action_close(self) -> None:
        if self.state == "working":  # it goes on: the host finishes it either way
            self.notify(f"the {self.op} goes on; its result will be shown when it ends", timeout=5)
            self.dismiss(None)
            return
        super().action_close()
