"""What ``runs`` prints: a host's live trainings (with or without telemetry), the ended
ones eagle3-tui observed, the registered runs, then the user's Slurm jobs that are
speculators trainings. No textual here."""

from __future__ import annotations

import time

from eagle3_tui.model.inert import printable
from eagle3_tui.model.observed import metrics_source
from eagle3_tui.slurm_text import slurm_lines
from eagle3_tui.telemetry.procs import describe_exit
from eagle3_tui.transport.replies import DiscoverReport, ProcessRow


def _when(ts: object) -> str:
    if not isinstance(ts, int | float):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(ts)))


BACKEND_WORDS = {
    "json": "own JSON",
    "tensorboard": "TensorBoard",
    "mlflow": "MLflow",
    "trackio": "trackio",
    "wandb": "W&B",
}
"""The runs column for what writes a training's metrics, by ``ProcessRow.handler``."""


def _telemetry(row: ProcessRow) -> str:
    """What writes a training's metrics, in a word: eagle3-tui's telemetry, a handler of
    the user's own (``own JSON``: its JSON lines; ``own``: dicts it prints), or nothing."""
    if row.telemetry:
        return "yes"
    if row.handler is not None:
        return BACKEND_WORDS.get(row.handler, "own")
    return "no"


def _row_extra(row: ProcessRow) -> str:
    """After a training's directory: its command, its log, its own handler's file, and
    once it ended, how."""
    command = " ".join(a.rsplit("/", 1)[-1] if i == 0 else a for i, a in enumerate(row.command))
    extra = f"  {command[:60]}"
    if row.handler is not None:
        what = metrics_source(row.handler)
        if row.metrics_note:
            extra += f"  (metrics by {what}, not read: {row.metrics_note})"
        else:
            run = f", run {row.metrics_run}" if row.metrics_run else ""
            extra += f"  (metrics by {what}: {row.metrics_file}{run})"
    if row.log and not row.telemetry and row.log != row.metrics_file:
        extra += f"  (log {row.log})"
    if not row.alive:
        when = (
            f"between {_when(row.last_alive)} and {_when(row.ended_at)}"
            if row.last_alive is not None
            else _when(row.ended_at)
        )
        extra += f"  (ended {when}, {describe_exit(row.exit_status)})"
    return extra


def format_discovered(result: DiscoverReport) -> str:
    """The host's live trainings (with or without telemetry), the ended ones eagle3-tui
    observed without telemetry, then the registered runs that are not live: one row per
    run."""
    rows: list[tuple[str, ...]] = [("STARTED", "HEALTH", "PID", "USER", "TELEMETRY", "WHERE")]
    for r in [*result.live, *result.ended]:
        where = r.run_dir or r.cwd or "?"
        health = (r.health or "live") if r.alive else "ended"
        rows.append(
            (
                _when(r.started),
                health,
                str(r.pid),
                r.user[:10],
                _telemetry(r),
                printable(where + _row_extra(r)),
            )
        )
    for e in result.runs:
        if e.live_pid:
            continue  # shown above, as the live process it is
        state = "stopped" if e.state == "interrupted" else e.state  # summary's word for it
        user = printable(e.user)[:10] if e.user else "-"
        rows.append(
            (_when(e.started_at), state, str(e.pid or "-"), user, "yes", printable(e.run_dir))
        )
    lines = _columns(rows)
    if result.others:
        lines.append(f"({result.others} run(s) of other users not shown: --all)")
    if result.pruned:
        lines.append(f"(forgot {len(result.pruned)} run(s) whose directory is gone:)")
        lines.extend(f"  {printable(d)}" for d in result.pruned)
    elif any(e.state == "gone" for e in result.runs):
        lines.append("(gone: the run's directory no longer exists; runs --prune forgets them)")
    return "\n".join((lines if len(rows) > 1 else []) + slurm_lines(result))


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    """The rows of ``runs``, each column as wide as its widest cell (``interrupted``,
    ``TensorBoard``), the PID right-aligned, the last column (WHERE) as it is."""
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return [
        f"{started:<{widths[0]}}  {health:<{widths[1]}}  {pid:>{widths[2]}}  "
        f"{user:<{widths[3]}}  {telemetry:<{widths[4]}}  {where}"
        for started, health, pid, user, telemetry, where in rows
    ]
