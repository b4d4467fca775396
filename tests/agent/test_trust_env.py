"""``resume`` as root checks what the saved environment makes the relaunch load or run.

A new-user review found: ``BASH_ENV`` naming another user's script, with the command
``bash -c true``, ran that script as root, while ``PYTHONPATH`` entries of another user
were refused; ``LD_PRELOAD`` and ``LD_LIBRARY_PATH`` were not looked at. Refusals
repeated one item (each file of a world-writable checkpoint said the checkpoint's
directory again) and called a world-writable run directory "the manifest". These tests
run :func:`trust.resume_problems` on real files, with real owners and modes (the
suite runs as root: a file of uid 65534 is another user's).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from eagle3_tui.agent import trust
from eagle3_tui.telemetry.safefs import user_name

OTHER = 65534  # nobody

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown to another uid)")


def _run(base: Path) -> tuple[Path, Path]:
    """A run directory of root's (0755) with its manifest and a checkpoint of two files,
    below ``base``."""
    run_dir = base / "run"
    ckpt = run_dir / "checkpoints" / "1"
    ckpt.mkdir(parents=True)
    for d in (base, run_dir, run_dir / "checkpoints", ckpt):
        d.chmod(0o755)
    (run_dir / "run.json").write_text("{}")
    for name in ("model.safetensors", "optimizer_state_dict.pt", "scheduler.pt"):
        (ckpt / name).write_text("x")
    return run_dir, ckpt


def _problems(run_dir: Path, ckpt: Path, env: dict[str, str], cwd: Path | None = None) -> list[str]:
    env = {"PATH": "/usr/bin:/bin", **env}
    cmd = ["/bin/bash", "-c", "true"]
    return trust.resume_problems(run_dir, {}, cmd, str(cwd or run_dir), env, ckpt)


@pytest.fixture
def base(tmp_path: Path) -> Path:
    tmp_path.chmod(0o755)
    return tmp_path


def _theirs(path: Path, directory: bool = False) -> Path:
    """``path`` made and given to the other user."""
    if directory:
        path.mkdir(parents=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("echo pwned\n")
    os.chown(path, OTHER, OTHER)
    return path


def test_a_clean_run_has_no_problem(base: Path) -> None:
    run_dir, ckpt = _run(base)
    lib = base / "lib"
    lib.mkdir(mode=0o755)
    (lib / "libok.so").write_text("x")
    env = {
        "LD_LIBRARY_PATH": f"{lib}::/nonexistent/lib",
        "LD_PRELOAD": "libok.so libc.so.6",
        "BASH_ENV": str(lib / "libok.so"),
        "PYTHONPYCACHEPREFIX": str(base / "pycache-to-be"),
    }
    assert _problems(run_dir, ckpt, env) == []


@pytest.mark.parametrize(
    ("var", "value", "directory"),
    [
        ("BASH_ENV", "{p}", False),
        ("ENV", "{p}", False),
        ("PYTHONSTARTUP", "{p}", False),
        ("PYTHONEXECUTABLE", "{p}", False),
        ("LD_PRELOAD", "{p}", False),
        ("LD_PRELOAD", "/lib/x86_64-linux-gnu/libc.so.6 {p}", False),  # space-separated
        ("LD_PRELOAD", "libc.so.6:{p}", False),  # colon-separated
        ("LD_AUDIT", "{p}", False),
        ("LD_LIBRARY_PATH", "/usr/lib:{p}", True),
        ("LD_LIBRARY_PATH", "/usr/lib;{p}", True),
        ("GCONV_PATH", "{p}", True),
        ("PATH", "{p}:/usr/bin:/bin", True),
        ("PYTHONHOME", "{p}", True),
        ("PYTHONUSERBASE", "{p}", True),
        ("PYTHONPYCACHEPREFIX", "{p}", True),
        ("PYTHONPATH", "{p}", True),  # refused before, and still
    ],
)
def test_a_variable_naming_another_users_file_is_refused(
    base: Path, var: str, value: str, directory: bool
) -> None:
    run_dir, ckpt = _run(base)
    theirs = _theirs(base / "x" / ("d" if directory else "evil.sh"), directory)
    problems = _problems(run_dir, ckpt, {var: value.format(p=theirs)})
    want = f"{var}: {theirs} belongs to {user_name(OTHER)}, not to root"
    assert want in problems, problems


def test_bash_env_of_the_review_is_refused(base: Path) -> None:
    """The review's case: ``BASH_ENV=/tmp/x/evil.sh`` of another user, ``bash -c true``."""
    run_dir, ckpt = _run(base)
    evil = _theirs(base / "x" / "evil.sh")
    problems = _problems(run_dir, ckpt, {"BASH_ENV": str(evil)})
    assert problems == [f"BASH_ENV: {evil} belongs to {user_name(OTHER)}, not to root"]


def test_a_relative_path_is_resolved_against_the_working_directory(base: Path) -> None:
    run_dir, ckpt = _run(base)
    evil = _theirs(run_dir / "libs" / "evil.so")
    problems = _problems(run_dir, ckpt, {"LD_PRELOAD": "libs/evil.so"}, cwd=run_dir)
    assert problems == [f"LD_PRELOAD: {evil} belongs to {user_name(OTHER)}, not to root"]


def test_a_bare_preload_name_is_the_file_on_ld_library_path(base: Path) -> None:
    run_dir, ckpt = _run(base)
    lib = base / "lib"
    lib.mkdir(mode=0o755)
    evil = _theirs(lib / "libevil.so")
    env = {"LD_LIBRARY_PATH": str(lib), "LD_PRELOAD": "libevil.so"}
    problems = _problems(run_dir, ckpt, env)
    assert problems == [f"LD_PRELOAD: {evil} belongs to {user_name(OTHER)}, not to root"]


def test_a_world_writable_cache_is_refused(base: Path) -> None:
    run_dir, ckpt = _run(base)
    cache = base / "pycache"
    cache.mkdir()
    cache.chmod(0o777)
    problems = _problems(run_dir, ckpt, {"PYTHONPYCACHEPREFIX": str(cache)})
    assert problems == [f"PYTHONPYCACHEPREFIX: {cache} is writable by every user"]


def test_a_missing_entry_anybody_may_create_is_refused(base: Path) -> None:
    """``/tmp``-like: sticky, so nobody replaces another's entry, but the first to make a
    missing one owns it."""
    run_dir, ckpt = _run(base)
    shared = base / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    missing = shared / "evil.so"
    problems = _problems(run_dir, ckpt, {"LD_PRELOAD": str(missing)})
    assert problems == [
        f"LD_PRELOAD: {missing} does not exist, and every user may create it in {shared}"
    ]


def test_a_value_the_shell_expands_is_refused(base: Path) -> None:
    run_dir, ckpt = _run(base)
    problems = _problems(run_dir, ckpt, {"BASH_ENV": "$(id>/tmp/p)"})
    assert problems == ["BASH_ENV: $(id>/tmp/p) is expanded when used, so it cannot be checked"]


def test_each_problem_is_said_once(base: Path) -> None:
    """A world-writable checkpoint directory: one item, not one per file in it."""
    run_dir, ckpt = _run(base)
    ckpt.chmod(0o777)
    problems = _problems(run_dir, ckpt, {})
    assert problems == [f"the checkpoint: {ckpt} is writable by every user"]


def test_a_directory_above_is_said_once_and_named_for_what_it_is(base: Path) -> None:
    run_dir, ckpt = _run(base)
    (run_dir / "checkpoints").chmod(0o777)
    problems = _problems(run_dir, ckpt, {})
    assert problems == [
        f"the checkpoint {ckpt}: {run_dir / 'checkpoints'} is writable by every user"
    ]


def test_a_world_writable_run_directory_is_not_called_the_manifest(base: Path) -> None:
    run_dir, ckpt = _run(base)
    run_dir.chmod(0o777)
    problems = _problems(run_dir, ckpt, {})
    assert problems == [f"the run directory: {run_dir} is writable by every user"]
    assert not any(p.startswith("the manifest") for p in problems)


def test_a_world_writable_parent_is_named_with_the_path_it_is_above(base: Path) -> None:
    parent = base / "above"
    parent.mkdir()
    run_dir, ckpt = _run(parent)
    parent.chmod(0o777)
    problems = _problems(run_dir, ckpt, {})
    assert problems == [f"the run directory {run_dir}: {parent} is writable by every user"]
