"""Kill only what was named (issue 26): ``eagle3-tui kill /tmp/x`` stopped a training
whose run directory was ``/tmp/x/run3`` and whose working directory was elsewhere. A
directory names a training only when it is its run, working, log or checkpoint
directory; a directory above them is refused (exit 24, one line listing the
candidates), nothing signalled; the exact directories still name it.

The training is a user's handler-less script (the real tiny speculators Trainer),
launched as in the story: ``cd base/hl/work; nohup python train.py --run-dir out … >
base/hl/logs/train.log 2>&1``; its checkpoints go to ``base/hl/work/out/checkpoints``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from textual.containers import VerticalScroll

from eagle3_tui.agent import discover
from eagle3_tui.app.run_control import RunControl
from eagle3_tui.exits import NOT_NAMED as EXIT_NOT_NAMED
from eagle3_tui.telemetry import procs
from eagle3_tui.transport.channel import LocalHost
from eagle3_tui.transport.replies import ProcessRow, decode
from tests.app.conftest import open_dialog, text_of
from tests.app.test_pilot import app_with
from tests.conftest import need_training, until, wait_until
from tests.transport.test_post_mortem import BARE, EAGLE3_TUI, SCRIPT, cli, ending, launch

pytestmark = pytest.mark.slow


def kill(target: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [EAGLE3_TUI, "kill", str(target), "--grace", "60"],
        capture_output=True,
        text=True,
        timeout=400,  # attach, a step boundary (60 s at most), the grace: bounds, not times
        check=False,
    )


def test_an_ancestor_directory_is_refused_and_the_exact_ones_name_the_training(
    tmp_path: Path,
) -> None:
    base = tmp_path / "x"
    work, logs = base / "hl" / "work", base / "hl" / "logs"
    logs.mkdir(parents=True)
    checkpoints = work / "out" / "checkpoints"
    args = [*BARE, "--rows", "20", "--epochs", "50", "--step-delay", "0.2"]
    with ending(launch(work, SCRIPT, *args, log=logs / "train.log")) as proc:
        wait_until(
            lambda: (checkpoints / "0").is_dir(),
            240,
            lambda: f"its first checkpoint; log:\n{(logs / 'train.log').read_text()[-1500:]}",
            0.2,
        )
        st = procs.stat(proc.pid)
        assert st is not None
        # above its own directories: refused, the candidate and its directories listed
        for above in (base, base / "hl"):
            done = kill(above)
            assert done.returncode == EXIT_NOT_NAMED == 24, (above, done.stdout, done.stderr)
            [line] = done.stderr.splitlines()
            assert f"{above} names no training" in line and f"pid {proc.pid} " in line, line
            for what, path in (
                ("working directory", work),
                ("log directory", logs),
                ("checkpoint directory", checkpoints),
            ):
                assert f"{what} {path}" in line, line
            assert done.stdout == ""
            assert procs.alive(proc.pid, st.start_ticks), "signalled"
        assert not (checkpoints / "interrupted").exists()
        # each of its own directories names it (its --run-dir too)
        for own in (work, logs, checkpoints, work / "out"):
            rc, out, err = cli("summary", str(own))
            assert out["observed"]["pid"] == proc.pid, (own, rc, err)
            assert f"the live training in {own}: pid {proc.pid}" in err
        done = kill(logs)
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert done.stdout.startswith("stopped: all "), done.stdout
        assert proc.wait(60) is not None


DIST = textwrap.dedent(
    """
    import multiprocessing, os, sys, time
    import torch

    def train():
        import speculators  # (the real work would start here)

    if __name__ == "__main__":
        ctx = multiprocessing.get_context("fork")
        helpers = [ctx.Process(target=time.sleep, args=(120,)) for _ in range(3)]
        for h in helpers:
            h.start()
        open(sys.argv[1] + os.environ["RANK"], "w").write("ready")
        time.sleep(120)
    """
)


@pytest.fixture
def torchrun_training(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], ProcessRow]]:
    """``torchrun --nproc_per_node 2 dist.py`` (each rank with 3 children), as discovery
    finds it; killed on leaving."""
    need_training()
    (tmp_path / "dist.py").write_text(DIST)
    ready = tmp_path / "ready-"
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    launcher = subprocess.Popen(
        [*argv, "--master_port", "0", "dist.py", str(ready)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(
            lambda: (
                all(Path(f"{ready}{r}").exists() for r in (0, 1)) or launcher.poll() is not None
            ),
            120,
            lambda: "torchrun's ranks",
            0.2,
        )
        assert launcher.poll() is None, "torchrun failed"
        [found] = [t for t in discover.scan()[0] if t.cwd == str(tmp_path)]
        yield launcher, decode(ProcessRow, discover._rows([found])[0])
    finally:
        os.killpg(launcher.pid, 9)
        launcher.wait()


async def test_the_kill_dialog_lists_each_process_labelled_and_its_rows_scroll(
    torchrun_training: tuple[subprocess.Popen[bytes], ProcessRow],
) -> None:
    """``k`` on a torchrun training without telemetry (2 ranks, 3 children each): every
    process the kill acts on, one row each, labelled as the README does (``rank 1``,
    ``worker, rank 0``, ``torchrun agent``), the ranks first (the first SIGTERM goes to
    them); at 80x24 the rows scroll. ``n`` signals nothing."""
    launcher, row = torchrun_training
    ranks = {r.rank: r.pid for r in row.ranks}
    control = RunControl(LocalHost(), None, "here", process=row)
    app, _ = app_with(control=control)
    async with app.run_test(size=(80, 24)) as pilot:
        dialog = await open_dialog(app, pilot, "k")
        plan = text_of(dialog.query_one("#plan"))
        assert "9 process(es) of the run now:" in plan, plan
        pids = ", ".join(str(pid) for pid in sorted(ranks.values()))
        assert f"SIGTERM each rank at once (pids {pids}) not the torchrun agent " in plan, plan
        for rank, pid in ranks.items():
            assert f"SIGTERM  pid {pid:<8} rank {rank} " in plan, plan
            helpers = procs.children(pid)
            assert len(helpers) == 3
            for helper in helpers:
                assert f"then     pid {helper:<8} worker, rank {rank} " in plan, plan
        assert f"then     pid {launcher.pid:<8} torchrun agent " in plan, plan
        body = dialog.query_one("#control-body", VerticalScroll)
        # more rows than the dialog shows (once laid out: a loaded machine lags a frame)
        await until(pilot, lambda: body.max_scroll_y > 0, what="rows to scroll")
        body.scroll_end(animate=False)
        await until(pilot, lambda: body.scroll_y == body.max_scroll_y, what="scrolled")
        await pilot.press("n")
    for pid in [launcher.pid, *ranks.values()]:
        assert procs.alive(pid), "signalled"
