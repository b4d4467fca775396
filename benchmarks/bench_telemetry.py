"""Caller-side cost of the telemetry handler, and what its samplers cost, measured in one run.

    python benchmarks/bench_telemetry.py [--records 10000] [--rounds 12] [--sampler-seconds 10]

Prints:

1. The cost of one ``logger.info(metrics_dict, extra={"step": n})`` on
   ``speculators.metrics`` as the training loop sees it (µs, wall clock, per call):
   no handler (the silent case), ``logging.FileHandler`` with a ``json.dumps``
   formatter (the baseline), and eagle3-tui's ``attach()``. Rounds alternate
   between the two so that a noisy machine affects both alike. Target: ours at
   most half the baseline (p50 and mean).
2. The same calls paced like training steps (the thread writes in the gaps).
3. CPU per record including our writer thread (the whole process's CPU time).
4. How soon a line is visible to a reader of the file after the log call.
5. The samplers' CPU use at 1 s intervals, in the sidecar and in a thread, with
   8 recorded GPUs, 2 reading child processes and a checkpoint directory; and the
   writer thread's idle cost.
6. Under torchrun, the samplers' CPU per node: 8 ranks of one node (stand-in
   processes under a stand-in agent), each with its sidecar, GPUs read as before
   (each rank its own device), as the issue feared (each rank every device), and
   now (local rank 0 reads the node's devices once, the others none).
7. Telemetry's overhead per rank in a real ``torchrun --nproc-per-node 2`` tiny
   training (skipped without torch): each rank's heartbeat figures.

Numbers are for comparison within one run; absolute times vary between machines.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eagle3_tui.telemetry import Telemetry, attach, procs
from eagle3_tui.telemetry import manifest as mf
from eagle3_tui.telemetry.reads import READS_ENV

FIXTURE = (
    Path(__file__).resolve().parent.parent
    / "tests"
    / "telemetry"
    / "fixtures"
    / "nvml_8x_h200.json"
)
METRICS = logging.getLogger("speculators.metrics")
MESSAGES = logging.getLogger("speculators")


def record(step: int) -> dict[str, Any]:
    """A speculators training record as the Trainer logs it (ttt_steps=3), ~590 bytes."""
    train: dict[str, Any] = {}
    for k in range(3):
        train[f"loss_{k}"] = 2.3 - 0.01 * k + step * 1e-6
        train[f"full_acc_{k}"] = 0.61 / (k + 1)
        train[f"cond_acc_{k}"] = 0.72 - 0.05 * k
    train["loss"] = 6.71 + step * 1e-6
    train["error_records"] = 0.0
    return {
        "train": train,
        "profile": {
            "fetch_ms": 1.234,
            "fwd_ms": 40.12,
            "bwd_ms": 81.33,
            "opt_ms": 5.02,
            "step_ms": 128.4,
            "tokens_per_s": 63812.5,
            "fetch_frac": 0.0096,
            "queue_ms": 0.11,
            "h2d_ms": 0.87,
            "clip_ms": 0.42,
        },
        "epoch": 1,
        "lr": 0.0003,
        "global_step": step,
    }


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps({"step": getattr(record, "step", None), **record.msg})  # type: ignore[dict-item]


def reset_loggers() -> None:
    for lg in (METRICS, MESSAGES):
        for h in list(lg.handlers):
            lg.removeHandler(h)
        lg.setLevel(logging.NOTSET)
        lg.propagate = True
    MESSAGES.propagate = False  # nothing above us in this benchmark


def time_calls(n: int, start: int, pace_s: float = 0.0) -> list[float]:
    """µs per logger.info call, one measurement per call."""
    msgs = [record(start + i) for i in range(n)]
    out = []
    clock = time.perf_counter_ns
    info = METRICS.info
    gc.disable()
    try:
        for i, msg in enumerate(msgs):
            t0 = clock()
            info(msg, extra={"step": start + i})
            out.append((clock() - t0) / 1000)
            if pace_s:
                time.sleep(pace_s)
    finally:
        gc.enable()
    return out


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * p))]


def fmt(xs: list[float]) -> str:
    return f"p50 {pct(xs, 0.5):7.2f}  p99 {pct(xs, 0.99):7.2f}  mean {statistics.fmean(xs):7.2f}"


class Baseline:
    def __init__(self, path: Path) -> None:
        self.handler = logging.FileHandler(path)
        self.handler.setFormatter(JsonFormatter())

    def __enter__(self) -> Baseline:
        reset_loggers()
        METRICS.addHandler(self.handler)
        METRICS.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: object) -> None:
        reset_loggers()


class Noop:
    """A handler that does nothing: what any handler costs (the LogRecord, the dispatch)."""

    class _H(logging.Handler):
        def handle(self, record: logging.LogRecord) -> bool:
            return True

    def __enter__(self) -> Noop:
        reset_loggers()
        METRICS.addHandler(self._H())
        METRICS.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: object) -> None:
        reset_loggers()


class Ours:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.t: Telemetry | None = None

    def __enter__(self) -> Ours:
        reset_loggers()
        self.t = attach(self.run_dir, samplers=False)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.t is not None
        self.t.close()
        reset_loggers()


def _contexts(tmp: Path, r: int) -> dict[str, Any]:
    tmp.mkdir(parents=True, exist_ok=True)
    return {
        "noop": Noop(),
        "base": Baseline(tmp / f"base-{r}.jsonl"),
        "ours": Ours(tmp / f"ours-{r}"),
    }


def _measure(tmp: Path, n: int, rounds: int, pace_s: float) -> dict[str, dict[str, Any]]:
    """Per configuration: all per-call times, the per-round p50s, CPU per record."""
    out: dict[str, dict[str, Any]] = {
        k: {"xs": [], "p50s": [], "cpu": []} for k in ("noop", "base", "ours")
    }
    for r in range(rounds):
        order = ["noop", "base", "ours"] if r % 2 == 0 else ["ours", "base", "noop"]
        contexts = _contexts(tmp / f"p{pace_s}", r)
        for name in order:
            ctx = contexts[name]
            with ctx:
                time_calls(200, 0, pace_s)  # warm up
                c0 = time.process_time()
                xs = time_calls(n, r * n, pace_s)
                if name == "ours":
                    ctx.t.writer.flush(30)  # the writer thread's share, counted in cpu
                cpu = (time.process_time() - c0) / n * 1e6
            out[name]["xs"].extend(xs)
            out[name]["p50s"].append(pct(xs, 0.5))
            out[name]["cpu"].append(cpu)
    return out


def _report(m: dict[str, dict[str, Any]]) -> tuple[float, float]:
    noop = statistics.median(m["noop"]["p50s"])
    base = statistics.median(m["base"]["p50s"])
    ours = statistics.median(m["ours"]["p50s"])
    print(f"   any handler (no-op)           {fmt(m['noop']['xs'])}")
    print(f"   FileHandler + json.dumps      {fmt(m['base']['xs'])}")
    print(f"   eagle3-tui attach()           {fmt(m['ours']['xs'])}")
    whole = ours / base
    own = max(0.0, ours - noop) / (base - noop)  # below the no-op's: within the noise
    print(
        f"   ratio ours/baseline, median of the rounds' p50: whole call {whole:.2f}; "
        f"the handler's own part (less the no-op's) {own:.2f}"
    )
    cb, co = statistics.median(m["base"]["cpu"]), statistics.median(m["ours"]["cpu"])
    print(
        f"   CPU per record, all threads (ours: its writer thread included): {cb:.2f} vs {co:.2f}"
    )
    return whole, own


def caller_cost(tmp: Path, n: int, rounds: int) -> bool:
    print("1. µs per logger.info(record, extra={'step': n}) on speculators.metrics, warm loop")
    print(f"   ({n} calls x {rounds} rounds each, rounds alternate; p50/p99/mean over all calls)")
    print(f"   no handler (the silent case)  {fmt(time_calls(n, 0))}")
    whole, own = _report(_measure(tmp, n, rounds, 0.0))
    ok = max(whole, own) <= 0.5
    print(f"   target: ours <= 0.50 of the baseline: {'OK' if ok else 'ABOVE TARGET'}")
    return ok


def paced_cost(tmp: Path, n: int, rounds: int) -> None:
    print("2. the same, one call per 'step' (0.5 ms apart, the GIL free in between, as in a")
    print(f"   training step: the writer thread works in the gaps), {n} calls x {rounds} rounds")
    _report(_measure(tmp, n, rounds, 0.0005))


def visibility(tmp: Path, n: int = 200) -> None:
    print(f"3. log call -> line visible in the file, ms ({n} records, 20 ms apart)")
    lat: list[float] = []
    with Ours(tmp / "visible") as o:
        assert o.t is not None
        path = o.t.run_dir / "metrics.jsonl"
        size = path.stat().st_size if path.exists() else 0
        for i in range(n):
            t0 = time.perf_counter()
            METRICS.info(record(i), extra={"step": i})
            while True:
                try:
                    new = path.stat().st_size
                except FileNotFoundError:
                    new = 0
                if new > size:
                    break
                time.sleep(0.0002)
            lat.append((time.perf_counter() - t0) * 1000)
            size = new
            time.sleep(0.02)
    print(f"   p50 {pct(lat, 0.5):.1f}  p99 {pct(lat, 0.99):.1f}  max {max(lat):.1f}  (bound: 100)")


READER = """
import os, sys, time
from eagle3_tui.telemetry.reads import report_read
path = sys.argv[1]
while True:
    with open(path, "rb") as f:
        f.read()
    report_read(path, os.path.getsize(path))
    time.sleep(0.01)
"""


def sampler_cpu(tmp: Path, seconds: float) -> None:
    print(f"4. samplers at 1 s intervals for {seconds:.0f} s: 8 recorded GPUs, 2 reading workers,")
    print("   a checkpoint directory with 3 saves; CPU use as % of one core")
    data = tmp / "shard.bin"
    data.write_bytes(os.urandom(1 << 20))
    ckpt = tmp / "ckpt"
    for e in range(3):
        d = ckpt / str(e)
        d.mkdir(parents=True)
        for name in ("model.safetensors", "optimizer_state_dict.pt", "config.json"):
            (d / name).write_bytes(b"x" * 10_000)
    os.environ["EAGLE3_TUI_NVML_FIXTURE"] = str(FIXTURE)
    for host in ("sidecar", "thread"):
        run_dir = tmp / f"samplers-{host}"
        for name in (mf.RUN_ID_ENV, mf.RUN_DIR_ENV):
            os.environ.pop(name, None)
        t = attach(run_dir, sampler_host=host, checkpoint_dir=ckpt, interval=1.0)
        workers = [
            subprocess.Popen([sys.executable, "-c", READER, str(data)], env=dict(os.environ))
            for _ in range(2)
        ]
        try:
            time.sleep(seconds)
            pid = t.samplers.pid if host == "sidecar" else None
            st = procs.stat(pid) if pid else None
            beats = [
                json.loads(line)
                for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                if '"kind":"heartbeat"' in line
            ]
        finally:
            for w in workers:
                w.kill()
                w.wait()
            t.close()
        last = beats[-1]
        if st is not None:  # the whole sidecar process (startup included) from /proc
            alive = time.time() - (t.manifest or {}).get("started_at", time.time())
            print(
                f"   sidecar process: {100 * st.cpu_s / alive:5.2f} % over its life "
                f"(incl. start-up), {last['sampler_cpu_pct']:5.2f} % in the last interval"
            )
        else:
            print(f"   sampler thread:  {last['sampler_cpu_pct']:5.2f} % in the last interval")
    os.environ.pop("EAGLE3_TUI_NVML_FIXTURE", None)
    os.environ.pop(READS_ENV, None)
    # the trainer's writer thread with nothing to write: its polling cost
    with Ours(tmp / "idle") as o:
        assert o.t is not None
        c0 = o.t.writer.figures()["writer_cpu_s"]
        time.sleep(5)
        c1 = o.t.writer.figures()["writer_cpu_s"]
    print(f"   idle writer thread in the trainer: {100 * (c1 - c0) / 5:.3f} %")


AGENT = """
import subprocess, sys, time
ranks = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1e6)"])
         for _ in range(int(sys.argv[1]))]
print(" ".join(str(r.pid) for r in ranks), flush=True)
time.sleep(1e6)
"""


def _node_configs(
    mode: str, pids: list[int], agent: int, run_dir: Path, enabled: list[str]
) -> list[Any]:
    """The sampler configurations of a node's ranks: ``before`` (each rank its own device,
    the code before this change), ``every`` (each rank every device), ``now``."""
    from eagle3_tui.telemetry.samplers import SamplerConfig

    out = []
    for r, pid in enumerate(pids):
        scope, local, launcher = {
            "before": ("own", r, None),
            "every": ("own", None, None),
            "now": ("node" if r == 0 else "none", r, agent),
        }[mode]
        out.append(
            SamplerConfig(
                run_dir=str(run_dir),
                trainer_pid=pid,
                trainer_start_ticks=procs.start_ticks(pid),
                rank=r,
                run_id="bench",
                interval=1.0,
                enabled=enabled,
                local_rank=local,
                world_size=len(pids) if local is not None else 1,
                local_world_size=len(pids),
                launcher_pid=launcher,
                gpu_scope=scope,
                nvml_fixture=str(FIXTURE),
                writes_manifest=False,
            )
        )
    return out


def _cpu_of(clients: list[Any]) -> float:
    return sum(st.cpu_s for c in clients if c.pid and (st := procs.stat(c.pid)))


MODES = {
    "before": "before: each rank reads its own GPU",
    "every": "each rank reads every GPU",
    "now": "now: local rank 0 reads the node's",
}


def node_samplers(tmp: Path, seconds: float, ranks: int = 8) -> None:
    from eagle3_tui.telemetry.sidecar import SamplerHost, SidecarClient
    from eagle3_tui.telemetry.writer import JsonlWriter

    print(f"6. one node, {ranks} ranks (stand-ins) under a torchrun-like agent, 8 recorded GPUs")
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, str(ranks)], stdout=subprocess.PIPE, text=True
    )
    assert agent.stdout is not None
    pids = [int(p) for p in agent.stdout.readline().split()]
    try:
        # a: the GPU sampling itself, every rank's sampler of the node in one process
        print("   a. GPU sampling per node per second: CPU (ms), device reads, NVML sessions,")
        print("      records and bytes written (200 rounds of every rank's sampler)")
        cost: dict[str, float] = {}
        for mode, label in MODES.items():
            run_dir = tmp / f"gpu-{mode}"
            run_dir.mkdir()
            writer = JsonlWriter(run_dir / "metrics.jsonl", background=False)
            hosts = [
                SamplerHost(c, writer, source="bench", get_ops=lambda t: [], sampler_cpu=time.time)
                for c in _node_configs(mode, pids, agent.pid, run_dir, ["gpu"])
            ]
            gpus = [h.sset.get("gpu") for h in hosts if h.sset.get("gpu") is not None]
            for g in gpus:  # NVML start-up and device lookup: once, not per second
                g.sample(time.time())
            size0, rounds = writer.figures()["bytes"], 200
            c0 = time.process_time()
            for _ in range(rounds):
                for g in gpus:
                    g.sample(time.time())
            cpu_ms = 1000 * (time.process_time() - c0) / rounds
            nbytes = (writer.figures()["bytes"] - size0) / rounds
            reads = sum(len(g._indices or []) for g in gpus)
            cost[mode] = cpu_ms
            print(
                f"      {label:<38} {cpu_ms:6.3f} ms  {reads:2d} reads  {len(gpus)} sessions  "
                f"{len(gpus)} records  {nbytes / 1024:5.1f} KiB"
            )
            for h in hosts:
                h.sset.close()
            writer.close()
        print(
            f"      now/before {cost['now'] / cost['before']:.2f}, "
            f"now/every {cost['now'] / cost['every']:.2f}"
        )
        # b: the whole sidecars (their loop, /proc checks, heartbeats and reads included)
        print(f"   b. every rank's sidecar process, {seconds:.0f} s after start-up, % of one core")
        for mode, label in MODES.items():
            run_dir = tmp / f"sidecars-{mode}"
            run_dir.mkdir()
            configs = _node_configs(mode, pids, agent.pid, run_dir, ["gpu", "io", "heartbeat"])
            clients = [SidecarClient(c) for c in configs]
            time.sleep(3.0)  # imports and NVML start-up, not counted

            c0, t0 = _cpu_of(clients), time.monotonic()
            time.sleep(seconds)
            pct_ = 100 * (_cpu_of(clients) - c0) / (time.monotonic() - t0)
            for c in clients:
                c.close()
            print(f"      {label:<38} {pct_:5.2f} %  ({pct_ / ranks:.2f} % per rank)")
    finally:
        agent.kill()
        agent.wait()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def torchrun_overhead(tmp: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("speculators") is None:
        print("7. skipped: speculators is not installed")
        return
    run_dir = tmp / "torchrun"
    print("7. telemetry per rank in a real torchrun --nproc-per-node 2 tiny training (gloo)")
    env = dict(os.environ, EAGLE3_TUI_NVML_FIXTURE=str(FIXTURE))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "eagle3_tui.train.tiny",
        "--run-dir",
        str(run_dir),
        "--epochs",
        "4",
        "--workers",
        "1",
    ]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        print(f"   the training failed ({proc.returncode}): {proc.stderr[-500:]}")
        return
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if r["kind"] == "train"]
    step_ms = statistics.median(r["profile"]["step_ms"] for r in steps)
    print(
        f"   {len(steps)} steps in {wall:.0f} s (start-up included), median step {step_ms:.0f} ms"
    )
    for rank in (0, 1):
        beats = [r for r in recs if r["kind"] == "heartbeat" and r["rank"] == rank]
        last = next(b for b in reversed(beats) if b.get("trainer", {}).get("cpu_s"))
        life = max(1e-9, last["ts"] - beats[0]["ts"])
        o = last["overhead_us"]
        calls_per_step = o["n"] / max(1, len(steps))
        share = 100 * o["p50"] * calls_per_step / 1000 / step_ms
        print(
            f"   rank {rank}: handler {o['p50']:.1f}/{o['p99']:.1f} µs p50/p99 per call, "
            f"{calls_per_step:.1f} calls a step = {share:.3f} "
            f"% of a step; writer thread {100 * last['writer_cpu_s'] / life:.2f} %, sidecar "
            f"{100 * last['sampler_cpu_s'] / life:.2f} % of a core over {life:.0f} s "
            f"(the rank itself: {100 * last['trainer']['cpu_s'] / life:.0f} %)"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=10000)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--sampler-seconds", type=float, default=10.0)
    p.add_argument(
        "--only", choices=("node", "torchrun"), help="run only section 6 or 7 (the torchrun ones)"
    )
    a = p.parse_args()
    for name in (mf.RUN_ID_ENV, mf.RUN_DIR_ENV, READS_ENV):
        os.environ.pop(name, None)
    with tempfile.TemporaryDirectory(prefix="bench-telemetry-") as d:
        tmp = Path(d)
        os.environ["XDG_STATE_HOME"] = str(tmp / "state")
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
        if a.only is None:
            caller_cost(tmp, a.records, a.rounds)
            paced_cost(tmp, 2000, 4)
            visibility(tmp)
            sampler_cpu(tmp, a.sampler_seconds)
        if a.only in (None, "node"):
            node_samplers(tmp, a.sampler_seconds)
        if a.only in (None, "torchrun"):
            torchrun_overhead(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
