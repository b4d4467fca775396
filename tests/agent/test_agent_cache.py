"""The agent's code cache on the host (transport/bundle.py), with real agent processes.

Each call runs ``python3 -c BOOTSTRAP`` as the client does, with ``XDG_CACHE_HOME``
pointing at the test's directory. That a call used the cache is seen from outside: a
planted cache file whose ``main`` answers differently changes the answer when, and
only when, it is trusted.
"""

from __future__ import annotations

import json
import marshal
import os
import pwd
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.agent import BOOTSTRAP
from eagle3_tui.agent.names import PROTOCOL
from eagle3_tui.transport.bundle import (
    CACHE_MAGIC,
    LEAN_MISS,
    LEAN_MISS_STATUS,
    agent_sources,
    bundle,
    lean_bundle,
    make_bundle,
)
from eagle3_tui.transport.channel import AGENT_TAG, agent_payload
from tests.conftest import interpreters, need
from tests.sources import parse

MISSING = {"op": "status", "run_dir": "/nonexistent/eagle3-tui-test-run"}
REAL_ANSWER = (
    b'J {"event":"error","kind":"missing",'
    b'"message":"/nonexistent/eagle3-tui-test-run: no such run directory"}\n'
)
PLANTED_MAIN = (
    "import sys\n"
    "def main():\n"
    '    sys.stdout.write(\'J {"event":"result","planted":true}\\n\')\n'
    "    sys.exit(0)\n"
)
PLANTED_ANSWER = b'J {"event":"result","planted":true}\n'
MAIN = "eagle3_tui.agent.main"
MAIN_PATH = "<eagle3-tui-agent>/eagle3_tui/agent/main.py"


def call(
    cache_home: Path | str,
    request: dict[str, Any] = MISSING,
    exe: str = sys.executable,
    payload: bytes | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """One agent process, as the client starts it (its stdin: the bundle, the request)."""
    if payload is None:
        payload = agent_payload(request)
    environ = dict(os.environ if env is None else env, XDG_CACHE_HOME=str(cache_home))
    return subprocess.run(
        [os.path.abspath(exe), "-c", BOOTSTRAP, AGENT_TAG],
        input=payload,
        capture_output=True,
        timeout=120,
        env=environ,
        cwd=cwd,
        check=False,
    )


def answers_really(proc: subprocess.CompletedProcess[bytes]) -> None:
    """The bundle's own answer, and nothing else on stdout or stderr."""
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, REAL_ANSWER, b"")


def cache_files(cache_home: Path) -> list[Path]:
    return sorted((cache_home / "eagle3-tui").glob("agent-*.marshal"))


def read_cache(path: Path) -> tuple[str, str, dict[str, bytes]]:
    data = path.read_bytes()
    body = data[len(CACHE_MAGIC) + 4 :]
    assert data[: len(CACHE_MAGIC) + 4] == CACHE_MAGIC + zlib.crc32(body).to_bytes(4, "big")
    key, tag, codes = marshal.loads(body)
    return key, tag, codes


def cache_bytes(body: bytes) -> bytes:
    return CACHE_MAGIC + zlib.crc32(body).to_bytes(4, "big") + body


def write_cache(path: Path, key: str, tag: str, codes: dict[str, bytes]) -> None:
    path.write_bytes(cache_bytes(marshal.dumps((key, tag, codes))))
    path.chmod(0o600)


def plant(path: Path, filename: str = MAIN_PATH) -> None:
    """Rewrite a valid cache file so that its ``main`` answers PLANTED_ANSWER."""
    key, tag, codes = read_cache(path)
    codes[MAIN] = marshal.dumps(compile(PLANTED_MAIN, filename, "exec"))
    write_cache(path, key, tag, codes)


def warmed(tmp_path: Path) -> tuple[Path, Path]:
    """A cache directory after one call: (XDG_CACHE_HOME, the cache file)."""
    home = tmp_path / "cache"
    answers_really(call(home))
    files = cache_files(home)
    assert len(files) == 1, files
    return home, files[0]


def test_the_first_call_writes_the_cache_and_the_next_uses_it(tmp_path: Path) -> None:
    home, path = warmed(tmp_path)
    tag = sys.implementation.cache_tag
    assert path.name.startswith("agent-") and path.name.endswith(f"-{tag}.marshal")
    assert (path.stat().st_mode & 0o777, (home / "eagle3-tui").stat().st_mode & 0o777) == (
        0o600,
        0o700,
    )
    key, got_tag, codes = read_cache(path)
    assert path.name == f"agent-{key}-{tag}.marshal" and got_tag == tag
    assert set(codes) == set(agent_sources())  # every module, compiled once
    plant(path)
    planted = call(home)
    assert (planted.returncode, planted.stdout, planted.stderr) == (0, PLANTED_ANSWER, b"")


def test_a_traceback_names_the_module_from_the_cache_as_from_the_sources(
    tmp_path: Path,
) -> None:
    home = tmp_path / "cache"
    bad = {"op": "status", "run_dir": 5}  # a TypeError deep in the agent: a traceback
    cold, warm = call(home, bad), call(home, bad)
    assert cache_files(home)
    for proc in (cold, warm):
        assert proc.returncode == 1 and proc.stdout == b""
        assert b'File "<eagle3-tui-agent>/eagle3_tui/agent/runs.py", line ' in proc.stderr


def _group_writable(path: Path, where: Path) -> None:
    path.chmod(0o620)


def _other_writable(path: Path, where: Path) -> None:
    path.chmod(0o602)


def _a_link(path: Path, where: Path) -> None:
    target = where.parent / "elsewhere.marshal"
    path.rename(target)
    path.symlink_to(target)


def _owned_by_nobody(path: Path, where: Path) -> None:
    need(os.geteuid() == 0, "chown to another user needs root")
    nobody = pwd.getpwnam("nobody")
    os.chown(path, nobody.pw_uid, nobody.pw_gid)


@pytest.mark.parametrize(
    "spoil", [_group_writable, _other_writable, _a_link, _owned_by_nobody], ids=lambda f: f.__name__
)
def test_a_cache_file_others_could_have_written_is_ignored_and_replaced(
    tmp_path: Path, spoil: Any
) -> None:
    home, path = warmed(tmp_path)
    plant(path)
    spoil(path, home / "eagle3-tui")
    answers_really(call(home))
    st = os.lstat(path)  # replaced by the agent's own: a file, ours, private, the real code
    assert (st.st_uid, st.st_mode & 0o777, path.is_symlink()) == (os.geteuid(), 0o600, False)
    answers_really(call(home))


@pytest.mark.parametrize("how", ["group-writable", "owned by nobody"])
def test_a_cache_directory_others_could_write_is_neither_read_nor_written(
    tmp_path: Path, how: str
) -> None:
    home, path = warmed(tmp_path)
    plant(path)
    planted = path.read_bytes()
    where = home / "eagle3-tui"
    if how == "group-writable":
        where.chmod(0o770)
    else:
        need(os.geteuid() == 0, "chown to another user needs root")
        os.chown(where, pwd.getpwnam("nobody").pw_uid, -1)
    answers_really(call(home))
    assert path.read_bytes() == planted  # left alone: not ours to rewrite either


def _truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _flipped(data: bytes) -> bytes:
    i = len(data) * 2 // 3
    return data[:i] + bytes([data[i] ^ 0x40]) + data[i + 1 :]


def _empty(data: bytes) -> bytes:
    return b""


def _not_ours(data: bytes) -> bytes:
    return b"\x7fELF" + data[4:]


def _not_marshal(data: bytes) -> bytes:
    return cache_bytes(b"\xff not marshal data")


def _not_a_triple(data: bytes) -> bytes:
    return cache_bytes(marshal.dumps([1, 2]))


def _wrong_types(data: bytes) -> bytes:
    key, tag, codes = marshal.loads(data[len(CACHE_MAGIC) + 4 :])
    return cache_bytes(marshal.dumps((key, tag, {name: 1 for name in codes})))


def _other_key(data: bytes) -> bytes:
    key, tag, codes = marshal.loads(data[len(CACHE_MAGIC) + 4 :])
    return cache_bytes(marshal.dumps(("0" * len(key), tag, codes)))


@pytest.mark.parametrize(
    "corrupt",
    [
        _truncated,
        _flipped,
        _empty,
        _not_ours,
        _not_marshal,
        _not_a_triple,
        _wrong_types,
        _other_key,
    ],
    ids=lambda f: f.__name__,
)
def test_a_corrupt_cache_file_is_compiled_past_and_rewritten(tmp_path: Path, corrupt: Any) -> None:
    home, path = warmed(tmp_path)
    key, tag, _ = read_cache(path)
    plant(path)  # planted, then corrupt: were any of it used, the answer would show it
    path.write_bytes(corrupt(path.read_bytes()))
    answers_really(call(home))
    assert read_cache(path)[:2] == (key, tag)  # rewritten whole, the real code again:
    answers_really(call(home))


def test_a_bad_entry_is_compiled_from_the_sources(tmp_path: Path) -> None:
    """A file that checks out but holds an entry that is not the module's code (a
    garbled one, or another file's code): that module is compiled from the sources."""
    home, path = warmed(tmp_path)
    key, tag, codes = read_cache(path)
    write_cache(path, key, tag, {**codes, MAIN: b"\xff garbled"})
    answers_really(call(home))
    plant(path, filename="<somewhere else>/main.py")
    answers_really(call(home))


@pytest.mark.parametrize("where", ["a file", "under a file", "eagle3-tui is a file", "relative"])
def test_an_unusable_cache_location_changes_nothing_on_stdout(tmp_path: Path, where: str) -> None:
    """Root ignores permission bits: a path through a regular file fails for anyone."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    env = dict(os.environ)
    if where == "a file":
        home: Path | str = blocker
    elif where == "under a file":
        home = blocker / "cache"
    elif where == "eagle3-tui is a file":
        home = tmp_path / "cache"
        home.mkdir()
        (home / "eagle3-tui").write_text("not a directory")
    else:  # ignored (XDG), so ~/.cache: and HOME is a file
        home, env["HOME"] = "relative/cache", str(blocker)
    for _ in range(2):
        answers_really(call(home, env=env, cwd=tmp_path))
    assert blocker.read_text() == "not a directory"
    assert not (tmp_path / "relative").exists()


def test_a_changed_bundle_has_its_own_cache_and_old_ones_are_pruned(tmp_path: Path) -> None:
    home, path = warmed(tmp_path)
    plant(path)  # the old bundle's cache would answer PLANTED_ANSWER
    where = home / "eagle3-tui"
    tag = sys.implementation.cache_tag
    now = time.time()
    for age in range(1, 4):  # older bundles (the planted one is the newest of the old)
        old = where / f"agent-{age:024x}-{tag}.marshal"
        old.write_bytes(b"old")
        os.utime(old, (now - 3600 * age, now - 3600 * age))
    stale = where / f".agent-{0:024x}-{tag}.marshal.99999.tmp"
    stale.write_bytes(b"left by a killed agent")
    os.utime(stale, (now - 3600, now - 3600))
    fresh = where / f".agent-{1:024x}-{tag}.marshal.99998.tmp"
    fresh.write_bytes(b"being written")
    (where / "lib").mkdir()  # attach's files share the directory
    sources = agent_sources()
    names = "eagle3_tui.agent.names"
    changed = make_bundle({**sources, names: sources[names] + "\n# changed\n"})
    answers_really(call(home, payload=changed + json.dumps(MISSING).encode() + b"\n"))
    kept = {path.name, f"agent-{1:024x}-{tag}.marshal", fresh.name, "lib"}
    (new,) = {p.name for p in where.iterdir()} - kept  # the two oldest, the stale tmp: gone
    assert new.startswith("agent-") and read_cache(where / new)[0] != read_cache(path)[0]
    assert kept <= {p.name for p in where.iterdir()}
    planted = call(home)  # the first bundle's file is still there, and still used
    assert planted.stdout == PLANTED_ANSWER


def test_each_interpreter_has_its_own_cache(tmp_path: Path) -> None:
    """The agent runs on any python3 3.8+ of the host: ``marshal``'s code differs
    between versions, so the file is per interpreter (its cache tag), side by side."""
    home = tmp_path / "cache"
    exes = interpreters()
    tags = []
    for exe in exes:
        tag = subprocess.run(
            [exe, "-c", "import sys; print(sys.implementation.cache_tag)"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        tags.append(tag)
        for _ in range(2):  # a miss, then a hit
            answers_really(call(home, exe=exe))
        assert len([p for p in cache_files(home) if p.name.endswith(f"-{tag}.marshal")]) == 1
    assert len(cache_files(home)) == len(set(tags))
    (ours,) = (
        p for p in cache_files(home) if p.name.endswith(f"-{sys.implementation.cache_tag}.marshal")
    )
    plant(ours)
    assert call(home).stdout == PLANTED_ANSWER
    for exe in exes:
        if exe != sys.executable:
            answers_really(call(home, exe=exe))


def test_optimized_code_has_its_own_cache(tmp_path: Path) -> None:
    """``python3 -O`` (or ``PYTHONOPTIMIZE``) compiles without asserts: not the same code."""
    home, path = warmed(tmp_path)
    plant(path)
    optimized = dict(os.environ, PYTHONOPTIMIZE="1")
    for _ in range(2):
        answers_really(call(home, env=optimized))
    tag = sys.implementation.cache_tag
    assert [p.name.endswith(f"-{tag}-opt1.marshal") for p in cache_files(home)].count(True) == 1
    assert call(home).stdout == PLANTED_ANSWER


def test_the_loader_parses_as_python_3_8() -> None:
    """The loader runs on the host's python3 (3.8 and later), whatever runs the client."""
    length, rest = bundle().split(b"\n", 1)
    program = zlib.decompress(rest[: int(length)]).decode("utf-8")
    parse(program, "eagle3-tui-agent", feature_version=(3, 8))


# ---- the lean bundle: the loader alone, for a host whose cache holds the sources --------


def test_a_lean_bundle_runs_from_the_cache_and_without_one_does_nothing(tmp_path: Path) -> None:
    req = json.dumps({"protocol": PROTOCOL, **MISSING}).encode() + b"\n"
    lean = lean_bundle() + req
    assert len(lean) < 4000 < 250_000 < len(bundle())
    home = tmp_path / "cache"
    missed = call(home, payload=lean)  # nothing cached yet: said, and nothing done
    assert (missed.returncode, missed.stdout) == (LEAN_MISS_STATUS, b"")
    assert missed.stderr.decode().strip() == LEAN_MISS
    answers_really(call(home))  # the whole bundle: compiled and cached
    answers_really(call(home, payload=lean))  # now the loader alone is enough
    path = cache_files(home)[0]
    key, tag, codes = read_cache(path)
    del codes[MAIN]  # a cache without one of the modules: nothing done either
    body = marshal.dumps((key, tag, codes))
    path.write_bytes(CACHE_MAGIC + zlib.crc32(body).to_bytes(4, "big") + body)
    missed = call(home, payload=lean)
    assert (missed.returncode, missed.stdout) == (LEAN_MISS_STATUS, b"")


async def test_calls_after_the_first_send_the_loader_alone_and_a_miss_is_sent_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``call_agent`` on a host: the whole bundle until an agent has answered there,
    then the lean one; a lean call that finds no cache is made again, whole, and so is
    every later call on that host."""
    from eagle3_tui.transport import channel

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(channel, "_CACHED", {})
    sent: list[int] = []
    payload = channel.agent_payload

    def counted(request: dict[str, Any]) -> bytes:
        data = payload(request)
        sent.append(len(data))
        return data

    monkeypatch.setattr(channel, "agent_payload", counted)
    host = channel.LocalHost()

    async def status() -> None:
        with pytest.raises(channel.AgentAnswerError, match="no such run directory"):
            await channel.call_agent(host, dict(MISSING))

    await status()
    await status()
    await status()
    whole, lean = len(agent_payload(MISSING)), len(lean_bundle())
    assert sent[0] == whole and sent[1] < lean + 1000 and sent[2] < lean + 1000
    for path in cache_files(tmp_path / "cache"):
        path.unlink()  # the host's cache gone (cleaned, another home)
    sent.clear()
    await status()
    assert sent[0] < lean + 1000 and sent[1] == whole  # missed, then sent whole: answered
    await status()
    assert sent[2] == whole  # and whole from then on, on that host
