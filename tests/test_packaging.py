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
