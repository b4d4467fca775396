"""One meaning per exit status across commands (issue 29): every number comes from
``eagle3_tui/exits.py``, is named once there, is a row of the README's one table, and
each command's help says only numbers that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from eagle3_tui import exits
from eagle3_tui.cli import main
from eagle3_tui.reports import ATTACH_EXIT, EXIT_BY_KIND, KILL_EXIT

README = Path(__file__).resolve().parents[1] / "README.md"


def named() -> dict[str, int]:
    return {k: v for k, v in vars(exits).items() if k.isupper() and isinstance(v, int)}


def readme_rows() -> list[int]:
    text = README.read_text()
    table = text[text.index("### Exit statuses\n") :]
    table = table[: table.index("\n\n", table.index("| status |"))]
    return [int(m) for m in re.findall(r"^\| (\d+) \|", table, re.M)]


def test_each_number_has_one_name() -> None:
    numbers = list(named().values())
    assert len(numbers) == len(set(numbers)), sorted(numbers)


def test_every_mapping_uses_the_named_numbers() -> None:
    known = set(named().values())
    for mapping in (exits.BY_HEALTH, KILL_EXIT, EXIT_BY_KIND, ATTACH_EXIT):
        assert set(mapping.values()) <= known, mapping


def test_the_readme_has_one_row_per_number() -> None:
    rows = readme_rows()
    assert len(rows) == len(set(rows)), rows
    assert sorted(rows) == sorted(named().values())


@pytest.mark.parametrize(
    "command", ["summary", "kill", "resume", "runs", "attach", "compare", "demo", "watch"]
)
def test_a_commands_help_says_only_known_numbers(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    said = text.partition("Exit status:")[2].partition("options:")[0]
    pairs = re.findall(r"(?:^|[ ,;(])(\d+)(?:-(\d+))? [a-z]", said)
    numbers = {int(n) for pair in pairs for n in pair if n}
    assert numbers <= set(named().values()), (command, said)
    if command != "demo":  # the demo's help names no status
        assert numbers, (command, text)
