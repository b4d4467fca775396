"""The trainer's side of ``eagle3-tui attach``: telemetry added to a live training.

``eagle3-tui attach`` (the agent's ``attach`` operation, ``agent/attach.py``)
writes this package into a private directory on the host and makes the trainer's
own interpreter run a small entry file (:func:`entry_source`) at its next safe
point, in its main thread: through a debugger-scheduled ``Py_AddPendingCall``
(CPython 3.8-3.13) or ``sys.remote_exec`` (3.14). That file imports this module
from the private directory and calls :func:`run`, which

1. checks that telemetry is not attached already (then changes nothing);
2. finds the speculators ``Trainer`` in the process: in the main thread's frames
   (it is at a safe point inside ``run_training``), else among all objects;
   none found: nothing is changed;
3. calls the documented one-liner, :func:`eagle3_tui.telemetry.attach`, with the
   Trainer (handler and INFO level on the speculators loggers, manifest and index
   entry, samplers in a sidecar) and a resume command that relaunches the same
   command line under :mod:`eagle3_tui.telemetry.rerun`, so a resumed run has
   telemetry from its first step;
4. writes its outcome — ``attached``, ``already``, ``no_trainer`` or ``failed``
   with the traceback — and the time it held the main thread to a result file
   that the agent reads.

Nothing here raises into the trainer: every exception is caught and reported.
Standard library only, Python 3.8+.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import Any

from eagle3_tui.telemetry.parsing import parse_json
from eagle3_tui.telemetry.safefs import write_atomic

TRAINER_MODULE = "speculators.train.trainer"
ENTRY_NAME = "__eagle3_tui_attach__"


def entry_source(lib: str, request: str, result: str) -> str:
    """The file the trainer's interpreter runs: import this module from ``lib`` and run
    the ``request``; if even the import fails, say so in ``result``. It binds no name
    in the namespace it runs in but its own function, which it deletes."""
    return f"""# Written by eagle3-tui attach: run once by the trainer's interpreter, main thread.
def _eagle3_tui_attach(lib={lib!r}, request={request!r}, result={result!r}):
    import sys
    try:
        added = lib not in sys.path
        if added:
            sys.path.insert(0, lib)
        try:
            from eagle3_tui.telemetry import inject
        finally:
            if added and lib in sys.path:
                sys.path.remove(lib)
        inject.run(request)
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        import json, os, traceback
        out = {{"status": "failed", "message": "cannot load eagle3-tui's telemetry: %s: %s"
               % (type(e).__name__, e), "traceback": traceback.format_exc()[-4000:],
               "pid": os.getpid()}}
        tmp = result + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f)
        os.replace(tmp, result)


_eagle3_tui_attach()
del _eagle3_tui_attach
"""


def find_trainer() -> tuple[Any, str, int]:
    """The speculators Trainer of this process: (trainer or None, where it was found,
    how many there are). Never imports speculators: a process that has not
    imported it trains with something else."""
    module = sys.modules.get(TRAINER_MODULE)
    cls = getattr(module, "Trainer", None)
    if not isinstance(cls, type):
        return None, "not imported", 0
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:  # the main thread is inside run_training: cheap
        candidate = frame.f_locals.get("self") if frame.f_code.co_name != "<module>" else None
        if isinstance(candidate, cls):
            return candidate, "frames", 1
        frame = frame.f_back
    found = [obj for obj in gc.get_objects() if isinstance(obj, cls)]
    if found:  # built, not training yet (or between two run_training calls)
        return found[-1], "objects", len(found)
    return None, "none", 0


def _write_json(path: str, obj: dict[str, Any], mode: int = 0o600) -> None:
    """``path`` replaced by ``obj`` (never written through a link: safefs.write_atomic)."""
    write_atomic(path, json.dumps(obj, default=str).encode(), mode, fsync=False)


def _attach(req: dict[str, Any], t0: float) -> dict[str, Any]:
    if req.get("pid") not in (None, os.getpid()):
        return {"status": "failed", "message": f"this request is for pid {req.get('pid')}"}
    from eagle3_tui.telemetry import session

    live = [s for s in list(session._sessions) if not s._closed]
    if live:
        return {
            "status": "already",
            "message": "telemetry is attached to this process already",
            "run_dir": str(live[0].run_dir),
            "run_id": live[0].run_id,
        }
    trainer, found_by, count = find_trainer()
    if trainer is None:
        why = (
            "speculators' Trainer is not imported in this process"
            if found_by == "not imported"
            else "speculators is imported but no Trainer exists yet"
        )
        return {"status": "no_trainer", "message": f"{why}: nothing was changed"}
    from eagle3_tui.telemetry import attach

    run_dir = Path(req["run_dir"])
    resume = req.get("resume_command")
    telemetry = attach(
        run_dir,
        trainer=trainer,
        resume_command=list(resume) if isinstance(resume, list) and resume else None,
        log_file=req.get("log_file"),
    )
    step = telemetry.progress_step()
    pause_ms = round((time.perf_counter() - t0) * 1000.0, 3)
    attached = {
        "at": time.time(),
        "mechanism": req.get("mechanism"),
        "global_step": step,
        "pause_ms": pause_ms,
        "found_by": found_by,
    }
    telemetry.update_manifest(attached=attached)
    telemetry.event("attach", pid=os.getpid(), global_step=step, mechanism=req.get("mechanism"))
    m = telemetry.manifest or {}
    return {
        "status": "attached",
        "message": f"telemetry attached after step {step}",  # steps done
        "run_dir": str(run_dir.resolve()),
        "run_id": telemetry.run_id,
        "global_step": step,
        "epochs": m.get("epochs"),
        "steps_per_epoch": m.get("steps_per_epoch"),
        "total_steps": m.get("total_steps"),
        "checkpoint_dir": m.get("checkpoint_dir"),
        "sampler_pid": getattr(telemetry.samplers, "pid", None),
        "found_by": found_by,
        "trainers": count,
    }


def run(request_path: str) -> None:
    """Attach as ``request_path`` asks; the outcome goes to the request's result file.
    Runs in the trainer's main thread; never raises (a KeyboardInterrupt that
    arrives meanwhile is passed on)."""
    t0 = time.perf_counter()
    result: dict[str, Any] = {"status": "failed", "message": "unreadable request"}
    result_path: str | None = None
    interrupted: KeyboardInterrupt | None = None
    try:
        with open(request_path) as f:
            req = parse_json(f.read())
        result_path = str(req["result"])
        result = _attach(req, t0)
    except KeyboardInterrupt as e:
        interrupted = e
        result = {"status": "failed", "message": "interrupted (KeyboardInterrupt)"}
    except BaseException as e:  # never into the trainer
        result = {
            "status": "failed",
            "message": f"{type(e).__name__}: {e}"[:1000],
            "traceback": traceback.format_exc()[-4000:],
        }
    result["pause_ms"] = round((time.perf_counter() - t0) * 1000.0, 3)
    result["pid"] = os.getpid()
    result["thread"] = threading.current_thread().name
    result["python"] = sys.version.split()[0]
    result["telemetry_from"] = str(Path(__file__).resolve().parent.parent.parent)
    result["finished_at"] = time.time()
    if result_path is None:
        result_path = os.path.join(os.path.dirname(os.path.abspath(request_path)), "result.json")
    with contextlib.suppress(OSError):
        _write_json(result_path, result)
    if interrupted is not None:
        raise interrupted
