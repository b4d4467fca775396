"""``scripts/install.sh`` never downloads a CUDA torch unasked (issue 28, item 1): where
the package index offers torch 2.13.0 as its CUDA build (it needs nvidia-* packages),
it says so, how to get the CPU build, and stops before anything is installed; and it
says how to run what it installed."""

from __future__ import annotations

import os
import subprocess
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A minimal pure-Python wheel (metadata only)."""
    dist = f"{name.replace('-', '_')}-{version}"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    tag = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as z:
        z.writestr(f"{dist}.dist-info/METADATA", meta)
        z.writestr(f"{dist}.dist-info/WHEEL", tag)
        z.writestr(f"{dist}.dist-info/RECORD", "")


def test_a_cuda_torch_is_refused_with_the_way_to_the_cpu_build(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "torch", "2.13.0", ("nvidia-cublas-cu12", "triton"))
    _wheel(wheels, "nvidia-cublas-cu12", "12.8.4")
    _wheel(wheels, "triton", "3.5.0")
    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    env = dict(
        os.environ,
        PYTHON=python,
        PIP_CONFIG_FILE=os.devnull,  # only the wheels above: an index that offers CUDA
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(wheels),
    )
    proc = subprocess.run(
        ["./scripts/install.sh", "--test"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    err = proc.stderr
    assert "CUDA build" in err and "nvidia-cublas-cu12" in err and "triton" in err, err
    assert "PIP_EXTRA_INDEX_URL=" in err and "--allow-cuda" in err, err
    installed = subprocess.run(
        [python, "-c", "import importlib.util as u; print(u.find_spec('torch') is None)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert installed.stdout.strip() == "True"  # nothing downloaded
