"""What a run, a process or another user wrote is inert in every output.

Another user on a shared box plants a process that discovery takes for a training (a
Python process with a ``libtorch`` file mapped, ``speculators`` in its argv), from a
working directory whose name, like its argv and its log, holds what a terminal acts
on: OSC 0 (the window's title), OSC 52 (the clipboard), SGR, Rich markup, C1 controls,
a line separator, a bidi override, DEL. As root, the headless commands print it
escaped (``\\x1b``, ``\\u202e``) and their JSON decodes to the very string; the
monitor shows it escaped and its markup as written wherever it appears (header,
notification, dialogs, chooser, compare picker, log), and in a real terminal (tmux)
the pane's title and the clipboard stay as they were.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from textual.widget import Widget
from textual.widgets import OptionList, Static

from eagle3_tui.app.app import make_app
from eagle3_tui.app.chooser import LiveChooser
from eagle3_tui.app.run_control import RunControl
from eagle3_tui.app.screens.attach import AttachDialog
from eagle3_tui.app.screens.runs import RunPicker
from eagle3_tui.app.widgets.header import RunHeader
from eagle3_tui.app.widgets.log import LogPanel
from eagle3_tui.model.inert import json_ascii, printable
from eagle3_tui.transport import calls
from eagle3_tui.transport.channel import LocalHost
from eagle3_tui.transport.observed import ObservedTransport
from eagle3_tui.transport.replies import Choice
from eagle3_tui.transport.target import LocalTarget
from tests.app.conftest import open_dialog, text_of
from tests.app.test_tmux import Tmux
from tests.conftest import SYSTEM_PYTHON, OtherUser, need, until, wait_until
from tests.transport.fakes import dead_pid, fake_manifest, register

HOSTILE = (
    "[red]x[/red]"  # Rich markup
    "\x1b]0;pwned\x07"  # OSC 0: the window's and the pane's title
    "\x1b]52;c;ZXZpbA==\x07"  # OSC 52: "evil" into the clipboard
    "\x1b[31mred"  # SGR: red from here on
    "\x9b31m\x85"  # C1: an 8-bit CSI, NEL
    "\u2028\u202eevil\x7f"  # line separator, right-to-left override, DEL
)
"""The planted process's last argument and a line of its log; its working directory
ends with the same text (``/`` is a separator there: ``[red]x[`` is a directory)."""

ESCAPED = (
    "[red]x[/red]\\x1b]0;pwned\\x07\\x1b]52;c;ZXZpbA==\\x07\\x1b[31mred"
    "\\x9b31m\\x85\\u2028\\u202eevil\\x7f"
)
"""How every output shows :data:`HOSTILE`."""

BIDI_AND_SEPARATORS = "\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"

PLANTED = """\
import ctypes, os, sys, time
ctypes.CDLL(os.path.abspath("libtorch_x.so"))  # what discovery reads as torch loaded
log = os.open("train.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
os.dup2(log, 1)  # as `nohup python ... > train.log`
print("speculators: epoch starts " + sys.argv[-1], flush=True)
with open("ready.tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename("ready.tmp", "ready")
time.sleep(600)
"""


@dataclass(frozen=True)
class Planted:
    pid: int
    cwd: str
    runuser: subprocess.Popen[bytes]

    @property
    def where(self) -> str:
        """The working directory as every output shows it."""
        return self.cwd[: -len(HOSTILE)] + ESCAPED


def a_shared_library() -> str:
    """A small shared library of the system, loadable twice (zlib, mapped here by the
    ``zlib`` module)."""
    import zlib  # noqa: F401 - maps libz

    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if re.search(r"/libz\.so[.\d]*$", path):
                return path
    pytest.skip("no libz mapped here")


@pytest.fixture
def planted(other_user: OtherUser, shared_dir: Path) -> Iterator[Planted]:
    """The other user's process, from a working directory named with :data:`HOSTILE`,
    with it in its argv and its log; killed (with the user) afterwards."""
    need(os.path.exists(SYSTEM_PYTHON), f"{SYSTEM_PYTHON} (the interpreter every user may run)")
    script = shared_dir / "planted.py"
    script.write_text(PLANTED)
    script.chmod(0o644)
    cwd = shared_dir / HOSTILE
    cwd.mkdir(parents=True)
    shutil.copy(a_shared_library(), cwd / "libtorch_x.so")
    for path in (cwd.parent, cwd, cwd / "libtorch_x.so"):
        os.chown(path, other_user.uid, other_user.gid)
    runuser = other_user.popen(
        SYSTEM_PYTHON, str(script), "speculators", HOSTILE, cwd=cwd, stdin=subprocess.DEVNULL
    )
    try:
        ready = cwd / "ready"
        wait_until(lambda: ready.exists() or runuser.poll() is not None, 30, "the process")
        assert runuser.poll() is None, "the planted process did not start"
        yield Planted(int(ready.read_text()), str(cwd), runuser)
    finally:
        if runuser.poll() is None:
            subprocess.run(["pkill", "-KILL", "-u", other_user.name], check=False)
        runuser.wait(30)


# ---- the two boundary functions ---------------------------------------------------------


@given(st.text())
def test_printable_leaves_nothing_a_terminal_acts_on(text: str) -> None:
    shown = printable(text, keep="\n")
    assert all(c.isprintable() or c == "\n" for c in shown)
    assert shown.count("\n") == text.count("\n")  # the report's lines stay its lines
    assert "\n" not in printable(text)  # without keep: one line
    if text.isprintable():
        assert printable(text) == text  # printable text is shown as it is


@given(
    st.recursive(
        st.text() | st.floats(allow_nan=False, allow_infinity=False),
        lambda x: st.lists(x) | st.dictionaries(st.text(), x),
    )
)
def test_json_ascii_keeps_the_value_and_nothing_else(value: object) -> None:
    for encoded in (
        json.dumps(value),
        json.dumps(value, ensure_ascii=False),
        msgspec.json.encode(value).decode(),
    ):
        shown = json_ascii(encoded)
        assert shown.isascii() and "\x7f" not in shown
        assert all(c.isprintable() for c in shown)
        assert json.loads(shown) == value


# ---- the headless commands ---------------------------------------------------------------


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    """``eagle3-tui ARGS`` as root, its output the bytes a terminal would get."""
    return subprocess.run(
        [sys.executable, "-m", "eagle3_tui", *args],
        capture_output=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def inert(out: bytes) -> str:
    """``out`` as text, once nothing in it is what a terminal acts on: no ESC, BEL or DEL
    byte, valid UTF-8 (no stray 0x80-0x9f byte), no C1 control, line separator or bidi
    character; nothing but printable characters and the lines' own newlines."""
    for byte in (b"\x1b", b"\x07", b"\x7f"):
        assert byte not in out, f"raw {byte!r} in {out!r}"
    text = out.decode("utf-8")  # strict
    raw = [c for c in text if "\x80" <= c <= "\x9f" or c in BIDI_AND_SEPARATORS]
    assert not raw, f"raw {raw!r} in {text!r}"
    odd = [c for c in text if not (c.isprintable() or c == "\n")]
    assert not odd, f"unprintable {odd!r} in {text!r}"
    return text


def test_headless_commands_print_a_planted_process_inert(planted: Planted) -> None:
    pid = str(planted.pid)

    summary = cli("summary", "--pid", pid)
    assert summary.returncode in (0, 3, 4), summary  # a verdict, not an error
    text = inert(summary.stdout)
    assert f"in {planted.where};" in text  # the whole directory, escaped
    assert f"log      {planted.where}/train.log" in text
    assert f"speculators {ESCAPED[:40]}" in text  # its argv (cut to 100 characters)
    assert planted.where in inert(summary.stderr)  # the note that says what was chosen

    as_json = cli("summary", "--pid", pid, "--json")
    assert as_json.returncode in (0, 3, 4), as_json
    assert as_json.stdout.isascii() and "\\u001b]0;pwned\\u0007" in inert(as_json.stdout)
    observed = json.loads(as_json.stdout)["observed"]
    assert observed["cwd"] == planted.cwd and observed["command"][-1] == HOSTILE
    assert observed["log_file"] == f"{planted.cwd}/train.log" and observed["user"] != "root"

    runs = cli("runs")  # this machine's live trainings (every user's, as root)
    assert runs.returncode == 0, runs
    row = next(line for line in inert(runs.stdout).splitlines() if f" {pid} " in line)
    assert planted.where in row, row
    runs_json = cli("runs", "--json")
    assert runs_json.returncode == 0, runs_json
    shown = inert(runs_json.stdout)
    assert runs_json.stdout.isascii() and "\\u009b31m\\u0085\\u2028\\u202eevil\\u007f" in shown
    live = next(r for r in json.loads(runs_json.stdout)["live"] if r["pid"] == planted.pid)
    assert live["cwd"] == planted.cwd and live["command"][-1] == HOSTILE

    killed = cli("kill", "--pid", pid, "--grace", "10")
    assert killed.returncode == 0, killed
    report = inert(killed.stdout)
    assert report.startswith("stopped: ") and pid in report, report
    assert planted.where in inert(killed.stderr)  # what was chosen: the process, its directory
    assert planted.runuser.wait(30) is not None  # the process (and runuser with it) ended
    assert not os.path.exists(f"/proc/{planted.pid}")


# ---- the monitor -------------------------------------------------------------------------


def title_of(widget: Widget) -> tuple[str, int]:
    """A border title as drawn: its text, and how many styled spans it has (markup that
    was parsed would leave ``[red]`` out of the text and a span in)."""
    title = widget._border_title
    assert title is not None
    return title.plain, len(title.spans)


async def test_every_part_of_the_monitor_shows_a_planted_process_inert(
    planted: Planted, tmp_path: Path
) -> None:
    # a run of root's index named likewise, for the compare picker
    old = tmp_path / HOSTILE
    fake_manifest(old, dead_pid(), f"inert-{os.getpid()}", status="finished")
    register(Path(os.environ["XDG_STATE_HOME"]), f"inert-{os.getpid()}", old)
    host = LocalHost()
    chosen = await calls.choose(host, None, planted.pid)  # what `eagle3-tui --pid` does
    assert chosen.choice is Choice.PROCESS
    row = chosen.chosen_row()
    app = make_app(
        ObservedTransport(host, row),
        control=RunControl.for_process(LocalTarget(Path(".")), host, row),
        note=chosen.note,
        chosen=chosen.short,
        refresh_interval=0.05,
    )
    async with app.run_test(size=(200, 50)) as pilot:
        header = app.query_one(RunHeader)
        await until(pilot, lambda: planted.where in text_of(header, 400), what="the header")
        note = next(n for n in app._notifications if n.title == "chosen")
        assert planted.where in note.message and not note.markup
        log = app.query_one(LogPanel)
        await until(pilot, lambda: "epoch starts" in text_of(log, 400), what="the log line")
        # the log's colours (CSI) dropped; the agent drops OSC; the rest escaped
        assert "epoch starts [red]x[/red]red\\x85\\u2028\\u202eevil\\x7f" in text_of(log, 400)

        dialog = await open_dialog(app, pilot, "k")
        title, spans = title_of(dialog.query_one("#control"))
        assert title.endswith(planted.where) and spans == 0, title
        plan = text_of(dialog.query_one("#plan", Static), 400)
        assert f"run  pid {planted.pid} planted.py in {planted.where}" in plan, plan
        await pilot.press("escape")

        await pilot.press("a")
        await until(pilot, lambda: isinstance(app.screen, AttachDialog), what="attach")
        attach = app.screen
        assert isinstance(attach, AttachDialog)
        await until(pilot, lambda: attach.state != "loading", timeout=30, what="its plan")
        title, spans = title_of(attach.query_one("#attach"))
        assert title.endswith(planted.where) and spans == 0, title
        await pilot.press("escape")

        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, RunPicker), what="the picker")
        picker = app.screen
        assert isinstance(picker, RunPicker)
        options = picker.query_one("#runs", OptionList)
        await until(pilot, lambda: options.option_count > 0, timeout=30, what="runs")
        listed = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
        assert any(f"finished     {str(old)[: -len(HOSTILE)]}{ESCAPED}" in r for r in listed)
        await pilot.press("escape")
        assert app.title == "eagle3-tui" and app.sub_title == ""  # nothing of the run

    several = msgspec.structs.replace(chosen, choice=Choice.SEVERAL, runs=[row, row])
    chooser = LiveChooser(several)
    async with chooser.run_test(size=(200, 20)) as pilot:
        title, spans = title_of(chooser.query_one("#chooser"))
        assert spans == 0 and "[red]" not in title  # the host's name, inert
        options = chooser.query_one("#live", OptionList)
        assert planted.where in str(options.get_option_at_index(0).prompt)
        await pilot.press("q")


def test_the_terminal_keeps_its_title_and_clipboard(planted: Planted, tmp_path: Path) -> None:
    """In tmux: the kill and attach dialogs on the planted process show it escaped, and
    nothing of it reaches the terminal raw (the pane's title, tmux's paste buffers)."""
    need(shutil.which("tmux") is not None, "tmux is not installed (apt-get install tmux)")
    monitor = [sys.executable, "-m", "eagle3_tui", "--pid", str(planted.pid)]
    command = "env -u COLUMNS -u LINES TZ=UTC TERM=xterm-256color " + shlex.join(monitor)
    tmux = Tmux(tmp_path / "tmux.sock")

    def title() -> str:
        return tmux.run("display", "-p", "#{pane_title}").strip()

    try:
        # the pane waits for a line: its title and the clipboard's capture are set first
        tmux.run("new-session", "-d", "-x", "160", "-y", "45", f"read _ && exec {command}")
        tmux.run("set", "-g", "set-clipboard", "on")  # an OSC 52 would fill a paste buffer
        tmux.run("select-pane", "-T", "before-the-monitor")
        tmux.keys("Enter")
        tmux.wait(lambda s: "no telemetry" in s and "epoch starts" in s, 60, "the monitor")
        tmux.keys("k")
        plan = tmux.wait(lambda s: "SIGTERM" in s and "run  pid" in s, 60, "the kill plan")
        assert title() == "before-the-monitor"
        assert tmux.run("list-buffers").strip() == ""  # no OSC 52 reached the terminal
        line = next(x for x in plan.splitlines() if "run  pid" in x)
        assert "[red]x[/red]\\x1b]0;pwned\\x07\\x1b]52;c;ZXZpbA==" in line, plan
        tmux.keys("Escape")
        tmux.wait(lambda s: "SIGTERM" not in s, 30, "the kill dialog to close")
        tmux.keys("a")
        shown = tmux.wait(lambda s: "attach telemetry to a" in s, 60, "the attach dialog")
        line = next(x for x in shown.splitlines() if "attach telemetry to a" in x)
        assert "/[red]x[/red]\\x1b]0" in line, shown  # the title, cut to the dialog's width
        assert title() == "before-the-monitor"
        assert tmux.run("list-buffers").strip() == ""  # no OSC 52 reached the terminal
        tmux.keys("Escape")
        tmux.wait(lambda s: "attach telemetry to a" not in s, 30, "the attach dialog to close")
        tmux.keys("q")
        tmux.wait(lambda s: "no telemetry" not in s, 30, "the monitor to quit")
    finally:
        tmux.run("kill-server")
    assert os.path.exists(f"/proc/{planted.pid}")  # nothing was signalled
