"""Text that came from a run, a process or a file, made inert before it is shown.

Anything a run, a process or another user can write (argv, a working directory, a
path, a log line, a user or host name, an error that quotes one) may hold what a
terminal acts on: OSC 0 retitles the window, OSC 52 writes the clipboard, SGR
recolours, a C1 control (``\\x9b`` is an 8-bit CSI, ``\\x85`` a line break), line
separators and bidi overrides (U+2028, U+202E) that move or reorder what is read.
:func:`printable` shows each such character escaped, as Python writes it
(``\\x1b``, ``\\x9b``, ``\\u202e``); :func:`json_ascii` leaves a JSON text nothing
but printable ASCII. The command line's output goes through both (``cli.say``,
``cli.say_json``), the monitor's through ``app/text.py``.

Pure: standard library only.
"""

from __future__ import annotations

import re


def printable(text: str, keep: str = "") -> str:
    """``text`` with every character that is not printable shown escaped as ``repr``
    writes it: C0 and C1 controls, DEL, line and paragraph separators, bidi and other
    format characters, lone surrogates (what ``str.isprintable`` refuses). ``keep``:
    characters left as they are (a report's newlines); without it, one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in text)


_NOT_PRINTABLE_ASCII = re.compile(r"[^\t\n\r\x20-\x7e]")


def _json_escape(m: re.Match[str]) -> str:
    n = ord(m.group())
    if n > 0xFFFF:  # a surrogate pair, as JSON writes a character past the BMP
        n -= 0x10000
        return f"\\u{0xD800 | n >> 10:04x}\\u{0xDC00 | n & 0x3FF:04x}"
    return f"\\u{n:04x}"


def json_ascii(text: str) -> str:
    """A JSON text with every character outside printable ASCII written as a ``\\uXXXX``
    escape: the same value, and nothing a terminal acts on (``json.dumps`` leaves DEL
    raw, msgspec every non-ASCII character: C1 controls, U+2028, U+202E). In valid JSON
    such characters occur only inside strings, where the escape stands for the same
    character; the whitespace between tokens (tab, newline, return) stays."""
    return _NOT_PRINTABLE_ASCII.sub(_json_escape, text)
