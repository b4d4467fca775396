"""What an install gets: the packages (train/ among them, as eagle3_tui.train), no
torch on a client, the stylesheet, the agent and the launchers in the wheel."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parent.parent


def test_train_is_the_package_eagle3_tui_train() -> None:
    """The link that makes the design card's top-level train/ the package of its name."""
    link = ROOT / "eagle3_tui" / "train"
    assert link.is_symlink() and os.readlink(link) == "../train"
    assert link.resolve() == (ROOT / "train").resolve()
    found = set(find_packages(str(ROOT), include=["eagle3_tui", "eagle3_tui.*"]))
    folders = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "eagle3_tui").rglob("__init__.py")
    }
    assert "eagle3_tui.train" in found and found == folders | {"eagle3_tui.train"}


def test_a_checkout_runs_the_launchers_by_their_documented_name(tmp_path: Path) -> None:
    """`python -m eagle3_tui.train.tee` from the checkout's root with nothing installed
    in sight: -S (no site-packages, so no editable install's finder), -E (no PYTHONPATH)."""
    out = tmp_path / "copy"
    proc = subprocess.run(
        [sys.executable, "-S", "-E", "-m", "eagle3_tui.train.tee", str(out)],
        cwd=ROOT,
        input="a line\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "a line\n" and out.read_text() == "a line\n"


def test_the_client_install_does_not_pull_torch_or_speculators() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {
        d.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower() for d in deps
    }
    assert not names & {"torch", "speculators", "transformers", "nvidia-ml-py", "pynvml"}


def test_the_wheel_carries_the_stylesheet_the_agent_and_the_launchers(tmp_path: Path) -> None:
    """What `pip install .` on a laptop or a training host gets (not the editable tree)."""
    import zipfile

    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("eagle3_tui-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "eagle3_tui/app/app.tcss",
        "eagle3_tui/py.typed",
        "eagle3_tui/agent/main.py",
        "eagle3_tui/train/tiny.py",
        "eagle3_tui/train/launch.py",
        "eagle3_tui/cli/__init__.py",
        "eagle3_tui/cli/summary.py",
        "eagle3_tui/api/__init__.py",
        "eagle3_tui/exits.py",
    ):
        assert needed in names, needed
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)
