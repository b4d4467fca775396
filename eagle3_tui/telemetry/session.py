"""The telemetry session of one training process: :func:`attach` and :class:`Telemetry`.

What ``attach()`` sets up, and why each part is there:

* a :class:`TelemetryHandler` on ``speculators.metrics`` and ``speculators``,
  with both loggers at INFO (a handler alone on a NOTSET logger receives
  nothing), writing through a :class:`JsonlWriter` (encode in the caller,
  ``os.write`` in a thread: never blocks the training loop);
* protection against ``logging.config.dictConfig``, which speculators'
  ``setup_metric_logger`` calls and which removes every handler of the loggers
  it configures: the ``dictConfig`` that the library calls is wrapped so the
  handler is back the moment it returns, and the writer thread checks every
  interval (a logging reset by any other means is repaired within one interval);
  both are counted (``reattached``) and written as a ``log`` record;
* ``run.json`` and the per-user index (rank 0), the run marker in the
  environment, the ``start``/``resume`` lifecycle event;
* the samplers (GPU, reads, checkpoints, heartbeat) in a sidecar process or a
  thread (see ``sidecar.py``);
* where a quiet trainer is: when the step stops advancing, the writer thread
  records the main thread's stack (``stacks.py``);
* on exit: the final lifecycle event if the script did not write one
  (``crash`` for an uncaught exception), the manifest status, the writer's
  figures in the manifest, every queued line written.

Under torchrun only rank 0 writes metrics, messages below WARNING and lifecycle
events; each node's local rank 0 writes that node's manifest (the ranks, the
torchrun agent and its command line, every node once the job's store has them:
``topology.py``) and samples the node's GPUs; every rank samples its own
dataloader and writes its own heartbeat (its last step, where its main thread is).

Over 600 lines: the session is the one object the trainer holds; its logging protection,
lifecycle events, manifest and ranks all act on the same handler and writer at the same
moments.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import logging.config
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from eagle3_tui.telemetry import manifest as mf
from eagle3_tui.telemetry import procs
from eagle3_tui.telemetry.handler import MESSAGES_LOGGER, METRICS_LOGGER, TelemetryHandler
from eagle3_tui.telemetry.progress import ProgressPrinter
from eagle3_tui.telemetry.reads import READS_ENV, socket_name
from eagle3_tui.telemetry.safefs import foreign_dir_problem
from eagle3_tui.telemetry.samplers import SAMPLERS, SamplerConfig
from eagle3_tui.telemetry.schema import (
    CHECKPOINT_SAVED,
    MANIFEST_FILE,
    METRICS_FILE,
    SAVING_CHECKPOINT,
    Kind,
)
from eagle3_tui.telemetry.stacks import StallWatch
from eagle3_tui.telemetry.stop import MANIFEST_FIELD as STOP_FIELD
from eagle3_tui.telemetry.stop import StepStop
from eagle3_tui.telemetry.topology import (
    TORCHRUN_ENV,
    Place,
    TopologyExchange,
    launcher_info,
    manifest_fields,
    nodes_of,
    place_from_env,
    rank_entry,
)
from eagle3_tui.telemetry.where import MainThreadWhere
from eagle3_tui.telemetry.writer import JsonlWriter

NVML_FIXTURE_ENV = "EAGLE3_TUI_NVML_FIXTURE"
"""A recorded-readings file for the GPU sampler instead of the real NVML (tests, demos)."""

_STATUS_OF_EVENT = {"finish": "finished", "interrupt": "interrupted", "crash": "crashed"}
_EVENT_ALIASES = {"finished": "finish", "interrupted": "interrupt", "crashed": "crash"}
_TELEMETRY_LOGGER = "eagle3_tui.telemetry"


def _env_rank() -> int:
    for name in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(name)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                pass
    return 0


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _distributed_rank() -> int | None:
    """torch.distributed's rank when it is initialized (without importing torch)."""
    td = sys.modules.get("torch.distributed")
    if td is None:
        return None
    try:
        if td.is_available() and td.is_initialized():
            return int(td.get_rank())
    except Exception:
        return None
    return None


class Telemetry:
    """An attached telemetry session: its writer, handler, manifest and samplers."""

    def __init__(
        self,
        run_dir: Path,
        writer: JsonlWriter,
        handler: TelemetryHandler,
        *,
        interval: float = 1.0,
    ) -> None:
        self.run_dir = run_dir
        self.writer = writer
        self.handler = handler
        self.interval = interval
        self.run_id = ""
        self.rank = writer.rank
        self.manifest_path = run_dir / MANIFEST_FILE
        self.manifest: dict[str, Any] | None = None
        self.trainer: Any = None
        self.samplers: Any = None
        """The sampler host: a SidecarClient, a ThreadSamplers, or None."""
        self.sampler_config: SamplerConfig | None = None
        self.progress: ProgressPrinter | None = None
        self.place = Place()
        self.topology: TopologyExchange | None = None
        """Under torchrun: this rank's entry in the job's store, and everybody's."""
        self._where: MainThreadWhere | None = None
        self.reattached = 0
        self.interrupted = False
        self._finished = False
        self._stop_pid: int | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._prev_excepthook: Callable[..., Any] | None = None
        handler.on_message = self._on_message
        self.stall_watch = StallWatch(self.progress_step, self._write_stack)
        """Records the main thread's stack when the steps stop (see ``stacks.py``)."""
        self.step_stop = StepStop(run_dir, lambda: self.rank, self.event)
        """The stop at a step boundary a kill asks for (``stop.py``), checked by the handler
        after each training step's metrics."""
        handler.step_stop = self.step_stop

    @property
    def last_step(self) -> int | None:
        """The step of the last train record written."""
        return self.handler.last_step

    @last_step.setter
    def last_step(self, step: int | None) -> None:
        self.handler.last_step = step

    def progress_step(self) -> int | None:
        """How far the training is: the watched Trainer's ``global_step`` (every step,
        every rank), else the step of the last train record written."""
        step = getattr(self.trainer, "global_step", None)
        return step if isinstance(step, int) else self.last_step

    def _write_stack(self, payload: dict[str, Any]) -> None:
        self.writer.write(Kind.STACK, payload)

    # ---- logging ----------------------------------------------------------------
    def ensure_attached(self) -> bool:
        """(Re)attach the handler and levels; idempotent. Returns whether it changed anything."""
        changed = False
        for name in (METRICS_LOGGER, MESSAGES_LOGGER):
            logger = logging.getLogger(name)
            if self.handler not in logger.handlers:
                logger.addHandler(self.handler)
                changed = True
            if logger.getEffectiveLevel() > logging.INFO:
                logger.setLevel(logging.INFO)
                changed = True
            if logger.disabled:
                logger.disabled = False
                changed = True
        return changed

    def reattach(self, reason: str) -> bool:
        """Re-attach after something reset logging; counted and written as a ``log`` record."""
        if self._closed or not self.ensure_attached():
            return False
        self.reattached += 1
        self._log("INFO", f"telemetry re-attached to the speculators loggers after {reason}")
        return True

    # ---- records ----------------------------------------------------------------
    def event(self, event: str, **fields: object) -> None:
        """Write a lifecycle event (start, resume, interrupt, finish, crash...)."""
        self.writer.write(Kind.LIFECYCLE, {"event": event, **fields})

    def _log(self, level: str, text: str) -> None:
        self.writer.write(Kind.LOG, {"level": level, "logger": _TELEMETRY_LOGGER, "msg": text})

    def _warn(self, text: str) -> None:
        self._log("WARNING", text)
        with contextlib.suppress(Exception):  # a closed stderr
            print(f"eagle3-tui telemetry: {text}", file=sys.stderr)

    def stats(self) -> dict[str, Any]:
        """The writer's figures and the session's (what a heartbeat reports)."""
        s = self.writer.figures()
        s["reattached"] = self.reattached
        s["last_step"] = self.last_step
        s["interrupted"] = self.interrupted or self.step_stop.stopped is not None
        unsent = getattr(self.samplers, "unsent", 0)
        if unsent:
            s["sidecar_unsent"] = unsent
        if self._where is not None:  # under torchrun: which rank stopped, which ones wait
            s["where"] = self._where.where()
        return s

    # ---- what the handler passes on ----------------------------------------------
    def _on_message(self, text: str) -> None:
        if text.startswith((SAVING_CHECKPOINT, CHECKPOINT_SAVED)):
            self._send({"op": "message", "text": text, "ts": time.time()})
        elif text.startswith("Received SIG") and "interrupting" in text:
            self.interrupted = True
        self.step_stop.on_message(text)

    def _send(self, op: dict[str, Any]) -> None:
        host = self.samplers
        if host is not None:
            host.send(op)

    # ---- the writer thread's tick ------------------------------------------------
    def _tick(self) -> None:
        """Every interval, in the writer thread: repair logging, follow the rank,
        publish the figures to the sidecar, replace a dead sidecar by a thread."""
        if self._closed:
            return
        self.reattach("a logging reset (found by the periodic check)")
        self.step_stop.tick()
        if self.rank == 0 or self.trainer is not None:  # a rank > 0 logs no step of its own
            self.stall_watch.tick()
        rank = _distributed_rank()
        if rank is not None and rank != self.rank:
            self.rank = self.writer.rank = rank
            self.handler.is_writer_rank = rank == 0
        if self.topology is not None and not self.topology.done:
            entries = self.topology.step()
            if entries is not None:
                mine = self.place.node_rank
                self.update_manifest(
                    ranks=[e for e in entries if e.get("node_rank") == mine],
                    nodes=nodes_of(entries),
                )
        host = self.samplers
        if host is None:
            return
        if getattr(host, "source", "") == "sidecar":
            if host.alive():
                host.send({"op": "stats", "ts": time.time(), "stats": self.stats()})
            elif not self._finished:
                self._warn(
                    f"the sampler sidecar (pid {host.pid}) exited; sampling in a thread instead"
                )
                self._start_samplers("thread")

    # ---- samplers ----------------------------------------------------------------
    def _start_samplers(self, how: str) -> None:
        cfg = self.sampler_config
        if cfg is None:
            return
        from eagle3_tui.telemetry.sidecar import SidecarClient, ThreadSamplers

        if how == "sidecar":
            try:
                self.samplers = SidecarClient(cfg)
                return
            except Exception as e:  # no fork, no interpreter: fall back to a thread
                self._warn(f"cannot start the sampler sidecar ({e}); sampling in a thread")
        self.samplers = ThreadSamplers(cfg, self.writer, self.stats)

    # ---- manifest ----------------------------------------------------------------
    @property
    def writes_manifest(self) -> bool:
        """Rank 0, or under torchrun each node's local rank 0 (its node's manifest)."""
        return self.manifest is not None

    def update_manifest(self, **fields: Any) -> None:
        """Set fields of ``run.json`` (rank 0 only); never raises into the trainer."""
        if not self.writes_manifest:
            return
        with self._lock:
            assert self.manifest is not None
            self.manifest.update(fields)
            self.manifest["updated_at"] = time.time()
            try:
                mf.write_manifest(self.manifest_path, self.manifest)
            except OSError as e:
                self._warn(f"cannot update {self.manifest_path}: {e}")

    def bounds(self) -> tuple[int | None, int | None]:
        m = self.manifest or {}
        return m.get("total_steps"), m.get("epochs")

    def watch_trainer(self, trainer: Any) -> None:
        """Learn the run's bounds from a speculators ``Trainer``: checkpoint dir,
        epochs, steps per epoch (and total), the global step it starts from."""
        self.trainer = trainer
        config = getattr(trainer, "config", None)
        fields: dict[str, Any] = {}
        save_path = getattr(config, "save_path", None)
        if save_path is not None:
            fields["checkpoint_dir"] = str(Path(save_path).resolve())
        epochs = getattr(config, "num_epochs", None)
        if isinstance(epochs, int):
            fields["epochs"] = epochs
        try:
            steps = len(trainer.train_loader)
        except Exception:  # an iterable loader has no length
            steps = None
        if isinstance(steps, int):
            fields["steps_per_epoch"] = steps
        e, s = fields.get("epochs"), fields.get("steps_per_epoch")
        if e is not None and s is not None:
            fields["total_steps"] = e * s
        max_steps = getattr(config, "max_steps", None)
        if isinstance(max_steps, int) and max_steps > 0:
            fields["total_steps"] = min(fields.get("total_steps", max_steps), max_steps)
        step = getattr(trainer, "global_step", None)
        if isinstance(step, int) and self.last_step is None:
            self.last_step = step - 1 if step > 0 else None
        if fields and self.manifest is not None:
            self.update_manifest(**fields)
        if "checkpoint_dir" in fields:
            if self.sampler_config is not None:
                self.sampler_config.checkpoint_dir = fields["checkpoint_dir"]
            self._send({"op": "ckpt_dir", "path": fields["checkpoint_dir"]})

    # ---- end ---------------------------------------------------------------------
    def finish(self, status: str | None = None, **fields: object) -> None:
        """Write the final lifecycle event (``finish``, ``interrupt`` or ``crash``) and
        the manifest status. Idempotent: the first call wins.

        Without ``status`` it is decided as at exit (:meth:`final_status`). An interrupt
        is never overwritten: speculators returns normally from ``run_training()`` after
        a SIGTERM/SIGINT (it saved ``interrupted/``), so a ``finish`` asked for after the
        handler saw "Received SIGTERM — interrupting" is written as ``interrupt``.

        After a stop at a step boundary (``stop.py``) it is an ``interrupt`` too, and its
        ``step`` is the steps done at the stop, whatever the caller passed: the interrupt
        left ``train_epoch`` before speculators counted that step (``global_step`` is one
        short), and a caller passing ``trainer.global_step`` would say one step less than
        the save holds."""
        if self._finished:
            return
        self._finished = True
        stopped = self.step_stop.stopped
        if stopped is not None:
            self.interrupted = True
            fields["step"] = stopped["global_step"]
        event = _EVENT_ALIASES.get(status, status) if status else self._auto_status()
        if event == "finish" and self.interrupted:
            event = "interrupt"
        if "step" not in fields:
            step = getattr(self.trainer, "global_step", None)
            if isinstance(step, int):
                fields["step"] = step
            elif self.last_step is not None:
                fields["step"] = self.last_step + 1
        if self.rank == 0 or event == "crash":
            self.event(event, **fields)
        self._send({"op": "finish", "event": event})
        self.update_manifest(status=_STATUS_OF_EVENT.get(event, event), finished_at=time.time())

    def final_status(self) -> str:
        """``interrupt`` when the trainer was interrupted or stopped short of its total
        steps, else ``finish`` (what :meth:`finish` is given at exit by default)."""
        return self._auto_status()

    def _auto_status(self) -> str:
        if self.interrupted or self.step_stop.stopped is not None:
            return "interrupt"
        total, _ = self.bounds()
        step = getattr(self.trainer, "global_step", None)
        if not isinstance(step, int) and self.last_step is not None:
            step = self.last_step + 1
        if isinstance(total, int) and isinstance(step, int) and step < total:
            return "interrupt"
        return "finish"

    def close(self, timeout: float = 5.0) -> None:
        """Stop the samplers, write every queued line, record the writer's figures in
        the manifest, detach from the loggers. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for name in (METRICS_LOGGER, MESSAGES_LOGGER):
            logging.getLogger(name).removeHandler(self.handler)
        if self._prev_excepthook is not None and sys.excepthook == self._excepthook:
            sys.excepthook = self._prev_excepthook
        self.writer.flush(timeout)
        host = self.samplers
        if host is not None:
            if getattr(host, "source", "") == "sidecar":  # its last heartbeat: the final figures
                host.send({"op": "stats", "ts": time.time(), "stats": self.stats()})
            self.samplers = None
            host.close(timeout)
        self.writer.flush(timeout)
        stats = self.writer.figures()
        self.update_manifest(
            telemetry={k: stats[k] for k in ("written", "dropped", "bytes", "errors", "last_error")}
        )
        self.writer.close(timeout)
        _sessions.discard(self)
        atexit.unregister(self._at_exit)

    def detach(self) -> None:
        """Same as :meth:`close` (the name of the walking skeleton)."""
        self.close()

    def _excepthook(
        self, t: type[BaseException], v: BaseException, tb: TracebackType | None
    ) -> None:
        if not issubclass(t, KeyboardInterrupt):
            self.finish("crash", error=f"{t.__name__}: {v}"[:2000])
        else:
            self.finish("interrupt")
        prev = self._prev_excepthook or sys.__excepthook__
        prev(t, v, tb)

    def _at_exit(self) -> None:
        if self._closed:
            return
        self.finish(self._auto_status())
        self.close(timeout=3.0)

    def _install_stop_handler(self) -> None:
        """SIGTERM before speculators installs its graceful-shutdown handler (in
        ``run_training``: while the model loads, the workers spawn) or after it removed
        it ends the process at once, nothing saved, and without a word it would read as
        a crash. This handler says it first — an ``interrupt`` that names the signal and
        that nothing was saved — then lets the signal end the process as before. Only
        where nothing else handles SIGTERM; speculators' handler replaces it while
        training and puts it back after."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self._stop_pid = os.getpid()
            signal.signal(signal.SIGTERM, self._on_stop_signal)

    def _on_stop_signal(self, signum: int, frame: object) -> None:
        if os.getpid() == self._stop_pid and not self._finished:
            name = signal.Signals(signum).name
            self.interrupted = True
            self.finish("interrupt", error=f"{name} outside the training loop: nothing saved")
            self.close(timeout=2.0)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


# ---- surviving dictConfig ------------------------------------------------------------------

_sessions: weakref.WeakSet[Telemetry] = weakref.WeakSet()
_hook_lock = threading.Lock()


def _reattach_all(reason: str) -> None:
    for s in list(_sessions):
        try:
            s.reattach(reason)
        except Exception as e:  # never into the caller of dictConfig
            s.writer._count_error(e)


def install_dictconfig_hook() -> None:
    """Wrap ``logging.config.dictConfig`` (and the copy speculators imported, if it
    already did) so that telemetry re-attaches the moment any dictConfig returns."""
    with _hook_lock:
        current: Any = logging.config.dictConfig
        if getattr(current, "_eagle3_tui_wrapped", False):
            original: Any = current.__wrapped__
            wrapper: Any = current
        else:
            original = current

            def dict_config(config: Any) -> None:
                try:
                    original(config)
                finally:
                    _reattach_all("logging.config.dictConfig")

            wrapper = dict_config
            wrapper.__wrapped__ = original
            wrapper._eagle3_tui_wrapped = True
            wrapper.__doc__ = original.__doc__
            wrapper.__name__ = "dictConfig"
            setattr(logging.config, "dictConfig", wrapper)  # noqa: B010 - typeshed: a function
        # speculators.train.logger did `from logging.config import dictConfig`:
        # if it was imported before us, its name still points at the original.
        for name in ("speculators.train.logger",):
            module: Any = sys.modules.get(name)
            if module is not None and getattr(module, "dictConfig", None) is original:
                module.dictConfig = wrapper


# ---- attach ----------------------------------------------------------------------------


def attach(
    run_dir: str | os.PathLike[str],
    *,
    rank: int | None = None,
    trainer: Any = None,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    epochs: int | None = None,
    steps_per_epoch: int | None = None,
    resume_command: list[str] | None = None,
    log_file: str | None = None,
    samplers: bool | Iterable[str] = True,
    sampler_host: str = "sidecar",
    interval: float = 1.0,
    intervals: Mapping[str, float] | None = None,
    progress_every: int = 0,
    exclude_pids: Iterable[int] = (),
) -> Telemetry:
    """Attach telemetry that writes ``run_dir/metrics.jsonl`` and ``run_dir/run.json``.

    Call it before or after building the Trainer, before or after the library's
    ``setup_metric_logger``. ``samplers``: True for all (``gpu``, ``io``,
    ``ckpt``, ``heartbeat``), False for none, or the names to run;
    ``sampler_host``: ``"sidecar"`` (a process, the default) or ``"thread"``;
    ``interval`` (s) for all samplers, ``intervals`` per sampler (0 = off);
    ``progress_every``: print a one-line summary every N steps to stderr.

    On a run directory that already has a manifest (a resume) the run keeps its
    id and a ``resume`` event is written instead of ``start``. Raises only when
    ``run_dir`` cannot be created, or belongs (or a directory above it) to another
    user, who could redirect what is written there; after that, nothing raises into
    the trainer.
    """
    enabled = _sampler_names(samplers, sampler_host, interval)
    rank = _env_rank() if rank is None else rank
    place = place_from_env(rank)
    path = _node_run_dir(Path(run_dir), place)
    run_id = mf.resolve_run_id(path)
    # inherited by the dataloader workers spawned later
    os.environ[mf.RUN_ID_ENV] = run_id
    os.environ[mf.RUN_DIR_ENV] = str(path.resolve())
    telemetry = _new_session(path, rank, place, run_id, interval)

    previous = _previous_manifest(path)
    ckpt_dir = _checkpoint_dir(checkpoint_dir, trainer, previous)
    if rank == 0 or (place.launcher_pid is not None and place.node_leader):
        _write_manifest(
            telemetry,
            previous,
            resume_command=resume_command,
            checkpoint_dir=ckpt_dir,
            epochs=epochs,
            steps_per_epoch=steps_per_epoch,
            log_file=log_file,
        )
    if enabled:
        _start_samplers(telemetry, enabled, sampler_host, ckpt_dir, intervals, exclude_pids)
    if progress_every > 0:
        telemetry.progress = ProgressPrinter(progress_every, telemetry.bounds)
        telemetry.handler.on_metrics = telemetry.progress.on_metrics
    if trainer is not None:
        telemetry.watch_trainer(trainer)
    if rank == 0:  # lifecycle events of the run come from rank 0 (a crash from any rank)
        _first_event(telemetry, previous, trainer, ckpt_dir)
    _install_exit_hooks(telemetry, rank)
    return telemetry


def _previous_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest an earlier process of the run wrote (this is a resume), if any."""
    try:
        return mf.read_manifest(path / MANIFEST_FILE)
    except (OSError, ValueError):
        return None


def _checkpoint_dir(
    checkpoint_dir: str | os.PathLike[str] | None, trainer: Any, previous: dict[str, Any] | None
) -> str | None:
    """Where the run saves checkpoints: as given, else the trainer's ``save_path``,
    else what the earlier manifest said."""
    if trainer is not None and checkpoint_dir is None:
        checkpoint_dir = getattr(getattr(trainer, "config", None), "save_path", None)
    if checkpoint_dir is not None:
        return str(Path(checkpoint_dir).resolve())
    return previous.get("checkpoint_dir") if previous is not None else None


def _install_exit_hooks(telemetry: Telemetry, rank: int) -> None:
    """What ends the session whatever ends the process: the excepthook (a crash), the
    exit handler (the final event, the queue written) and, on rank 0, the stop signal."""
    telemetry._prev_excepthook = sys.excepthook
    sys.excepthook = telemetry._excepthook
    atexit.register(telemetry._at_exit)
    if rank == 0:
        telemetry._install_stop_handler()


def _sampler_names(samplers: bool | Iterable[str], sampler_host: str, interval: float) -> list[str]:
    """The samplers to run; ValueError for an unknown one or a bad host or interval."""
    enabled = list(SAMPLERS) if samplers is True else list(samplers or [])
    unknown = sorted(set(enabled) - set(SAMPLERS))
    if unknown:
        raise ValueError(f"unknown samplers {unknown}; known: {', '.join(SAMPLERS)}")
    if sampler_host not in ("sidecar", "thread"):
        raise ValueError(f"sampler_host must be 'sidecar' or 'thread', not {sampler_host!r}")
    if not interval > 0:
        raise ValueError(f"interval must be positive, not {interval!r}")
    return enabled


def _node_run_dir(run_dir: Path, place: Place) -> Path:
    """This node's run directory, made, with any earlier session on it closed."""
    path = run_dir
    if place.node_rank > 0:
        # another node's telemetry has a run directory of its own inside the run's: on a
        # shared filesystem the nodes never write the same files, on local disks each
        # node's directory is complete (its manifest, its samples) for its own agent
        path = path / f"node{place.node_rank}"
    path.mkdir(parents=True, exist_ok=True)
    refused = foreign_dir_problem(path)
    if refused is not None:
        raise PermissionError(f"eagle3-tui telemetry: {refused}: use a run directory of your own")
    for earlier in list(_sessions):  # attached again (a notebook): one session per run dir
        if earlier.run_dir.resolve() == path.resolve():
            earlier.close()
    return path


def _new_session(path: Path, rank: int, place: Place, run_id: str, interval: float) -> Telemetry:
    """The writer, the handler on the library's loggers, the ranks' exchange."""
    telemetry: Telemetry | None = None

    def tick() -> None:
        if telemetry is not None:
            telemetry._tick()

    writer = JsonlWriter(path / METRICS_FILE, rank=rank, tick=(interval, tick), run_id=run_id)
    handler = TelemetryHandler(writer, is_writer_rank=rank == 0)
    telemetry = Telemetry(path, writer, handler, interval=interval)
    telemetry.run_id = run_id
    telemetry.place = place
    if place.launcher_pid is not None:
        telemetry._where = MainThreadWhere()
        telemetry.topology = TopologyExchange(
            place, rank_entry(place, str(path.resolve()), run_id), collect=place.node_leader
        )
    _sessions.add(telemetry)
    install_dictconfig_hook()
    telemetry.ensure_attached()
    return telemetry


def _write_manifest(
    telemetry: Telemetry,
    previous: dict[str, Any] | None,
    *,
    resume_command: list[str] | None,
    checkpoint_dir: str | None,
    epochs: int | None,
    steps_per_epoch: int | None,
    log_file: str | None,
) -> None:
    """The run's manifest (a resume carries the earlier one's facts on) and its
    index entry; a failure to write them is a warning."""
    path, run_id, place = telemetry.run_dir, telemetry.run_id, telemetry.place
    launcher = launcher_info(place.launcher_pid) if place.launcher_pid is not None else None
    if launcher is not None and launcher["argv"]:
        resume_command = list(launcher["argv"])  # the same torchrun arguments
    manifest = mf.build_manifest(
        path,
        run_id=run_id,
        resume_command=resume_command,
        checkpoint_dir=checkpoint_dir,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        log_file=log_file,
    )
    if place.distributed:
        entry = rank_entry(place, manifest["run_dir"], run_id)
        manifest.update(manifest_fields(place, launcher, entry))
    manifest["stop"] = dict(STOP_FIELD)  # a kill may ask for a stop at a step boundary
    if previous is not None:
        for key in _CARRIED:
            if manifest.get(key) is None and previous.get(key) is not None:
                manifest[key] = previous[key]
        manifest["first_started_at"] = previous.get("first_started_at", previous.get("started_at"))
        manifest["resumes"] = int(previous.get("resumes", 0) or 0) + 1
    else:  # the process's own start: telemetry attached to a training mid-way began later
        manifest["first_started_at"] = _process_start(manifest["started_at"])
        manifest["resumes"] = 0
    if manifest.get("log_file") is None:  # the one-liner under `nohup … > train.log`
        started = place.launcher_pid if place.launcher_pid is not None else os.getpid()
        manifest["log_file"] = procs.output_file(started)
    if _save_environment(telemetry):
        manifest["resume_env_file"] = mf.RESUME_ENV_FILE
    telemetry.manifest = manifest
    try:
        mf.write_manifest(telemetry.manifest_path, manifest)
        mf.register_run(manifest)
    except OSError as e:
        telemetry._warn(f"cannot write the run manifest or index: {e}")


_CARRIED = (
    "checkpoint_dir",
    "epochs",
    "steps_per_epoch",
    "total_steps",
    "log_file",
    "resume_env_file",
    mf.STOP_SAVES,
)
"""What a resumed process keeps of the manifest before it when it cannot tell itself."""


def _save_environment(telemetry: Telemetry) -> bool:
    """The whole environment the run's command was started with, kept for ``resume`` to
    run it in again (the script's own variables, the scheduler's, the user's PATH): the
    initial environment (``/proc/PID/environ``) of this process, or under torchrun of the
    agent whose command a resume reruns, in ``resume-env.json``, mode 0600 (it may hold
    tokens). False when it cannot be written (a warning; resume then starts from the
    agent's environment and the manifest's few variables)."""
    place = telemetry.place
    env = procs.environ(place.launcher_pid) if place.launcher_pid is not None else None
    if env is None:
        env = procs.environ(os.getpid()) or dict(os.environ)
        if place.launcher_pid is not None:  # a rank's own: less what torchrun sets per rank
            env = {k: v for k, v in env.items() if k not in TORCHRUN_ENV}
    path = telemetry.run_dir / mf.RESUME_ENV_FILE
    try:
        mf.save_environment(path, env)
    except OSError as e:
        telemetry._warn(f"cannot write {path}: {e}; resume uses the agent's environment")
        return False
    return True


def _start_samplers(
    telemetry: Telemetry,
    enabled: list[str],
    sampler_host: str,
    checkpoint_dir: str | None,
    intervals: Mapping[str, float] | None,
    exclude_pids: Iterable[int],
) -> None:
    """The samplers' configuration, the samplers started, their pid in the manifest."""
    place = telemetry.place
    reads = socket_name(telemetry.run_id, os.getpid()) if "io" in enabled else None
    if reads:
        os.environ[READS_ENV] = reads
    telemetry.sampler_config = SamplerConfig(
        run_dir=str(telemetry.run_dir.resolve()),
        trainer_pid=os.getpid(),
        trainer_start_ticks=procs.start_ticks(os.getpid()),
        rank=telemetry.writer.rank,
        run_id=telemetry.run_id,
        interval=telemetry.interval,
        intervals=dict(intervals or {}),
        enabled=enabled,
        checkpoint_dir=checkpoint_dir,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        local_rank=_env_int("LOCAL_RANK"),
        world_size=_env_int("WORLD_SIZE") or 1,
        local_world_size=place.local_world_size,
        launcher_pid=place.launcher_pid,
        gpu_scope=(
            "own" if place.launcher_pid is None else "node" if place.node_leader else "none"
        ),
        writes_manifest=telemetry.manifest is not None,
        nvml_fixture=os.environ.get(NVML_FIXTURE_ENV),
        reads_socket=reads,
        exclude_pids=list(exclude_pids),
    )
    telemetry._start_samplers(sampler_host)
    if telemetry.manifest is not None and telemetry.samplers is not None:
        telemetry.update_manifest(sampler_pid=telemetry.samplers.pid)


def _first_event(
    telemetry: Telemetry, previous: dict[str, Any] | None, trainer: Any, ckpt_dir: str | None
) -> None:
    """``start`` (a trainer attached to while it trains starts where it is), or
    ``resume`` from the checkpoint it resumes from."""
    if previous is None:
        step = telemetry.progress_step() if trainer is not None else 0
        telemetry.event("start", pid=os.getpid(), global_step=step or 0, run_id=telemetry.run_id)
        return
    checkpoint, step = mf.resume_point(ckpt_dir)
    if trainer is not None and isinstance(getattr(trainer, "global_step", None), int):
        step = trainer.global_step
    telemetry.event(
        "resume", pid=os.getpid(), checkpoint=checkpoint, global_step=step, run_id=telemetry.run_id
    )


def _process_start(telemetry_start: float) -> float:
    """When this process started (the kernel's word), where that is before its
    telemetry's start (a live attach, a kill that attached first: hours earlier); else
    the telemetry's start."""
    st = procs.stat(os.getpid())
    began = procs.started_at(st) if st is not None else None
    return began if began is not None and began < telemetry_start else telemetry_start
