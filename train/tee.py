"""``python -m eagle3_tui.train.tee FILE``: copy stdin to FILE and to stdout.

The launchers' ``--log tee`` runs this in a session of its own, with the
trainer's stdout and stderr as its stdin, so that the run's output lands in
``RUN_DIR/train.log`` and still on the terminal. Unlike ``tee(1)`` it keeps
writing the file when the terminal goes away (a closed pipe, a dropped SSH
session) and it ignores the terminal's and the group's signals: the trainer
must never get EPIPE on its own output because the copier died first.
"""

from __future__ import annotations

import os
import signal
import sys

from eagle3_tui.telemetry.safefs import open_append


def _write_all(fd: int, data: bytes) -> bool:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        except OSError:
            return False
        view = view[n:]
    return True


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m eagle3_tui.train.tee FILE", file=sys.stderr)
        return 2
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    try:  # never through a link, a FIFO or into another user's file
        log, _ = open_append(args[0])
    except OSError as e:
        print(f"eagle3-tui: cannot write {e}; output goes on to the terminal", file=sys.stderr)
        log = -1
    out_ok = True
    while True:
        try:
            data = os.read(0, 1 << 16)
        except InterruptedError:
            continue
        if not data:
            return 0
        if log >= 0:
            _write_all(log, data)
        if out_ok:
            out_ok = _write_all(1, data)


if __name__ == "__main__":
    sys.exit(main())
