"""The core never imports the UI or the SSH library; telemetry stays standard-library."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sources import parse

CHECK = """
import sys
from pathlib import Path
import {module}
bad = sorted(m for m in sys.modules if m.split('.')[0] in {banned!r})
print(','.join(bad))
"""


@pytest.mark.parametrize(
    ("module", "banned"),
    [
        ("eagle3_tui.model.snapshot", {"textual", "asyncssh", "rich", "textual_plotext"}),
        ("eagle3_tui.model.summary", {"textual", "asyncssh", "rich", "textual_plotext"}),
        ("eagle3_tui.telemetry", {"textual", "asyncssh", "rich", "msgspec", "numpy", "torch"}),
        # imported into a live trainer by `attach`, and by the agent on the host
        ("eagle3_tui.telemetry.inject", {"textual", "asyncssh", "rich", "msgspec", "numpy"}),
        ("eagle3_tui.telemetry.rerun", {"textual", "asyncssh", "rich", "msgspec", "numpy"}),
        ("eagle3_tui.agent.attach", {"textual", "asyncssh", "rich", "msgspec", "numpy", "torch"}),
        ("eagle3_tui.transport.local", {"textual", "rich", "textual_plotext"}),
        ("eagle3_tui.cli", {"textual", "asyncssh", "torch", "numpy"}),
        # a notebook's import: no UI, no SSH library until a host is reached
        # ... and no numpy until a run's records are read (`runs`, `kill`: ~0.2 s a command)
        ("eagle3_tui.api", {"textual", "asyncssh", "torch", "rich", "numpy"}),
        # a watcher on a host or a bastion: no UI library loaded
        ("eagle3_tui.watch", {"textual", "torch", "rich"}),
    ],
)
def test_module_does_not_pull_in(module: str, banned: set[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CHECK.format(module=module, banned=banned)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert proc.stdout.strip() == "", f"{module} imports {proc.stdout.strip()}"


def import_graph() -> dict[str, set[str]]:
    """Which eagle3_tui module imports which, read from the sources: every import
    counts, at the top, inside a function (lazy) or under ``TYPE_CHECKING``. A module's
    import of its own package (Python imports it first anyway) is no edge."""
    root = Path(__file__).resolve().parents[1]
    paths = {}
    for path in (root / "eagle3_tui").rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[1] == "train":  # train/ (linked): the launchers, checked by their own rules
            continue
        if parts[-1] == "__init__":
            parts.pop()
        paths[".".join(parts)] = path
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(parse(path.read_text())):
            found: list[str] = []
            if isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                found = [base, *(f"{base}.{a.name}" for a in node.names)]
            graph[name] |= {
                f for f in found if f in graph and f != name and not name.startswith(f + ".")
            }
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_itself_round_about() -> None:
    graph = import_graph()
    assert len(graph) > 100 and "eagle3_tui.model.state" in graph  # the sources were read
    found = cycles(graph)
    assert found == [], "\n".join(
        " <-> ".join(c) + ": " + "; ".join(f"{a} -> {b}" for a in c for b in graph[a] & set(c))
        for c in found
    )


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


LONG = 600


def test_a_module_over_600_lines_says_why_in_its_docstring() -> None:
    """One home per concern: a long file is either split or says in its docstring why
    its parts belong together ("Over 600 lines: ..."), where its next reader looks."""
    root = Path(__file__).resolve().parent.parent / "eagle3_tui"
    long = {
        p: n for p in sorted(root.rglob("*.py")) if (n := len(p.read_text().splitlines())) > LONG
    }
    assert long, "the sources were read"  # some long modules are expected
    unsaid = [
        f"{p.relative_to(root)} ({n} lines)"
        for p, n in long.items()
        if "Over 600 lines:" not in (ast.get_docstring(parse(p.read_text())) or "")
    ]
    assert unsaid == [], "long without a reason: " + ", ".join(unsaid)
