"""Processes that check themselves while they are injected into (tests/attach/test_ptrace.py).

    python targets.py KIND DIR

Each runs one step over and over and checks every result against a value known
exactly (integer-valued floating point, hashes, byte sequences, times that may not
be short), until ``DIR/stop`` exists; then it prints its counts as JSON and exits 0.
``DIR/ready`` appears once it runs. An exception out of a step (``InterruptedError``,
``OSError: [Errno 514]``: what a badly restored syscall gives) is recorded with its
repr, never fatal. Kinds:

``numpy``     vector sums, a BLAS dot product and a clipped difference (SIMD loops)
``torch``     a float32 matrix product and a vector sum, one intra-op thread
``pool``      four threads hashing and summing; the main thread waits for them
``timer``     SIGALRM every millisecond (setitimer) over busy Python and short sleeps;
              the handler's calls are counted
``read``      the main thread blocked in ``os.read`` of a pipe a thread feeds
``select``    ``select`` on a pipe that is sometimes ready, with a timeout
``sleep``     ``time.sleep(0.02)``; it may not come back early
``lock``      ``Lock.acquire(timeout=0.02)`` of a lock a thread holds most of the time
``waitpid``   ``os.waitpid`` of a child that exits with status 7 after 5 ms
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable

KIND, DIR = sys.argv[1], sys.argv[2]
ERRORS: list[str] = []
TIMER = {"ticks": 0, "since": 0.0}
"""The timer target's handler calls, and when its timer started."""


def numpy_step() -> Callable[[], bool]:
    import numpy as np

    n = 1 << 15
    a = np.arange(n, dtype=np.float64)
    dot = float(sum(i * i for i in range(n)))  # < 2**53: exact in any order
    k = [0]

    def step() -> bool:
        k[0] = k[0] % 1000 + 1
        m = k[0]
        return bool(
            (a * m).sum() == m * n * (n - 1) / 2
            and a @ a == dot
            and np.maximum(a - m, 0).sum() == (n - m) * (n - m - 1) / 2
        )

    return step


def torch_step() -> Callable[[], bool]:
    import torch

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 4, (96, 96), generator=g).float()
    y = torch.randint(0, 4, (96, 96), generator=g).float()
    product = (x.double() @ y.double()).float()  # entries <= 864: exact in float32
    v = torch.arange(1024, dtype=torch.float32)

    def step() -> bool:
        return bool(torch.equal(x @ y, product) and float((v * 3).sum()) == 3 * 1024 * 1023 / 2)

    return step


def pool_step() -> Callable[[], bool]:
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(4)
    data = [bytes([i]) * 65536 for i in range(8)]
    digests = [hashlib.sha256(d).hexdigest() for d in data]

    def work(i: int) -> bool:
        n = i * 1000
        return (
            hashlib.sha256(data[i]).hexdigest() == digests[i] and sum(range(n)) == n * (n - 1) // 2
        )

    return lambda: all(pool.map(work, range(8)))


def timer_step() -> Callable[[], bool]:
    def tick(signum: int, frame: object) -> None:
        TIMER["ticks"] += 1

    signal.signal(signal.SIGALRM, tick)
    signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
    TIMER["since"] = time.monotonic()
    expect = sum(i * i for i in range(2000))

    def step() -> bool:
        busy = sum(i * i for i in range(2000))
        t = time.monotonic()
        time.sleep(0.002)  # the timer interrupts it all the time: it resumes (PEP 475)
        return busy == expect and time.monotonic() - t >= 0.0019

    return step


def pipe_fed(every: float) -> int:
    """A pipe's read end, a thread writing the bytes 0, 1, ... 250, 0, ... into it."""
    r, w = os.pipe()

    def feed() -> None:
        i = 0
        while True:
            os.write(w, bytes([i % 251]))
            i += 1
            time.sleep(every)

    threading.Thread(target=feed, daemon=True).start()
    return r


def read_step() -> Callable[[], bool]:
    r = pipe_fed(0.005)
    expect = [0]

    def step() -> bool:
        got = os.read(r, 1)
        ok = got == bytes([expect[0] % 251])
        expect[0] += 1
        return ok

    return step


def select_step() -> Callable[[], bool]:
    r = pipe_fed(0.03)
    expect = [0]

    def step() -> bool:
        t = time.monotonic()
        ready, _, _ = select.select([r], [], [], 0.02)
        if not ready:
            return time.monotonic() - t >= 0.0195  # a timeout may not come early
        ok = ready == [r] and os.read(r, 1) == bytes([expect[0] % 251])
        expect[0] += 1
        return ok

    return step


def sleep_step() -> Callable[[], bool]:
    def step() -> bool:
        t = time.monotonic()
        time.sleep(0.02)
        return time.monotonic() - t >= 0.0195

    return step


def lock_step() -> Callable[[], bool]:
    lock = threading.Lock()

    def hold() -> None:
        while True:
            with lock:
                time.sleep(0.01)
            time.sleep(0.001)

    threading.Thread(target=hold, daemon=True).start()

    def step() -> bool:
        t = time.monotonic()
        got = lock.acquire(timeout=0.02)
        waited = time.monotonic() - t
        if got:
            lock.release()
        return got or waited >= 0.0195

    return step


def waitpid_step() -> Callable[[], bool]:
    def step() -> bool:
        child = os.fork()
        if child == 0:
            time.sleep(0.005)
            os._exit(7)
        pid, status = os.waitpid(child, 0)
        return pid == child and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 7

    return step


def main() -> int:
    step = globals()[f"{KIND}_step"]()
    stop = os.path.join(DIR, "stop")
    iterations = wrong = 0
    open(os.path.join(DIR, "ready"), "w").close()
    while not os.path.exists(stop):
        try:
            ok = step()
        except Exception as e:  # EINTR or errno 512-516 out of a syscall: recorded
            ERRORS.append(repr(e))
            continue
        iterations += 1
        wrong += not ok
    report = {"kind": KIND, "iterations": iterations, "wrong": wrong, "errors": ERRORS[:20]}
    if TIMER["since"]:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        report.update(ticks=TIMER["ticks"], ms=1000 * (time.monotonic() - TIMER["since"]))
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
