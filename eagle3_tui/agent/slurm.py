"""Slurm, as the host's own commands say it: the ``jobs`` and ``job_control`` operations.

``jobs`` lists the login user's jobs that the controller knows (``scontrol show job -o``:
pending, running, and those ended within its ``MinJobAge``; one job asked for by id
and no longer there: ``sacct``, where accounting is on), each with its state, the
scheduler's reason, its exit code, its nodes (``scontrol show hostnames``), its output
file and working directory, and whether it is a speculators training (its batch script
or command names speculators or eagle3-tui, or its processes hold one). On a node that
runs the job (``scontrol listpids`` answers here) it names the job's training among this
host's live ones (``discover.py``'s rows: its trainer, run directory, telemetry).

``job_control`` asks the scheduler: ``cancel`` (``scancel``: the job is then recorded as
cancelled by its user) or ``requeue`` (``scontrol requeue``, then ``StartTime=now``
where the user may: Slurm otherwise holds a requeued job two minutes).

Nothing here signals a process: stopping the training itself is ``kill``'s (the
trainer alone gets SIGTERM, the library's save signal, or a stop at a step boundary;
``scancel --signal=TERM --full`` would signal its dataloader workers too, and the
library's save then fails).

Standard library only, Python 3.8+.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any, Dict  # noqa: UP035

from eagle3_tui.agent.frames import AgentError, emit
from eagle3_tui.agent.names import (
    ERR_INVALID,
    ERR_MISSING,
    ERR_REFUSED,
    EV_RESULT,
    OP_JOB_CONTROL,
    OP_JOBS,
)
from eagle3_tui.agent.process_facts import user_name
from eagle3_tui.telemetry.safefs import trust_problem

SLURM_DIRS = ("/usr/bin", "/usr/local/bin", "/opt/slurm/bin", "/usr/local/slurm/bin")
"""Where Slurm's commands are looked for after ``PATH`` (a session over ssh often has a
short one)."""
CALL_S = 15.0
"""The longest a scheduler command may take (a controller that does not answer)."""
SCRIPT_BYTES = 256 * 1024
SCRIPTS_READ = 50
"""At most this many batch scripts are read per listing (one ``scontrol`` call each)."""
JOB_ID = re.compile(r"^[0-9]+(?:_[0-9]+)?$")
TRAINING_WORDS = re.compile(r"speculators|eagle3_tui|eagle3-tui")
_KEY = re.compile(r" (?=[A-Z][A-Za-z0-9_/:.]*=)")
ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING")
"""Job states in which the job still holds (or waits for) its allocation."""

Job = Dict[str, Any]  # noqa: UP006
NO_CLUSTER = "Could not establish a configuration source"
"""What Slurm's commands say on a host that has them but belongs to no cluster (no
slurm.conf, no configless controller): no Slurm here."""


class NoClusterError(Exception):
    pass


def command(name: str) -> str | None:
    """Slurm's command ``name``: the first in ``PATH``'s absolute folders, then in
    :data:`SLURM_DIRS`, that nobody but root or this user could have put there (one in a
    folder another user may write, or a relative ``PATH`` entry, is never run)."""
    folders = [d for d in (os.environ.get("PATH") or "").split(os.pathsep) if os.path.isabs(d)]
    for folder in (*folders, *SLURM_DIRS):
        path = os.path.join(folder, name)
        if os.path.isfile(path) and os.access(path, os.X_OK) and trust_problem(path) is None:
            return path
    return None


def _call(argv: list[str], limit: int = 4 * 1024 * 1024) -> subprocess.CompletedProcess[str]:
    """One scheduler command, bounded in time and output; never raises for its status."""
    try:
        proc = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=CALL_S,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise AgentError(
            ERR_REFUSED, f"{os.path.basename(argv[0])} did not answer in {CALL_S:.0f} s"
        ) from e
    except OSError as e:
        raise AgentError(ERR_REFUSED, f"{argv[0]}: {e.strerror or e}") from e
    proc.stdout = proc.stdout[:limit]
    return proc


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def parse_show_job(line: str) -> dict[str, str]:
    """``scontrol show job -o``'s one line as KEY -> VALUE (a value may hold spaces: a key
    starts a new field only as an upper-case word right after a space)."""
    fields: dict[str, str] = {}
    for part in _KEY.split(line.strip()):
        key, sep, value = part.partition("=")
        if sep and key and key not in fields:
            fields[key] = value.strip()
    return fields


def _none(value: str | None) -> str | None:
    if value is None or value in ("", "(null)", "None", "N/A", "Unknown"):
        return None
    return value


def _when(value: str | None) -> float | None:
    """Slurm's local ``YYYY-MM-DDTHH:MM:SS`` as seconds since the epoch."""
    value = _none(value)
    if value is None:
        return None
    try:
        return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def _exit_code(value: str | None) -> list[int] | None:
    """``143:0`` -> [143, 0] (the exit status, and the signal that ended it)."""
    if not value:
        return None
    code, _, signal = value.partition(":")
    try:
        return [int(code), int(signal or 0)]
    except ValueError:
        return None


def _user(value: str | None) -> str | None:
    """``alice(1001)`` -> ``alice``."""
    if not value:
        return None
    return value.split("(", 1)[0] or None


def hostnames(scontrol: str, nodelist: str | None, cache: dict[str, list[str]]) -> list[str]:
    """A node list (``gpu[01-03,07]``) expanded by Slurm itself."""
    nodelist = _none(nodelist)
    if nodelist is None:
        return []
    if nodelist not in cache:
        proc = _call([scontrol, "show", "hostnames", nodelist])
        names = proc.stdout.split() if proc.returncode == 0 else [nodelist]
        cache[nodelist] = names[:4096]
    return cache[nodelist]


def job_of(fields: dict[str, str], scontrol: str, cache: dict[str, list[str]]) -> Job:
    array, task = _none(fields.get("ArrayJobId")), _none(fields.get("ArrayTaskId"))
    return {
        "id": fields.get("JobId", ""),
        "array": f"{array}_{task}" if array and task else None,
        "name": fields.get("JobName"),
        "user": _user(fields.get("UserId")),
        "state": (fields.get("JobState") or "UNKNOWN").split("+")[0],
        "reason": _none(fields.get("Reason")),
        "exit_code": _exit_code(fields.get("ExitCode")),
        "nodes": hostnames(scontrol, fields.get("NodeList"), cache),
        "batch_host": _none(fields.get("BatchHost")),
        "partition": _none(fields.get("Partition")),
        "command": _none(fields.get("Command")),
        "workdir": _none(fields.get("WorkDir")),
        "stdout": _none(fields.get("StdOut")),
        "stderr": _none(fields.get("StdErr")),
        "submitted": _when(fields.get("SubmitTime")),
        "started": _when(fields.get("StartTime")),
        "ended": _when(fields.get("EndTime")),
        "eligible": _when(fields.get("EligibleTime")),
        "restarts": _int(fields.get("Restarts")),
        "requeue": fields.get("Requeue") == "1",
        "batch": fields.get("BatchFlag") == "1",
        "source": "scontrol",
    }


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _sacct_job(job_id: str, cache: dict[str, list[str]], scontrol: str) -> Job | None:
    """A job the controller has forgotten, from accounting (``None`` where it is off)."""
    sacct = command("sacct")
    if sacct is None:
        return None
    fmt = "JobID,JobName,User,State,ExitCode,NodeList,WorkDir,Submit,Start,End,Partition"
    proc = _call([sacct, "-j", job_id, "-X", "-n", "-P", "-o", fmt])
    if proc.returncode != 0:
        return None
    for line in proc.stdout.splitlines():
        parts = line.split("|")
        if len(parts) != 11 or parts[0] != job_id:
            continue
        state = parts[3].split()[0] if parts[3] else "UNKNOWN"  # "CANCELLED by 0"
        return {
            "id": job_id,
            "array": None,
            "name": parts[1] or None,
            "user": parts[2] or None,
            "state": state,
            "reason": None,
            "exit_code": _exit_code(parts[4]),
            "nodes": hostnames(scontrol, parts[5], cache),
            "batch_host": None,
            "partition": parts[10] or None,
            "command": None,
            "workdir": parts[6] or None,
            "stdout": None,
            "stderr": None,
            "submitted": _when(parts[7]),
            "started": _when(parts[8]),
            "ended": _when(parts[9]),
            "eligible": None,
            "restarts": None,
            "requeue": False,
            "batch": True,
            "source": "sacct",
        }
    return None


def _script(scontrol: str, job_id: str) -> str | None:
    proc = _call([scontrol, "write", "batch_script", job_id, "-"], limit=SCRIPT_BYTES)
    return proc.stdout if proc.returncode == 0 else None


def _listpids(scontrol: str, job_id: str) -> list[int]:
    """The job's processes on this host (none where no slurmd of it runs here)."""
    proc = _call([scontrol, "listpids", job_id])
    pids: list[int] = []
    if proc.returncode != 0:
        return pids
    for line in proc.stdout.splitlines()[1:]:
        first = line.split()[:1]
        if first and first[0].isdigit():
            pids.append(int(first[0]))
    return pids


def _training_here(job: Job, pids: list[int]) -> dict[str, Any] | None:
    """The live training (discover's row) whose trainer or launcher is one of the job's
    processes on this host."""
    from eagle3_tui.agent.discover import live_rows

    wanted = set(pids)
    for row in live_rows(health=False):
        if row.get("pid") in wanted or row.get("launcher_pid") in wanted:
            return {
                key: row.get(key)
                for key in (
                    "pid",
                    "start_ticks",
                    "launcher_pid",
                    "command",
                    "cwd",
                    "log",
                    "telemetry",
                    "run_dir",
                    "run_id",
                    "checkpoint_dir",
                )
            }
    return None


def run_of_job(job: Job) -> str | None:
    """The newest run registered on this host (this user's) whose manifest says it ran as
    this job (``SLURM_JOB_ID``; an array task's ``SLURM_ARRAY_JOB_ID_TASK``)."""
    from eagle3_tui.agent.runs import read_manifest, registered_rows

    for row in registered_rows(False)[0]:  # newest first
        if not row.get("exists"):
            continue
        try:
            env = read_manifest(Path(row["run_dir"])).get("env")
        except AgentError:
            continue
        if not isinstance(env, dict):
            continue
        task = f"{env.get('SLURM_ARRAY_JOB_ID')}_{env.get('SLURM_ARRAY_TASK_ID')}"
        if env.get("SLURM_JOB_ID") == job["id"] or (job["array"] and task == job["array"]):
            return str(row["run_dir"])
    return None


def _show(scontrol: str, job_id: str | None) -> list[dict[str, str]]:
    argv = [scontrol, "show", "job", "-o"]
    if job_id is not None:
        argv.append(job_id)
    proc = _call(argv, limit=64 * 1024 * 1024)
    if proc.returncode != 0:
        text = _first_line(proc.stderr) or _first_line(proc.stdout)
        if job_id is not None and "invalid job id" in text.lower():
            return []
        if NO_CLUSTER in proc.stderr:
            raise NoClusterError(text)
        raise AgentError(ERR_REFUSED, f"scontrol show job: {text or 'failed'}")
    return [parse_show_job(line) for line in proc.stdout.splitlines() if "JobId=" in line]


def list_jobs(job_id: str | None, everyone: bool) -> dict[str, Any]:
    scontrol = command("scontrol")
    me = user_name(os.geteuid())
    out: dict[str, Any] = {
        "op": OP_JOBS,
        "slurm": scontrol is not None,
        "jobs": [],
        "host": os.uname().nodename,
        "user": me,
        "now": time.time(),
    }
    if scontrol is None:
        out["note"] = "scontrol not found"
        return out
    cache: dict[str, list[str]] = {}
    try:
        shown = _show(scontrol, job_id)
    except NoClusterError:
        out["slurm"] = False  # its commands, but no cluster: as without them
        out["note"] = "its commands are here but no cluster: no slurm.conf, SLURM_CONF unset"
        return out
    jobs = [job_of(f, scontrol, cache) for f in shown]
    if job_id is None and not everyone:
        jobs = [j for j in jobs if j["user"] == me]
    if job_id is not None:
        jobs = [j for j in jobs if j["id"] == job_id or j["array"] == job_id]
        if not jobs:
            gone = _sacct_job(job_id, cache, scontrol)
            jobs = [gone] if gone is not None else []
    scripts = 0
    for job in jobs:
        pids = _listpids(scontrol, job["id"]) if job["state"] == "RUNNING" else []
        job["here"] = bool(pids)
        job["training_row"] = _training_here(job, pids) if pids else None
        script = None
        if job["source"] == "scontrol" and job["batch"] and scripts < SCRIPTS_READ:
            scripts += 1
            script = _script(scontrol, job["id"])
        words = " ".join(x for x in (script, job.get("command")) if x)
        row = job["training_row"]
        job["run_dir"] = row.get("run_dir") if row is not None else None
        if job["run_dir"] is None and job_id is not None:
            job["run_dir"] = run_of_job(job)
        job["training"] = (
            row is not None or job["run_dir"] is not None or bool(TRAINING_WORDS.search(words))
        )
        job["script_read"] = script is not None
    out["jobs"] = jobs
    return out


def ended_job_of(env: dict[str, str]) -> str | None:
    """The Slurm job a run's saved environment names, when this host's Slurm says that
    job has ended (or no longer knows it): relaunched here, the run would go on outside
    any allocation. None where it is not a job's, the job is active, no Slurm answers,
    or this agent itself runs inside an allocation (a resume from within a new one)."""
    job = env.get("SLURM_JOB_ID")
    if not job or not JOB_ID.match(job) or os.environ.get("SLURM_JOB_ID"):
        return None
    scontrol = command("scontrol")
    if scontrol is None:
        return None
    try:
        shown = _show(scontrol, job)
    except (AgentError, NoClusterError):
        return None
    state = (shown[0].get("JobState") or "").split("+")[0] if shown else ""
    return None if state in ACTIVE else job


def op_jobs(req: dict[str, Any]) -> int:
    job_id = req.get("job")
    if job_id is not None and (not isinstance(job_id, str) or not JOB_ID.match(job_id)):
        raise AgentError(ERR_INVALID, f"{job_id!r}: not a Slurm job id")
    emit(EV_RESULT, **list_jobs(job_id, bool(req.get("all"))))
    return 0


def op_job_control(req: dict[str, Any]) -> int:
    job_id, action = req.get("job"), req.get("action")
    if not isinstance(job_id, str) or not JOB_ID.match(job_id):
        raise AgentError(ERR_INVALID, f"{job_id!r}: not a Slurm job id")
    if action not in ("cancel", "requeue"):
        raise AgentError(ERR_INVALID, f"{action!r}: not a scheduler action")
    scontrol = command("scontrol")
    if scontrol is None:
        raise AgentError(ERR_MISSING, "no Slurm here (scontrol not found)")
    if action == "cancel":
        scancel = command("scancel")
        if scancel is None:
            raise AgentError(ERR_MISSING, "no Slurm here (scancel not found)")
        proc = _call([scancel, job_id])
    else:
        proc = _call([scontrol, "requeue", job_id])
    said = _first_line(proc.stderr) or _first_line(proc.stdout)
    if proc.returncode != 0:
        raise AgentError(ERR_REFUSED, f"{os.path.basename(proc.args[0])}: {said or 'refused'}")
    note = None
    if action == "requeue":  # eligible now, where this user may say so
        now = _call([scontrol, "update", f"JobId={job_id}", "StartTime=now"])
        if now.returncode != 0:
            note = _first_line(now.stderr) or "StartTime=now refused"
    deadline = time.monotonic() + 10.0
    job: Job | None = None
    while True:  # the state the scheduler moved it to
        shown = _show(scontrol, job_id)
        cache: dict[str, list[str]] = {}
        job = job_of(shown[0], scontrol, cache) if shown else None
        settled = job is None or (
            job["state"] not in ("COMPLETING", "RUNNING")
            if action == "cancel"
            else job["state"] in ACTIVE
        )
        if settled or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    emit(EV_RESULT, op=OP_JOB_CONTROL, action=action, job=job, said=said or None, note=note)
    return 0
