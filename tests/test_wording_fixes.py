"""Words that were false when shown: a duration rounded so that two compared ones read
the same, a hint naming a file that was not read, a usage error that called the
TARGET an unknown argument, a kill's line trimmed by matching its own text, and an
ended process's description that said "no telemetry" of a process given some live."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.model.verdict import ago

# ---- ago: minutes and seconds below 10 min --------------------------------------------


def _seconds_said(text: str) -> int:
    """The whole seconds ``ago`` says in "M min S s", "M min" or "S s"."""
    m = re.fullmatch(r"(?:(\d+) min)?(?: ?(\d+) s)?", text)
    assert m is not None and text, text
    return int(m.group(1) or 0) * 60 + int(m.group(2) or 0)


def test_ago_says_minutes_and_seconds_below_ten_minutes() -> None:
    """90 s read "2 min", as did 120 s and 150 s: "No metric for 2 min … longer than the
    2 min a pause may take" after 93 s of a 90 s allowance."""
    assert ago(90) == "1 min 30 s"
    assert ago(93) == "1 min 33 s"
    assert ago(120) == "2 min"
    assert ago(150) == "2 min 30 s"
    assert ago(599.4) == "9 min 59 s"
    for seconds in range(90, 600):  # every whole second reads as itself, none alike
        assert _seconds_said(ago(seconds)) == seconds, (seconds, ago(seconds))
    assert len({ago(s) for s in range(90, 600)}) == 600 - 90


def test_ago_keeps_its_other_forms() -> None:
    assert ago(-3) == "0.0 s" and ago(4.25) == "4.2 s" and ago(61) == "61 s"
    assert ago(89.4) == "89 s"
    assert ago(600) == "10 min" and ago(599.6) == "10 min" and ago(3000) == "50 min"
    assert ago(5400) == "1.5 h" and ago(7200) == "2.0 h"


# ---- ssh: the configuration file a wrong-user hint names ------------------------------


def _denied(config: tuple[str, ...]) -> str:
    from eagle3_tui.transport.ssh import HostRefusedError, connect_error
    from eagle3_tui.transport.sshlib import asyncssh
    from eagle3_tui.transport.target import SshOptions, SshTarget

    target = SshTarget(host="gpu1", user="ann", options=SshOptions(config=config))
    err = connect_error(asyncssh.PermissionDenied("publickey"), target, None)
    assert isinstance(err, HostRefusedError)
    return str(err)


def test_permission_denied_names_the_ssh_config_that_was_read() -> None:
    """``-F FILE``: the hint named ~/.ssh/config, a file the connection never read."""
    said = _denied(("/etc/cluster/ssh_config",))
    assert said.endswith("or IdentityFile/User in /etc/cluster/ssh_config"), said
    assert "~/.ssh/config" not in said, said
    said = _denied(())
    assert said.endswith("or IdentityFile/User in ~/.ssh/config"), said
    assert said.startswith("ann@gpu1: permission denied (publickey)"), said


# ---- the command line: an option a command does not have ------------------------------


def _usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    from eagle3_tui.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(list(argv))
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.strip()


def test_an_option_summary_has_not_is_named_and_the_target_is_not(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``summary --ssh-client openssh HOST:DIR`` said "unrecognized arguments:
    --ssh-client HOST:DIR" (argparse took ``openssh`` for the TARGET)."""
    target = f"{tmp_path}/run"
    err = _usage_error(capsys, "summary", "--ssh-client", "openssh", target)
    assert err == "eagle3-tui summary: unknown option --ssh-client (see eagle3-tui summary --help)"
    err = _usage_error(capsys, "summary", target, "--bogus")  # after the target too
    assert "unknown option --bogus" in err and target not in err, err
    err = _usage_error(capsys, "kill", "--zz=4", "-q", target)
    assert "unknown options --zz, -q" in err and "=4" not in err and target not in err, err
    err = _usage_error(capsys, "--bogus", "x", target)  # the monitor's own parser
    assert err.startswith("eagle3-tui: ") and "unknown option" in err, err
    # a second TARGET is no option: said as argparse says it
    err = _usage_error(capsys, "summary", target, f"{tmp_path}/other")
    assert f"unrecognized arguments: {tmp_path}/other" in err, err


def test_a_negative_number_is_no_unknown_option(capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(capsys, "summary", "--pid", "-5")
    assert "a process ID is a whole number from 1" in err and "unknown" not in err, err


# ---- a kill's attach-first line: built for whether a trainer was signalled ------------


def _report(first: dict[str, object], signalled: bool) -> str:
    from eagle3_tui.reports import format_kill
    from eagle3_tui.transport.replies import KillReport, decode

    result = decode(
        KillReport,
        {
            "op": "kill",
            "status": "stopped",
            "message": "all 1 process(es) of the run are gone",
            "signalled_trainer": signalled,
            "attached_first": first,
        },
    )
    return format_kill(result)


def test_the_attach_first_line_says_sigterm_only_where_a_trainer_was_signalled() -> None:
    from eagle3_tui.reports import attached_first_line
    from eagle3_tui.transport.replies import AttachedFirst

    failed = {"status": "failed", "message": "no trainer found", "took_s": 1.0}
    said = _report(failed, signalled=True).splitlines()[1]
    assert said == "not attached first (failed: no trainer found): SIGTERM as before", said
    said = _report(failed, signalled=False).splitlines()[1]
    assert said == "not attached first (failed: no trainer found)", said
    first = AttachedFirst(status="refused", message="pid 7 is another process now")
    assert attached_first_line(first, signalled_trainer=False).endswith("now)")
    assert attached_first_line(first, signalled_trainer=True).endswith(": SIGTERM as before")


def test_an_attached_line_is_never_cut_by_its_own_words() -> None:
    """The line was trimmed where it ended in ": SIGTERM as before" and no trainer was
    signalled (an attached run stops at a step boundary: none is): a run directory
    whose name ends so lost its end."""
    odd = "/runs/x: SIGTERM as before"
    attached = {"status": "attached", "run_dir": odd, "mechanism": "ptrace", "took_s": 1.5}
    said = _report(attached, signalled=False).splitlines()[1]
    assert said == f"attached telemetry first (ptrace, 1.5 s): its metrics in {odd}", said


# ---- an ended process that had telemetry attached -------------------------------------


def _index(state: Path, entries: list[dict[str, object]]) -> None:
    index = state / "eagle3-tui" / "runs.jsonl"
    index.parent.mkdir(parents=True, exist_ok=True)
    index.write_text("".join(json.dumps(e) + "\n" for e in entries))


def _attached_manifest(run_dir: Path, pid: int, start: int, boot: str | None) -> None:
    run_dir.mkdir(parents=True)
    manifest = {"pid": pid, "start_ticks": start, "boot_id": boot, "attached": {"at": 1.0}}
    (run_dir / "run.json").write_text(json.dumps(manifest))


def test_an_attached_run_is_found_where_attach_put_it_without_the_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Telemetry attached by root to another user's trainer (or a trainer whose
    XDG_STATE_HOME is not the agent's) registers its run in the trainer's index, not the
    one the agent reads: the ended process read "no telemetry". Its run is where attach
    puts it by default, its manifest naming that very process."""
    from eagle3_tui.agent.discover import attached_run
    from eagle3_tui.telemetry import procs

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    _index(tmp_path / "state", [])
    boot = procs.boot_id()
    work = tmp_path / "work"
    row: dict[str, Any] = {"pid": 4242, "start_ticks": 777, "boot_id": boot, "cwd": str(work)}
    row.update(started=1_800_000_000.0, ended_at=1_800_000_100.0)
    assert attached_run(row) is None
    _attached_manifest(work / "eagle3-runs" / "attached-4242", 4242, 777, boot)
    assert attached_run(row) == str(work / "eagle3-runs" / "attached-4242")
    # another process of that PID (another start), or one never attached: not its run
    assert attached_run({**row, "start_ticks": 778}) is None
    assert attached_run({**row, "pid": 4243}) is None


def test_an_ended_process_given_telemetry_is_described_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``summary --pid P`` of a process telemetry was attached to, once it ended, said
    "pid P (...), no telemetry, ended …; telemetry was attached to it: its run DIR"."""
    from eagle3_tui.agent import discover
    from eagle3_tui.agent.frames import AgentError

    run_dir = tmp_path / "work" / "eagle3-runs" / "attached-4242"
    run_dir.mkdir(parents=True)
    t0 = 1_800_000_000.0
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    _index(tmp_path / "state", [{"run_dir": str(run_dir), "pid": 4242, "started_at": t0 + 5}])
    row = {"pid": 4242, "started": t0, "ended_at": t0 + 50, "telemetry": False, "run_dir": None}

    class Ended:
        def row(self) -> dict[str, object]:
            return dict(row)

    def gone(pid: int, start: int | None) -> dict[str, object]:
        raise AgentError("gone", f"pid {pid}: no such process (it has exited)")

    monkeypatch.setattr(discover, "describe", gone)
    monkeypatch.setattr(discover, "find_ended", lambda *a: Ended())
    said, _ = discover.live_or_ended(4242, None)
    assert said["telemetry"] is True and said["run_dir"] == str(run_dir), said


def test_runs_lists_an_ended_process_with_the_telemetry_attached_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``runs`` listed such a process as ended with TELEMETRY no (its attached run in an
    index it does not read); one whose run the index lists is that run's row alone."""
    from eagle3_tui.agent import discover
    from eagle3_tui.runs_text import format_discovered
    from eagle3_tui.telemetry import procs
    from eagle3_tui.transport.replies import DiscoverReport, decode

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    _index(tmp_path / "state", [])
    boot = procs.boot_id()
    work = tmp_path / "work"
    run_dir = work / "eagle3-runs" / "attached-4242"
    _attached_manifest(run_dir, 4242, 777, boot)
    row: dict[str, Any] = {"pid": 4242, "start_ticks": 777, "boot_id": boot, "cwd": str(work)}
    row["user"] = "ann"
    row.update(started=1_800_000_000.0, ended_at=1_800_000_100.0, alive=False)
    row.update(command=["python", "train.py"], telemetry=False, run_dir=None)

    class Ended:
        def end(self) -> dict[str, object]:
            return {"ended_at": row["ended_at"]}

        def row(self) -> dict[str, object]:
            return dict(row)

    monkeypatch.setattr(discover, "settle", lambda found_gone: [Ended()])
    ended = discover.ended_rows()
    assert [(r["telemetry"], r["run_dir"]) for r in ended] == [(True, str(run_dir))], ended
    text = format_discovered(decode(DiscoverReport, {"op": "discover", "ended": ended}))
    line = text.splitlines()[1]
    assert re.search(rf"ended\s+4242\s+ann\s+yes\s+{re.escape(str(run_dir))}", line), text
    # registered in the index read here: listed as that run, not again as a process
    entry = {"run_dir": str(run_dir), "pid": 4242, "started_at": 1_800_000_005.0}
    _index(tmp_path / "state", [entry])
    assert discover.ended_rows() == []
