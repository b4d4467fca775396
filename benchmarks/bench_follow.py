"""What the monitor costs while it follows a live run, against a bare Textual app.

    python benchmarks/bench_follow.py [--seconds 60] [--history 0|1000000] [--pairs 3]

A feeder appends what a real run writes to ``metrics.jsonl`` in real time: a training
step every 0.5 s (2 steps/s) and, each second, an 8-GPU sample, an 8-worker read sample
and a heartbeat. ``eagle3-tui RUN_DIR`` follows it in a real terminal (tmux, 120×40).
After a warm-up, the app's CPU time (its own and its reaped children's: the agent it
runs for liveness) is read from ``/proc`` over ``--seconds`` of wall time. The floor:
a bare Textual app (header, footer, one label updated each second) in the same
terminal. Printed: each CPU share (% of one core), RSS, and the ratio. The run directory
holds a live manifest (``run.json``, this process as its trainer), as a real run's does:
the app probes its trainer as it would.

``--pairs K`` measures app and floor alternately K times (the machine's speed drifts)
and prints the median of the paired ratios. The app runs under ``frame_probe.py``,
which times each of Textual's screen updates (layout, renders, compositor, the write
to the terminal): printed as frames per second and the median and 95th-percentile
frame time over the measured window.

``--history N`` first writes N steps (with the samples of their time span, as a real
run's file holds) and its companion (``metrics.cols``, as the run's writers keep it)
so the app follows a long run, opened at a glance.

Goals (issue 15): <= 3 % of a core without history, <= 5 % with 1M steps.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.records import gpu_line, heartbeat_line, io_line, mixed_lines, train_line
from eagle3_tui.telemetry.column_log import index_file
from eagle3_tui.telemetry.manifest import build_manifest, new_run_id, write_manifest

CLK_TCK = os.sysconf("SC_CLK_TCK")
WIDTH, HEIGHT = 120, 40

BARE_APP = textwrap.dedent(
    """
    import time
    from textual.app import App
    from textual.widgets import Footer, Header, Label

    class Bare(App):
        def compose(self):
            yield Header()
            yield Label("", id="l")
            yield Footer()

        def on_mount(self):
            self.set_interval(1.0, self.tick)

        def tick(self):
            self.query_one("#l", Label).update(time.strftime("%H:%M:%S"))

    Bare().run()
    """
)


def cpu_seconds(pid: int, children: bool = True) -> float:
    """utime + stime + cutime + cstime of ``pid`` (itself and its reaped children;
    ``children=False``: itself alone)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    f = raw[raw.rfind(")") + 2 :].split()
    return sum(int(x) for x in f[11 : 15 if children else 13]) / CLK_TCK


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def app_pid(tmux: list[str], session: str) -> int:
    """The process running in the pane (tmux starts it through a shell that execs it)."""
    out = subprocess.run(
        [*tmux, "display-message", "-p", "-t", session, "#{pane_pid}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip())


class Feeder(threading.Thread):
    """Appends a live run's lines to ``path`` in real time, until stopped."""

    def __init__(self, path: Path, first_step: int, seq0: int) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.step = first_step
        self.seq = seq0
        self.side = seq0
        self.stop = threading.Event()
        self.rng = random.Random(1)

    def run(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        next_sample = time.time()
        try:
            while not self.stop.is_set():
                now = time.time()
                out = [train_line(self.step, self.seq, now, self.rng)]
                self.step += 1
                self.seq += 1
                if now >= next_sample:
                    for line in (
                        gpu_line(self.side, now, self.rng),
                        io_line(self.side + 1, now, self.rng),
                        heartbeat_line(self.side + 2, now),
                    ):
                        out.append(line.replace(b'"w":"4242-a1b2c3"', b'"w":"4243-sidecar"'))
                    self.side += 3
                    next_sample += 1.0
                os.write(fd, b"".join(out))
                self.stop.wait(0.5)
        finally:
            os.close(fd)


def frame_stats(path: Path, t0: float, t1: float) -> tuple[float, float, float] | None:
    """Frames per second, median and 95th-percentile frame time (ms) within [t0, t1]."""
    try:
        frames = [tuple(map(float, line.split())) for line in path.read_text().splitlines()]
    except (OSError, ValueError):
        return None
    took = sorted(d for end, d in frames if t0 <= end <= t1)
    if not took:
        return None
    p95 = took[min(len(took) - 1, int(0.95 * len(took)))]
    return len(took) / (t1 - t0), 1000 * statistics.median(took), 1000 * p95


def shown_step(tmux: list[str], session: str) -> int:
    """The step the header shows (0 before any)."""
    screen = subprocess.run(
        [*tmux, "capture-pane", "-p", "-t", session], capture_output=True, text=True
    ).stdout
    found = re.search(r"step ([\d,]+)", screen)
    return int(found.group(1).replace(",", "")) if found else 0


def measure(
    command: list[str],
    seconds: float,
    warmup: float,
    label: str,
    frames: Path | None = None,
    caught_up: int = 0,
) -> tuple[float, float]:
    """CPU share and RSS of ``command`` over ``seconds``, after ``warmup`` seconds and
    (``caught_up``) once its header shows that step: the history read, it follows."""
    sock = tempfile.mktemp(prefix="bench-follow-tmux-")
    tmux = ["tmux", "-S", sock]
    session = "bench"
    env_cmd = " ".join(subprocess.list2cmdline([c]) for c in command)
    subprocess.run(
        [
            *tmux,
            "new-session",
            "-d",
            "-s",
            session,
            "-x",
            str(WIDTH),
            "-y",
            str(HEIGHT),
            f"exec {env_cmd}",
        ],
        check=True,
    )
    try:
        if caught_up:
            t_start = time.monotonic()
            while shown_step(tmux, session) < caught_up:
                if time.monotonic() - t_start > 900:
                    sys.exit(f"bench_follow: the app did not reach step {caught_up:,}")
                time.sleep(1.0)
            print(f"  (history read in {time.monotonic() - t_start:.0f} s)")
        time.sleep(warmup)
        pid = app_pid(tmux, session)
        c0, own0, t0, w0 = cpu_seconds(pid), cpu_seconds(pid, False), time.monotonic(), time.time()
        time.sleep(seconds)
        c1, own1, t1, w1 = cpu_seconds(pid), cpu_seconds(pid, False), time.monotonic(), time.time()
        rss = rss_mb(pid)
        screen = subprocess.run(
            [*tmux, "capture-pane", "-p", "-t", session], capture_output=True, text=True
        ).stdout
    finally:
        subprocess.run([*tmux, "kill-server"], check=False, capture_output=True)
        Path(sock).unlink(missing_ok=True)
    share = 100 * (c1 - c0) / (t1 - t0)
    kids = share - 100 * (own1 - own0) / (t1 - t0)
    first = next((line.strip() for line in screen.splitlines() if line.strip()), "")
    stats = frame_stats(frames, w0, w1) if frames is not None else None
    timing = ""
    if stats is not None:
        fps, median, p95 = stats
        timing = f", {fps:4.1f} frames/s, frame {median:5.1f} ms (p95 {p95:5.1f})"
    print(f"{label:>26}: {share:5.2f} % of a core, RSS {rss:4.0f} MB{timing}   [{first[:44]}]")
    if kids > 0:
        print(f"{'':>26}  of which {kids:4.2f} % its children (the agent it starts to probe)")
    return share, rss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--history", type=int, default=0, help="steps already in the file")
    ap.add_argument("--pairs", type=int, default=1, help="app/floor measurements, alternated")
    ap.add_argument(
        "--history-cache",
        type=Path,
        help="a file to keep the written history in and copy from next time (1M steps: minutes)",
    )
    ap.add_argument(
        "--without",
        default="",
        help="comma-separated parts left out, to see what each costs: charts (no chart "
        "follows the data), panels (the text panels keep their first picture), pictures "
        "(no snapshot after the first few: reading and parsing alone)",
    )
    ap.add_argument(
        "--profile",
        type=Path,
        help="run the app under cProfile, its stats written here (the CPU figures then include it)",
    )
    args = ap.parse_args()
    if args.without:
        os.environ["E3_WITHOUT"] = args.without  # frame_probe.py reads it
    if args.profile is not None:
        os.environ["E3_PROFILE"] = str(args.profile.resolve())  # frame_probe.py reads it
    if shutil.which("tmux") is None:
        sys.exit("bench_follow: needs tmux")
    run_dir = Path(tempfile.mkdtemp(prefix="bench-follow-"))
    path = run_dir / "metrics.jsonl"
    seq0 = 0
    if args.history:
        cache = args.history_cache
        if cache is not None and cache.exists():
            shutil.copyfile(cache, path)  # its times are older: the run is silent meanwhile
        else:
            t0 = time.time() - args.history * 0.5
            with open(path, "wb") as f:
                for line in mixed_lines(args.history, t0=t0, dt=0.5):
                    f.write(line)
            if cache is not None:
                shutil.copyfile(path, cache)
        t_index = time.monotonic()  # the companion a run's writers keep (a copy's is not
        index_file(str(path), as_written=True)  # the copy's: its blocks name the file they
        # index; closed as the live writer closes them, by the lines' own times)
        print(f"  (companion made in {time.monotonic() - t_index:.0f} s)")
        seq0 = 10 * args.history  # past every sequence number the history used
        print(f"history: {args.history:,} steps, {path.stat().st_size / 1e6:.0f} MB")
    # the manifest of a live run (its trainer: this process), so the app probes it as it
    # does a real run's every 5 s (an agent started on the host each time)
    manifest = build_manifest(run_dir, run_id=new_run_id())
    write_manifest(run_dir / "run.json", manifest)
    feeder = Feeder(path, args.history, seq0)
    feeder.start()
    probe = Path(__file__).resolve().parent / "frame_probe.py"
    frames = run_dir / "frames.txt"
    bare_py = run_dir / "bare.py"
    bare_py.write_text(BARE_APP)
    ratios: list[float] = []
    apps: list[float] = []
    floors: list[float] = []
    try:
        for _ in range(args.pairs):
            frames.unlink(missing_ok=True)
            app = [sys.executable, str(probe), str(frames), str(run_dir)]
            ours, _ = measure(
                app, args.seconds, args.warmup, "eagle3-tui following", frames, args.history
            )
            floor, _ = measure(
                [sys.executable, str(bare_py)], args.seconds, args.warmup, "bare Textual (floor)"
            )
            apps.append(ours)
            floors.append(floor)
            ratios.append(ours / max(floor, 1e-9))
    finally:
        feeder.stop.set()
        feeder.join()
        shutil.rmtree(run_dir, ignore_errors=True)
    goal = 5 if args.history >= 1_000_000 else 3
    print(
        f"median of {len(ratios)}: eagle3-tui {statistics.median(apps):.2f} %, "
        f"floor {statistics.median(floors):.2f} %, paired ratio "
        f"{statistics.median(ratios):.1f}x   (goal: <= {goal} % of a core)"
    )


if __name__ == "__main__":
    main()
