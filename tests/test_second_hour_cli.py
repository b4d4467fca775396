"""Issue 28 on the command line: input that cannot be read (item 2) and the words a
person meets (item 7).

Unreadable input is made as the issue found it, by ``chmod 000`` on a run directory
or one of its files, and the CLI is run as a user the mode refuses. That user is root
without the two capabilities that let root read any file (``setpriv --bounding-set
-dac_override,-dac_read_search``): the kernel then checks the mode bits for root as
for any file's owner, so mode 000 refuses it with the same ``EACCES`` an ordinary user
meets on their own file. (Another user cannot run the suite's interpreter at all: it
lives under /root, mode 0700; ``/usr/bin/python3`` has none of the CLI's packages.)
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3_tui.telemetry import manifest as mf
from tests.app.test_tmux import Tmux, tmux  # noqa: F401 - the fixture
from tests.conftest import need
from tests.records import Lines
from tests.transport.fakes import dead_pid, fake_manifest

EXIT_MISSING = 2
EXIT_PERMISSION = 21
EXIT_WRONG_KIND = 25

NO_DAC = ("setpriv", "--bounding-set=-dac_override,-dac_read_search", "--")
"""Root as the mode bits see it: no CAP_DAC_OVERRIDE, no CAP_DAC_READ_SEARCH."""


def cli(
    *args: str, as_owner: bool = False, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``eagle3-tui ARGS``, without a terminal; ``as_owner``: refused by mode bits."""
    prefix = NO_DAC if as_owner else ()
    return subprocess.run(
        [*prefix, sys.executable, "-m", "eagle3_tui", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


def one_line(proc: subprocess.CompletedProcess[str], status: int) -> str:
    """The one line on stderr of a command that failed with ``status`` (nothing on
    stdout, no traceback)."""
    assert proc.returncode == status, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    assert proc.stdout == "", proc.stdout[-2000:]
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.stderr


def a_run(run_dir: Path, manifest: bool = True) -> Path:
    """A run directory with ten steps of records (and a manifest whose trainer is gone)."""
    if manifest:
        fake_manifest(run_dir, dead_pid(), f"r-{run_dir.name}", status="running")
    else:
        run_dir.mkdir()
    lines = Lines()
    (run_dir / "metrics.jsonl").write_bytes(b"".join(lines.train(s, 2.0) for s in range(10)))
    return run_dir


@pytest.fixture
def refused_by_mode(tmp_path: Path) -> None:
    """Checks that the mode bits refuse the CLI's user here (else the tests below would
    pass for the wrong reason)."""
    need(os.geteuid() == 0 and shutil.which("setpriv") is not None, "root and setpriv")
    probe = tmp_path / "probe"
    probe.write_text("x")
    probe.chmod(0)
    proc = subprocess.run(
        [*NO_DAC, sys.executable, "-c", f"open({str(probe)!r})"], capture_output=True, check=False
    )
    assert proc.returncode != 0 and b"PermissionError" in proc.stderr, proc.stderr


# ---- item 2: unreadable input ---------------------------------------------------------


def command_line(command: str, run: Path, other: Path) -> tuple[str, ...]:
    """The arguments of ``command`` on ``run`` (``other``: the second run of compare)."""
    return {
        "summary": ("summary", str(run)),
        "summary --json": ("summary", str(run), "--json"),
        "kill": ("kill", str(run)),
        "compare A": ("compare", str(run), str(other)),
        "compare B": ("compare", str(other), str(run)),
        "monitor": (str(run),),
    }[command]


COMMANDS = ["compare A", "compare B", "kill", "monitor", "summary", "summary --json"]


@pytest.mark.usefixtures("refused_by_mode")
@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(
    ("what", "telemetry"),
    [
        ("run directory", True),
        ("metrics.jsonl", True),
        ("run.json", True),
        ("metrics.jsonl", False),
    ],
)
def test_a_chmod_000_input_is_one_line_naming_it(
    tmp_path: Path, command: str, what: str, telemetry: bool
) -> None:
    """``chmod 000`` on a run directory, its metrics.jsonl or its run.json: one line
    naming the path and saying it may not be read, exit 21, in every command (today: a
    PermissionError traceback, or 'no run.json here', or the monitor's 'DEAD refused')."""
    run = a_run(tmp_path / "run", manifest=telemetry)
    other = a_run(tmp_path / "other")
    path = run if what == "run directory" else run / what
    path.chmod(0)
    err = one_line(cli(*command_line(command, run, other), as_owner=True), EXIT_PERMISSION)
    assert f"{path}: " in err and "permission denied" in err, err


@pytest.mark.usefixtures("refused_by_mode")
def test_the_monitor_says_unreadable_while_it_cannot_read_and_reads_on_after(
    tmp_path: Path,
    tmux: Tmux,  # noqa: F811 - the fixture
) -> None:
    """The real monitor in tmux, as the user the mode refuses: the run directory made
    ``chmod 000`` while it is shown says UNREADABLE with the path and why (before: the
    stream died, 'REFUSED PermissionError: [Errno 13]…' and '✖ refused'); given back
    its mode, the monitor reads on (a step appended meanwhile is shown)."""
    run = a_run(tmp_path / "run")
    monitor = [*NO_DAC, sys.executable, "-m", "eagle3_tui", str(run)]
    command = "env -u COLUMNS -u LINES TERM=xterm-256color " + shlex.join(monitor)
    tmux.run("new-session", "-d", "-x", "120", "-y", "30", command)
    tmux.wait(lambda s: "step 10 " in s and "local file" in s, 60, "the run shown")
    run.chmod(0)
    shown = tmux.wait(lambda s: "UNREADABLE" in s, 30, "the UNREADABLE banner")
    head = " ".join(shown.split())
    assert f"{run}/metrics.jsonl: permission denied (its directory {run}: mode 000" in head
    assert "cannot read metrics.jsonl" in head and "refused" not in head, head
    assert "Error" not in head, head
    run.chmod(0o755)
    lines = Lines(t0=1_000_010.0)  # a_run's writer, on from its tenth record
    lines.seq = 10
    with open(run / "metrics.jsonl", "ab") as f:
        f.write(lines.train(10, 1.5))
    tmux.wait(lambda s: "step 11 " in s and "local file" in s, 30, "the step written meanwhile")
    assert "UNREADABLE" not in tmux.screen()


def test_exit_statuses_are_documented_in_the_help() -> None:
    """Every command that reads a run says 21 and 25 in its --help."""
    for command in ("summary", "kill", "compare"):
        text = " ".join(cli(command, "--help").stdout.split())
        assert "21 no permission" in text and "25 not what it should be" in text, text
    text = cli("--help").stdout
    assert "21" in text and "25" in text, text


WRONG_KINDS = ["run dir is a file", "metrics is a directory", "metrics is a FIFO", "dangling link"]


@pytest.mark.parametrize("command", ["summary", "kill", "compare A", "compare B", "monitor"])
@pytest.mark.parametrize("kind", WRONG_KINDS)
def test_an_input_of_the_wrong_kind_is_one_line(tmp_path: Path, command: str, kind: str) -> None:
    """A file where a run directory should be, a directory, a FIFO or a dangling link
    where metrics.jsonl should be: one line naming it, exit 25 (today: 2 like a missing
    run, or 'no run.json here', or 'no metrics.jsonl here' for a link that is there)."""
    other = a_run(tmp_path / "other")
    run = tmp_path / "run"
    if kind == "run dir is a file":
        run.write_text("{}\n")
        named = run
    else:
        run.mkdir()
        named = run / "metrics.jsonl"
        if kind == "metrics is a directory":
            named.mkdir()
        elif kind == "metrics is a FIFO":
            os.mkfifo(named)
        else:
            named.symlink_to(tmp_path / "nowhere")
    err = one_line(cli(*command_line(command, run, other)), EXIT_WRONG_KIND)
    assert f"{named}: " in err, err


@pytest.mark.parametrize("command", ["summary", "kill", "compare A", "compare B", "monitor"])
def test_a_missing_run_is_one_line_and_2(tmp_path: Path, command: str) -> None:
    other = a_run(tmp_path / "other")
    run = tmp_path / "nothing"
    err = one_line(cli(*command_line(command, run, other)), EXIT_MISSING)
    assert f"{run}: no such run directory" in err, err


# ---- item 7: words --------------------------------------------------------------------


@pytest.mark.parametrize("args", [("sumary", "RUN"), ("sumary",), ("kil", "RUN"), ("comapre",)])
def test_a_mistyped_command_is_named(tmp_path: Path, args: tuple[str, ...]) -> None:
    """``eagle3-tui sumary RUN``: 'did you mean summary?', never 'several targets are
    the nodes of one run' nor 'cannot resolve host name'."""
    run = a_run(tmp_path / "RUN")
    err = one_line(cli(*args, cwd=tmp_path), 2)
    meant = {"sumary": "summary", "kil": "kill", "comapre": "compare"}[args[0]]
    assert f"did you mean 'eagle3-tui {meant}'" in err, err
    assert "several targets" not in err and "host name" not in err, err
    assert run.is_dir()


def test_a_directory_named_like_a_typo_is_still_a_target(tmp_path: Path) -> None:
    """A word that names an existing directory is that directory, however it is spelt."""
    a_run(tmp_path / "sumary")
    proc = cli("summary", "sumary", cwd=tmp_path)
    assert proc.returncode != 2 and "did you mean" not in proc.stderr, proc.stderr


def test_help_is_the_help() -> None:
    """``eagle3-tui help`` prints the help (not 'cannot resolve host name');
    ``eagle3-tui help summary`` the command's."""
    proc = cli("help")
    assert proc.returncode == 0 and proc.stdout == cli("--help").stdout, proc.stderr
    assert "summary RUN_DIR" in proc.stdout
    proc = cli("help", "summary")
    assert proc.returncode == 0 and proc.stdout.startswith("usage: eagle3-tui summary"), proc
    err = one_line(cli("help", "sumary"), 2)
    assert "did you mean 'eagle3-tui summary'" in err, err


@pytest.mark.parametrize(
    "args",
    [
        ("--pid", "-5"),
        ("--pid", "0"),
        ("--pid", "abc"),
        ("summary", "--pid", "-5"),
        ("kill", "--pid", "0"),
        ("resume", "--pid", "-1"),
        ("attach", "--pid", "0"),
        ("summary", ".", "--pid", "1.5"),
    ],
)
def test_a_pid_that_cannot_be_one_is_a_usage_error(args: tuple[str, ...]) -> None:
    """``--pid -5``: one line saying a PID is a whole number from 1, exit 2 (today:
    'pid -5: no such process (it has exited)', exit 22)."""
    err = one_line(cli(*args), 2)
    assert "--pid" in err and "a process ID is a whole number from 1" in err, err
    assert "exited" not in err, err


@pytest.mark.parametrize(
    "args",
    [
        ("kill", "run", "--grace", "-1"),
        ("kill", "run", "--save-wait", "nan"),
        ("kill", "run", "--grace", "inf"),
        ("resume", "run", "--wait", "-0.5"),
        ("attach", "--pid", "1", "--wait", "x"),
        ("watch", "run", "--hold", "nan"),
        ("fleet", "--interval", "inf"),
        ("demo", "--step-delay", "-2"),
    ],
)
def test_a_duration_that_cannot_be_one_is_a_usage_error(args: tuple[str, ...]) -> None:
    """``kill --grace -1``: one line, exit 2 (it was taken: a SIGKILL at once, in the
    middle of the trainer's save; ``nan`` and ``inf`` too), before anything is done."""
    err = one_line(cli(*args), 2)
    assert f"argument {args[-2]}" in err and "a number of seconds, 0 or more" in err, err


def test_a_usage_error_is_one_line() -> None:
    err = one_line(cli("summary", "--grace", "3"), 2)
    assert "unknown option --grace" in err and "(see eagle3-tui summary --help)" in err


@pytest.mark.parametrize("spelling", ["same", "slash", "relative", "link"])
def test_a_run_compared_with_itself_is_said(tmp_path: Path, spelling: str) -> None:
    """``compare RUN RUN`` (however the second is spelt): one line saying it is the same
    run, exit 2, not a table of zero differences."""
    run = a_run(tmp_path / "run")
    b = {
        "same": str(run),
        "slash": f"{run}/",
        "relative": "./run",
        "link": str(tmp_path / "link"),
    }[spelling]
    (tmp_path / "link").symlink_to(run)
    err = one_line(cli("compare", str(run), b, cwd=tmp_path), 2)
    assert "the same run" in err and str(run) in err, err


def test_two_copies_of_a_run_still_compare(tmp_path: Path) -> None:
    run = a_run(tmp_path / "run")
    shutil.copytree(run, tmp_path / "copy")
    proc = cli("compare", str(run), str(tmp_path / "copy"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)


def test_kill_of_a_run_that_is_not_running_says_it_in_words(tmp_path: Path) -> None:
    """The kill's report (and the app's dialog, which shows the same text) leads with
    words, not the agent's status code ('not_running: the run is not running')."""
    run = a_run(tmp_path / "run")
    proc = cli("kill", str(run))
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert "not_running" not in proc.stdout and "_" not in first.split(":")[0], first
    assert first == "nothing to stop: the run is not running", first


def test_runs_columns_line_up_and_the_footnote_reads(tmp_path: Path) -> None:
    """``runs``: a registered run stopped by a kill (its manifest's ``interrupted``) is
    ``stopped`` as ``summary`` says it, under its owner's name and its first start (not
    its last resume's); a directory started afresh is one row; its columns stay under
    their headings, and the note on gone runs is a sentence."""
    interrupted = tmp_path / "interrupted"
    reused = fake_manifest(interrupted, dead_pid(), f"old-{tmp_path.name}", status="finished")
    mf.register_run(reused)  # the directory's first run, then a new one started there
    m = fake_manifest(
        interrupted,
        dead_pid(),
        f"int-{tmp_path.name}",
        status="interrupted",
        first_started_at=1_700_000_000.0,
    )
    mf.register_run(m)
    gone = tmp_path / "gone"
    g = fake_manifest(gone, dead_pid(), f"gone-{tmp_path.name}", status="finished")
    mf.register_run(g)
    shutil.rmtree(gone)
    proc = cli("runs")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    header = lines[0]
    where = header.index("WHERE")
    mine = [line for line in lines if str(interrupted) in line or str(gone) in line]
    assert len(mine) == 2, proc.stdout
    for line in mine:
        assert line[where:].startswith(str(tmp_path)), (header, line)
        assert line[header.index("HEALTH") :].split()[0] in ("stopped", "gone"), line
    row = next(line for line in mine if str(interrupted) in line)
    assert row.startswith(time.strftime("%Y-%m-%d %H:%M", time.localtime(1_700_000_000))), row
    assert row[header.index("USER") :].split()[0] == pwd.getpwuid(os.getuid()).pw_name, row
    for line in lines[1:]:  # every row, live ones too: its columns under their headings
        if line.startswith("("):
            continue
        assert line[where - 2 : where] == "  " and line[where] != " ", (header, line)
    assert "their directory is;" not in proc.stdout
    assert "(gone: the run's directory no longer exists; runs --prune forgets them)" in (
        proc.stdout
    ), proc.stdout


def test_resume_of_a_process_that_is_no_training_says_so_as_summary_does() -> None:
    """``resume --pid`` of a live ``sleep``: "is running without telemetry: kill it
    first", exit 9, where ``summary`` and ``kill`` say it is not a training, exit 20."""
    other = subprocess.Popen(["sleep", "300"])
    try:
        for command in ("resume", "summary"):
            err = one_line(cli(command, "--pid", str(other.pid)), 20)
            assert "not a Python process, not a training" in err, err
        assert other.poll() is None  # never signalled
    finally:
        other.kill()
        other.wait()
