"""Any run open in under a second: the monitor's first full frame of a long run, at a glance.

    python benchmarks/bench_open.py [--steps 1000000] [--rate 12.5e6] [--rounds 3]

The run is the telemetry's real record mix: a training step every 0.5 s (the
trainer's writer), every second an 8-GPU sample, an 8-worker read sample and a
heartbeat (the sidecar's), and per epoch of 15,000 steps its events (a validation,
a checkpoint's save started/finished, three log lines); its companion is made as
the writer would have made it while the run went (``index_file(as_written=True)``:
columns, stats and marks, a block closed 300 s after its first row, ~600 rows).
``--steps 1000000`` is ~2.6 GB, made once and kept in the temporary directory.

Each measurement runs in a process of its own (its memory is its own) and takes the
monitor's data path (app/pipeline.py with the monitor's glance threshold): from
nothing to the first snapshot built (what the panels draw; drawing adds ~40-80 ms,
benchmarks/bench_app.py), then on until the whole file is read and shown in its
place, its memory then, and the event loop's worst lag meanwhile (a key waits at
most that long for the loop: the input lag the fill adds). Over SSH everything goes
through a relay that lets ``--rate`` bytes a second through each way (12.5e6:
100 Mbit/s) to a private OpenSSH sshd, and counts the bytes before the first frame.

``summary RUN --json`` of both runs, here and through the relay (its bytes on the
wire), each in a process of its own and checked against the summary made from every
line of the long run (the anchor: that read's time). ``--only summary`` or ``--only
monitor`` measures one of the two.

Anchors in the same run: the same record mix for 1,000 steps (read whole: below the
glance threshold), ``ssh HOST cat`` of that file and a ``json.loads`` loop over it.

Goals (issue 31): first full frame <= 1 s locally and over the relay, <= 1.3x the
1k-step run's; <= 2 MB on the wire before it; <= 250 MB once the whole history is
in; no loop lag above 50 ms while it fills; ``summary`` <= 1 s locally and over the relay.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_catchup import SlowLink, config_through
from benchmarks.records import gpu_line, heartbeat_line, io_line, record_line, train_line
from eagle3_tui import heap
from eagle3_tui.app.app import tune_collector
from eagle3_tui.app.pipeline import Pipeline
from eagle3_tui.model.snapshot import ViewParams
from eagle3_tui.telemetry.column_log import index_file
from eagle3_tui.transport.base import Link, LinkChanged
from eagle3_tui.transport.glancing import MIN_GLANCE_BYTES
from eagle3_tui.transport.local import LocalTransport
from eagle3_tui.transport.openssh import OpenSshHost
from eagle3_tui.transport.ssh import SshTransport
from eagle3_tui.transport.target import SshOptions, SshTarget
from tests.transport.sshd import ALIAS, Sshd

TRAINER = "4242-a1b2c3"
SIDECAR = "4243-sidecar"
EPOCH = 15_000


def real_mix(n_steps: int, seed: int = 0, t0: float = 1.79e9, dt: float = 0.5) -> Iterator[bytes]:
    """The lines a real run writes, in the order it writes them (see the docstring)."""
    rng = random.Random(seed)
    seq = side = 0
    next_tick = t0

    def event(kind: str, ts: float, **fields: Any) -> bytes:
        nonlocal seq
        seq += 1
        return record_line(kind, seq - 1, ts, TRAINER, **fields)

    yield event("lifecycle", t0, event="start", pid=4242, global_step=0, run_id="bench")
    yield event("hparams", t0, hparams={"lr": 1e-4, "epochs": n_steps // EPOCH + 1})
    for step in range(n_steps):
        ts = t0 + step * dt
        while next_tick <= ts:
            for line in (
                gpu_line(side, next_tick, rng),
                io_line(side + 1, next_tick, rng),
                heartbeat_line(side + 2, next_tick),
            ):
                yield line.replace(b'"w":"4242-a1b2c3"', b'"w":"' + SIDECAR.encode() + b'"')
            side += 3
            next_tick += 1.0
        yield train_line(step, seq, ts, rng, EPOCH)
        seq += 1
        if (step + 1) % EPOCH == 0:
            e = step // EPOCH
            path = f"/ckpt/{e}"
            yield event("log", ts, level="INFO", logger="speculators", msg=f"Epoch {e} done")
            yield event("val", ts, step=step + 1, epoch=e, val={"loss_epoch": rng.uniform(1, 3)})
            yield event("ckpt", ts, event="save_started", path=path, epoch=e, started=ts)
            yield event("log", ts, level="INFO", logger="speculators", msg=f"Saving {path}")
            yield event(
                "ckpt", ts + 5, event="save_finished", path=path, epoch=e, bytes=5e9,
                duration_s=5.0, complete=True, files=3,
            )  # fmt: skip
            yield event("log", ts + 5, level="INFO", logger="speculators", msg="Checkpoint saved")


MADE = "indexed as written, each block with its pace"
"""The run directory's ``made``: its companion has the blocks a live writer closes (a
run made before was indexed 1,024 rows a block, kinder than a live run's ~600), each
with its ``"pace"`` as the writer now says it (telemetry/columns.py's ``pace_of``)."""


def make_run(steps: int) -> Path:
    """The run directory (made once, kept in the temporary directory). Its companion is
    indexed as the writer would have written it while the run went (``as_written``:
    a block closed 300 s after its first row, ~600 rows at 2 steps a second)."""
    run = Path(tempfile.gettempdir()) / f"eagle3-bench-open-{steps}"
    done = run / "made"
    if done.exists() and done.read_text() == MADE:
        return run
    run.mkdir(exist_ok=True)
    t = time.perf_counter()
    if not done.exists():  # (made before: only indexed again)
        with open(run / "metrics.jsonl", "wb") as out:
            batch: list[bytes] = []
            for line in real_mix(steps):
                batch.append(line)
                if len(batch) >= 4096:
                    out.write(b"".join(batch))
                    batch = []
            out.write(b"".join(batch))
    blocks = index_file(str(run / "metrics.jsonl"), as_written=True)
    took = time.perf_counter() - t
    print(f"made {run} ({blocks} blocks) in {took:.0f} s", flush=True)
    done.write_text(MADE)
    return run


# ---- one measurement, in a process of its own --------------------------------------------


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def on_the_wire(stats: Path) -> int:
    totals = json.loads(stats.read_text())
    return int(totals["up"] + totals["down"])


async def measure(source: Any, relay_stats: Path | None) -> dict[str, Any]:
    t0 = time.perf_counter()
    pipeline = Pipeline(glance_min=MIN_GLANCE_BYTES)
    size: list[int] = []

    def on_link(ev: LinkChanged) -> None:
        if ev.link in (Link.CONNECTED, Link.LOCAL) and ev.size is not None:
            size.append(ev.size)
        elif ev.link == Link.REFUSED:
            raise RuntimeError(ev.detail)

    lag = 0.0
    ticking = True

    async def ticker() -> None:
        nonlocal lag
        while ticking:
            t = time.perf_counter()
            await asyncio.sleep(0.005)
            lag = max(lag, time.perf_counter() - t - 0.005)

    tasks = [
        asyncio.ensure_future(pipeline.pump(source, on_link)),
        asyncio.ensure_future(pipeline.ingest()),
        asyncio.ensure_future(ticker()),
    ]
    out: dict[str, Any] = {}
    view = ViewParams(columns=110)
    try:
        while True:
            for task in tasks:
                if task.done():
                    task.result()
            await asyncio.sleep(0.005)
            run = pipeline.run
            at_a_glance = run.unsettled.history is not None
            whole = bool(size) and run.reader.next_offset >= size[0] and not pipeline.filling
            if "first_s" not in out and (at_a_glance or whole) and run.unsettled.records:
                snap, _ = await pipeline.snapshot(time.time(), view)
                out["first_s"] = time.perf_counter() - t0
                out["first_step"] = snap.progress.step
                out["points"] = sum(len(line.x) for line in snap.loss_lines)
                out["glance"] = at_a_glance
                out["why_not"] = pipeline.glance_note
                if relay_stats is not None:
                    out["wire_first"] = on_the_wire(relay_stats)
                lag = 0.0  # from here on: what the fill adds
                tune_collector()  # as the monitor does after its first picture
            if "first_s" in out and pipeline.filling is None and whole:
                out["lag_ms"] = lag * 1000  # (not the last picture's build, below)
                snap, _ = await pipeline.snapshot(time.time(), view)
                out["full_s"] = time.perf_counter() - t0
                out["full_step"] = snap.progress.step
                out["records"] = snap.records
                if at_a_glance or out["glance"]:  # the heap it used handed back, as it is
                    await asyncio.wait_for(pipeline.filled.wait(), 30)
                out["rss_mb"] = rss_mb()
                out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
                for _ in range(STEADY_SNAPSHOTS):  # then a picture a second, as it follows
                    await asyncio.sleep(1.0)
                    await pipeline.snapshot(time.time(), view)
                out["steady_mb"] = rss_mb()
                return out
    finally:
        ticking = False
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


STEADY_SNAPSHOTS = 8
"""Pictures built a second apart after the whole read, before the memory is read again:
what the monitor holds while it follows (its snapshots' arrays come and go)."""


def child(ns: argparse.Namespace) -> None:
    heap.keep_large_blocks_apart()  # as the command line does first
    heap.collect_less()
    run = Path(ns.measure)
    if ns.config:
        target = SshTarget(ALIAS, None, str(run), SshOptions(config=(ns.config,)))
        source: Any = SshTransport(OpenSshHost(target), str(run))
        stats = Path(ns.relay_stats)
        base = on_the_wire(stats)
        out = asyncio.run(measure(source, stats))
        if "wire_first" in out:
            out["wire_first"] -= base
    else:
        out = asyncio.run(measure(LocalTransport(run), None))
    print(json.dumps(out))


def run_child(run: Path, extra: list[str]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, "--measure", str(run), *extra],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


SAME = ("step", "global_step", "epoch", "loss", "ttt", "metrics", "validation", "checkpoint",
        "records", "malformed_lines", "lost_records", "duplicate_records", "write_gaps",
        "redone_steps", "anomalies")  # fmt: skip
"""What a summary says that its reading decides (not its clock)."""


def timed_summary(run: Path, ssh: list[str], like: dict[str, Any] | None = None) -> float:
    """``eagle3-tui summary RUN --json`` (over the relay with ``ssh``), in its own process;
    ``like``: the summary from every line, which it must match (:data:`SAME`)."""
    target = f"{ALIAS}:{run}" if ssh else str(run)
    t = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "eagle3_tui", "summary", *ssh, target, "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    took = time.perf_counter() - t
    try:
        out = json.loads(proc.stdout)
    except ValueError:
        raise RuntimeError(proc.stderr[-3000:]) from None
    if not isinstance(out.get("step"), int):
        raise RuntimeError(f"summary said {proc.stdout[:300]}")
    differ = [k for k in SAME if like is not None and out.get(k) != like.get(k)]
    if differ:
        raise RuntimeError(f"summary {target} differs from every line's in {differ}")
    return took


def whole_summary(run: Path) -> tuple[float, dict[str, Any]]:
    """The summary from every line of the file (what ``summary`` read before the
    companion accounted for the samples), in its own process: its time and its JSON."""
    code = (
        "import json, sys, time\n"
        "from pathlib import Path\n"
        "from eagle3_tui.model.run import Run\n"
        "from eagle3_tui.model.summary import summarize\n"
        "from eagle3_tui.transport.local import iter_chunks\n"
        "t = time.perf_counter()\n"
        "run = Run()\n"
        "for c in iter_chunks(Path(sys.argv[1]) / 'metrics.jsonl'):\n"
        "    run.feed(c.offset, c.data)\n"
        "out = summarize(run.state, 0.0)\n"
        "print(json.dumps([time.perf_counter() - t, out], default=str))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(run)], capture_output=True, text=True, check=True
    )
    took, out = json.loads(proc.stdout)
    return float(took), json.loads(json.dumps(out))


def json_loop(path: Path) -> float:
    t = time.perf_counter()
    with open(path, "rb") as f:
        for line in f:
            json.loads(line)
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--rate", type=float, default=12.5e6, help="bytes/s each way (100 Mbit/s)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--only",
        choices=("monitor", "summary"),
        help="measure the monitor's first frame, or summary, alone",
    )
    p.add_argument("--measure", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--relay-stats", help=argparse.SUPPRESS)
    ns = p.parse_args()
    if ns.measure:
        child(ns)
        return
    long_run, short_run = make_run(ns.steps), make_run(1000)
    size = (long_run / "metrics.jsonl").stat().st_size
    print(f"{ns.steps:,} steps: {size / 1e9:.2f} GB; 1,000 steps: "
          f"{(short_run / 'metrics.jsonl').stat().st_size / 1e6:.2f} MB")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-open-") as tmp:
        root = Path(tmp)
        sshd = Sshd(root / "sshd").start()
        link = SlowLink(sshd.port, ns.rate, 0.0, root)
        cfg = config_through(sshd, link.port, root)
        ssh = ["--config", str(cfg), "--relay-stats", str(link.stats)]
        rows: dict[str, list[dict[str, Any]]] = {}
        big = f"{ns.steps // 1000}k"
        whole: dict[str, Any] | None = None
        try:
            if ns.only != "monitor":
                took, whole = whole_summary(long_run)
                rows["summary, every line, local " + big] = [{"first_s": took}]
                print(f"  {big} summary from every line: {took:.2f} s", flush=True)
            for r in range(ns.rounds):
                for name, run, extra in () if ns.only == "monitor" else (
                    ("local 1k", short_run, []),
                    (f"local {big}", long_run, []),
                    ("relay 1k", short_run, ["-F", str(cfg)]),
                    (f"relay {big}", long_run, ["-F", str(cfg)]),
                ):  # fmt: skip
                    link.idle()
                    before = on_the_wire(link.stats)
                    took = timed_summary(run, extra, whole if run is long_run else None)
                    sent = on_the_wire(link.stats) - before if extra else None
                    rows.setdefault("summary " + name, []).append(
                        {"first_s": took} | ({"wire_first": sent} if extra else {})
                    )
                    print(
                        f"  round {r + 1} summary {name:10} {took:5.2f} s"
                        + (f", {sent / 1e6:.2f} MB on the wire" if sent is not None else ""),
                        flush=True,
                    )
                for name, run, extra in () if ns.only == "summary" else (
                    ("local 1k", short_run, []),
                    (f"local {big}", long_run, []),
                    ("relay 1k", short_run, ssh),
                    (f"relay {big}", long_run, ssh),
                ):  # fmt: skip
                    link.idle()
                    got = run_child(run, extra)
                    rows.setdefault(name, []).append(got)
                    wire = got.get("wire_first")
                    print(
                        f"  round {r + 1} {name:12} first frame {got['first_s']:5.2f} s"
                        f" (step {got['first_step']}, glance {got['glance']}"
                        + (f", {wire / 1e6:.2f} MB on the wire" if wire is not None else "")
                        + f"); whole {got['full_s']:6.2f} s, {got['rss_mb']:.0f} MB"
                        f" ({got['steady_mb']:.0f} MB {STEADY_SNAPSHOTS} s later),"
                        f" loop lag {got['lag_ms']:.0f} ms",
                        flush=True,
                    )
                    if got["full_step"] != ns.steps and run is long_run:
                        raise RuntimeError(f"the whole read shows step {got['full_step']}")
                t = time.perf_counter()
                subprocess.run(
                    ["ssh", "-F", str(cfg), "-o", "BatchMode=yes", ALIAS,
                     f"cat {short_run / 'metrics.jsonl'}"],
                    stdout=subprocess.DEVNULL, check=True,
                )  # fmt: skip
                rows.setdefault("ssh cat 1k", []).append({"first_s": time.perf_counter() - t})
                rows.setdefault("json.loads 1k", []).append(
                    {"first_s": json_loop(short_run / "metrics.jsonl")}
                )
        finally:
            link.stop()
            sshd.stop()

    def med(name: str, key: str) -> float:
        return statistics.median(float(x[key]) for x in rows[name] if key in x)

    print(f"\nmedians of {ns.rounds} rounds:")
    for name in rows:
        print(f"  {name:14} first frame {med(name, 'first_s'):6.3f} s", end="")
        if "full_s" in rows[name][0]:
            print(
                f"   whole {med(name, 'full_s'):7.2f} s  {med(name, 'rss_mb'):5.0f} MB"
                f" (then {med(name, 'steady_mb'):4.0f} MB)"
                f"  loop lag {med(name, 'lag_ms'):4.0f} ms",
                end="",
            )
        if "wire_first" in rows[name][0]:
            print(f"  {med(name, 'wire_first') / 1e6:6.2f} MB before the first frame", end="")
        print()
    if ns.only != "monitor":
        for where in ("local", "relay"):
            took, small = (
                med(f"summary {where} {big}", "first_s"),
                med(f"summary {where} 1k", "first_s"),
            )
            print(
                f"  summary {where}: {took:.3f} s (goal 1 s: {took:.2f}x), "
                f"{took / small:.2f}x the 1k-step run's"
            )
        every = med("summary, every line, local " + big, "first_s")
        here = med(f"summary local {big}", "first_s")
        print(f"  summary from every line: {every:.2f} s ({here / every:.2f}x of it now)")
    if ns.only == "summary":
        return
    for where in ("local", "relay"):
        first, small = med(f"{where} {big}", "first_s"), med(f"{where} 1k", "first_s")
        print(
            f"  {where}: first frame {first:.3f} s (goal 1 s: {first:.2f}x), "
            f"{first / small:.2f}x the 1k-step run's (goal 1.3x)"
        )
    wire = med(f"relay {big}", "wire_first") / 1e6
    print(
        f"  bytes before the first frame over the relay: {wire:.2f} MB (goal 2 MB: {wire / 2:.2f}x)"
    )
    rss = med(f"local {big}", "rss_mb")
    steady = med(f"local {big}", "steady_mb")
    print(
        f"  memory once the whole history is in: {rss:.0f} MB, {STEADY_SNAPSHOTS} s later "
        f"{steady:.0f} MB (goal 250 MB: {max(rss, steady) / 250:.2f}x)"
    )
    lag = max(med(f"{w} {big}", "lag_ms") for w in ("local", "relay"))
    print(f"  worst loop lag while it fills: {lag:.0f} ms (goal 50 ms: {lag / 50:.2f}x)")


if __name__ == "__main__":
    main()
