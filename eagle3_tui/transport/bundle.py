"""The agent's bundle: the host-side packages, shipped over the connection.

The host needs nothing installed but ``python3``. :data:`eagle3_tui.agent.BOOTSTRAP`
reads a length and that many zlib-compressed bytes from stdin and executes them: a
small loader, which reads the second part (a length, then the zlib-compressed JSON
sources of :mod:`eagle3_tui.agent` and :mod:`eagle3_tui.telemetry`, standard library
only), puts them on ``sys.meta_path`` as in-memory modules, and runs
:func:`eagle3_tui.agent.main.main`. Modules run when first imported, and
``agent/main.py`` imports only the operation's module, so an operation pays only for
what it uses (a ``status`` imports neither follow nor the samplers).

Every operation is a fresh process on the host (the app's status probe: one a minute
while a run is followed), so the loader keeps the compiled modules in a per-user code
cache, ``${XDG_CACHE_HOME:-~/.cache}/eagle3-tui/agent-<key>-<cache tag>.marshal``:
the key is a hash of the loader and the sources (made here, so the host hashes
nothing), the tag the interpreter's (``marshal``'s code format changes between
versions; ``-O`` adds ``-optN``). A miss compiles every module and writes the file
atomically; a hit unmarshals only the modules imported, and the sources are never
parsed. Measured with the ``status`` probe (the agent process's CPU by rusage, on this
loaded 2-core machine, the venv's Python 3.11, whose bare ``python -c pass`` costs
26 ms): 132-140 ms before (every module compiled, every operation's module imported),
54-57 ms when only the operation's module is imported (and ``ProcStat`` no longer
needs :mod:`dataclasses`), 39-42 ms with the cache; 119-129 ms for the one call that
writes it. With Debian's ``/usr/bin/python3`` (bare: 11 ms): 113-120 ms before,
35-37 ms after.

**The loader alone.** Once an agent started from the whole bundle has answered on a
host, a process's later one-shot calls there (``call_agent``) send the loader with an
empty second part (~3 KB for ~250 KB): its code comes from the cache that first agent
wrote. Where the cache does not hold it (cleaned, unusable, another interpreter under
the same host name), the loader does nothing at all, says :data:`LEAN_MISS` on stderr
and exits :data:`LEAN_MISS_STATUS`; the client makes the call again with the whole
bundle, and sends the whole bundle to that host from then on. The cache's checks are
the same either way: a file it would not trust is a miss, never code run.

The cache cannot make an operation fail or print: the file is used only when it is a
regular file owned by this user and not writable by group or others, in a directory
likewise, its checksum, key and tag match and every entry is a code object compiled
under the module's name; anything else (no home, a read-only file system, a corrupt
file) falls back to compiling from the sources, silently. Files of other keys beyond
the two newest are removed when one is written. ``PYTHONDONTWRITEBYTECODE`` is not
obeyed: container images set it to keep ``.pyc`` files out of their layers, and this
file lives in the user's cache, not beside any sources.

Package ``__init__`` files travel empty: ``eagle3_tui.telemetry``'s re-exports would
import the whole telemetry session into every agent. :func:`package_sources` hands
the real files to an operation that writes a package to disk (attach).

No textual, no asyncssh.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from functools import cache
from pathlib import Path

import eagle3_tui

PACKAGES = ("eagle3_tui.agent", "eagle3_tui.telemetry")
"""What the agent may import on the host."""

LEAN_MISS = "eagle3-tui-agent: no cached code for a bundle without sources"
"""What the loader of a lean bundle says on stderr where the host's cache lacks the code."""
LEAN_MISS_STATUS = 86
"""Its exit status then (the agent's own are 0 to 3 and 130; ssh's 255; a shell's 126 and 127)."""

CACHE_MAGIC = b"E3TAGC1\n"
"""The cache file: this, the CRC-32 of the rest (4 bytes, big-endian), then
``marshal.dumps((key, cache_tag, {module: marshal.dumps(code)}))``."""

LOADER = '''
import marshal
import os
import sys

_KEY = %(key)r
_NAMES = frozenset(%(names)r)
_PACKAGES = %(packages)r
_MAGIC = %(magic)r
_KEEP = 2
_stdin = sys.stdin.buffer
_packed = _stdin.read(int(_stdin.readline()))
_sources = None
_code = None


def _where(name):
    return "<eagle3-tui-agent>/" + name.replace(".", "/") + ".py"


_CodeType = type(_where.__code__)


def _source(name):
    global _sources
    if _sources is None:
        import json
        import zlib

        _sources = json.loads(zlib.decompress(_packed).decode("utf-8"))
    return _sources[name]


def _private(st, is_dir):
    """Ours, and nobody else may write it (but root, who may do anything anyway)."""
    kind = 0o040000 if is_dir else 0o100000
    return st.st_mode & 0o170000 == kind and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _open_dir():
    base = os.environ.get("XDG_CACHE_HOME") or ""
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    if not os.path.isabs(base):
        return None
    path = os.path.join(base, "eagle3-tui")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        os.makedirs(path, 0o700, exist_ok=True)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    if _private(os.fstat(fd), True):
        return fd
    os.close(fd)
    return None


def _load(dfd, name, tag):
    import zlib

    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
    try:
        if not _private(os.fstat(fd), False):
            return None
        parts = []
        while True:
            part = os.read(fd, 1 << 20)
            if not part:
                break
            parts.append(part)
    finally:
        os.close(fd)
    data = b"".join(parts)
    body = data[len(_MAGIC) + 4 :]
    if data[: len(_MAGIC)] != _MAGIC or data[len(_MAGIC) : len(_MAGIC) + 4] != (
        zlib.crc32(body).to_bytes(4, "big")
    ):
        return None
    key, got_tag, codes = marshal.loads(body)
    if key != _KEY or got_tag != tag or type(codes) is not dict:
        return None
    for module, code in codes.items():
        if type(module) is not str or type(code) is not bytes:
            return None
    return codes


def _store(dfd, name, tag, codes):
    import zlib

    body = marshal.dumps((_KEY, tag, {m: marshal.dumps(c) for m, c in codes.items()}))
    data = _MAGIC + zlib.crc32(body).to_bytes(4, "big") + body
    tmp = ".%%s.%%d.tmp" %% (name, os.getpid())
    try:
        os.unlink(tmp, dir_fd=dfd)
    except OSError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        raise


def _prune(dfd):
    """Files of other keys but the newest few (a client's upgrade leaves one behind),
    and temporary files a killed agent left."""
    import time

    ours = "agent-%%s-" %% _KEY
    old = []
    for entry in os.listdir(dfd):
        try:
            st = os.stat(entry, dir_fd=dfd, follow_symlinks=False)
            if entry.startswith("agent-") and entry.endswith(".marshal"):
                if not entry.startswith(ours):
                    old.append((st.st_mtime, entry))
            elif entry.startswith(".agent-") and entry.endswith(".tmp"):
                if st.st_mtime < time.time() - 600:
                    os.unlink(entry, dir_fd=dfd)
        except OSError:
            pass
    for _, entry in sorted(old, reverse=True)[_KEEP:]:
        try:
            os.unlink(entry, dir_fd=dfd)
        except OSError:
            pass


def _prepare():
    """``_code``: the cached modules (marshalled), or all of them compiled and cached."""
    global _code
    tag = sys.implementation.cache_tag
    if not tag:
        return
    if sys.flags.optimize:  # compile() follows -O: asserts and docstrings differ
        tag = "%%s-opt%%d" %% (tag, sys.flags.optimize)
    name = "agent-%%s-%%s.marshal" %% (_KEY, tag)
    dfd = _open_dir()
    if dfd is None:
        return
    try:
        try:
            _code = _load(dfd, name, tag)
        except Exception:
            _code = None
        if _code is not None:
            return
        _code = {m: compile(_source(m), _where(m), "exec") for m in _NAMES}
        _store(dfd, name, tag, _code)
        _prune(dfd)
    finally:
        os.close(dfd)


class _BundleImporter:
    """Imports the bundle's modules from memory (a meta path finder and loader)."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name not in _NAMES:
            return None
        from importlib.machinery import ModuleSpec

        return ModuleSpec(name, cls, is_package=name in _PACKAGES)

    @staticmethod
    def create_module(spec):
        return None

    @staticmethod
    def exec_module(module):
        name = module.__name__
        code = None if _code is None else _code.get(name)
        if type(code) is bytes:
            try:
                code = marshal.loads(code)
            except Exception:
                code = None
        if type(code) is not _CodeType or code.co_filename != _where(name):
            code = compile(_source(name), _where(name), "exec")
        exec(code, module.__dict__)


try:
    _prepare()
except Exception:
    pass
if not _packed and (type(_code) is not dict or not _NAMES <= set(_code)):
    # a lean bundle (no sources: the client found them cached here before) and no cache
    # of them now: nothing of the request is done, the client sends them again
    sys.stderr.write(%(miss)r + "\\n")
    sys.stderr.flush()
    os._exit(%(miss_status)d)
sys.meta_path.insert(0, _BundleImporter)
from eagle3_tui.agent.main import main

main()
'''


def package_sources(package: str) -> dict[str, str]:
    """``{module name: source}`` of a package's modules (one level), ``__init__`` included."""
    root = Path(eagle3_tui.__file__).parent.joinpath(*package.split(".")[1:])
    out = {}
    for path in sorted(root.glob("*.py")):
        name = package if path.stem == "__init__" else f"{package}.{path.stem}"
        out[name] = path.read_text(encoding="utf-8")
    return out


def agent_sources() -> dict[str, str]:
    """``{module name: source}`` of what the agent may import (package ``__init__``s empty)."""
    sources: dict[str, str] = {"eagle3_tui": f"__version__ = {eagle3_tui.__version__!r}\n"}
    for package in PACKAGES:
        for name, text in package_sources(package).items():
            sources[name] = "" if name == package else text
    return sources


def make_bundle(sources: dict[str, str]) -> bytes:
    """What the agent reads on stdin before its request: the loader :data:`BOOTSTRAP`
    executes, then the sources it reads, each a length line and zlib-compressed bytes.
    The cache key is a hash of both (a changed module, or loader, is a new key)."""
    packed = json.dumps(sources, sort_keys=True).encode("utf-8")
    fields = {
        "names": tuple(sorted(sources)),
        "packages": tuple(sorted(n for n in sources if n == "eagle3_tui" or n in PACKAGES)),
        "magic": CACHE_MAGIC,
        "miss": LEAN_MISS,
        "miss_status": LEAN_MISS_STATUS,
    }
    digest = hashlib.sha256((LOADER % {**fields, "key": ""}).encode("utf-8") + b"\0" + packed)
    program = LOADER % {**fields, "key": digest.hexdigest()[:24]}
    loader = zlib.compress(program.encode("utf-8"), 6)
    data = zlib.compress(packed, 6)
    return b"%d\n" % len(loader) + loader + b"%d\n" % len(data) + data


@cache
def bundle() -> bytes:
    """:func:`make_bundle` of :func:`agent_sources` (built once per process)."""
    return make_bundle(agent_sources())


def lean_of(full: bytes) -> bytes:
    """A bundle without its sources (the loader alone, then an empty second part): for a
    host whose code cache holds them (an earlier call there compiled them); where it does
    not, the loader does nothing and exits :data:`LEAN_MISS_STATUS`, saying
    :data:`LEAN_MISS`."""
    size, _, _ = full.partition(b"\n")
    return full[: len(size) + 1 + int(size)] + b"0\n"


@cache
def lean_bundle() -> bytes:
    """:func:`lean_of` :func:`bundle`: ~3 KB where the whole is ~250 KB."""
    return lean_of(bundle())


@cache
def telemetry_library() -> dict[str, str]:
    """``{path: source}`` of what ``attach`` writes on the host for the trainer to import:
    ``eagle3_tui/__init__.py`` and the whole (standard-library-only) telemetry package,
    ``__init__`` included (the one-liner ``from eagle3_tui.telemetry import attach``)."""
    root = Path(eagle3_tui.__file__).parent
    out = {"eagle3_tui/__init__.py": (root / "__init__.py").read_text(encoding="utf-8")}
    for name, text in package_sources("eagle3_tui.telemetry").items():
        stem = "__init__" if name == "eagle3_tui.telemetry" else name.rsplit(".", 1)[1]
        out[f"eagle3_tui/telemetry/{stem}.py"] = text
    return out
