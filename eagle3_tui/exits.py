"""Every exit status of every command, one meaning per number (the README's table).

A number means the same thing whichever command returns it: 21 is "no permission"
for ``summary``, ``kill`` and ``attach`` alike, 22 "no such process". Ranges:

- 0-2: done, the monitor's crash, an error (usage, missing run, unreachable host)
- 3-7, 10-12: a run's health (``summary``, ``demo --headless``), from :data:`BY_HEALTH`
- 8, 9: ``kill``/``resume`` done but incomplete, or refused with nothing done
- 20-25: what a target names cannot be acted on (a process, a directory, a file)
- 30-36: ``attach``'s own outcomes

Standard library only, no imports: the model, the transport and the CLI share it.
"""

OK = 0
CRASHED = 1  # the monitor stopped on an error (its traceback is printed)
ERROR = 2  # usage, missing run, unreachable target, refused host key

# A run's health (summary, demo --headless); running, finished and waiting are 0.
SILENT = 3
STALLED = 4
DEAD = 5
DIVERGED = 6  # also a run that finished or was stopped after its loss diverged
STOPPED = 7
UNREADABLE = 10  # no valid record in the file, only malformed lines
DISK_FULL = 11  # no record for a while, and no room on the run's filesystem
COPY = 12  # a copy of another run's directory: nothing writes it (its first one is the run)

BY_HEALTH = {
    "waiting": OK,
    "running": OK,
    "finished": OK,
    "silent": SILENT,
    "stalled": STALLED,
    "dead": DEAD,
    "diverged": DIVERGED,
    "stopped": STOPPED,
    "unreadable": UNREADABLE,
    "disk_full": DISK_FULL,
    "copy": COPY,
}

# kill and resume
INCOMPLETE = 8  # done, but processes of the run remain / the resumed run died at once
REFUSED = 9  # nothing done: the PID is another process now, no complete checkpoint...

# What a target names cannot be acted on (every command that takes one).
NOT_TRAINING = 20  # the PID is not a speculators training
PERMISSION = 21  # another user's process or file; for attach also ptrace_scope, a tracer
GONE = 22  # no such process: it exited (meanwhile), or its PID is another process now
SEVERAL = 23  # several live trainings and no --pid (headless)
NOT_NAMED = 24  # a directory above trainings' own directories: the candidates listed
WRONG_KIND = 25  # a file where a run directory should be, a FIFO/directory/dangling link

# attach
DECLINED = 30  # the person answered no: nothing done
ALREADY = 31  # telemetry is attached already: nothing changed
QUEUED = 32  # injected; runs when the trainer's main thread next runs Python
NOT_ATTACHABLE = 33  # not CPython 3.8+, not a training, no Trainer found inside
NO_WAY_IN = 34  # the injector cannot go there and gdb is missing or unusable (3.8-3.13);
# remote debugging disabled (3.14+)
ATTACH_FAILED = 35  # the injection or the attach inside failed (traceback shown)
WHICH_PROCESS = 36  # no --pid, and not exactly one training on the host

INTERRUPTED = 130  # Ctrl-C (the shell's 128 + SIGINT)
