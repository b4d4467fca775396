"""Names the agent and its client share: the protocol version, files, the run marker,
operations, events and error kinds. Standard library only (the agent runs on the host)."""

from __future__ import annotations

from eagle3_tui.telemetry.columns import MONITOR_PROFILE

PROTOCOL = 1
MANIFEST = "run.json"
RUN_ID_ENV = "EAGLE3_TUI_RUN_ID"
KILL_GRACE_S = 130.0
"""How long a kill waits for the trainer to save and exit before SIGKILL: speculators
gives up on its own save after 120 s (its watchdog)."""
SAVE_WAIT_S = 900.0
"""How long a kill waits for a checkpoint save in progress to finish before its first
signal (agent/saving.py): a drafter's optimizer state takes minutes to write."""
COMPRESS_ZLIB = "zlib"
"""A follow or read request's ``"compress"``: send the catch-up as zlib Z frames."""
COLUMNS_WANTED = {"profile": list(MONITOR_PROFILE)}
"""A follow or read request's ``"columns"``: send the steps the companion file indexes
as C frames (agent/column_plan.py), with only these fields of these groups."""
SUMMARY_HISTORY = {
    "paths": ["train.loss", "profile.step_ms", "profile.tokens_per_s"],
    "newest": 2048,
    "pace_sums_s": 300,
}
"""A read request's ``"history"``: of the steps before the newest ``newest``, only these
columns (and each step's envelope, and any metric the newest block no longer has) --
what a summary reads of a run's whole history: the loss (its anomalies), the steps and
times (resumes, gaps, epochs) and the pace over the run; everything of the newest steps
(the windows a verdict and the latest values read). ``pace_sums_s``: of a block whose
rows are all older than that before the newest block's last one, and among whose lines
no process starts, the pace's timings go as their sum (agent/column_plan.py's
:func:`~eagle3_tui.agent.column_plan.pace_summed`): a run's pace is the tokens of its
current process over its time, or of its last minute, so no such block is split."""
TICK_S = 5.0
"""A stream's agent (follow, observe) says ``tick`` after this long without another
frame: a client that hears nothing for a few of them knows the agent is stopped or
frozen (its sshd may still be up: the connection alone says nothing)."""
NVML_FIXTURE_ENV = "EAGLE3_TUI_NVML_FIXTURE"  # recorded NVML readings (telemetry/session.py)
RUNS_FOLDER = "eagle3-runs"
"""In a trainer's working directory: the run directories eagle3-tui makes for a training
started without it (``attached-PID`` by attach, ``restart-PID`` by a kill)."""

# Operations (the request's "op").
OP_FOLLOW = "follow"
OP_RESOLVE = "resolve"
OP_READ = "read"
OP_RUNS = "runs"
OP_KILL = "kill"
OP_RESUME = "resume"
OP_STATUS = "status"
OP_DISCOVER = "discover"  # live trainings on the host, with or without telemetry
OP_CHOOSE = "choose"  # which run or process a target means
OP_LOOK = "look"  # choose, read and status in one process (api.follow's looks)
OP_DESCRIBE = "describe"  # one process: what it is, and a manifest-like identity
OP_OBSERVE = "observe"  # records synthesized from outside a run without telemetry
OP_ATTACH = "attach"
OP_SAVE_WAIT = "save_wait"  # kill's first step alone: wait for a checkpoint save
OP_GLANCE = "glance"  # a long run's first picture: its tail, events and digest
EV_GLANCE = "glance"  # glance: whether there is one, and where its tail starts
OP_JOBS = "jobs"  # Slurm: the user's jobs (or one), and a job's training on this node
OP_JOB_CONTROL = "job_control"  # Slurm: cancel or requeue a job through the scheduler

# What ``choose`` found a target to mean (its result's "choice").
CHOICE_RUN = "run"  # a run directory (``run_dir``)
CHOICE_PROCESS = "process"  # a training without telemetry (``row``)
CHOICE_SEVERAL = "several"  # several live trainings (``runs``): the client asks which
PURPOSE_RESUME = "resume"  # a choose request's ``purpose``: a run to resume (a stopped one)

# Events (a J frame's "event").
EV_RESOLVED = "resolved"
EV_WAITING = "waiting"
EV_OPENED = "opened"
EV_RESTARTED = "restarted"
EV_PROGRESS = "progress"
EV_RESULT = "result"
EV_EOF = "eof"
EV_ERROR = "error"
EV_OBSERVED = "observed"  # observe: the process being observed (once, first)
EV_CURSOR = "cursor"  # observe: where a reconnect resumes (after each data frame)
EV_ENDED = "ended"  # observe: the trainer exited; nothing more will come
EV_DISK = "disk"  # follow: the room on the run's filesystem (agent/diskspace.py)
EV_TICK = "tick"  # follow, observe: nothing else said for TICK_S (the agent is not frozen)
EV_CHOSEN = "chosen"  # look: what the target means, before the run's file is read
FINAL_EVENTS = (EV_RESULT, EV_EOF, EV_ENDED)  # what ends an operation's answer

# Error kinds (an error event's "kind").
ERR_INVALID = "invalid"  # a request the agent does not understand
ERR_MISSING = "missing"  # no such run, file or manifest
ERR_REFUSED = "refused"  # understood, and refused (resume a running run...)
# A process named as a target (--pid, a work directory, a host's live run):
ERR_NOT_TRAINING = "not_training"  # it exists, but is not a speculators training
ERR_PERMISSION = "permission"  # another user's process, or an input this user may not read
ERR_GONE = "gone"  # no such process (it exited, or its PID is another process now)
ERR_NO_MANIFEST = "no_manifest"  # the run directory exists but has no run manifest
ERR_NOT_NAMED = "not_named"  # a directory above trainings' own directories: not one of them
ERR_WRONG_KIND = "wrong_kind"  # a file where a run directory should be, a FIFO as metrics...
ERROR_KINDS = (
    ERR_INVALID,
    ERR_MISSING,
    ERR_REFUSED,
    ERR_NOT_TRAINING,
    ERR_PERMISSION,
    ERR_GONE,
    ERR_NO_MANIFEST,
    ERR_NOT_NAMED,
    ERR_WRONG_KIND,
)
"""Every kind an error event may carry (the client's ``replies.ErrorKind`` mirrors it)."""
