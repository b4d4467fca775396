"""A TCP relay that throttles like a slow link and counts the bytes on it.

    python benchmarks/relay.py TARGET_PORT --rate 12.5e6 --stats FILE

Listens on 127.0.0.1 (the port it chose is the first line of its stdout), forwards
every connection to 127.0.0.1:TARGET_PORT, and lets at most ``--rate`` bytes a
second through in each direction, all connections together (a token bucket: one
link). ``--delay`` adds a one-way latency. FILE holds the running totals as JSON:
``{"up": N, "down": N, "open": N, "connections": N}``, rewritten on every change
of ``open`` and every 0.1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path


class Bucket:
    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.t = time.monotonic()
        self.lock = asyncio.Lock()

    async def take(self, n: int) -> None:
        async with self.lock:  # first come, first served
            while True:
                now = time.monotonic()
                self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
                self.t = now
                if self.tokens >= n:
                    self.tokens -= n
                    return
                await asyncio.sleep((n - self.tokens) / self.rate)


class Relay:
    def __init__(self, target: int, rate: float, delay: float, stats: Path) -> None:
        self.target = target
        self.delay = delay
        self.stats = stats
        chunk = 32 * 1024
        burst = max(256 * 1024, int(rate * 0.02))  # 20 ms of the link: a late wake-up
        self.buckets = {"up": Bucket(rate, burst), "down": Bucket(rate, burst)}
        self.totals = {"up": 0, "down": 0, "open": 0, "connections": 0}
        self.chunk = chunk

    def write_stats(self) -> None:
        tmp = self.stats.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.totals))
        os.replace(tmp, self.stats)

    async def pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, way: str
    ) -> None:
        """Bytes through the bucket, then delivered ``delay`` later (a queue: the latency
        does not cut the rate)."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                at, data = await queue.get()
                if not data:
                    break
                wait = at - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
                self.totals[way] += len(data)
            if writer.can_write_eof():
                writer.write_eof()

        out = asyncio.ensure_future(deliver())
        try:
            while True:
                data = await reader.read(self.chunk)
                if not data:
                    break
                await self.buckets[way].take(len(data))
                queue.put_nowait((time.monotonic() + self.delay, data))
            queue.put_nowait((0.0, b""))
            await out
        except (ConnectionError, OSError):
            out.cancel()
            writer.close()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.totals["open"] += 1
        self.totals["connections"] += 1
        self.write_stats()
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target)
            await asyncio.gather(self.pump(reader, up_w, "up"), self.pump(up_r, writer, "down"))
            up_w.close()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
            self.totals["open"] -= 1
            self.write_stats()

    async def main(self) -> None:
        server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        while True:
            self.write_stats()
            await asyncio.sleep(0.1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("target", type=int)
    p.add_argument("--rate", type=float, default=12.5e6, help="bytes/s each way")
    p.add_argument("--delay", type=float, default=0.0, help="one-way latency, s")
    p.add_argument("--stats", type=Path, required=True)
    ns = p.parse_args()
    asyncio.run(Relay(ns.target, ns.rate, ns.delay, ns.stats).main())


if __name__ == "__main__":
    main()
