"""Which data files the dataloader workers read: a datagram from each read.

Dataloader workers are started with ``spawn``, so nothing patched in the trainer
reaches them; what does is the ``transfer`` object the dataset reads through (it
is pickled into every worker). A transfer that calls :func:`report_read` after
each file it loads (``eagle3_tui.train.observe``) sends one datagram to the
sampler: ``pid \\t bytes \\t path``. :class:`ReadsReceiver` (in the sampler)
collects them per process and interval.

The channel is a Linux abstract-namespace Unix datagram socket named in the
environment (``EAGLE3_TUI_READS``, set by ``attach()`` and inherited by the
workers): no file, nothing to clean up, and a send never blocks — with no
receiver, or a full one, the report is dropped and counted in the sender.

Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from typing import Final

READS_ENV: Final = "EAGLE3_TUI_READS"
_MAX_PATH = 900

_sock: socket.socket | None = None
_sock_pid = 0
unsent = 0
"""Reports this process could not send (no receiver, or its buffer was full)."""


def socket_name(run_id: str, pid: int) -> str:
    """The channel's name for the trainer ``pid`` of run ``run_id`` (``@`` = abstract)."""
    return f"@eagle3-tui/{run_id}/{pid}/reads"


def _address(name: str) -> str | bytes:
    return b"\0" + name[1:].encode() if name.startswith("@") else name


def report_read(path: str, nbytes: int) -> None:
    """Report that this process read ``nbytes`` of ``path``. Never raises or blocks."""
    global _sock, _sock_pid, unsent
    name = os.environ.get(READS_ENV)
    if not name:
        return
    try:
        pid = os.getpid()
        if _sock is None or _sock_pid != pid:
            _sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            _sock.setblocking(False)
            _sock_pid = pid
        data = f"{pid}\t{int(nbytes)}\t{path[-_MAX_PATH:]}".encode(errors="replace")
        _sock.sendto(data, _address(name))
    except OSError:  # no receiver (yet, or any more), or its buffer is full
        unsent += 1
    except Exception:  # never into the dataloader
        unsent += 1


class ReadsReceiver:
    """Receives read reports in a daemon thread; :meth:`take` returns and resets them."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._bytes: dict[int, int] = {}
        self._files: dict[int, set[str]] = {}
        self.received = 0
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        with contextlib.suppress(OSError):
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self._sock.bind(_address(name))  # may raise OSError: the caller decides
        self._sock.settimeout(0.5)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="eagle3-tui-reads", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._closed:
            try:
                data = self._sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                pid_s, n_s, path = data.decode(errors="replace").split("\t", 2)
                pid, n = int(pid_s), int(n_s)
            except ValueError:
                continue
            with self._lock:
                self.received += 1
                self._bytes[pid] = self._bytes.get(pid, 0) + n
                self._files.setdefault(pid, set()).add(path)

    def take(self) -> tuple[dict[int, int], dict[int, set[str]]]:
        """Bytes and files per PID since the last call."""
        with self._lock:
            b, f = self._bytes, self._files
            self._bytes, self._files = {}, {}
        return b, f

    def close(self) -> None:
        self._closed = True
        self._thread.join(1.0)
        self._sock.close()
