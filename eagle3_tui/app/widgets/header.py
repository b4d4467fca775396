"""The top of the screen: where the run is, whether data flows, how the run is doing."""

from __future__ import annotations

import math
import re
import time

from rich.text import Text
from textual.reactive import reactive, var
from textual.widgets import Static

from eagle3_tui.app.text import inert
from eagle3_tui.app.view import ViewState
from eagle3_tui.app.widgets.panels import KeptLines
from eagle3_tui.model.events import Event
from eagle3_tui.model.snapshot import EMPTY, Snapshot
from eagle3_tui.model.verdict import Health
from eagle3_tui.transport.base import Link, LinkChanged

HEALTH_STYLE = {
    Health.UNREADABLE: "bold #ffffff on #d70000",
    Health.WAITING: "bold #d0d0d0 on #3a3a3a",
    Health.RUNNING: "bold #101010 on #5fd75f",
    Health.FINISHED: "bold #101010 on #5fafd7",
    Health.STOPPED: "bold #101010 on #d7af5f",
    Health.SILENT: "bold #ffffff on #d70000",
    Health.STALLED: "bold #101010 on #ff8700",
    Health.DEAD: "bold #ffffff on #d70000",
    Health.DIVERGED: "bold #ffffff on #af00af",
    Health.DISK_FULL: "bold #ffffff on #d75f00",
    Health.COPY: "bold #d0d0d0 on #3a3a3a",
}
CALM = frozenset({Health.WAITING, Health.STOPPED, Health.COPY})
QUIET = frozenset({Health.RUNNING, Health.FINISHED})
LINK_DOWN_STYLE = "bold #101010 on #ffd75f"
OTHER_FILE_STYLE = "bold #ffffff on #af00af"
"""The header's tag while another file's history is shown (what the path holds now)."""


def link_text(link: LinkChanged, waited: float = 0.0) -> Text:
    """The connection state in a few words: connected, reconnecting in N s (``waited``:
    seconds since it was said, counted down), refused..."""
    state = link.link
    if state == Link.LOCAL:
        return Text("● local file", style="green")
    if state == Link.CONNECTED:
        return Text("● connected", style="green")
    if state == Link.CONNECTING:
        return Text("◌ connecting…", style="yellow")
    if state == Link.WAITING:
        return Text("◌ waiting for metrics.jsonl", style="yellow")
    if state == Link.RECONNECTING:
        # rounded up: a 0.2 s backoff reads "in 1 s", never "in 0 s"; none: trying now
        left = None if link.retry_in is None else link.retry_in - waited
        retry = f" in {math.ceil(left)} s" if left is not None and left > 0 else "…"
        return Text(f"◌ reconnecting{retry}", style="bold #101010 on #ffd75f")
    if state == Link.UNREADABLE:
        return Text("✖ cannot read metrics.jsonl", style="bold #ffffff on #d70000")
    return Text("✖ refused", style="bold #ffffff on #d70000")


def health_word(health: Health) -> str:
    """A health as the header writes it (``STALLED``, ``DISK FULL``)."""
    return health.value.upper().replace("_", " ")


NAMED_PID = re.compile(r"\bpid (\d+)\b")
"""The process a header note names ("resumed: pid 21786", "pid 4242")."""


def host_time(snap: Snapshot) -> float | None:
    """The run's host's clock as of ``snap`` (the client's where the host's is not known);
    None for the empty picture."""
    if snap is EMPTY:
        return None
    return snap.host_now if snap.host_now is not None else snap.now


def newest_process(snap: Snapshot) -> Event | None:
    """The start or resume record of the newest process the run's records show."""
    for event in reversed(snap.events):
        if event.event in ("start", "resume"):
            return event
    return None


def note_now(note: str, since: float | None, snap: Snapshot) -> str:
    """``note`` as the header shows it: where it names a process (``pid N``) and a
    process other than that one started or resumed the run after the note was said
    (``since``, the host's clock; a ``resume`` run from the command line while the
    monitor is open), the trainer now, as its records name it."""
    named = NAMED_PID.search(note)
    newest = newest_process(snap)
    if named is None or since is None or newest is None or newest.pid is None:
        return note
    if newest.pid == int(named.group(1)) or newest.ts <= since:
        return note
    return f"{'resumed' if newest.event == 'resume' else 'started'}: pid {newest.pid}"


class RunHeader(KeptLines):
    """One line: app, target, link, health, step and epoch, and the view's state."""

    snapshot: var[Snapshot] = var(EMPTY)
    """The picture of the run being shown (repaints only when what the line shows of
    it changed)."""
    link: reactive[LinkChanged] = reactive(LinkChanged(Link.CONNECTING))
    """Whether data flows from the run's host."""
    view: reactive[ViewState] = reactive(ViewState())
    """Window, smoothing, log scale, pause."""

    def __init__(self, target: str, note: str = "", **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.target = target
        self.note = note
        """Why this run is shown (the host's live training, its latest run...)."""
        self._note_at: float | None = None
        """When ``note`` was said, on the run's host's clock (None: at the first picture):
        a process started after it is the trainer shown (:func:`note_now`)."""
        self._inputs: object = None
        self.renders = 0
        self._link_at = time.monotonic()
        """When the link last changed (a reconnection's wait is counted down from it)."""

    def watch_link(self, link: LinkChanged) -> None:
        self._link_at = time.monotonic()
        if link.link == Link.RECONNECTING and link.retry_in is not None:
            self.set_timer(1.0, lambda: self._count_down(link))

    def _count_down(self, link: LinkChanged) -> None:
        """Once a second while a reconnection waits: its "in N s" counts down."""
        if self.link is not link:
            return
        self.refresh()
        if link.retry_in is not None and time.monotonic() - self._link_at < link.retry_in:
            self.set_timer(1.0, lambda: self._count_down(link))

    def show_target(self, target: str, note: str) -> None:
        """Another run is shown now (a restarted training, followed): where, and why."""
        self.target, self.note = target, note
        self._note_at = host_time(self.snapshot)
        self._inputs = None
        self.refresh()

    def watch_snapshot(self, snap: Snapshot) -> None:
        if self._note_at is None:  # the note said as the monitor opened: from now on
            self._note_at = host_time(snap)
        d, p = snap.diagnosis, snap.progress
        key = (d.label, d.health, d.link_down_since is None, snap.other_file is None)
        key2 = (p.step, p.total_steps, p.epoch, p.epochs_total, _source(snap), snap.history)
        key3 = note_now(self.note, self._note_at, snap)
        if (key, key2, key3) != self._inputs:
            self._inputs = (key, key2, key3)
            self.repaint_changed()

    def render(self) -> Text:
        self.renders += 1
        snap, view = self.snapshot, self.view
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(" eagle3-tui ", style="bold reverse")
        text.append(" ")
        d = snap.diagnosis
        if self.link.link == Link.UNREADABLE:  # this machine's file: no link is down
            text.append(" UNREADABLE ", style=HEALTH_STYLE[Health.UNREADABLE])
        elif d.link_down_since is not None:
            text.append(f" {d.label} ", style=LINK_DOWN_STYLE)
        else:
            text.append(f" {d.label} ", style=HEALTH_STYLE[d.health])
        if d.link_down_since is not None:
            # what is true now first, then the last verdict that reached us, in its own
            # colours whatever it was (an alarm never turns grey on a link drop, and no
            # health reads as current): "LINK DOWN last known STALLED", "… RUNNING"
            text.append(" last known ", style="dim")
            text.append(f" {health_word(d.health)} ", style=HEALTH_STYLE[d.health])
        if snap.other_file is not None:  # not this run's history: the path's file now
            text.append(" ")
            text.append(" OTHER FILE ", style=OTHER_FILE_STYLE)
        text.append(" ")
        text.append_text(link_text(self.link, time.monotonic() - self._link_at))
        text.append(" ")
        if view.paused:
            plural = "" if view.behind == 1 else "s"
            behind = f", {view.behind:,} step{plural} behind" if view.behind else ""
            text.append(f" ⏸ PAUSED{behind} ", style="bold #101010 on #87afff")
            text.append(" ")
        p = snap.progress
        if p.step is not None:
            text.append(f"step {p.step:,}", style="bold")
            if p.total_steps:
                text.append(f"/{p.total_steps:,}")
        if p.epoch is not None:
            total = f"/{p.epochs_total}" if p.epochs_total else ""
            text.append(f" · epoch {p.epoch}{total}")
        source = _source(snap)
        if source:
            text.append(f" · {source}", style="dim")
        if snap.history:  # opened at a glance: the rest is being read
            text.append(f" · {snap.history}", style="dim")
        text.append("  ")
        note = note_now(self.note, self._note_at, snap)
        if note:  # why this run (before the target, which may be long)
            text.append_text(inert(note, style="italic"))
            text.append(": ", style="dim")
        text.append_text(inert(self.target, style="dim"))
        return text


SOURCE_WORDS = {
    "tensorboard": "metrics from TensorBoard event files",
    "mlflow": "metrics from MLflow's store",
    "trackio": "metrics from trackio's database",
    "wandb": "metrics from W&B's run file",
    "json": "metrics from its own JSON handler",
    "printed": "metrics from its log",
}


def _source(snap: Snapshot) -> str | None:
    """Where the metrics of a run without telemetry come from (None: telemetry, or
    nowhere)."""
    obs = snap.observed
    if obs is None or obs.handler is None:
        return None
    return SOURCE_WORDS.get(obs.handler, "metrics from its own handler")


def banner_text(label: str, sentence: str) -> Text:
    text = Text()
    text.append(f" {label} ", style="bold reverse")
    text.append(" ")
    text.append_text(inert(sentence))
    text.no_wrap = False
    text.overflow = "fold"
    return text


def cut_here(sentence: str, room: int) -> str:
    """``sentence``'s first ``room`` characters and "…" where it is cut (a banner that
    stopped mid-word at its last line read as if that were all it said)."""
    if len(sentence) <= room:
        return sentence
    return sentence[:room].rstrip(" ,:;") + "…"


def keep_the_remedy(sentence: str, room: int) -> str:
    """``sentence`` cut to about ``room`` characters in its middle: its end (the cause
    and what to do: "…: the speculators.metrics logger has no handler … Attach live (a,
    …) …") is always shown, with its beginning (what is seen); the banner has at most
    three lines, and it cut the remedy ("Attach live (a, or")."""
    if len(sentence) <= room or room < 30:
        return sentence
    head_room = room // 3
    head = sentence[:head_room]
    # each side cut where a clause ends or starts, where one is near ("its CPU is busy …
    # complete in its output" read as one thought); else between words
    ends = [head.rfind(p) for p in (". ", "; ", ": ", ", ")]
    cut = max(ends)
    head = (
        head[: cut + 1]
        if cut >= head_room // 2
        else head[: head.rfind(" ")]
        if " " in head
        else head
    )
    tail = sentence[len(sentence) - (room - len(head) - 2) :]
    for p in (". ", "; ", ": ", ", "):
        at = tail.find(p)
        if 0 <= at <= len(tail) // 2:
            tail = tail[at + 2 :]
            break
    else:
        tail = tail[tail.find(" ") + 1 :] if " " in tail else tail
    return f"{head.rstrip(' ,:;')} … {tail}"


PAUSE_NOTE = "No metric for "
"""How the verdict on a run without telemetry begins where it is RUNNING with a note: no
metric for a while, but the trainer works, within the pauses it has shown
(``observed_health._quiet_with_metrics``)."""


class HealthBanner(Static):
    """A full-width bar with the diagnosis whenever the run is not simply running or
    finished, and when the host refuses us: the silent run cannot be missed. Also what
    happened to metrics.jsonl: while another file's history is shown, and for a while
    after any change of the file; and, dim, the note of a run running through a pause
    (no metric for a while: why it is not called silent, and until when)."""

    snapshot: var[Snapshot] = var(EMPTY, init=False)
    """The picture of the run being shown."""
    link: var[LinkChanged] = var(LinkChanged(Link.CONNECTING), init=False)
    """Whether data flows from the run's host."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._shown: tuple[str, str, str] | None = None
        self._height = 0
        """The lines the banner took when last drawn (0: none, or not drawn yet)."""

    def _room(self) -> int:
        """How many lines the banner may take."""
        return 2 if self.screen.has_class("-short") else 3

    def _lines(self, problem: tuple[str, str, str] | None) -> int:
        """How many lines ``problem`` takes at the banner's width (0: none, or the width
        is not known yet)."""
        width = self.content_size.width
        if problem is None or width <= 0:
            return 0
        wrapped = banner_text(problem[0], problem[1]).wrap(self.app.console, width)
        return min(self._room(), len(wrapped))

    def _problem(self) -> tuple[str, str, str] | None:
        """(label, sentence, CSS class) of what the banner says, or None."""
        if self.link.link == Link.REFUSED:
            return "REFUSED", self.link.detail or "the host refused the connection", "-alarm"
        if self.link.link == Link.UNREADABLE:
            return "UNREADABLE", self.link.detail or "metrics.jsonl cannot be read", "-alarm"
        snap = self.snapshot
        d = snap.diagnosis
        health = d.health
        if d.link_down_since is not None:  # judged on what arrived before the link went down
            cls = "-calm" if health in CALM or health in QUIET else "-alarm"
            return d.label, d.reason, cls
        if snap.other_file is not None:
            return "OTHER FILE", f"{snap.other_file}. It says: {d.label}: {d.reason}", "-alarm"
        if health == Health.FINISHED and any(not x.gone for x in snap.leftovers):
            return d.label, d.reason, "-calm"  # what outlived it, and that k ends them
        if health in QUIET:
            if snap.file_news:
                return "FILE", snap.file_news, "-calm"
            if health == Health.RUNNING and d.reason.startswith(PAUSE_NOTE):
                return d.label, d.reason, "-note"  # why a quiet run is not called silent
            return None
        if self.link.link == Link.WAITING and health == Health.WAITING:
            return "WAITING", self.link.detail or "waiting for metrics.jsonl", "-calm"
        cls = "-calm" if health in CALM else "-alarm"
        return d.label, d.reason, cls

    def watch_snapshot(self) -> None:
        self._update_state()

    def watch_link(self) -> None:
        self._update_state()

    def _update_state(self) -> None:
        """Laid out again only when what it says changed (its height follows its text):
        a layout of the whole screen on every snapshot cost more than any panel."""
        problem = self._problem()
        if problem == self._shown:
            return
        before, self._shown = self._shown, problem
        same_box = before is not None and problem is not None and before[::2] == problem[::2]
        if same_box and self._height > 0 and self._lines(problem) == self._height:
            self.refresh()  # new words in the same box ("No metric for 71 s")
            return
        self.refresh(layout=True)
        self.display = problem is not None
        self.set_class(problem is not None and problem[2] == "-alarm", "-alarm")
        self.set_class(problem is not None and problem[2] == "-calm", "-calm")
        self.set_class(problem is not None and problem[2] == "-note", "-note")

    def render(self) -> Text:
        problem = self._problem()
        self._height = self._lines(problem)
        if problem is None:
            return Text()
        label, sentence, _ = problem
        width = self.content_size.width
        text = banner_text(label, sentence)
        if width <= 0:
            return text
        lines = self._room()

        def fits(t: Text) -> bool:
            return len(t.wrap(self.app.console, width)) <= lines

        if self._height < lines or fits(text):
            return text
        # one sentence (a path, an error): its beginning matters most, cut where it says
        # so; else the longest middle cut that fits, its end (the remedy) kept
        cut, least = (cut_here, 0) if ". " not in sentence.rstrip() else (keep_the_remedy, 30)
        lo, hi = least, len(sentence)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(banner_text(label, cut(sentence, mid))):
                lo = mid
            else:
                hi = mid - 1
        return banner_text(label, cut(sentence, lo))
