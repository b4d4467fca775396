"""The agent's bundle: the host-side packages, shipped over the connection.

The host needs nothing installed but ``python3``. :data:`eagle3_tui.agent.BOOTSTRAP`
reads a length and that many zlib-compressed bytes from stdin and executes them: a
small loader that puts the sources of :mod:`eagle3_tui.agent` and
:mod:`eagle3_tui.telemetry` (standard library only) on ``sys.meta_path`` as
in-memory modules, then runs :func:`eagle3_tui.agent.main.main`. Modules compile
when first imported, so an operation pays only for what it uses (a ``follow``
imports neither the samplers nor the session).

Package ``__init__`` files travel empty: ``eagle3_tui.telemetry``'s re-exports would
import the whole telemetry session into every agent. :func:`package_sources` hands
the real files to an operation that writes a package to disk (attach).

No textual, no asyncssh.
"""

from __future__ import annotations

import zlib
from functools import cache
from pathlib import Path

import eagle3_tui

PACKAGES = ("eagle3_tui.agent", "eagle3_tui.telemetry")
"""What the agent may import on the host."""

LOADER = '''
import sys
_SOURCES = %(sources)r
_PACKAGES = %(packages)r


class _BundleImporter:
    """Imports the bundle's modules from memory (a meta path finder and loader)."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name not in _SOURCES:
            return None
        import importlib.util

        return importlib.util.spec_from_loader(name, cls, is_package=name in _PACKAGES)

    @staticmethod
    def create_module(spec):
        return None

    @staticmethod
    def exec_module(module):
        name = module.__name__
        where = "<eagle3-tui-agent>/" + name.replace(".", "/") + ".py"
        exec(compile(_SOURCES[name], where, "exec"), module.__dict__)


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


@cache
def bundle() -> bytes:
    """The compressed program :data:`BOOTSTRAP` executes (built once per process)."""
    sources: dict[str, str] = {"eagle3_tui": f"__version__ = {eagle3_tui.__version__!r}\n"}
    for package in PACKAGES:
        for name, text in package_sources(package).items():
            sources[name] = "" if name == package else text
    packages = ("eagle3_tui", *PACKAGES)
    program = LOADER % {"sources": sources, "packages": packages}
    return zlib.compress(program.encode("utf-8"), 6)


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
