"""Python sources parsed the way tests read them.

CPython 3.11 before 3.11.9 keeps the AST converter's recursion counter per interpreter,
not per thread (gh-106905): when another thread converts a tree at the same moment (a
traceback being formatted parses its line to place the carets), ``ast.parse`` raises a
spurious ``SystemError: AST constructor recursion depth mismatch``. The counter is set
afresh on every call, so parsing again is the fix; a real error is raised again.
"""

from __future__ import annotations

import ast


def parse(
    source: str, filename: str = "<unknown>", feature_version: tuple[int, int] | None = None
) -> ast.Module:
    """``ast.parse`` that parses again after the spurious cross-thread ``SystemError``."""
    for _ in range(4):
        try:
            return ast.parse(source, filename, feature_version=feature_version)
        except SystemError as e:
            if "recursion depth mismatch" not in str(e):
                raise
    return ast.parse(source, filename, feature_version=feature_version)
