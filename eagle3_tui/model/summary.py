"""The state of a run as one plain dict: what ``eagle3-tui summary`` prints.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

import math
import os
from typing import Any

from eagle3_tui.model.anomalies import NonFinite, Resume, Spike
from eagle3_tui.model.derived import epoch_number, step_number
from eagle3_tui.model.health import stuck_at
from eagle3_tui.model.inert import printable
from eagle3_tui.model.liveness import process_role
from eagle3_tui.model.observed import metrics_source
from eagle3_tui.model.observed_health import stuck_observed
from eagle3_tui.model.snapshot import Snapshot, ViewParams, build_snapshot
from eagle3_tui.model.stack import StackFrame, StackSample, key_frames, stuck_json
from eagle3_tui.model.state import RunState
from eagle3_tui.model.units import clock, duration, size


def _num(x: float | None) -> float | str | None:
    if x is None:
        return None
    if math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def summarize(state: RunState, now: float) -> dict[str, Any]:
    """Everything a script needs, JSON-ready (non-finite floats as strings)."""
    snap = build_snapshot(state, now, ViewParams(columns=1, smoothing=0.0))
    out = summary_of(snap)
    if state.plain_records:
        out["format"] = {
            "plain_records": state.plain_records,
            "handler_lines": state.wrapped_records,
        }
    observed = state.observed is not None and state.last_train_ts is None
    stuck = stuck_observed(state) if observed else stuck_at(state)
    # a stall is current only while the run goes on: once it ended (finished, stopped,
    # died) a stack of its last quiet spell (a final validation...) is history
    ended = out.get("ended_at") is not None
    out["stuck"] = _stuck(stuck) if stuck is not None and not ended else None
    out["stack_before_end"] = _stuck(stuck) if stuck is not None and ended else None
    if out["checkpoint"] is not None:
        out["checkpoint"]["present"] = _present(
            out["checkpoint"]["path"], state.liveness.checkpoints_present
        )
    if observed and stuck is None and state.observed is not None:
        # where a run without telemetry is stuck cannot be read (no py-spy): why
        out["stuck_unavailable"] = state.observed.info.stack_unavailable
    return out


def _in_speculators(f: StackFrame) -> bool:
    return f"{os.sep}speculators{os.sep}" in f.file


def where_frames(frames: tuple[StackFrame, ...]) -> list[StackFrame]:
    """The frames a location is told by, innermost first: ``stack.key_frames`` (the
    innermost, the training's own, speculators' where it called the training's code),
    and the speculators Trainer's method the main thread is in (``Trainer.val_epoch``:
    validating) where none of them is one: a script whose ``main`` calls
    ``run_training`` (its own frame outermost) would else say nothing of the loop."""
    chosen = key_frames(frames)
    loop = [f for f in frames if _in_speculators(f)]
    if not any(f in loop and f.func.startswith("Trainer.") for f in chosen):
        trainer = next((f for f in loop if f.func.startswith("Trainer.")), None)
        if trainer is None and not any(f in loop for f in chosen):
            trainer = next(iter(loop), None)
        if trainer is not None and trainer not in chosen:
            chosen.append(trainer)
    return sorted(chosen, key=frames.index)


def _stuck(sample: StackSample) -> dict[str, Any]:
    """``stuck_json``, its one line told by :func:`where_frames`."""
    out = stuck_json(sample)
    out["where"] = " ← ".join(
        f"{f.func} ({os.path.basename(f.file)}:{f.line})" for f in where_frames(sample.frames)
    )
    return out


def _present(path: str, numbered: bool | None) -> bool | None:
    """Whether the last checkpoint saved is still there, as far as the host said: a
    numbered one is gone when the host found no numbered checkpoint in its directory."""
    if numbered is False and path.rstrip("/").rsplit("/", 1)[-1].isdigit():
        return False
    return None


def summary_of(snap: Snapshot) -> dict[str, Any]:
    p = snap.progress
    ttt = [
        {
            "step": k,
            "full_acc": _num(snap.latest.get(f"train/full_acc_{k}")),
            "cond_acc": _num(snap.latest.get(f"train/cond_acc_{k}")),
        }
        for k in range(snap.ttt_steps)
    ]
    last_ckpt = next((c for c in reversed(snap.checkpoints) if c.event == "save_finished"), None)
    return {
        "health": snap.health.value,
        "reason": snap.diagnosis.reason,
        "step": p.step,
        "global_step": p.global_step,
        "epoch": p.epoch,
        "epochs": p.epochs_total,
        "total_steps": p.total_steps,
        "loss": _num(snap.latest.get("train/loss")),
        "ttt": ttt,
        "tau": _num(snap.tau),
        "steps_per_s": _num(p.steps_per_s),
        "tokens_per_s": _num(p.tokens_per_s),
        "pace_over": p.pace_over,
        "eta_epoch_s": _num(p.eta_epoch_s),
        "eta_run_s": _num(p.eta_run_s),
        "elapsed_s": _num(p.elapsed_s),
        "ended_at": p.ended_at,
        "ended_by": p.ended_by,
        "fetch_frac": _num(p.fetch_frac),
        "metrics": {k: _num(v) for k, v in sorted(snap.latest.items())},
        "validation": [
            {
                "epoch": epoch_number(r.epoch),
                # the steps done when it ran, as shown (1-based); global_step: the
                # last of them in speculators' counter, as the top-level one
                "step": r.step,
                "global_step": None if r.step is None else r.step - 1,
                **{k: _num(v) for k, v in r.values.items()},
            }
            for r in snap.val_rows
        ],
        "gpus": {
            "status": snap.gpu_status,
            "error": snap.gpu_error,
            "devices": [
                {
                    "index": g.index,
                    "name": g.name,
                    "util": g.util,
                    "mem_used": g.mem_used,
                    "mem_total": g.mem_total,
                    "power_w": g.power_w,
                    "temp_c": g.temp_c,
                }
                for g in snap.gpus
            ],
        },
        "checkpoint": (
            {
                "path": last_ckpt.path,
                "bytes": last_ckpt.bytes,
                # checkpoints/2 holds the third epoch (an epoch that is no number: as it is)
                "epoch": (
                    epoch_number(last_ckpt.epoch)
                    if isinstance(last_ckpt.epoch, int)
                    else last_ckpt.epoch
                ),
            }
            if last_ckpt is not None
            else None
        ),
        "saving": snap.saving,
        "records": snap.records,
        "malformed_lines": snap.malformed,
        "lost_records": snap.lost,
        "duplicate_records": snap.duplicates,
        "file_changes": [
            {
                "change": n.change,
                "outcome": n.outcome,
                "at": n.at,
                "moved_to": n.moved_to,
                "records_lost": n.lost,
                "said": n.text,
            }
            for n in snap.files
        ],
        "other_file": snap.other_file,
        "write_gaps": [
            {
                "writer": g.writer,
                "reason": g.reason,
                "records": g.records,
                "first_seq": g.first_seq,
                "last_seq": g.last_seq,
                "since": g.since,
                "until": g.until,
                "said": g.sentence(),
            }
            for g in snap.write_gaps
        ],
        "disk": _disk(snap),
        # as shown, 1-based (anomalies' resumes say the same steps so)
        "redone_steps": [
            {"first": step_number(r.first), "last": step_number(r.last)} for r in snap.redos
        ],
        "leftovers": [
            {
                "pid": x.pid,
                "comm": x.comm,
                "role": x.kind,
                "rss_bytes": x.rss_bytes,
                "gpu_bytes": x.gpu_bytes,
                "alive": not x.gone,
            }
            for x in snap.leftovers
        ],
        "telemetry": snap.observed is None,
        "observed": _observed(snap),
        "anomalies": _anomalies(snap),
    }


def _anomalies(snap: Snapshot) -> dict[str, list[dict[str, Any]]]:
    """What happened on the way, by kind; steps as "step N" shows them (1-based)."""
    out: dict[str, list[dict[str, Any]]] = {
        "nonfinite": [],
        "spikes": [],
        "resumes": [],
        "gaps": [],
    }
    for a in snap.anomalies:
        if isinstance(a, NonFinite):
            out["nonfinite"].append(
                {
                    "metric": a.metric,
                    "first_step": a.first_step,
                    "last_step": a.last_step,
                    "logged_steps": a.logged_steps,
                    "values": list(a.values),
                    "to_end": a.to_end,
                    "said": a.said,
                }
            )
        elif isinstance(a, Spike):
            out["spikes"].append(
                {
                    "metric": a.metric,
                    "first_step": a.first_step,
                    "last_step": a.last_step,
                    "peak": _num(a.peak),
                    "baseline": _num(a.baseline),
                    "factor": _num(a.factor),
                    "z": _num(a.z),
                    "said": a.said,
                }
            )
        elif isinstance(a, Resume):
            again = a.redone
            out["resumes"].append(
                {
                    "at": a.at,
                    "first_step": a.first_step,
                    "redone": {"first_step": again[0], "last_step": again[1]} if again else None,
                    "said": a.said,
                }
            )
        else:
            out["gaps"].append(
                {
                    "after_step": a.after_step,
                    "next_step": a.next_step,
                    "missing": a.missing,
                    "said": a.said,
                }
            )
    return out


def _disk(snap: Snapshot) -> dict[str, Any] | None:
    """The room on the run's filesystem, as the host last reported it."""
    d = snap.disk
    if d is None:
        return None
    return {
        "avail": d.avail,
        "free": d.free,
        "total": d.total,
        "room": d.room,
        "read_only": d.read_only,
        "at": d.at,
    }


def _observed(snap: Snapshot) -> dict[str, Any] | None:
    """A run without telemetry: the process watched, and where its output goes."""
    o = snap.observed
    if o is None:
        return None
    return {
        "pid": o.pid,
        "alive": o.alive,
        "user": o.user,
        "command": list(o.command),
        "cwd": o.cwd,
        "log_file": o.log_file,
        "checkpoint_dir": o.checkpoint_dir,
        "cpu_pct": o.cpu_pct,
        "handler": o.handler,
        "metrics_file": o.metrics_file,
        "metrics_problem": o.metrics_problem,
        "exit_status": o.exit_status,
        "ended_at": o.ended_at,
        "last_alive": o.last_alive,
        "processes": [
            {
                "pid": m.pid,
                # a dataloader worker first seen as a child: a worker, as the banner says
                "role": process_role(m.role, m.comm),
                "comm": m.comm,
                "cpu_pct": m.cpu_pct,
                "rss": m.rss,
            }
            for m in o.members
        ],
    }


def _seconds(s: Any) -> str:
    """A duration of the JSON summary (a number, or null)."""
    return duration(s) if isinstance(s, int | float) else "–"


def _counted(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _observed_lines(o: dict[str, Any] | None, no_metrics: bool) -> list[str]:
    """A run without telemetry: the process, where its output and checkpoints go."""
    if not o:
        return []
    workers = sum(1 for p in o["processes"] if p["role"] == "worker")
    cmd = " ".join(o["command"])[:100]
    how = metrics_source(o.get("handler")) or "no telemetry"
    tree = _counted(len(o["processes"]), "process", "processes")
    tree += f" ({_counted(workers, 'dataloader worker', 'dataloader workers')})"
    if not o["alive"]:
        left = f"{tree} of it still alive then" if o["processes"] else "nothing of it left"
        tree = f"ended; {left}"
    lines = [
        f"process  pid {o['pid']} ({o['user']}), {how}: {cmd}",
        f"         in {o['cwd']}; {tree}",
        f"log      {o['log_file'] or 'not a file (a terminal or a pipe)'}",
        f"ckpts    {o['checkpoint_dir'] or 'not found yet'}",
    ]
    if o.get("metrics_file") and o["metrics_file"] != o["log_file"]:
        lines.append(f"metrics  {o['metrics_file']} (from {metrics_source(o.get('handler'))})")
    if o.get("metrics_problem"):
        lines.append(f"         not read: {printable(o['metrics_problem'])}")
    if no_metrics:
        lines.append("metrics  per-step loss and accuracies: not available without telemetry")
    return lines


HISTORY_LINES = 12
"""Anomalies the text lists at most (the JSON has every one)."""


def _history_lines(anomalies: dict[str, list[dict[str, Any]]] | None) -> list[str]:
    """One line per anomaly of the run's history, non-finite stretches and spikes first."""
    said = [
        a["said"]
        for kind in ("nonfinite", "spikes", "resumes", "gaps")
        for a in (anomalies or {}).get(kind, [])
    ]
    lines = [f"history  {s}" for s in said[:HISTORY_LINES]]
    if len(said) > HISTORY_LINES:
        lines.append(
            f"history  … and {len(said) - HISTORY_LINES} more (summary --json lists them all)"
        )
    return lines


def format_text(summary: dict[str, Any]) -> str:
    """The summary for a person: a few aligned lines, each one line whatever the run's
    paths, command line or messages hold (control characters shown escaped)."""

    def f(x: Any, digits: int = 4) -> str:
        if isinstance(x, float):
            return f"{x:.{digits}f}"
        return "–" if x is None else str(x)

    epochs = f"/{summary['epochs']}" if summary.get("epochs") else ""
    lines = [
        f"health   {summary['health']}: {summary['reason']}",
        *_observed_lines(summary.get("observed"), summary.get("loss") is None),
        f"step     {f(summary['step'])}"
        + (f"/{summary['total_steps']}" if summary.get("total_steps") else "")
        + f"   epoch {f(summary['epoch'])}{epochs}",
        f"loss     {f(summary['loss'])}   τ {f(summary['tau'], 3)}",
    ]
    for t in summary["ttt"]:
        lines.append(
            f"ttt {t['step']}    full_acc {f(t['full_acc'])}   cond_acc {f(t['cond_acc'])}"
        )
    pace = f"{f(summary['steps_per_s'], 2)} steps/s   {f(summary['tokens_per_s'], 0)} tokens/s"
    if summary.get("ended_at") is not None:  # over: how long it ran, at what average
        ran = f"ended {clock(summary['ended_at'])}, ran {_seconds(summary.get('elapsed_s'))}"
        if summary.get("ended_by") is not None:  # between two looks: the least it ran
            ran = (
                f"ended between {clock(summary['ended_at'])} and {clock(summary['ended_by'])}, "
                f"ran at least {_seconds(summary.get('elapsed_s'))}"
            )
        over = "its average" if summary.get("pace_over") == "run" else "its last epoch's average"
        lines.append(f"pace     {ran}; {over} {pace}")
    else:
        eta = f"ETA epoch {_seconds(summary['eta_epoch_s'])}  run {_seconds(summary['eta_run_s'])}"
        lines.append(f"pace     {pace}   {eta}   up {_seconds(summary.get('elapsed_s'))}")
    gpus = summary["gpus"]
    if gpus["status"] == "no_driver":
        lines.append("gpus     no NVIDIA driver")
    elif gpus["devices"]:
        utils = " ".join(
            f"{d['util']:.0f}%" if d["util"] is not None else "?" for d in gpus["devices"]
        )
        lines.append(f"gpus     {utils}")
    if summary["checkpoint"]:
        gone = summary["checkpoint"].get("present") is False
        lines.append(
            f"ckpt     {summary['checkpoint']['path']}"
            + (" (gone: no numbered checkpoint in its directory now)" if gone else "")
        )
    if summary.get("stuck"):
        lines.append(f"stuck    {summary['stuck']['where']}")
    lines.append(
        f"records  {summary['records']}   malformed lines {summary['malformed_lines']}"
        f"   lost records {summary['lost_records']}"
    )
    lines += [f"file     {n['said']}" for n in summary.get("file_changes", [])]
    lines += [f"gap      {g['said']}" for g in summary.get("write_gaps", [])]
    lines += _history_lines(summary.get("anomalies"))
    disk = summary.get("disk")
    if disk:
        lines.append(
            f"disk     {size(disk['room'])} free of {size(disk['total'])} on the run's filesystem"
            + (" (read-only)" if disk["read_only"] else "")
        )
    fmt = summary.get("format")
    if fmt:
        how = (
            f"{fmt['handler_lines']} lines of a custom JSON handler (speculators dicts under 'msg')"
            if fmt["handler_lines"]
            else f"{fmt['plain_records']} plain speculators dicts"
        )
        lines.append(
            f"format   not eagle3-tui's schema: {how}, read as such; no sequence numbers, "
            "so lost lines cannot be counted"
        )
    return "\n".join(printable(line) for line in lines)  # a newline in a path: no new line
