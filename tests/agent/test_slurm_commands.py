"""Slurm's commands as the agent finds and reads them (agent/slurm.py): only a command
nobody else could have planted is run, and a host without Slurm (or without a cluster)
says so instead of failing."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from eagle3_tui.agent import slurm


def planted(folder: Path, name: str = "scontrol") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\necho planted\n")
    path.chmod(0o755)
    return path


def test_a_scontrol_in_a_folder_others_may_write_or_a_relative_path_is_never_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    open_dir = tmp_path / "shared-bin"
    mine = planted(open_dir)
    open_dir.chmod(0o777)  # any user may put a file here
    relative = tmp_path / "cwd"
    planted(relative)
    monkeypatch.chdir(relative)
    monkeypatch.setenv("PATH", os.pathsep.join([str(open_dir), ".", ""]))
    found = slurm.command("scontrol")
    assert found != str(mine) and found != str(relative / "scontrol")
    assert found is None or found.startswith(tuple(slurm.SLURM_DIRS)), found
    assert stat.S_IMODE(open_dir.stat().st_mode) == 0o777  # the test planted it so


def test_no_slurm_here_is_said_not_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr(slurm, "SLURM_DIRS", ())
    out = slurm.list_jobs(None, False)
    assert out["slurm"] is False and out["jobs"] == [] and out["note"] == "scontrol not found"
    assert slurm.ended_job_of({"SLURM_JOB_ID": "12"}) is None  # nothing to ask: resume may


def test_scontrols_fields_become_a_job() -> None:
    line = (
        "JobId=13 ArrayJobId=12 ArrayTaskId=3 JobName=e3 UserId=bob(1002) JobState=FAILED "
        "Reason=NonZeroExitCode ExitCode=143:0 NodeList= BatchHost=gpu01 Requeue=1 "
        "Restarts=2 BatchFlag=1 SubmitTime=2026-12-05T04:59:08 EndTime=Unknown "
        "Command=/w/run.sh WorkDir=/w StdOut=/w/out-13.log"
    )
    job = slurm.job_of(slurm.parse_show_job(line), "/nonexistent/scontrol", {})
    assert job["id"] == "13" and job["array"] == "12_3" and job["user"] == "bob"
    assert job["state"] == "FAILED" and job["exit_code"] == [143, 0]
    assert job["nodes"] == [] and job["batch_host"] == "gpu01"
    assert job["restarts"] == 2 and job["requeue"] and job["batch"]
    assert job["submitted"] is not None and job["ended"] is None
    assert job["stdout"] == "/w/out-13.log" and job["command"] == "/w/run.sh"
