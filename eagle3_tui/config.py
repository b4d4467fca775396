"""The user's settings file: ``$XDG_CONFIG_HOME/eagle3-tui/config.toml`` (by default
``~/.config/eagle3-tui/config.toml``). Optional; what it may hold::

    hosts = ["gpu-a", "alice@gpu-b", "localhost"]   # the fleet's hosts without arguments

    [fleet]
    recent_hours = 24     # registered runs started this recently are rows too
    interval = 10.0       # seconds between looks

A file that is not TOML, or a setting of the wrong type, is one clear error naming the
file and the setting (never a traceback, never ignored in silence).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from eagle3_tui.transport.base import TargetError

LIMIT = 256 * 1024
"""A settings file larger than this is refused (it is a few lines)."""


@dataclass(frozen=True)
class Config:
    path: Path
    hosts: tuple[str, ...] = ()
    recent_hours: float | None = None
    interval: float | None = None


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "eagle3-tui" / "config.toml"


def load_config(path: Path | None = None) -> Config:
    """The settings (defaults where the file is missing); a bad file raises
    :class:`TargetError` with one line."""
    path = path or config_path()
    try:
        with open(path, "rb") as f:
            data = f.read(LIMIT + 1)
    except FileNotFoundError:
        return Config(path)
    except OSError as e:
        raise TargetError(f"{path}: not read ({e.strerror or e})") from None
    if len(data) > LIMIT:
        raise TargetError(f"{path}: larger than {LIMIT // 1024} KiB; not a settings file")
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise TargetError(f"{path}: not TOML ({e})") from None
    hosts = doc.get("hosts", [])
    if not isinstance(hosts, list) or not all(isinstance(h, str) and h for h in hosts):
        raise TargetError(f'{path}: hosts must be a list of host names, e.g. hosts = ["gpu-a"]')
    fleet = doc.get("fleet", {})
    if not isinstance(fleet, dict):
        raise TargetError(f"{path}: [fleet] must be a table")
    return Config(
        path,
        tuple(hosts),
        _positive(path, fleet, "recent_hours"),
        _positive(path, fleet, "interval"),
    )


def _positive(path: Path, table: dict[str, object], name: str) -> float | None:
    value = table.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise TargetError(f"{path}: fleet.{name} must be a positive number, not {value!r}")
    return float(value)
