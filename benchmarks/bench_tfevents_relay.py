"""A long run whose metrics exist only as speculators' TensorBoard event files (no
eagle3-tui telemetry), opened over SSH through a 100 Mbit/s link: eagle3-tui against
``ssh HOST cat`` of its event file through the same link, and against TensorBoard's
own load of the same directory (its ``EventAccumulator``, the anchor; local, no link).

    python benchmarks/bench_tfevents_relay.py [--steps 200000] [--rounds 3] [--profile]

The event file is benchmarks/bench_tfevents.py's (what speculators' backend writes per
step: 15 scalar events; ~780 bytes a step, 156 MB for 200,000 steps). The training is
a Python process that has torch and speculators imported and holds still (what
discovery takes for a training); the file is named after its PID, as the writer names
it, in its ``--log-dir``: the agent finds it there (agent/tfevents.py) and reads it
(observe.EventFollower). A private OpenSSH ``sshd`` on 127.0.0.1 sits behind the
relay (benchmarks/relay.py: ``--rate`` bytes a second each way, bytes counted).

Per round (alternating, so all three see the same load):

- ``cat``: ``ssh HOST cat FILE >/dev/null``; the remote cat's CPU (the shell's
  ``times``), the ssh client's;
- ``ours``: the monitor's data path (app/pipeline.py over ``ObservedTransport`` and
  the ``ssh`` binary, the training's row known as the chooser knows it) from nothing
  until the model holds every step (its loss column checked equal to TensorBoard's
  loader, value by value); the agent's CPU (its /proc/PID/stat just before the stream
  closes) and peak memory, this process's CPU (event loop and ingest thread) and the
  ssh client's; and when the link said connected (discovery on the host done);
- ``loader``: ``EventAccumulator(DIR).Reload()`` in this process (its CPU).

Medians, and medians of the per-round ratios ours / cat and ours / loader.
``--profile``: afterwards, cProfile's top entries of the agent's first observe rounds
over the same file (the ``Observer`` in this process, no link) and of the client's
model fed the records they made, and the reader's stages timed without a profiler.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import re
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_catchup import SlowLink, config_through
from benchmarks.bench_tfevents import KEYS, write_run
from eagle3_tui.agent import discover, tfevents
from eagle3_tui.agent.observe import EventFollower, FrameSink, Observer
from eagle3_tui.app.pipeline import Pipeline
from eagle3_tui.model.run import Run
from eagle3_tui.telemetry import procs
from eagle3_tui.transport.base import Link, LinkChanged, StreamEvent
from eagle3_tui.transport.channel import AGENT_TAG
from eagle3_tui.transport.observed import ObservedTransport
from eagle3_tui.transport.openssh import OpenSshHost
from eagle3_tui.transport.replies import ProcessRow, decode
from eagle3_tui.transport.target import SshOptions, SshTarget
from tests.transport.sshd import ALIAS, Sshd

TRAINER = """\
# A training that wrote its metrics with speculators' TensorBoard backend and holds
# still: torch loaded and speculators imported, as discovery needs to see.
import sys
import time

import speculators
import torch

print("ready", torch.__version__, speculators.__name__, flush=True)
time.sleep(float(sys.argv[-1]))
"""
LOSS = "train/loss"


def start_trainer(work: Path, hold_s: float) -> subprocess.Popen[str]:
    (work / "train.py").write_text(TRAINER)
    proc = subprocess.Popen(
        [sys.executable, "train.py", "--log-dir", "logs", "--hold", str(hold_s)],
        cwd=work,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    if not proc.stdout.readline().startswith("ready"):
        raise RuntimeError("the training did not start")
    return proc


def event_file(work: Path, pid: int) -> Path:
    """Where the writer of process ``pid`` puts its event file (named after it, now)."""
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    return logs / f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{pid}.0"


def training_row(pid: int, path: Path) -> ProcessRow:
    """The training as the host's discovery describes it, its event file found."""
    row = discover.describe(pid)
    if row.get("handler") != "tensorboard" or row.get("metrics_file") != str(path):
        raise RuntimeError(f"discovery did not find the event file: {row.get('evidence')}")
    return decode(ProcessRow, row)


# ---- the three ways ---------------------------------------------------------------------


@dataclass
class Took:
    """One way's figures in one round."""

    seconds: float
    wire: int = 0
    """Bytes over the link, both ways."""
    host_cpu: float = 0.0
    """CPU seconds on the host: the agent, or the remote cat."""
    client_cpu: float = 0.0
    """CPU seconds on this side: the ssh client, and this process for ours and the loader."""
    extra: dict[str, float] = field(default_factory=dict)


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


_TIMES = re.compile(r"(\d+)m([\d.]+)s\s+(\d+)m([\d.]+)s")


def cat(cfg: Path, path: Path) -> Took:
    """``ssh HOST cat FILE``; the remote shell's ``times`` (on stderr) says its cat's CPU."""
    remote = f"cat {shlex.quote(str(path))} && times >&2"
    before = children_cpu()
    t = time.perf_counter()
    proc = subprocess.run(
        ["ssh", "-F", str(cfg), "-o", "BatchMode=yes", ALIAS, remote],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=True,
    )
    took = time.perf_counter() - t
    found = _TIMES.findall(proc.stderr)
    if len(found) < 2:
        raise RuntimeError(f"no times from the remote shell: {proc.stderr!r}")
    m_user, s_user, m_sys, s_sys = found[1]  # its children's: the cat
    host = 60 * int(m_user) + float(s_user) + 60 * int(m_sys) + float(s_sys)
    return Took(took, host_cpu=host, client_cpu=children_cpu() - before)


class Held:
    """A source whose stream is kept, to be closed (the agent channel with it)."""

    def __init__(self, inner: ObservedTransport) -> None:
        self.inner = inner
        self.gen: AsyncIterator[StreamEvent] | None = None

    @property
    def label(self) -> str:
        return self.inner.label

    def stream(self, offset: int = 0) -> AsyncIterator[StreamEvent]:
        self.gen = self.inner.stream(offset)
        return self.gen


def agent_of(sshd: Sshd) -> int | None:
    """The agent process under the sshd (not the ssh client, whose argv names it too)."""
    for pid in sshd.session_tree():
        argv = procs.cmdline(pid)
        if AGENT_TAG in argv and "python" in os.path.basename(argv[0]):
            return pid
    return None


def runqueue_wait(pid: int) -> float | None:
    """Seconds ``pid`` has waited for a CPU while runnable (``/proc/PID/schedstat``): the
    share of its wall time that was the machine's other load, not its own work."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def peak_rss(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    m = re.search(r"^VmHWM:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) * 1024 if m else 0


async def ours(
    cfg: Path, sshd: Sshd, row: ProcessRow, steps: int
) -> tuple[Took, npt.NDArray[np.float32]]:
    """From nothing until the model holds every step; its loss column."""
    children0 = children_cpu()
    cpu0 = time.process_time()
    t = time.perf_counter()
    target = SshTarget(ALIAS, options=SshOptions(config=(str(cfg),)))
    source = Held(ObservedTransport(OpenSshHost(target), row))
    pipeline = Pipeline()
    connected: list[float] = []

    def on_link(ev: LinkChanged) -> None:
        if ev.link == Link.CONNECTED and not connected:
            connected.append(time.perf_counter() - t)
        elif ev.link == Link.REFUSED:
            raise RuntimeError(ev.detail)

    tasks = [
        asyncio.ensure_future(pipeline.pump(source, on_link)),
        asyncio.ensure_future(pipeline.ingest()),
    ]
    agent: int | None = None
    agent_cpu = waited = 0.0
    first_step: float | None = None
    try:
        while True:
            for task in tasks:
                if task.done():
                    task.result()
                    raise RuntimeError("the stream ended before the last step")
            await asyncio.sleep(0.01)
            agent = agent or agent_of(sshd)
            if agent is not None:
                st = procs.stat(agent)
                agent_cpu = st.cpu_s if st is not None else agent_cpu
                waited = runqueue_wait(agent) or waited
            step = pipeline.global_step
            if step is not None and first_step is None:
                first_step = time.perf_counter() - t
            if step == steps - 1:
                took = time.perf_counter() - t
                break
        rss = peak_rss(agent) if agent is not None else 0
        async with pipeline.lock:
            table = pipeline.run.state.table
            if len(table) != steps:
                raise RuntimeError(f"the model holds {len(table)} steps, not {steps}")
            loss = table.view(LOSS)
            if loss is None or not np.array_equal(table.step_view(), np.arange(steps)):
                raise RuntimeError("the model's steps or loss column are not every step's")
            loss = loss.copy()
        client = time.process_time() - cpu0
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if source.gen is not None:
            await source.gen.aclose()  # type: ignore[attr-defined]
    extra = {
        "connected": connected[0] if connected else float("nan"),
        "first step": first_step if first_step is not None else float("nan"),
        "agent waited for a CPU s": waited,
        "agent peak RSS MB": rss / 1e6,
        "this process CPU": client,
    }
    ssh_client = children_cpu() - children0  # reaped once its stream closed
    return Took(took, host_cpu=agent_cpu, client_cpu=client + ssh_client, extra=extra), loss


def loader(folder: Path) -> tuple[Took, npt.NDArray[np.float32]]:
    """TensorBoard's own load of the directory; its loss values."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cpu0 = time.process_time()
    t = time.perf_counter()
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    took = time.perf_counter() - t
    cpu = time.process_time() - cpu0
    events = acc.Scalars(LOSS)
    if [e.step for e in events] != list(range(len(events))):
        raise RuntimeError("TensorBoard's loader did not give every step once")
    return Took(took, client_cpu=cpu), np.array([e.value for e in events], dtype=np.float32)


# ---- where the time goes -----------------------------------------------------------------


def top(profile: cProfile.Profile, n: int = 14) -> str:
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(n)
    text = out.getvalue()
    return text[text.find("   ncalls") :].rstrip()


PROFILE_ROUNDS = 3
"""Observe rounds profiled (8 MiB of event file each: observe.MAX_ROUND_BYTES)."""
STAGE_BYTES = 16 << 20


def stages(path: Path, scratch: Path) -> None:
    """The agent's reader on the file's first :data:`STAGE_BYTES`, stage by stage, without
    a profiler (whose per-call cost inflates the many small calls): framing with both
    CRCs, the CRCs alone, the events' decoding, and the follower's whole work. CPU
    seconds of this process: the other engineers' load does not count."""
    with open(path, "rb") as f:
        data = f.read(STAGE_BYTES)
    t = time.process_time()
    bodies, used = tfevents.records(data, tfevents.Framing())
    framing = time.process_time() - t
    heads, at = [], 0
    for body in bodies:
        heads.append(data[at : at + 8])
        at += 16 + len(body)
    t = time.process_time()
    for body in bodies:
        tfevents.masked_crc(body)
    body_crc = time.process_time() - t
    t = time.process_time()
    for head in heads:
        tfevents.masked_crc(head)
    head_crc = time.process_time() - t
    t = time.process_time()
    for body in bodies:
        tfevents.scalars(body)
    decode = time.process_time() - t
    part = scratch / "events.out.tfevents.1.stages.1.0"
    part.write_bytes(data[:used])
    out: list[bytes] = []
    follower = EventFollower(str(part), FrameSink("stages", out))
    t = time.process_time()
    while True:  # its offset moves only where no dict is half read: count records
        before = follower.records
        follower.poll(0.0)
        if follower.records == before:
            break
    whole = time.process_time() - t
    part.unlink()
    if follower.records != len(bodies):
        raise RuntimeError(f"the follower read {follower.records} records, not {len(bodies)}")
    rest = whole - framing - decode
    print(
        f"\nthe agent's reader on the first {used / 1e6:.1f} MB ({len(bodies):,} records), "
        f"no profiler: {whole:.2f} CPU s ({used / 1e6 / whole:.1f} MB/s)"
    )
    for what, s in (
        ("framing, both CRC-32Cs (tfevents.records)", framing),
        ("  of which the data CRCs", body_crc),
        ("  of which the length CRCs", head_crc),
        ("decoding the events (tfevents.scalars)", decode),
        ("regrouping, records, JSON (the rest)", rest),
    ):
        print(f"  {what:44} {s:6.2f} s  {s / whole:4.0%}")


def profile(pid: int, path: Path, scratch: Path) -> None:
    """Where the time goes: the agent's first observe rounds over the file, in this
    process under cProfile (no link, no waits between rounds), the client's model fed
    what they wrote, and the reader's stages unprofiled (:func:`stages`)."""
    obs = Observer(discover.describe(pid), {}, 1.0)
    prof = cProfile.Profile()
    t = time.perf_counter()
    data: list[bytes] = []
    prof.enable()
    try:
        for _ in range(PROFILE_ROUNDS):
            obs.round(time.time())
            data.extend(obs.out)
            obs.out.clear()
    finally:
        prof.disable()
        obs.close()
    took = time.perf_counter() - t
    blob = b"".join(data)
    steps = obs.metrics_sink.seq
    print(
        f"\nthe agent's first {PROFILE_ROUNDS} observe rounds in-process under cProfile: "
        f"{steps:,} steps, {took:.1f} s, {len(blob) / 1e6:.1f} MB of records "
        f"({len(blob) / max(steps, 1):.0f} bytes a step)"
    )
    print(top(prof))
    run = Run()
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    run.feed(0, blob)
    steps_seen = run.state.train_steps
    prof.disable()
    print(
        f"\nthe client's model fed those bytes under cProfile: {time.perf_counter() - t:.2f} s, "
        f"{steps_seen:,} steps"
    )
    print(top(prof, 8))
    stages(path, scratch)


# ---- the whole ---------------------------------------------------------------------------


def report(rows: dict[str, list[Took]], size: int, steps: int) -> None:
    def med(name: str, attr: str) -> float:
        return float(statistics.median(getattr(t, attr) for t in rows[name]))

    def ratio(name: str, base: str, attr: str = "seconds") -> float:
        return float(
            statistics.median(
                getattr(a, attr) / max(getattr(b, attr), 1e-9)
                for a, b in zip(rows[name], rows[base], strict=True)
            )
        )

    n = len(rows["ours"])
    print(f"\nmedians of {n} rounds ({steps:,} steps, {size / 1e6:.1f} MB event file):")
    labels = {
        "cat": "ssh HOST cat FILE",
        "ours": "eagle3-tui, every step",
        "loader": "TensorBoard's loader",
    }
    print(f"  {'':24} {'time s':>7} {'MB on link':>10} {'host CPU s':>10} {'client CPU s':>12}")
    for name, label in labels.items():
        wire = f"{med(name, 'wire') / 1e6:10.1f}" if name != "loader" else f"{'(local)':>10}"
        host = f"{med(name, 'host_cpu'):10.2f}" if name != "loader" else f"{'-':>10}"
        client = med(name, "client_cpu")
        print(f"  {label:24} {med(name, 'seconds'):7.2f} {wire} {host} {client:12.2f}")
    for key in rows["ours"][0].extra:
        value = statistics.median(t.extra[key] for t in rows["ours"])
        print(f"  eagle3-tui {key}: {value:.2f}")
    print("ratios (median of per-round ratios):")
    print(
        f"  ours / cat:    time {ratio('ours', 'cat'):5.2f}x, bytes on the link "
        f"{ratio('ours', 'cat', 'wire'):5.3f}x"
    )
    ours_cpu = statistics.median(
        (o.host_cpu + o.client_cpu) / max(b.client_cpu, 1e-9)
        for o, b in zip(rows["ours"], rows["loader"], strict=True)
    )
    print(
        f"  ours / loader: time {ratio('ours', 'loader'):5.2f}x, CPU (agent + client + ssh) / "
        f"loader's {ours_cpu:5.2f}x"
    )
    agent = med("ours", "host_cpu")
    print(
        f"  the agent read {size / 1e6 / agent:.1f} MB/s of event file per CPU second; the link "
        f"carries {12.5:.1f} MB/s at 100 Mbit/s"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=200_000)
    p.add_argument("--rate", type=float, default=12.5e6, help="bytes/s each way (100 Mbit/s)")
    p.add_argument("--delay", type=float, default=0.0, help="one-way latency, s")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--profile", action="store_true", help="cProfile the agent and the client")
    ns = p.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs at the start")
    root = Path(tempfile.mkdtemp(prefix="bench-tfevents-relay-"))
    work = root / "work"
    work.mkdir()
    trainer = start_trainer(work, hold_s=3600)
    sshd: Sshd | None = None
    link: SlowLink | None = None
    try:
        path = event_file(work, trainer.pid)
        t = time.perf_counter()
        write_run(path, ns.steps)
        size = path.stat().st_size
        print(
            f"{ns.steps:,} steps x {len(KEYS)} scalars: {size / 1e6:.1f} MB event file "
            f"(written in {time.perf_counter() - t:.0f} s); link {ns.rate * 8 / 1e6:.0f} Mbit/s"
        )
        row = training_row(trainer.pid, path)
        sshd = Sshd(root / "sshd").start()
        link = SlowLink(sshd.port, ns.rate, ns.delay, root)
        cfg = config_through(sshd, link.port, root)
        rows: dict[str, list[Took]] = {"cat": [], "ours": [], "loader": []}
        for r in range(ns.rounds):
            before = link.idle()
            got = cat(cfg, path)
            got.wire = sum(link.idle()[k] - before[k] for k in ("up", "down"))
            rows["cat"].append(got)
            before = link.idle()
            got, mine = asyncio.run(ours(cfg, sshd, row, ns.steps))
            got.wire = sum(link.idle()[k] - before[k] for k in ("up", "down"))
            rows["ours"].append(got)
            got, theirs = loader(path.parent)
            rows["loader"].append(got)
            if not np.array_equal(mine, theirs):
                bad = int(np.flatnonzero(mine != theirs)[0]) if len(mine) == len(theirs) else -1
                raise RuntimeError(f"the loss differs from TensorBoard's loader at step {bad}")
            print(
                "  round {}: cat {:.2f} s, ours {:.2f} s (agent CPU {:.2f} s), loader {:.2f} s; "
                "{:,} loss values equal to the loader's".format(
                    r + 1,
                    rows["cat"][-1].seconds,
                    rows["ours"][-1].seconds,
                    rows["ours"][-1].host_cpu,
                    got.seconds,
                    len(mine),
                ),
                flush=True,
            )
        report(rows, size, ns.steps)
        print(f"load average {os.getloadavg()[0]:.2f} at the end")
        if ns.profile:
            profile(trainer.pid, path, root)
    finally:
        if link is not None:
            link.stop()
        if sshd is not None:
            sshd.stop()
        os.killpg(trainer.pid, signal.SIGKILL)
        trainer.wait()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
