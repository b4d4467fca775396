"""What a look of ``api.follow`` costs at a long run over SSH, once the first has read it.

    python benchmarks/bench_follow_api.py [--steps 1000000] [--looks 5] [--rate 12.5e6]
                                          [--delay 0.025] [--tree DIR]

The run is bench_open.py's (the telemetry's real record mix, its companion as the
writer keeps it: ~2.5 GB for 1M steps, made once). A private OpenSSH sshd on 127.0.0.1
is reached through a relay that lets ``--rate`` bytes a second through each way (12.5e6:
100 Mbit/s), ``--delay`` seconds later (a far link's latency), and counts them. A
process of its own follows ``HOST:RUN`` with ``api.follow(every=0)``: the first look,
then ``--looks`` more, each after 10 more steps and their samples (what 5 s of the run
writes) are appended. Printed for each look: its time (the host's choice, the read, the
status, the summary taken; the connection, where the follow opens one a look) and its
bytes on the wire; the anchor in the same run: ``ssh HOST true`` through the relay (a
connection's own cost).

``--tree DIR`` runs the follower with ``PYTHONPATH=DIR`` (a worktree of another commit:
before and after, alternated with this tree's).

The appended lines are cut off the run's file again at the end (the run is the one
bench_open.py measures).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_catchup import SlowLink, config_through
from benchmarks.bench_open import SIDECAR, TRAINER, make_run
from benchmarks.records import gpu_line, heartbeat_line, io_line, train_line
from tests.transport.sshd import ALIAS, Sshd

FOLLOWER = r"""
import json, sys, time
from pathlib import Path
from eagle3_tui import api
from eagle3_tui.transport.target import SshOptions, SshTarget

run, cfg, stats, batches, looks_n = sys.argv[1:6]


def wire():
    # the relay's totals once they stop moving (a look's connection may stay open)
    deadline, last = time.monotonic() + 10, None
    while True:
        t = json.loads(Path(stats).read_text())
        now = t["up"] + t["down"]
        if now == last or time.monotonic() > deadline:
            return now
        last = now
        time.sleep(0.25)


looks = api.follow(SshTarget("ALIAS", None, run, SshOptions(config=(cfg,))), every=0.0)
out = []
for i in range(int(looks_n) + 1):
    if i:
        with open(Path(run) / "metrics.jsonl", "ab") as f:
            f.write((Path(batches) / str(i - 1)).read_bytes())
    w = wire()
    t = time.perf_counter()
    look = next(looks)
    took = time.perf_counter() - t
    out.append([took, wire() - w, look.summary()["global_step"]])
print(json.dumps(out))
""".replace('"ALIAS"', repr(ALIAS))


def last_seqs(path: Path) -> tuple[int, int, int, float]:
    """The run's last step, its writers' next sequence numbers and its last time."""
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - (1 << 20)))
        tail = f.read().splitlines()[1:]
    step, seq, side, ts = -1, 0, 0, 0.0
    for raw in tail:
        rec = json.loads(raw)
        ts = max(ts, float(rec["ts"]))
        if rec["w"] == TRAINER:
            seq = rec["seq"] + 1
            if rec["kind"] == "train":
                step = rec["global_step"]
        elif rec["w"] == SIDECAR:
            side = rec["seq"] + 1
    return step, seq, side, ts


def batches(path: Path, looks: int, into: Path) -> None:
    """Each look's appended lines: 10 steps at 2 a second, a sidecar tick a second."""
    step, seq, side, ts = last_seqs(path)
    rng = random.Random(7)
    for i in range(looks):
        out: list[bytes] = []
        for k in range(10):
            step, ts = step + 1, ts + 0.5
            out.append(train_line(step, seq, ts, rng))
            seq += 1
            if k % 2:
                for line in (
                    gpu_line(side, ts, rng),
                    io_line(side + 1, ts, rng),
                    heartbeat_line(side + 2, ts),
                ):
                    out.append(line.replace(TRAINER.encode(), SIDECAR.encode()))
                side += 3
        (into / str(i)).write_bytes(b"".join(out))


def follow(run: Path, cfg: Path, stats: Path, into: Path, looks: int, tree: str | None) -> list:  # type: ignore[type-arg]
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = tree
    proc = subprocess.run(
        [sys.executable, "-c", FOLLOWER, str(run), str(cfg), str(stats), str(into), str(looks)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        cwd=tempfile.gettempdir(),
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return list(json.loads(proc.stdout.strip().splitlines()[-1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--looks", type=int, default=5)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--rate", type=float, default=12.5e6, help="bytes/s each way (100 Mbit/s)")
    p.add_argument("--delay", type=float, default=0.0, help="seconds added each way (latency)")
    p.add_argument("--tree", help="also follow with PYTHONPATH=TREE (another commit's)")
    ns = p.parse_args()
    long_run = make_run(ns.steps)
    with tempfile.TemporaryDirectory(prefix="bench-follow-api-") as tmp:
        root = Path(tmp)
        run = root / "run"
        run.mkdir()
        for name in ("metrics.jsonl", "metrics.cols"):  # the same files (their companion
            os.link(long_run / name, run / name)  # names them by device and inode)
        path = run / "metrics.jsonl"
        size = path.stat().st_size
        into = root / "batches"
        into.mkdir()
        batches(path, ns.looks, into)
        sshd = Sshd(root / "sshd").start()
        link = SlowLink(sshd.port, ns.rate, ns.delay, root)
        cfg = config_through(sshd, link.port, root)
        trees: list[tuple[str, str | None]] = [("this tree", None)]
        if ns.tree:
            trees.insert(0, (ns.tree, ns.tree))
        rows: dict[str, list[list[float]]] = {}
        anchors: list[float] = []
        try:
            for r in range(ns.rounds):
                for name, tree in trees:
                    os.truncate(path, size)
                    link.idle()
                    got = follow(run, cfg, link.stats, into, ns.looks, tree)
                    rows.setdefault(name, []).extend(got[1:])
                    first = got[0]
                    print(
                        f"round {r + 1} {name}: first look {first[0]:.2f} s, "
                        f"{first[1] / 1e6:.2f} MB (step {first[2]:,}); then "
                        + ", ".join(f"{t:.2f} s {b / 1e3:.0f} KB" for t, b, _ in got[1:]),
                        flush=True,
                    )
                    steps = [s for _, _, s in got]
                    if steps != [steps[0] + 10 * i for i in range(len(steps))]:
                        raise RuntimeError(f"the looks saw steps {steps}")
                link.idle()
                t = time.perf_counter()
                subprocess.run(
                    ["ssh", "-F", str(cfg), "-o", "BatchMode=yes", ALIAS, "true"], check=True
                )
                anchors.append(time.perf_counter() - t)
        finally:
            os.truncate(path, size)  # the run as bench_open.py made it
            link.stop()
            sshd.stop()
    anchor = statistics.median(anchors)
    print(f"\nssh HOST true through the relay: {anchor:.3f} s (median of {len(anchors)})")
    for name, looks in rows.items():
        t = statistics.median(x[0] for x in looks)
        b = statistics.median(x[1] for x in looks)
        print(
            f"  {name}: a look after the first {t:.3f} s ({t / anchor:.1f}x ssh true), "
            f"{b / 1e3:.0f} KB on the wire (median of {len(looks)})"
        )


if __name__ == "__main__":
    main()
