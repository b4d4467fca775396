"""transport/forked.py: a long local read made in a forked child gives what a read in
one process gives, whether the child ends, fails mid-way or is left early. Each case
runs in a process of its own with one thread, as the command line does (a pytest
worker has threads of its own: there the read stays in one process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.transport.test_accounted import write_run

READ = """
import json, os, sys
from pathlib import Path
import eagle3_tui.transport.forked as forked
from eagle3_tui.agent import column_plan
from eagle3_tui.agent.names import SUMMARY_HISTORY
from eagle3_tui.model.run import Run
from eagle3_tui.model.summary import summarize
from eagle3_tui.transport.local import iter_frames

path, case = Path(sys.argv[1]), sys.argv[2]
forked.FORK_MIN = 0
column_plan.GROUP_ROWS = 2048  # two blocks a frame: a 12,000-step run is several frames
parent = os.getpid()
forks = []
real_fork = os.fork
def fork():
    pid = real_fork()
    if pid:
        forks.append(pid)
    return pid
os.fork = fork
if case == "fails":  # the child fails after its third part
    real_parts = forked.columnar_parts
    def parts(*args):
        for i, part in enumerate(real_parts(*args)):
            if os.getpid() != parent and i == 3:
                raise OSError("a read failed")
            yield part
    forked.columnar_parts = parts

piped = []  # what came through the pipe: a payload's length, or None (a range read here)
real_received = forked._received
def received(pipe):
    for part in real_received(pipe):
        if part is not None:
            piped.append(None if part[1] is None else len(part[1]))
        yield part
forked._received = received

def state(frames, inflated=None):
    run = Run()
    n = 0
    for frame in frames:
        ahead = None if inflated is None else inflated[n]
        run.feed(frame.offset, frame.data, 0, frame.span, ahead)
        assert not ahead, "every column the child inflated is used"
        n += 1
    s = summarize(run.state, 2e9)
    return n, {k: s[k] for k in ("step", "loss", "records", "malformed_lines", "lost_records",
                                 "duplicate_records", "checkpoint", "anomalies", "ttt")}

out = {}
if case.startswith("started "):  # a read started before the imports (summary DIR)
    started = []
    def checked():  # at exit, after the reads' own handler (atexit: last in, first out)
        reaped = True
        for pid in started:
            try:
                os.waitpid(pid, os.WNOHANG)
                reaped = False  # still this process's: running, or ended and not reaped
            except ChildProcessError:
                pass
        print(json.dumps({"reaped": reaped, "started": started}))
    import atexit
    atexit.register(checked)
    forked.start_early(path, SUMMARY_HISTORY)
    started += forks
    how = case.split()[1]
    if how == "unread":
        raise SystemExit(0)
    if how == "replaced":  # the path names another file by the time it is read
        copy = path.with_name("copy")
        copy.write_bytes(path.read_bytes())
        os.replace(copy, path)
    ours = [f for f, _ in forked.read_inflated(path, SUMMARY_HISTORY)]
    out["left"] = [pid for pid in started if os.path.exists(f"/proc/{pid}")]
    out["frames"] = [[f.offset, f.span, len(f.data)] for f in ours]
    out["state"] = state(ours)
    alone = list(iter_frames(path, SUMMARY_HISTORY))
    out["alone_frames"] = [[f.offset, f.span, len(f.data)] for f in alone]
    out["alone_state"] = state(alone)
elif case == "cli":  # eagle3-tui summary DIR, in this process
    import contextlib, io
    from eagle3_tui.cli import main
    real_take = forked._take_early
    def take(p, h):
        child = real_take(p, h)
        out["taken"] = child is not None
        return child
    forked._take_early = take
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        main(["summary", "--json", str(path.parent)])
    out["step"] = json.loads(printed.getvalue())["step"]
elif case == "early":
    frames = forked.read_inflated(path, SUMMARY_HISTORY)
    out["first"] = [next(frames)[0].offset, next(frames)[0].offset]
    frames.close()
    try:
        out["left"] = os.waitpid(-1, os.WNOHANG)[0]
    except ChildProcessError:
        out["left"] = None
else:
    forked.INFLATE_AHEAD_OF = 0 if case == "inflates" else forked.INFLATE_AHEAD_OF
    pairs = list(forked.read_inflated(path, SUMMARY_HISTORY))
    ours = [f for f, _ in pairs]
    out["inflated"] = sum(1 for _, ahead in pairs if ahead)
    out["frames"] = [[f.offset, f.span, len(f.data)] for f in ours]
    out["state"] = state(ours, [ahead for _, ahead in pairs])
    alone = list(iter_frames(path, SUMMARY_HISTORY))
    out["alone_frames"] = [[f.offset, f.span, len(f.data)] for f in alone]
    out["same_bytes"] = [f.data for f in ours] == [f.data for f in alone]
    out["alone_state"] = state(alone)
out["forks"] = len(forks)
out["piped"] = piped
print(json.dumps(out), flush=True)
"""


def _read(path: Path, case: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", READ, str(path), case],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out: dict[str, Any] = {}
    for line in done.stdout.splitlines():  # the read's, then what was left at exit
        out.update(json.loads(line))
    return out


def _run(tmp_path: Path) -> Path:
    path = tmp_path / "metrics.jsonl"
    write_run(path, 12_000, every=1)
    assert (tmp_path / "metrics.cols").exists()
    return path


def test_columns_the_child_inflates_leave_the_state_of_the_read_made_alone(
    tmp_path: Path,
) -> None:
    """The child inflates each payload's columns (here always: in a real read, while
    the parent has frames to apply) and the parent applies them as they come."""
    out = _read(_run(tmp_path), "inflates")
    spans = sum(1 for _, span, _ in out["frames"] if span >= 0)
    assert spans >= 5 and out["inflated"] == spans, "each payload came inflated"
    assert out["frames"] == out["alone_frames"] and out["same_bytes"]
    assert out["state"] == out["alone_state"]


def test_a_read_made_in_a_child_is_the_read_made_alone(tmp_path: Path) -> None:
    out = _read(_run(tmp_path), "ends")
    assert out["forks"] == 1
    assert sum(1 for _, span, _ in out["frames"] if span >= 0) >= 5, "columns frames"
    assert out["frames"] == out["alone_frames"] and out["same_bytes"]
    assert out["state"] == out["alone_state"]
    assert sum(1 for n in out["piped"] if n is not None) >= 5, "payloads through the pipe"
    assert out["state"][1]["records"] > 40_000 and out["state"][1]["step"] == 12_000


def test_a_copied_run_whose_companion_names_another_file_goes_through_no_pipe(
    tmp_path: Path,
) -> None:
    """A copy's companion names the original file (its device and inode): nothing of
    it is columns, and the child sends one range, read here (through the pipe, 2.5 GB
    of lines took 2 s more than without a child)."""
    import shutil

    (tmp_path / "a").mkdir()
    path = _run(tmp_path / "a")
    copy = tmp_path / "b"
    copy.mkdir()
    shutil.copyfile(path, copy / "metrics.jsonl")
    shutil.copyfile(path.with_name("metrics.cols"), copy / "metrics.cols")
    out = _read(copy / "metrics.jsonl", "ends")
    assert out["forks"] == 1
    assert out["piped"] == [None], "one range of lines, read by the parent"
    assert all(span < 0 for _, span, _ in out["frames"])
    assert out["frames"] == out["alone_frames"] and out["same_bytes"]
    assert out["state"] == out["alone_state"]


def test_a_child_that_fails_mid_way_leaves_the_rest_of_the_read_to_its_parent(
    tmp_path: Path,
) -> None:
    """Its frames up to the failure count; the rest is read (and planned) from there,
    in the parent: the same run, nothing lost or counted twice."""
    out = _read(_run(tmp_path), "fails")
    assert out["forks"] == 1
    assert out["frames"] != out["alone_frames"], "the rest read again from its place"
    places = [f[:2] for f in out["frames"]]  # (a sample block's number may differ)
    assert places[:3] == [f[:2] for f in out["alone_frames"][:3]]
    state = out["state"][1]
    assert state == out["alone_state"][1]
    assert state["lost_records"] == 0 and state["duplicate_records"] == 0


def test_a_read_started_before_its_imports_is_taken_up_by_the_read(tmp_path: Path) -> None:
    """``summary DIR`` starts the child before it imports the model: the read takes
    that child (no second fork) and gets what a read alone gets."""
    out = _read(_run(tmp_path), "started read")
    assert out["forks"] == 1 and len(out["started"]) == 1, "one child, started early"
    assert sum(1 for n in out["piped"] if n is not None) >= 5, "its payloads were read"
    assert out["frames"] == out["alone_frames"] and out["state"] == out["alone_state"]
    assert out["left"] == [] and out["reaped"]


def test_summary_of_a_local_run_starts_its_read_before_its_imports(tmp_path: Path) -> None:
    out = _read(_run(tmp_path), "cli")
    assert out["forks"] == 1 and out["taken"], "the read took the child started first"
    assert out["step"] == 12_000


def test_a_read_started_early_and_never_made_leaves_no_child(tmp_path: Path) -> None:
    """The command decided otherwise (the target was a host after all): the child is
    killed and reaped as the process exits."""
    out = _read(_run(tmp_path), "started unread")
    assert len(out["started"]) == 1
    assert out["reaped"], "the child outlived its parent's exit handlers"


def test_a_read_started_early_of_a_file_since_replaced_reads_the_new_one(
    tmp_path: Path,
) -> None:
    """The path names another file when the read comes: the early child (of the old
    one) is ended, and the new file is read as it is (here a copy: its companion names
    the old file, so all of it is lines)."""
    out = _read(_run(tmp_path), "started replaced")
    assert out["forks"] == 2, "the early child is not used for another file"
    assert all(span < 0 for _, span, _ in out["frames"])
    assert out["frames"] == out["alone_frames"] and out["state"] == out["alone_state"]
    assert out["left"] == [] and out["reaped"]


def test_a_read_left_early_leaves_no_child_behind(tmp_path: Path) -> None:
    out = _read(_run(tmp_path), "early")
    assert out["forks"] == 1
    assert out["first"][0] == 0 and out["first"][1] > 0
    assert out["left"] is None, "the child was killed and reaped"


def test_a_small_file_or_a_process_with_threads_reads_in_one_process(tmp_path: Path) -> None:
    """No child where it would not pay (a file under FORK_MIN) or not be safe (another
    thread, as in this pytest worker, could hold a lock the child would need)."""
    import threading

    from eagle3_tui.transport import forked

    path = _run(tmp_path)
    assert not forked._worth_a_child(path)  # under FORK_MIN
    small = forked.FORK_MIN
    try:
        forked.FORK_MIN = 0
        others = threading.active_count() > 1
        if not others:  # a thread of our own, alive while it is asked
            stop = threading.Event()
            t = threading.Thread(target=stop.wait)
            t.start()
        try:
            assert not forked._worth_a_child(path)
        finally:
            if not others:
                stop.set()
                t.join()
    finally:
        forked.FORK_MIN = small
