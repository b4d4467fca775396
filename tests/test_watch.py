"""``watch`` (issue 30), its parts: when a verdict becomes an alert (once, after it held,
no flapping, a gap per run, a link down and back), where alerts go (a real HTTP server
on loopback, a command), retries with backoff that never block, and a state that a
restarted watcher neither repeats nor loses (``watch --once`` on a real run)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.notify import (
    ATTEMPTS,
    Alert,
    DeliveryError,
    ExecNotifier,
    Outbox,
    WebhookNotifier,
    parse_notify,
    webhook_style,
)
from eagle3_tui.watch import Rules, RunMemory, Verdict, action, transition
from tests.records import Lines

RULES = Rules(hold_s=10.0, gap_s=30.0, link_down_s=60.0)


def v(health: str, **kw: Any) -> Verdict:
    return Verdict(health=health, reason=f"it is {health}", **kw)


def test_a_verdict_is_sent_once_after_it_held_and_never_for_a_flap() -> None:
    m = RunMemory("gpu-box:runs/exp7")
    assert transition(m, v("waiting"), 0, RULES) is None  # first seen healthy: its baseline
    assert transition(m, v("running"), 5, RULES) is None and m.alerted == "waiting"
    assert transition(m, v("running"), 20, RULES) is None  # waiting -> running: nothing to say
    assert m.alerted == "running"
    assert transition(m, v("silent"), 100, RULES) is None  # one look
    assert transition(m, v("silent"), 105, RULES) is None  # not held 10 s yet
    assert transition(m, v("silent"), 111, RULES) == "silent"
    assert [transition(m, v("silent"), t, RULES) for t in (120, 200, 400)] == [None] * 3
    # a flap: stalled for a few looks under the hold, then silent again: nothing sent
    assert transition(m, v("stalled"), 500, RULES) is None
    assert transition(m, v("stalled"), 505, RULES) is None
    assert transition(m, v("silent"), 509, RULES) is None
    assert transition(m, v("silent"), 530, RULES) is None
    # recovered: back to running, held
    assert transition(m, v("running"), 600, RULES) is None
    assert transition(m, v("running"), 611, RULES) == "recovered"


def test_an_alerts_previous_health_is_what_the_looks_found_before_the_change() -> None:
    """Waiting, then running for less than a hold, then stopped: the alert said
    "previous: waiting" (the last health sent) of a run that had logged steps."""
    m = RunMemory("r")
    transition(m, v("waiting"), 0, RULES)  # the baseline
    transition(m, v("running"), 5, RULES)
    transition(m, v("running"), 9, RULES)  # not held yet: never sent
    transition(m, v("stopped"), 12, RULES)
    assert transition(m, v("stopped"), 25, RULES) == "stopped"
    assert m.previous == "running"
    # a recovery's previous is the alarm it recovered from
    transition(m, v("stalled"), 100, RULES)
    assert transition(m, v("stalled"), 111, RULES) == "stalled" and m.previous == "stopped"
    transition(m, v("running"), 150, RULES)
    assert transition(m, v("running"), 161, RULES) == "recovered" and m.previous == "stalled"


def test_one_alert_per_gap_and_the_change_in_it_waits_for_its_end() -> None:
    m = RunMemory("r")
    transition(m, v("running"), 0, RULES)
    transition(m, v("stalled"), 100, RULES)
    assert transition(m, v("stalled"), 110, RULES) == "stalled"
    transition(m, v("dead"), 115, RULES)
    assert transition(m, v("dead"), 126, RULES) is None  # held, but within 30 s of the last
    assert transition(m, v("dead"), 139, RULES) is None
    assert transition(m, v("dead"), 141, RULES) == "dead"  # sent at the gap's end


def test_a_run_first_seen_in_trouble_or_ended_is_said() -> None:
    for health in ("silent", "finished", "stopped", "dead", "diverged", "disk_full"):
        m = RunMemory("r")
        assert transition(m, v(health), 0, RULES) is None
        assert transition(m, v(health), 10, RULES) == health


def test_the_state_file_keeps_the_runs_seen_last_and_reads_back_what_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A watcher over months sees runs come and go: its file keeps the ``REMEMBERED``
    seen last, each read back as written; an old file without ``seen_at`` still reads."""
    import eagle3_tui.watch as watch

    monkeypatch.setattr(watch, "REMEMBERED", 3)
    path = tmp_path / "state.json"
    state = watch.WatchState(path)
    for i in range(5):
        state.runs[f"h:/r{i}"] = RunMemory(f"r{i}", alerted="finished", seen_at=100.0 - i)
    state.save([])
    back = watch.WatchState.load(path)
    assert back.problem is None and sorted(back.runs) == ["h:/r0", "h:/r1", "h:/r2"]
    assert back.runs["h:/r1"] == RunMemory("r1", alerted="finished", seen_at=99.0)
    data = json.loads(path.read_text())
    del data["runs"]["h:/r0"]["seen_at"]  # a file written before seen_at was kept
    path.write_text(json.dumps(data))
    assert watch.WatchState.load(path).runs["h:/r0"].seen_at == 0.0


def test_a_link_down_past_its_threshold_then_back() -> None:
    m = RunMemory("r")
    transition(m, v("running"), 0, RULES)
    down = v("running", link_down_since=100.0)
    assert transition(m, down, 130, RULES) is None  # 30 s: under the threshold
    assert transition(m, down, 161, RULES) == "link_down"
    assert transition(m, down, 200, RULES) is None  # once
    # while it is down, no verdict moves (nothing new can arrive)
    assert transition(m, v("silent", link_down_since=100.0), 300, RULES) is None
    assert transition(m, v("running"), 400, RULES) == "recovered"
    assert transition(m, v("running"), 500, RULES) is None


def test_each_alert_names_the_command_that_acts() -> None:
    observed = v("silent", observed=True, pid=4242)
    assert action("silent", "gpu-box pid 4242", observed, ["-p", "2222"]) == (
        "eagle3-tui attach gpu-box --pid 4242 -p 2222"
    )
    assert action("silent", "this machine pid 7", v("silent", observed=True, pid=7), []) == (
        "eagle3-tui attach --pid 7"
    )
    run = "gpu-box:runs/exp 7"  # quoted for a shell
    assert action("stalled", run, v("stalled"), []) == "eagle3-tui kill 'gpu-box:runs/exp 7'"
    quoted = "'gpu-box:runs/exp 7'"
    assert action("dead", run, v("dead", leftovers=True), []) == f"eagle3-tui kill {quoted}"
    assert action("dead", run, v("dead"), []) == f"eagle3-tui resume {quoted}"
    assert action("stopped", run, v("stopped"), []) == f"eagle3-tui resume {quoted}"
    assert action("finished", run, v("finished"), []) == f"eagle3-tui summary {quoted}"
    # nothing to continue from (a signal's interrupted/ only): no resume that is refused
    nothing = v("stopped", resumable=False)
    assert action("stopped", run, nothing, []) == f"eagle3-tui summary {quoted}"
    # diverged and still training: kill it; diverged and ended (it finished so): nothing
    # runs to kill ("nothing to stop"), its summary
    assert action("diverged", run, v("diverged"), []) == f"eagle3-tui kill {quoted}"
    over = v("diverged", ended=True)
    assert action("diverged", run, over, []) == f"eagle3-tui summary {quoted}"


def test_a_run_is_resumable_from_a_numbered_save_or_its_stops_save_only() -> None:
    """The stopped alert of a run with no numbered checkpoint said ``eagle3-tui resume``,
    which was refused ("no numbered checkpoint"): a signal's ``interrupted/`` is not
    resumed from; a stop at a step boundary's is (the kill numbers it)."""
    from eagle3_tui.model.run import Run
    from eagle3_tui.model.snapshot import ViewParams, build_snapshot
    from eagle3_tui.watch import verdict_of
    from tests.records import Lines

    def resumable(*extra: bytes) -> bool:
        lines = Lines()
        data = lines.event("start", pid=1, global_step=0)
        data += b"".join(lines.train(s, 1.0) for s in range(5))
        data += b"".join(extra) + lines.event("interrupt", step=5)
        run = Run()
        run.feed(0, data)
        return verdict_of(build_snapshot(run.state, lines.ts, ViewParams()), run.state).resumable

    def one(writer: str) -> Lines:  # each line a writer of its own (its own seq)
        return Lines(writer=writer, t0=2_000_000.0)

    saved = one("sidecar").ckpt("interrupted", "/c/interrupted", complete=True)
    assert not resumable(saved)  # a signal: speculators ignores interrupted/
    stop = one("trainer").event("stop", request="r", pid=1, epoch=0, local_step=5, global_step=5)
    assert resumable(stop, saved)
    numbered = one("sidecar").ckpt("completed", "/c/0", epoch=0, complete=True)
    assert resumable(numbered) and not resumable()


# ---- destinations ---------------------------------------------------------------------


class Hook:
    """A real HTTP server on loopback that records what is posted to it (and what it
    answered, with ``status``; ``statuses`` first, one a post)."""

    def __init__(self, status: int = 200, delay: float = 0.0) -> None:
        self.status, self.delay = status, delay
        self.statuses: list[int] = []
        self.posts: list[tuple[str, dict[str, Any]]] = []
        self.answers: list[int] = []
        self.auth: list[str | None] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                time.sleep(hook.delay)
                status = hook.statuses.pop(0) if hook.statuses else hook.status
                hook.posts.append((self.path, json.loads(body)))
                hook.answers.append(status)
                hook.auth.append(self.headers.get("Authorization"))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def delivered(self) -> list[dict[str, Any]]:
        """The bodies it took (answered 2xx), in the order they came."""
        return [body for (_, body), a in zip(self.posts, self.answers, strict=True) if a < 300]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    yield h
    h.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


ALERT = Alert(
    kind="silent",
    run="gpu-box:runs/exp7",
    host="gpu-box",
    pid=4242,
    health="silent",
    previous="running",
    reason="Working (GPU 98 %) but no metric for 31 min: the logger has no handler.",
    step=None,
    total_steps=45000,
    epoch=1,
    epochs=3,
    command="eagle3-tui attach gpu-box --pid 4242",
    at=1_800_000_000.0,
    id="a1",
)


def test_webhooks_get_the_payload_their_url_expects(hook: Hook) -> None:
    assert webhook_style("https://hooks.slack.com/services/T/B/X") == "slack"
    assert webhook_style("https://discord.com/api/webhooks/1/abc") == "discord"
    assert webhook_style("https://example.org/hook") == "json"
    parse_notify(hook.url).send(ALERT)
    parse_notify(f"slack:{hook.url}").send(ALERT)
    parse_notify(f"discord:{hook.url}").send(ALERT)
    (_, generic), (_, slack), (_, discord) = hook.posts
    assert generic["kind"] == "silent" and generic["pid"] == 4242
    assert generic["command"] == "eagle3-tui attach gpu-box --pid 4242"
    assert slack == {"text": ALERT.text(raised=True)} and "→ eagle3-tui attach" in slack["text"]
    assert discord["content"].startswith("eagle3-tui: SILENT: gpu-box:runs/exp7 (pid 4242)")
    assert discord["allowed_mentions"] == {"parse": []}
    # what a run wrote is text there: no Slack mention or link, no Discord ping
    planted = WebhookNotifier("s", hook.url, "slack").payload(
        Alert(**{**ALERT.__dict__, "reason": "<!channel> see <https://x|here> & @everyone"})
    )
    assert "<!channel>" not in planted["text"] and "&lt;!channel&gt;" in planted["text"]
    with pytest.raises(ValueError, match="not a destination"):
        parse_notify("ftp://x")


def test_a_command_gets_the_alert_on_stdin_and_in_its_environment(tmp_path: Path) -> None:
    out = tmp_path / "got"
    cmd = (
        f'cat > {out}.json; printf "%s|%s" "$EAGLE3_TUI_ALERT_KIND" "$EAGLE3_TUI_ALERT_PID" > {out}'
    )
    parse_notify(f"exec:{cmd}").send(ALERT)
    assert json.loads(Path(f"{out}.json").read_text())["reason"] == ALERT.reason
    assert out.read_text() == "silent|4242"
    with pytest.raises(DeliveryError, match="exit status 3: nope"):
        ExecNotifier("exec:x", "echo nope >&2; exit 3").send(ALERT)


def test_failed_deliveries_are_retried_with_backoff_reported_then_given_up(hook: Hook) -> None:
    now = [1000.0]
    said: list[str] = []
    good = WebhookNotifier(hook.url, hook.url, "json")
    unreachable = WebhookNotifier("dead-url", f"http://127.0.0.1:{closed_port()}/", "json")
    failing = ExecNotifier("exec:false", "exit 1")
    box = Outbox([good, unreachable, failing], said.append, clock=lambda: now[0])
    box.post(ALERT)
    waits = []
    for _ in range(ATTEMPTS):
        due = box.due()
        assert due, box.queue
        for d in due:
            box.attempt(d)
        if box.queue:
            waits.append(min(d.next_at for d in box.queue) - now[0])
            now[0] = min(d.next_at for d in box.queue)
    assert len(hook.posts) == 1  # the good destination once, never again
    assert waits[:4] == [5.0, 10.0, 20.0, 40.0]  # doubling
    assert box.queue == [] and box.given_up == 2 and box.delivered == 1
    assert sum("not delivered (" in line for line in said) == 2 * (ATTEMPTS - 1)
    gave_up = [line for line in said if "given up" in line]
    assert len(gave_up) == 2 and "dead-url: silent of gpu-box:runs/exp7" in gave_up[0]


def test_a_slow_destination_never_holds_the_watching_up() -> None:
    slow = Hook(delay=2.0)
    try:
        box = Outbox([WebhookNotifier(slow.url, slow.url, "json")], lambda line: None)
        box.start()
        t0 = time.monotonic()
        box.post(ALERT)
        posted = time.monotonic() - t0
        assert posted < 0.2, posted
        deadline = time.monotonic() + 20
        while box.delivered == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert box.delivered == 1 and len(slow.posts) == 1
        box.stop()
    finally:
        slow.close()


def alert(kind: str, at: float, **kw: Any) -> Alert:
    return Alert(**{**ALERT.__dict__, "kind": kind, "health": kind, "at": at, **kw})


def test_one_destinations_alerts_arrive_in_the_order_they_were_raised(
    tmp_path: Path, hook: Hook
) -> None:
    """An endpoint down while finished, dead, recovered, stalled were raised, each
    retried on its own backoff: back up, it got "stalled" after "finished". A later
    alert waits while an earlier one to the same endpoint is retried, then goes; one
    given up lets the next go; a restart (the state file) keeps the order."""
    from eagle3_tui.watch import WatchState

    now = [0.0]
    said: list[str] = []
    good = Hook()
    try:
        box = Outbox(
            [WebhookNotifier("down", hook.url, "json"), WebhookNotifier("up", good.url, "json")],
            said.append,
            clock=lambda: now[0],
        )
        hook.status = 503
        kinds = ["finished", "dead", "recovered", "stalled"]
        for t in range(120):
            now[0] = float(t)
            if t % 3 == 0 and t // 3 < len(kinds):
                box.post(alert(kinds[t // 3], float(t), id=f"a{t // 3}"))
            if t == 42:
                hook.status = 200
            while due := box.due():
                for d in due:
                    box.attempt(d)
        assert [b["kind"] for b in hook.delivered()] == kinds  # in order, though late
        assert [b["kind"] for b in good.delivered()] == kinds
        assert box.queue == []
        # the first one given up lets the next go; a restart keeps them in order
        hook.status = 503
        box.post(alert("dead", 200.0, id="b0"))
        box.post(alert("stopped", 201.0, id="b1"))
        for _ in range(ATTEMPTS - 1):
            for d in box.due():
                box.attempt(d)
            now[0] = next(d.next_at for d in box.queue if d.notifier == "down")
        assert [d.alert.id for d in box.queue if d.notifier == "down"] == ["b0", "b1"]
        assert all(d.attempts == 0 for d in box.queue if d.alert.id == "b1")  # it waited
        state = WatchState(tmp_path / "state.json")
        state.save(box.queue)
        back = Outbox(box.notifiers, said.append, clock=lambda: now[0])
        back.queue = WatchState.load(state.path).outbox
        hook.status = 200
        hook.statuses = [503]  # b0's last try fails: given up, and b1 goes at once
        back.try_all()
        assert back.given_up == 1 and back.queue == []
        assert [b["id"] for b in hook.delivered()][-1:] == ["b1"]
        # watch --once tries all at once: one that fails holds the next back
        back.post(alert("dead", 300.0, id="c0"))
        back.post(alert("finished", 301.0, id="c1"))
        hook.statuses = [503]
        back.try_all()
        assert [d.alert.id for d in back.queue] == ["c0", "c1"]
        back.try_all()
        assert [b["id"] for b in hook.delivered()][-2:] == ["c0", "c1"] and back.queue == []
    finally:
        good.close()


def test_each_alert_has_an_id_and_its_raise_time_the_same_on_every_try(
    tmp_path: Path, hook: Hook
) -> None:
    """A slow endpoint got each alert again after each timeout, with nothing to tell a
    repeat: the id is the same on every try, after a restart too (one kept without an
    id gets one made of what it says), and when it was raised is in the body and in a
    chat's text."""
    from eagle3_tui.notify import Delivery
    from eagle3_tui.watch import WatchState

    box = Outbox([WebhookNotifier("j", hook.url, "json")], lambda line: None)
    hook.statuses = [504]
    box.post(ALERT)
    box.try_all()  # 504
    box.try_all()  # delivered
    state = WatchState(tmp_path / "state.json")
    state.save([Delivery(ALERT, "j")])
    data = json.loads(state.path.read_text())
    del data["outbox"][0]["alert"]["id"]  # as an older watcher kept it
    state.path.write_text(json.dumps(data))
    loaded = [WatchState.load(state.path).outbox[0] for _ in range(2)]  # two restarts
    assert loaded[0].alert.id and loaded[0].alert.id == loaded[1].alert.id
    box.queue = [loaded[0]]
    box.try_all()
    bodies = [b for _, b in hook.posts]
    assert [b["id"] for b in bodies[:2]] == ["a1", "a1"]  # a retry: the same id
    assert bodies[2]["id"] == loaded[0].alert.id and len(hook.delivered()) == 2
    assert {b["raised"] for b in bodies} == {"2027-01-15T08:00:00Z"}
    assert {b["at"] for b in bodies} == {ALERT.at}
    slack = WebhookNotifier("s", hook.url, "slack").payload(ALERT)["text"]
    assert slack.endswith("raised 2027-01-15 08:00:00 UTC")
    discord = WebhookNotifier("d", hook.url, "discord").payload(ALERT)["content"]
    assert "raised 2027-01-15 08:00:00 UTC" in discord


# ---- the whole command: --once on a real run, twice, and a state kept ----------------


def watch_once(
    *args: str, env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eagle3_tui", "watch", "--once", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=cwd,
        check=False,
    )


@pytest.mark.parametrize(("make", "status"), [("file", 25), ("missing", 2), ("dir-as-file", 25)])
def test_once_on_a_target_it_cannot_read_exits_as_summary_does(
    tmp_path: Path, make: str, status: int
) -> None:
    """``watch --once`` on a plain file, or a run whose metrics.jsonl is not a file (or
    cannot be read), exited 2 where ``summary`` exits 25 (or 21): the README's table,
    for both."""
    import os

    target = tmp_path / "target"
    if make == "file":
        target.write_text("x")
    elif make == "dir-as-file":
        target.mkdir()
        (target / "metrics.jsonl").mkdir()  # a directory where the file should be
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    done = watch_once(str(target), "--state", str(tmp_path / "w.json"), env=env)
    summary = subprocess.run(
        [sys.executable, "-m", "eagle3_tui", "summary", str(target)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert summary.returncode == status, summary.stderr
    assert done.returncode == status, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and str(target) in done.stdout + done.stderr


def test_once_alerts_a_change_once_and_a_failed_delivery_waits_for_the_next(
    tiny_run: Path, tmp_path: Path, hook: Hook
) -> None:
    import os

    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    state = tmp_path / "watch.json"
    flaky = tmp_path / "fail"
    flaky.write_text("")  # while it exists, the command fails
    command = f"exec:test ! -e {flaky} && cat >> {tmp_path / 'got.jsonl'}"
    args = (str(tiny_run), "--notify", hook.url, "--notify", command, "--state", str(state))
    first = watch_once(*args, env=env)
    assert first.returncode == 0, first.stderr  # finished: all well
    assert "FINISHED" in first.stdout and "eagle3-tui summary" in first.stdout, first.stdout
    assert [p["kind"] for _, p in hook.posts] == ["finished"]
    assert "not delivered (exit status 1)" in first.stderr, first.stderr
    saved = json.loads(state.read_text())
    assert [d["notifier"] for d in saved["outbox"]] == [command]  # kept for the next time
    flaky.unlink()
    second = watch_once(*args, env=env)
    assert second.returncode == 0 and "FINISHED" not in second.stdout  # no repeat
    assert [p["kind"] for _, p in hook.posts] == ["finished"]  # the webhook: still once
    got = [json.loads(line) for line in (tmp_path / "got.jsonl").read_text().splitlines()]
    assert [g["kind"] for g in got] == ["finished"]  # delivered late, not lost
    assert json.loads(state.read_text())["outbox"] == []


def test_a_local_run_is_one_run_however_it_is_spelled(
    tiny_run: Path, tmp_path: Path, hook: Hook
) -> None:
    """``watch r2``, ``watch /tmp/x/r2``, ``watch ./r2/`` with one state file each sent
    the alert again (kept under the target as typed): it is the run's resolved path, in
    the state, the alert's run and its command; a state kept the old way still counts."""
    import os

    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "xdg"))
    cwd, name = tiny_run.parent, tiny_run.name
    state = tmp_path / "watch.json"
    for spelled in (name, str(tiny_run), f"./{name}/", f"../{cwd.name}/{name}"):
        done = watch_once(spelled, "--notify", hook.url, "--state", str(state), env=env, cwd=cwd)
        assert done.returncode == 0, done.stderr
    resolved = str(tiny_run.resolve())
    assert [(b["kind"], b["run"]) for b in hook.delivered()] == [("finished", resolved)]
    assert hook.delivered()[0]["command"] == f"eagle3-tui summary {resolved}"
    assert list(json.loads(state.read_text())["runs"]) == [f"this machine:{resolved}"]
    # a state file an older watcher kept (its key as typed) is read: nothing sent again
    old = tmp_path / "old.json"
    old.write_text(
        json.dumps({"version": 1, "runs": {f"this machine:{name}": {"alerted": "finished"}}})
    )
    done = watch_once(f"./{name}", "--notify", hook.url, "--state", str(old), env=env, cwd=cwd)
    assert done.returncode == 0 and "FINISHED" not in done.stdout, done.stdout
    assert len(hook.delivered()) == 1
    assert list(json.loads(old.read_text())["runs"]) == [f"this machine:{resolved}"]


def test_a_webhooks_password_is_never_printed_and_a_bad_url_refused_at_start(
    tiny_run: Path, tmp_path: Path, hook: Hook
) -> None:
    """``http://user:secret@host/x``: the secret was in the errors on stderr (urllib
    took it for a port); it is sent as Basic authentication and shown ``***``. A URL
    no delivery can reach (no host, a port out of range) was accepted and retried: it
    is refused at the start, with the usage error's status, the value named."""
    import os

    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "xdg"))
    down = f"http://user:s%40cret@127.0.0.1:{closed_port()}/x"
    up = hook.url.replace("http://", "http://user:s%40cret@")
    state = str(tmp_path / "w.json")
    done = watch_once(str(tiny_run), "--notify", down, "--notify", up, "--state", state, env=env)
    assert done.returncode == 0, done.stderr
    assert "not delivered (" in done.stderr and "user:***@127.0.0.1" in done.stderr
    assert "cret" not in done.stderr + done.stdout, done.stderr
    assert hook.delivered() and hook.auth == ["Basic dXNlcjpzQGNyZXQ="]  # user:s@cret
    for url, said in (
        ("http://", "'http://': no host"),
        ("http://127.0.0.1:99999/x", "'http://127.0.0.1:99999/x': Port out of range"),
        ("json:http://[::1/x", "'http://[::1/x': Invalid IPv6 URL"),
        ("http://u:pw@:80/x", "'http://u:***@:80/x': no host"),
    ):
        done = watch_once(str(tiny_run), "--notify", url, "--state", state, env=env)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and said in done.stderr, done.stderr
        assert "pw" not in done.stderr and "FINISHED" not in done.stdout


# ---- following a live run --------------------------------------------------------------


@pytest.mark.slow
def test_a_live_run_whose_loss_turns_nan_is_diverged_once(tmp_path: Path, hook: Hook) -> None:
    """The watcher in this process on a real tiny training with telemetry: its first
    looks are its baseline (waiting, running: nothing sent), its weights made NaN mid-run
    is one ``diverged`` alert, and its end after that (still diverged) one ``ended``
    alert (none when the diverged alert already said it had finished)."""
    import asyncio
    import os

    from eagle3_tui.following import WatchTarget
    from eagle3_tui.telemetry.manifest import launch_env
    from eagle3_tui.transport.target import LocalTarget
    from eagle3_tui.watch import Watcher, WatchState
    from tests.conftest import live_training, read_jsonl, wait_until_async

    run_dir, control = tmp_path / "run", tmp_path / "control"
    args = ("--epochs", "2", "--step-delay", "0.05", "--debug-control", str(control))
    said: list[str] = []

    def kinds() -> list[str]:
        return [p["kind"] for _, p in hook.posts]

    def trained() -> int:
        path = run_dir / "metrics.jsonl"
        return sum(r["kind"] == "train" for r in read_jsonl(path)) if path.exists() else 0

    async def watch(run: Any) -> None:
        target = WatchTarget(str(run_dir), LocalTarget(run_dir), discover=False)
        notifier = WebhookNotifier(hook.url, hook.url, "json")
        state = WatchState(tmp_path / "state.json")
        rules = Rules(hold_s=2.0, gap_s=2.0, link_down_s=60.0)
        w = Watcher([target], [notifier], state, rules=rules, interval_s=0.5, say=said.append)
        stop = asyncio.Event()
        task = asyncio.ensure_future(w.run(stop))
        try:
            await wait_until_async(lambda: trained() >= 5, 180, lambda: f"steps\n{run.log()}")
            await asyncio.sleep(3)  # looked at while it runs: its baseline
            assert kinds() == [], said
            control.write_text("nan 0\n")
            await wait_until_async(lambda: "diverged" in kinds(), 60, lambda: f"{said}")
            alert = hook.posts[-1][1]
            # still training: kill it; it finished diverged by then (a short run): nothing
            # to stop, its summary
            ended = alert["reason"].startswith(("Training finished", "Interrupted"))
            want = "summary" if ended else "kill"
            assert alert["command"] == f"eagle3-tui {want} {run_dir}", alert
            assert "nan" in alert["reason"].lower(), alert["reason"]
            await wait_until_async(lambda: run.proc.poll() is not None, 180, run.log)
            if not ended:  # its end, still diverged: said once
                await wait_until_async(lambda: "ended" in kinds(), 60, lambda: f"{said}")
                end = hook.posts[-1][1]
                assert (end["health"], end["command"]) == (
                    "diverged",
                    f"eagle3-tui summary {run_dir}",
                ), end
            await asyncio.sleep(4)  # looked at again: nothing more to send
        finally:
            stop.set()
            await task
        assert kinds() == (["diverged"] if ended else ["diverged", "ended"]), said

    with live_training(run_dir, args, dict(os.environ, **launch_env(run_dir))) as run:
        asyncio.run(watch(run))


async def test_a_training_found_with_telemetry_is_not_found_again_by_its_pid(
    tmp_path: Path,
) -> None:
    """``watch localhost``: a finished training was alerted twice, as its run directory and
    then as "this machine pid N" (a later listing found the exiting process without its
    telemetry). The same process (PID and start) is its run's, not another training."""
    from eagle3_tui.following import Follower, WatchTarget
    from eagle3_tui.transport.replies import DiscoverReport, ProcessRow
    from eagle3_tui.transport.target import parse_target

    (tmp_path / "metrics.jsonl").write_bytes(Lines(t0=time.time()).train(0, 1.0))
    target = parse_target("localhost")
    follower = Follower([WatchTarget("localhost", target, True)], say=lambda _: None)

    def row(telemetry: bool, start: int = 777) -> ProcessRow:
        return ProcessRow(
            pid=4242, start_ticks=start, mine=True, run_dir=str(tmp_path), telemetry=telemetry
        )

    try:
        await follower.discovered("localhost", target, DiscoverReport(live=[row(True)]))
        assert len(follower.followed) == 1
        await follower.discovered("localhost", target, DiscoverReport(live=[row(False)]))
        assert len(follower.followed) == 1, list(follower.followed)
        reused = row(False, start=778)  # the PID of another process since
        await follower.discovered("localhost", target, DiscoverReport(live=[reused]))
        assert len(follower.followed) == 2, list(follower.followed)
    finally:
        await follower.close()
