"""A stop at a step boundary, asked for by ``eagle3-tui kill``.

speculators' SIGTERM handler raises wherever the main thread is (mid-forward, inside a
collective) and saves ``interrupted/``, which has no ``training_state.json``: the library
ignores it on the next start and every kill redoes up to an epoch. Here the trainer
stops itself *between* two steps instead, through the library's own interrupt path: the
metric handler (called in the main thread right after a step's optimizer and scheduler
update, at every logged step, on every rank) raises speculators'
``TrainingInterruptedError``; ``run_training``'s wrapper catches it and saves
``interrupted/``, which then holds exactly the steps done. The handler writes down which
ones (epoch, the epoch's 1-based ``local_step``, global steps done), and the kill turns
that save into the numbered checkpoint the library resumes from mid-epoch
(``agent/checkpoints.py``): the restart continues at the next step, none redone.

The protocol, through two files of the run directory named in the manifest's ``stop``
field (an agent asks only a telemetry that says it understands; an older one keeps the
SIGTERM path):

* the agent writes ``stop-request.json`` ``{"id", "at"}`` (atomically, as the run's user);
* rank 0's handler looks for it at each logged step: one ``os.stat`` of a missing file
  (~2.4 µs here, against a step of 50 ms on this CPU and hundreds on a GPU);
* to take the request it deletes the file. The agent withdraws a request that was not
  taken in time by deleting it too: exactly one of them succeeds, so the agent knows
  whether a stop is under way before it falls back to SIGTERM (a SIGTERM that reached a
  trainer already saving after a stop would kill it in the middle of the save);
* the state file ``stop-state.json`` (rank 0, replaced atomically) says where the stop
  stands: ``accepted`` (taken; several ranks: waiting for each to be ready),
  ``scheduled`` (``stop_at``), ``stopped`` (``epoch``, ``local_step``, ``step``: the last
  step done, ``global_step``: steps done), then ``saved`` (speculators said "Interrupt
  checkpoint saved to …") or ``save_failed``; ``refused`` (``reason``) when this process
  cannot stop there (no speculators Trainer loop above the handler), nothing taken;
* at the stop rank 0 writes a ``lifecycle`` ``stop`` event (``step``, ``global_step``,
  ``epoch``, ``local_step``, ``request``), then the session ends ``interrupt`` as after
  a signal (``run.json`` ``interrupted``).

Under torchrun every rank must stop at the same step: the interrupt save gathers the
sharded state across ranks, and a rank that stopped alone would leave the others waiting
in their next collective. :class:`StepStop` agrees on that step through the job's
TCPStore (the one ``init_process_group`` connected to; ``topology.py``):

1. rank 0 takes the request and sets ``eagle3_tui/stop/request``;
2. every other rank's telemetry thread looks for that key once a second (a store round
   trip in the background, never in the training loop); when it sees it, the rank marks
   itself *pending* (from then on its handler asks the store for the stop step at each
   logged step) and only then sets ``eagle3_tui/stop/ready/<rank>``;
3. rank 0, at each logged step, checks whether every rank is ready; once they are, at
   its logged step ``s`` it sets ``eagle3_tui/stop/at`` = ``s + 1``, reads it back (the
   store has it before rank 0 goes on) and writes ``scheduled``;
4. each rank stops at its first logged step ``≥ s + 1``.

Why every rank sees the stop step in time: logged steps are the same on every rank
(``global_step % log_freq``, one ``global_step`` for all), and at a logged step every rank
first meets the others in the all-reduce of that step's metrics (``train_epoch``), before
its metric call. So no rank reaches the metric call of a step ``≥ s + 1`` before rank 0 has
left step ``s``'s metric call, where it published and read back ``s + 1``; and every rank
was pending before rank 0 published (its ready key is set after its pending flag), so its
handler asks the store at that very step and finds it. None can stop earlier (no step
``≥ s + 1`` is logged before it), none later (pending ranks ask at every logged step).

Standard library only (it runs inside the trainer); ``torch.distributed`` through
``sys.modules`` (``topology._default_store``), speculators' exception through
``sys.modules`` too: a process without them is never asked to stop this way.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, Final

from eagle3_tui.telemetry.parsing import parse_json
from eagle3_tui.telemetry.safefs import read_bounded, write_atomic
from eagle3_tui.telemetry.topology import _default_store

STOP_REQUEST: Final = "stop-request.json"
STOP_STATE: Final = "stop-state.json"
STOP_VERSION: Final = 1
MANIFEST_FIELD: Final = {"request": STOP_REQUEST, "state": STOP_STATE, "version": STOP_VERSION}
"""What ``run.json`` says under ``stop``: this telemetry stops at a step boundary when
asked through these files."""

STORE_PREFIX: Final = "eagle3_tui/stop/"
REQUEST_LIMIT: Final = 4096
ID_RE: Final = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
GRACEFUL_MODULE: Final = "speculators.train.graceful_shutdown"
FRAMES_LOOKED_AT: Final = 40
"""How far up from the handler the Trainer's loop is looked for (it is ~7 frames up)."""
INTERRUPT_SAVED: Final = "Interrupt checkpoint saved to "
INTERRUPT_FAILED: Final = "Failed to save interrupt checkpoint"
"""speculators 0.9's messages once the interrupt save ends (``graceful_shutdown.py``)."""


def read_request(path: Path) -> dict[str, Any] | None:
    """The request at ``path``, if it is one: ``{"id": str, "at": float}`` (a regular file,
    read bounded; anything else is None)."""
    try:
        obj = parse_json(read_bounded(path, REQUEST_LIMIT, follow=False))
    except (OSError, ValueError):
        return None
    if not isinstance(obj, dict):
        return None
    rid, at = obj.get("id"), obj.get("at")
    if not isinstance(rid, str) or not ID_RE.match(rid):
        return None
    if not isinstance(at, (int, float)) or isinstance(at, bool):
        return None
    return {"id": rid, "at": float(at)}


class LoopPlace:
    """Where the Trainer's loop is, read from the frames above the metric call: the epoch,
    the epoch's 1-based ``local_step`` (``train_epoch``'s locals), the Trainer, and the
    exception speculators' interrupt wrapper catches. ``problem`` says why a stop there
    would not take the library's save path (then nothing is raised)."""

    def __init__(self, frame: FrameType | None) -> None:
        self.epoch: int | None = None
        self.local_step: int | None = None
        self.trainer: Any = None
        self.error: type[BaseException] | None = None
        self.problem = ""
        loop = wrapped = False
        for _ in range(FRAMES_LOOKED_AT):
            if frame is None:
                break
            code = frame.f_code
            if not loop and code.co_name == "train_epoch" and "local_step" in frame.f_locals:
                local = frame.f_locals
                self.local_step, self.epoch = local.get("local_step"), local.get("epoch")
                self.trainer = local.get("self")
                loop = True
            elif loop and code.co_name == "wrapper":
                wrapped = frame.f_globals.get("__name__") == GRACEFUL_MODULE
                if wrapped:
                    break
            frame = frame.f_back
        module = sys.modules.get(GRACEFUL_MODULE)
        error = getattr(module, "TrainingInterruptedError", None)
        if isinstance(error, type) and issubclass(error, BaseException):
            self.error = error
        if not loop:
            self.problem = "no speculators Trainer.train_epoch above the metric call"
        elif not isinstance(self.local_step, int) or not isinstance(self.epoch, int):
            self.problem = "train_epoch has no integer epoch and local_step"
        elif not wrapped:
            self.problem = "run_training is not wrapped by speculators' graceful shutdown"
        elif self.error is None:
            self.problem = f"{GRACEFUL_MODULE} has no TrainingInterruptedError"


def _world_size() -> int:
    """torch.distributed's world size once initialized (1 otherwise)."""
    dist: Any = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size())
    except Exception:
        return 1
    return 1


class StepStop:
    """The stop at a step boundary of one training process (see the module docstring).

    ``rank()`` is the process's rank as the session knows it (it changes once
    ``torch.distributed`` is up); ``event(name, **fields)`` writes a lifecycle event;
    ``started`` is when this process's telemetry began (an older request is an earlier
    kill's leftover, never taken)."""

    def __init__(
        self,
        run_dir: Path,
        rank: Callable[[], int],
        event: Callable[..., None],
        *,
        started: float | None = None,
    ) -> None:
        self.request_path = run_dir / STOP_REQUEST
        self.state_path = run_dir / STOP_STATE
        self._rank = rank
        self._event = event
        self.started = time.time() if started is None else started
        self.request: dict[str, Any] | None = None
        """The request taken (rank 0), or the one the store named (other ranks)."""
        self.pending = False
        """Every logged step asks whether it is the stop step."""
        self.stop_at: int | None = None
        """The first step (0-based) at or after which the next logged step stops."""
        self.stopped: dict[str, Any] | None = None
        """Where the run stopped: epoch, local_step, step, global_step (steps done)."""
        self.stopped_at: float | None = None
        """When (wall clock): the interrupt save that follows is newer."""
        self.world = 1
        self.ignored: tuple[int, int, int] | None = None
        """The (inode, size, mtime) of a request file not taken: not read again."""
        self.error = ""
        """The last store error (the job ending); kept for the record, never raised."""

    # ---- the handler's call, in the main thread ----------------------------------------
    def at_step(self, step: int, record: logging.LogRecord, handler: logging.Handler) -> None:
        """At a logged training step, after its optimizer update: raise speculators'
        ``TrainingInterruptedError`` when this is the stop step; else look for a request
        (rank 0: one ``os.stat``), or ask the store for the stop step (pending ranks)."""
        if self.stopped is not None:
            return
        place: LoopPlace | None
        try:
            if self.stop_at is not None:
                if step < self.stop_at:
                    return
                place = LoopPlace(sys._getframe(1))
            elif self.pending:
                place = self._pending_step(step)
                if place is None:
                    return
            elif self._rank() == 0:
                place = self._look_for_request(step)
                if place is None:
                    return
            else:
                return
            if place is None or place.error is None:
                return
            self._stop(step, place)
        except Exception as e:  # never into the trainer, but the interrupt below
            self.error = f"{type(e).__name__}: {e}"[:300]
            return
        deliver_rest(record, handler)
        raise place.error(f"eagle3-tui: stop at a step boundary (after global step {step})")

    def _look_for_request(self, step: int) -> LoopPlace | None:
        """Rank 0 without a request yet: the stop's place when it is to stop now (one
        process), else None (no request; or taken, and the other ranks are asked)."""
        try:
            st = os.stat(self.request_path)
        except OSError:
            return None
        if self.ignored == (st.st_ino, st.st_size, st.st_mtime_ns):
            return None
        self.ignored = (st.st_ino, st.st_size, st.st_mtime_ns)
        request = read_request(self.request_path)
        if request is None or request["at"] < self.started - 1.0:
            return None  # not one, or an earlier kill's: the agent withdraws it
        place = LoopPlace(sys._getframe(2))
        world = _world_size()
        store: Any = _default_store() if world > 1 else None
        problem = place.problem or (
            "torch.distributed has no store to agree on the stop step"
            if world > 1 and store is None
            else ""
        )
        if problem:
            self._write_state("refused", request, reason=problem)
            return None
        try:
            os.unlink(self.request_path)  # taken: the agent's withdrawal fails from now on
        except OSError:
            return None  # withdrawn meanwhile: the agent signals instead
        self.request, self.world, self.ignored = request, world, None
        if world == 1:
            return place
        store.set(STORE_PREFIX + "request", request["id"])
        store.set(self._ready_key(0), "1")
        self.pending = True
        self._write_state("accepted", request, world_size=world)
        return self._pending_step(step)

    def _pending_step(self, step: int) -> LoopPlace | None:
        """A pending rank at a logged step: rank 0 publishes the stop step once every rank
        is ready; the others read it. The place when this step is the stop step."""
        store = _default_store()
        if store is None:
            return None
        try:
            if self.stop_at is None:
                if self._rank() == 0:
                    ready = [self._ready_key(r) for r in range(self.world)]
                    if not store.check(ready):
                        return None
                    store.set(STORE_PREFIX + "at", str(step + 1))
                    self.stop_at = int(store.get(STORE_PREFIX + "at"))
                    self._write_state("scheduled", self.request, stop_at=self.stop_at)
                    return None  # this step is before the stop step, by definition
                if not store.check([STORE_PREFIX + "at"]):
                    return None
                self.stop_at = int(store.get(STORE_PREFIX + "at"))
        except Exception as e:  # the store went away: the job is ending
            self.error = f"{type(e).__name__}: {e}"[:300]
            return None
        if step < self.stop_at:
            return None
        return LoopPlace(sys._getframe(2))

    def _stop(self, step: int, place: LoopPlace) -> None:
        """This is the stop step: the numbers recorded (rank 0: the state file for the
        agent, the ``stop`` event), before the interrupt is raised."""
        steps_done = step + 1  # the metric call comes before speculators' global_step += 1
        trainer_step = getattr(place.trainer, "global_step", None)
        if isinstance(trainer_step, int) and trainer_step != step:
            steps_done = trainer_step + 1  # the Trainer's own count wins
        self.stopped = {
            "epoch": place.epoch,
            "local_step": place.local_step,
            "step": steps_done - 1,
            "global_step": steps_done,
        }
        self.stopped_at = time.time()
        if self._rank() != 0:
            return
        request = self.request or {}
        self._write_state("stopped", request, stopped_at=self.stopped_at, **self.stopped)
        self._event(
            "stop",
            request=request.get("id"),
            requested_at=request.get("at"),
            pid=os.getpid(),
            **self.stopped,
        )

    # ---- the telemetry thread's tick (every interval) ------------------------------------
    def tick(self) -> None:
        """Ranks other than 0: look for rank 0's request in the job's store; once seen,
        pending first, then ready (the order the module docstring's argument needs)."""
        if self.pending or self.stopped is not None or self._rank() == 0:
            return
        store = _default_store()
        if store is None:
            return
        try:
            if not store.check([STORE_PREFIX + "request"]):
                return
            rid = store.get(STORE_PREFIX + "request")
            self.request = {"id": rid.decode("utf-8", "replace") if isinstance(rid, bytes) else ""}
            self.pending = True
            store.set(self._ready_key(self._rank()), "1")
        except Exception as e:  # the store went away: the job is ending
            self.error = f"{type(e).__name__}: {e}"[:300]

    # ---- what speculators says after the stop ------------------------------------------
    def on_message(self, text: str) -> None:
        """Rank 0's ``speculators`` messages after the stop: the interrupt save's end."""
        if self.stopped is None or self._rank() != 0:
            return
        when = self.stopped_at
        if text.startswith(INTERRUPT_SAVED):
            path = text[len(INTERRUPT_SAVED) :].strip().strip("'")
            self._write_state("saved", self.request, saved_to=path, stopped_at=when, **self.stopped)
        elif text.startswith(INTERRUPT_FAILED):
            self._write_state("save_failed", self.request, stopped_at=when, **self.stopped)

    # ---- helpers ---------------------------------------------------------------------
    @staticmethod
    def _ready_key(rank: int) -> str:
        return f"{STORE_PREFIX}ready/{rank}"

    def _write_state(self, phase: str, request: dict[str, Any] | None, **fields: Any) -> None:
        """``stop-state.json`` replaced (never written through a link); an error is kept."""
        state = {
            "v": STOP_VERSION,
            "phase": phase,
            "id": (request or {}).get("id"),
            "pid": os.getpid(),
            "at": time.time(),
            **fields,
        }
        try:
            write_atomic(self.state_path, json.dumps(state).encode(), 0o644, fsync=False)
        except OSError as e:
            self.error = f"{self.state_path}: {e}"[:300]


def deliver_rest(record: logging.LogRecord, handler: logging.Handler) -> None:
    """Hand ``record`` to the handlers logging would have called after ``handler`` (the
    rest of its logger's, then its ancestors' while it propagates): the interrupt raised
    from ``handler`` ends ``logger.info`` there, and the stop step's metrics still reach
    every handler (a user's JSON file, the library's own). Their errors stay theirs."""
    logger: logging.Logger | None = logging.getLogger(record.name)
    after = False
    while logger is not None:
        for h in list(logger.handlers):
            if h is handler:
                after = True
                continue
            if after and record.levelno >= h.level:
                try:
                    h.handle(record)
                except Exception:
                    h.handleError(record)
        if not logger.propagate:
            break
        parent = logger.parent
        logger = parent if isinstance(parent, logging.Logger) else None
