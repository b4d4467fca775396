"""``watch``: a tester's reports, each with the test that failed before its fix — a slow
webhook held up the other destinations, a directory's run without telemetry was named by
its PID, totals written after the first look never reached an alert, URLs that can never
be delivered to were accepted, a state path that is no file was used, the interval's two
messages, the exit status of a stopped watcher, a diverged run's end unsaid."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.notify import Alert, ExecNotifier, Outbox, WebhookNotifier
from tests.test_watch import Hook

ALERT = Alert(
    kind="stalled",
    run="/tmp/x/r2",
    host="this machine",
    pid=4242,
    health="stalled",
    previous="running",
    reason="No GPU activity, no reads, no metrics for 5 min.",
    step=10,
    total_steps=48,
    epoch=0,
    epochs=2,
    command="eagle3-tui kill /tmp/x/r2",
    at=1_800_000_000.0,
    id="a1",
)


@pytest.fixture
def hook() -> Iterator[Hook]:
    """A real HTTP server on loopback (tests/test_watch.py's): what is posted to it."""
    h = Hook()
    yield h
    h.close()


def wait_for(predicate: Any, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


# ---- 1. destinations are independent --------------------------------------------------


def test_a_slow_webhook_holds_up_no_other_destinations_first_try(tmp_path: Path) -> None:
    """A webhook that answers after 6 s (one that times out after 10 s, the same) held
    the command given after it until it answered: each destination is tried at once."""
    got = tmp_path / "got.json"
    slow = Hook(delay=6.0)
    try:
        box = Outbox(
            [
                WebhookNotifier(slow.url, slow.url, "json"),
                ExecNotifier("exec:cat", f"cat > {got}"),
            ],
            lambda line: None,
        )
        box.start()
        t0 = time.monotonic()
        box.post(ALERT)
        assert wait_for(lambda: got.exists() and got.read_text(), 4.0), "exec waited"
        assert json.loads(got.read_text())["id"] == "a1"
        assert time.monotonic() - t0 < 5.0 and slow.posts == []  # the webhook still slow
        assert wait_for(lambda: box.delivered == 2, 20.0), box.queue
        assert [p["id"] for _, p in slow.posts] == ["a1"]
        box.stop()
        # watch --once: every delivery tried once, each destination on its own too
        got.unlink()
        once = Outbox(box.notifiers, lambda line: None)
        once.post(ALERT)
        trying = threading.Thread(target=once.try_all)
        trying.start()
        assert wait_for(lambda: got.exists() and got.read_text(), 4.0), "exec waited"
        trying.join(20)
        assert once.delivered == 2 and len(slow.posts) == 2
    finally:
        slow.close()


# ---- following real trainings -----------------------------------------------------------


def watcher_on(
    run_dir: Path, hook: Hook, tmp_path: Path, said: list[str], interval_s: float = 0.5
) -> Any:
    """A watcher in this process on ``run_dir`` (as the command gives it: resolved), its
    alerts to ``hook``, quick rules."""
    from eagle3_tui.following import WatchTarget
    from eagle3_tui.transport.target import LocalTarget
    from eagle3_tui.watch import Rules, Watcher, WatchState

    resolved = run_dir.resolve()
    target = WatchTarget(str(resolved), LocalTarget(resolved), discover=False)
    notifier = WebhookNotifier(hook.url, hook.url, "json")
    state = WatchState(tmp_path / "state.json")
    rules = Rules(hold_s=1.0, gap_s=1.0, link_down_s=60.0)
    return Watcher([target], [notifier], state, rules=rules, interval_s=interval_s, say=said.append)


@pytest.mark.slow
def test_a_directorys_training_without_telemetry_is_named_by_the_directory(
    tmp_path: Path, hook: Hook
) -> None:
    """``watch DIR`` on a training without telemetry working there: its alert said "this
    machine pid N" and its state was kept by PID; it is the directory's resolved path
    (as ``--once`` keeps it), the command still by PID."""
    import asyncio

    from tests.conftest import live_training, wait_until_async

    run_dir = tmp_path / "r2"
    said: list[str] = []
    # long enough to be silent (30 s) before it ends: the first alert is that one
    args = ("--epochs", "12", "--step-delay", "0.2", "--no-telemetry")

    async def watch(run: Any) -> None:
        w = watcher_on(run_dir, hook, tmp_path, said)
        stop = asyncio.Event()
        task = asyncio.ensure_future(w.run(stop))
        try:
            await wait_until_async(lambda: hook.posts, 150, lambda: f"{said}\n{run.log()}")
        finally:
            stop.set()
            await task
        alert = hook.posts[0][1]
        resolved = str(run_dir.resolve())
        assert alert["kind"] == "silent" and alert["pid"] == run.proc.pid, alert
        assert alert["run"] == resolved, alert
        assert alert["command"] == f"eagle3-tui attach --pid {run.proc.pid}", alert
        saved = json.loads((tmp_path / "state.json").read_text())
        assert list(saved["runs"]) == [f"this machine:{resolved}"], saved
        assert saved["runs"][f"this machine:{resolved}"]["label"] == resolved

    with live_training(run_dir, args, dict(os.environ)) as run:
        asyncio.run(watch(run))


@pytest.mark.slow
def test_a_watch_started_with_the_trainer_learns_its_totals_written_later(
    tmp_path: Path, hook: Hook
) -> None:
    """A watcher started with the trainer looked before its ``run.json`` had its totals
    (the Trainer writes them once it is made), and asked the host again only every 5
    min while records flowed: its alerts said ``"total_steps": null`` while ``summary``
    said 48. The totals reach the alert as they reach ``summary``."""
    import asyncio

    from eagle3_tui.telemetry.manifest import launch_env
    from tests.conftest import live_training, read_jsonl, wait_until_async

    run_dir, control = tmp_path / "run", tmp_path / "control"
    args = ("--epochs", "2", "--step-delay", "0.2", "--debug-control", str(control))
    said: list[str] = []

    def trained() -> int:
        path = run_dir / "metrics.jsonl"
        return sum(r["kind"] == "train" for r in read_jsonl(path)) if path.exists() else 0

    async def watch(run: Any) -> None:
        w = watcher_on(run_dir, hook, tmp_path, said, interval_s=2.0)  # heartbeats each look
        stop = asyncio.Event()
        task = asyncio.ensure_future(w.run(stop))
        try:
            await wait_until_async(lambda: trained() >= 3, 180, lambda: f"steps\n{run.log()}")
            control.write_text("nan 0\n")
            await wait_until_async(lambda: hook.posts, 90, lambda: f"{said}\n{run.log()}")
        finally:
            stop.set()
            await task
        alert = hook.posts[0][1]
        manifest = run.manifest()
        assert alert["kind"] == "diverged", alert
        assert manifest["total_steps"] and manifest["epochs"] == 2, manifest
        assert (alert["total_steps"], alert["epochs"]) == (manifest["total_steps"], 2), alert

    with live_training(run_dir, args, dict(os.environ, **launch_env(run_dir))) as run:
        asyncio.run(watch(run))


# ---- what is refused at the start ---------------------------------------------------------


def watch(
    *args: str, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eagle3_tui", "watch", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        check=False,
    )


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://a b/x", "'http://a b/x': a blank or control character in the URL"),
        ("http://127.0.0.1:0/x", "'http://127.0.0.1:0/x': Port out of range 1-65535"),
        ("json:http://a%20b/x", "'http://a%20b/x': 'a%20b' is not a host name or address"),
    ],
)
def test_a_url_no_delivery_can_reach_is_refused_at_the_start(
    tmp_path: Path, url: str, said: str
) -> None:
    """A blank in the host, port 0: accepted, then retried 8 times. Refused at the
    start, a usage error (2), one line naming it."""
    done = watch("--once", str(tmp_path), "--notify", url, "--state", str(tmp_path / "w.json"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and said in done.stderr, done.stderr
    assert not (tmp_path / "w.json").exists()


def test_a_urls_scheme_is_case_insensitive(hook: Hook) -> None:
    """``HTTP://127.0.0.1:PORT/UP`` was "not a destination"; it is the webhook it names."""
    from eagle3_tui.notify import parse_notify

    upper = hook.url.replace("http://", "HTTP://")
    parse_notify(upper).send(ALERT)
    parse_notify(f"JSON:{upper}").send(ALERT)
    assert [p["id"] for _, p in hook.posts] == ["a1", "a1"]
    slack = parse_notify("HTTPS://hooks.slack.com/services/T/B/X")
    assert isinstance(slack, WebhookNotifier) and slack.style == "slack"


def test_a_state_path_that_is_no_file_is_refused_and_no_directory_made(tmp_path: Path) -> None:
    """``--state DIR`` started anyway ("not read (IsADirectoryError); starting afresh",
    then "not saved": every alert repeated after a restart); ``--state /missing/dir/x``
    made ``/missing/dir``. Both are usage errors at the start, nothing made."""
    (tmp_path / "adir").mkdir()
    missing = tmp_path / "missing"
    for state, said in (
        (tmp_path / "adir", f"{str(tmp_path / 'adir')!r}: a directory; --state names a file"),
        (missing / "dir" / "x", f"{str(missing / 'dir')!r} does not exist, and is not made"),
    ):
        done = watch("--once", str(tmp_path), "--state", str(state))
        assert done.returncode == 2, done.stdout + done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
        assert said in done.stderr and "watch --help" in done.stderr, done.stderr
    assert not missing.exists()


def test_interval_says_one_true_message_in_one_style(tmp_path: Path) -> None:
    """``--interval -1`` said "0 or more", ``--interval 0`` "above 0" with another
    prefix: one message, the usage error's, for both."""
    for value in ("-1", "0", "nan"):
        done = watch("--once", str(tmp_path), "--interval", value)
        assert done.returncode == 2, done.stderr
        assert done.stderr == (
            f"eagle3-tui watch: argument --interval: {value!r}: a number of seconds above 0 "
            "(see eagle3-tui watch --help)\n"
        )


# ---- how a watcher ends ---------------------------------------------------------------------


@pytest.mark.parametrize(("sig", "status"), [("SIGINT", 130), ("SIGTERM", 0)])
def test_a_watcher_interrupted_exits_130_and_one_stopped_by_sigterm_0(
    tmp_path: Path, sig: str, status: int
) -> None:
    """The README's table says 130 for Ctrl-C, every command; ``watch`` exited 0 on
    it. Ctrl-C is 130 (a script sees it was interrupted); SIGTERM, a service manager's
    stop (``systemctl stop``: 0 is a clean stop there), 0. The help says both."""
    import signal

    err = tmp_path / "err"
    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "eagle3_tui", "watch", str(tmp_path), "--interval", "0.5"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # its first look said: the handlers are in place
        assert "not followed yet" in line, line + err.read_text()
        proc.send_signal(getattr(signal, sig))
        assert proc.wait(60) == status, err.read_text()
        assert "stopped; 0 deliveries kept" in err.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    shown = watch("--help").stdout
    assert "0 stopped by SIGTERM" in shown and "130 interrupted (Ctrl-C)" in shown, shown


def test_a_diverged_run_that_ends_is_said_once_to_have_ended(tmp_path: Path) -> None:
    """A run alerted DIVERGED that then finished stayed diverged: no alert, and nobody
    watching learned it ended. Its end is one ``ended`` alert (after the hold, within
    the gap), kept in the state file (a restart sends it not again); a diverged alert
    that already said the run had finished needs none; a resumed run's next end does."""
    from eagle3_tui.watch import (
        Rules,
        RunMemory,
        Verdict,
        WatchState,
        make_alert,
        transition,
    )

    rules = Rules(hold_s=10.0, gap_s=30.0, link_down_s=60.0)

    def v(health: str, ended: bool = False) -> Verdict:
        said = "Training finished after 48 steps, diverged" if ended else f"it is {health}"
        return Verdict(health=health, reason=said, step=48, total_steps=48, ended=ended)

    def looks(m: RunMemory, *seq: tuple[float, Verdict]) -> list[tuple[float, str]]:
        return [(t, k) for t, x in seq if (k := transition(m, x, t, rules)) is not None]

    m = RunMemory("/r")
    sent = looks(m, (0, v("running")), (10, v("diverged")), (20, v("diverged")))
    assert sent == [(20, "diverged")]
    ended = [(t, v("diverged", ended=True)) for t in (25, 35, 45, 55, 65, 75)]
    assert looks(m, *ended) == [(55, "ended")]  # held at 35, the gap over at 50
    alert = make_alert("ended", m, "this machine", v("diverged", ended=True), "diverged", [], 55)
    assert (alert.kind, alert.health, alert.command) == (
        "ended",
        "diverged",
        "eagle3-tui summary /r",
    )
    assert alert.headline() == "eagle3-tui: ENDED: /r at step 48/48"
    state = WatchState(tmp_path / "state.json", runs={"k": m})
    state.save([])
    back = WatchState.load(state.path).runs["k"]
    assert looks(back, (100, v("diverged", ended=True)), (200, v("diverged", ended=True))) == []
    # resumed, diverged still, and ended again: said again
    assert looks(back, (300, v("diverged")), (400, v("diverged", ended=True))) == []
    assert looks(back, (410, v("diverged", ended=True))) == [(410, "ended")]
    # a diverged alert of a run that had finished said it: nothing more
    first = RunMemory("/s")
    seq = [(t, v("diverged", ended=True)) for t in (0, 10, 20, 30, 100)]
    assert looks(first, *seq) == [(10, "diverged")]
