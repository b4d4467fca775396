"""pyproject.toml lists every package folder (packages are listed, not found)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_folder_is_listed() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "eagle3_tui").rglob("__init__.py")
    }
    found |= {
        "eagle3_tui.train." + ".".join(p.parent.relative_to(ROOT / "train").parts)
        for p in (ROOT / "train").rglob("__init__.py")
        if p.parent != ROOT / "train"
    }
    found.add("eagle3_tui.train")
    assert found == listed
    assert config["package-dir"]["eagle3_tui.train"] == "train"


def test_the_client_install_does_not_pull_torch_or_speculators() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {
        d.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower() for d in deps
    }
    assert not names & {"torch", "speculators", "transformers", "nvidia-ml-py", "pynvml"}


def test_the_wheel_carries_the_stylesheet_the_agent_and_the_launchers(tmp_path: Path) -> None:
    """What `pip install .` on a laptop or a training host gets (not the editable tree)."""
    import subprocess
    import sys
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
        "eagle3_tui/cli.py",
    ):
        assert needed in names, needed
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)
