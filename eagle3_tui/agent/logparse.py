"""What a training's own output says, line by line, as records of the JSON-lines schema.

A speculators training with no handler on ``speculators.metrics`` still prints: its
progress bar per epoch (rich, without a terminal only when a bar ends:
``Epoch 0 100% ━━━ 24/24  [ 0:00:33 < 0:00:00 , 2 it/s ]``; tqdm's classic
``Epoch 0: 100%|███| 24/24 [00:33<00:00, 1.38it/s]``), Python warnings, tracebacks,
the library's loguru lines, transformers' ``Writing model shards`` bars. With a
handler that prints to stdout (a user's ``logging.basicConfig``), the metric dicts
themselves. Each line becomes:

* a ``train`` or ``val`` record when it carries a speculators metric dict (as
  ``repr`` or JSON, bare or in a JSON log line's ``msg``), or the dict as the
  library's own CLI prints it (``setup_root_logger``: its ``FormatDictFilter`` writes
  ``train/loss=0.071, …, global_step=3``, three digits, and rich wraps it over many
  lines: :class:`KeyValueBlock` puts them back together);
* a ``progress`` record for an ``Epoch N`` bar (``phase`` train for the first bar of an
  epoch, val for the second), besides its ``log`` record;
* a ``log`` record otherwise: level read from the line (loguru, logging, warnings,
  tracebacks), message as printed (ANSI escapes removed, the last ``\\r`` segment).

Standard library only, Python 3.8+.
"""

from __future__ import annotations

import ast
import math
import re
import time
from typing import TYPE_CHECKING, Any

from eagle3_tui.telemetry.parsing import parse_json

if TYPE_CHECKING:  # (not evaluated: Python 3.8 has no tuple[...] at run time)
    Parsed = tuple[str, dict[str, Any], float | None]
    """(kind, payload, timestamp read from the line or None)."""

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07")
_RICH_BAR = re.compile(
    r"^(?P<desc>.+?)\s+(?P<pct>\d{1,3})%\s+\S*\s*(?P<n>\d+)/(?P<total>\d+)\s+"
    r"\[\s*(?P<elapsed>[\d:]+)\s*<\s*(?P<remaining>[-\d:?]+)\s*,\s*(?P<rate>[\d.,]+|\?)\s*"
    r"(?P<scale>[kKMGTPE]?)(?P<unit>it/s|s/it)\s*\]"
)
_TQDM_BAR = re.compile(
    r"^(?P<desc>.+?):\s*(?P<pct>\d{1,3})%\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+)\s*"
    r"\[(?P<elapsed>[\d:]+)<(?P<remaining>[\d:?]+)"
    r"(?:,\s*(?P<rate>[\d.,]+|\?)\s*(?P<scale>[kKMGTPE]?)(?P<unit>it/s|s/it))?"
)
_SCALES = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
"""A rate's unit prefix (``unit_scale``); rich's thousands read ``1,234 it/s``."""
_EPOCH_DESC = re.compile(r"^Epoch (\d+)$")
_LOGURU = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?)\s*\|\s*(?P<level>[A-Z]+)\s*\|\s*"
    r"(?P<logger>[\w.]+)[:\w]*\s+-\s+(?P<msg>.*)$"
)
_STAMPED = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?)\S*\s+(?:-\s+)?"
    r"(?:(?P<logger>[\w.]+)\s+-\s+)?"
    r"(?:\[?(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\]?)\s*[-:|]?\s*(?P<msg>.*)$"
)
_BASIC = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL):(?P<logger>[\w.]*):(?P<msg>.*)$"
)
_WARNING = re.compile(r"^\S.*:\d+: \w*Warning: ")
_ERROR = re.compile(r"^(?:[\w.]+(?:Error|Exception|Interrupt)|Killed|Segmentation fault)\b(?::|$)")
_NONFINITE = re.compile(r"(?<![\w'\".])(-?)(nan|inf)(?![\w'\"])")
_LEVELS = {"WARN": "WARNING", "SUCCESS": "INFO", "TRACE": "DEBUG"}
_KV = re.compile(
    r"(?<![\w/.=-])([A-Za-z_][\w.-]*(?:/[\w.-]+)*)="
    r"(-?(?:\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|nan|inf)|'[^']*')(?=,|\s|$)"
)
_SOURCE_COLUMN = re.compile(r"\s+[\w.-]+\.py:\d+\s*$")
"""rich's right-hand column (``trainer.py:587``), on a record's first line."""


def clean(raw: str) -> str:
    """The line as a terminal would end up showing it: the last ``\\r`` segment, no ANSI."""
    text = raw.rstrip("\r\n")
    if "\r" in text:
        parts = [p for p in text.split("\r") if p.strip()]
        text = parts[-1] if parts else ""
    return _ANSI.sub("", text).rstrip()


def _clock(text: str) -> float | None:
    """``H:MM:SS`` or ``MM:SS`` as seconds."""
    try:
        parts = [int(p) for p in text.split(":")]
    except ValueError:
        return None
    total = 0
    for p in parts:
        total = total * 60 + p
    return float(total)


def _stamp(text: str) -> float | None:
    """``YYYY-MM-DD HH:MM:SS[.,fff]`` in local time as seconds since the epoch."""
    try:
        head, _, frac = text.replace(",", ".").replace("T", " ").partition(".")
        t = time.mktime(time.strptime(head, "%Y-%m-%d %H:%M:%S"))
        return t + (float("0." + frac) if frac.isdigit() else 0.0)
    except (ValueError, OverflowError):
        return None


def bar(line: str) -> dict[str, Any] | None:
    """A progress bar's figures: ``desc``, ``n``, ``total``, ``elapsed_s``,
    ``remaining_s``, ``rate`` (items per second), or None."""
    m = _RICH_BAR.match(line) or _TQDM_BAR.match(line)
    if m is None:
        return None
    n, total = int(m.group("n")), int(m.group("total"))
    rate_text, unit = m.group("rate"), m.group("unit")
    rate: float | None = None
    if rate_text and rate_text != "?":
        try:
            value = float(rate_text.replace(",", "")) * _SCALES[m.group("scale") or ""]
        except ValueError:  # "1.2.3": not a rate
            value = 0.0
        rate = (1.0 / value if value > 0 else None) if unit == "s/it" else value
    elapsed = _clock(m.group("elapsed"))
    if elapsed and n:
        rate = n / elapsed  # more digits than the printed rate ("2 it/s")
    return {
        "desc": m.group("desc").strip(),
        "n": n,
        "total": total,
        "elapsed_s": elapsed,
        "remaining_s": _clock(m.group("remaining")),
        "rate": rate,
    }


def _literal(text: str) -> Any:
    """A Python literal or JSON value; ``nan``/``inf`` (a dict's ``repr``) read as the
    schema's ``"NaN"``/``"Infinity"`` strings. Never evaluates code."""
    try:
        return parse_json(text)
    except ValueError:
        pass
    fixed = _NONFINITE.sub(
        lambda m: '"NaN"' if m.group(2) == "nan" else f'"{m.group(1)}Infinity"', text
    )
    try:
        return ast.literal_eval(fixed)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return None


def metric_dict(line: str) -> dict[str, Any] | None:
    """The speculators metric dict a line carries, if any (``{"train": …}``, ``{"val": …}``,
    or a JSON log line whose ``msg`` is one)."""
    if "train" not in line and "val" not in line:
        return None
    start = line.find("{")
    if start < 0:
        return None
    end = line.rfind("}")
    value = _literal(line[start : end + 1]) if end > start else None
    if isinstance(value, dict) and isinstance(value.get("msg"), dict):
        value = value["msg"]
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("train"), dict) or isinstance(value.get("val"), dict):
        return value
    return None


def _finite(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    if isinstance(v, dict):
        return {str(k): _finite(x) for k, x in v.items()}
    return v


def handler_line(line: str) -> dict[str, Any] | None:
    """A line of a user's own JSON handler (``{"t", "logger", "level", "msg"}``, as
    ``logging`` with a JSON formatter writes it), as its object; None for any other."""
    if not line.startswith("{") or '"msg"' not in line:
        return None
    try:
        obj = parse_json(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) and "msg" in obj else None


def _handler_time(t: Any) -> float | None:
    """A handler's ``t``: epoch seconds, or a date and time (``asctime``, ISO 8601)."""
    if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t):
        return float(t)
    if isinstance(t, str):
        return _stamp(t)
    return None


def level_of(line: str) -> tuple[str, str, str, float | None]:
    """(level, logger, message, timestamp) of one line of output (a JSON handler's
    line: its own)."""
    obj = handler_line(line)
    if obj is not None and isinstance(obj.get("msg"), str):
        level = str(obj.get("level") or obj.get("levelname") or "INFO").upper()
        logger = str(obj.get("logger") or obj.get("name") or "stdout")
        return _LEVELS.get(level, level), logger, obj["msg"], _handler_time(obj.get("t"))
    m = _LOGURU.match(line)
    if m:
        level = _LEVELS.get(m.group("level"), m.group("level"))
        return level, m.group("logger"), m.group("msg"), _stamp(m.group("ts"))
    m = _BASIC.match(line)
    if m:
        return m.group("level"), m.group("logger") or "root", m.group("msg"), None
    m = _STAMPED.match(line)
    if m:
        level = _LEVELS.get(m.group("level"), m.group("level"))
        return level, m.group("logger") or "stdout", m.group("msg"), _stamp(m.group("ts"))
    if _WARNING.match(line) or "Received SIGTERM" in line:
        return "WARNING", "stdout", line, None
    if line.startswith("Traceback (most recent call last)") or _ERROR.match(line):
        return "ERROR", "stdout", line, None
    return "INFO", "stdout", line, None


def unflatten(flat: list[tuple[str, Any]]) -> dict[str, Any]:
    """speculators' ``_flatten_dict`` undone (``train/loss`` → ``{"train": {"loss"}}``);
    ``epoch`` and ``global_step`` as ints."""
    out: dict[str, Any] = {}
    for tag, value in flat:
        parts = tag.split("/")
        node = out
        for p in parts[:-1]:
            child = node.get(p)
            if not isinstance(child, dict):
                child = node[p] = {}
            node = child
        v = value
        if len(parts) == 1 and parts[0] in ("epoch", "global_step") and isinstance(v, float):
            v = int(v) if math.isfinite(v) and v == int(v) else v
        node[parts[-1]] = v
    return out


def tracked_dict(flat: list[tuple[str, Any]], step: int | None) -> dict[str, Any] | None:
    """One of speculators' metric dicts from what a tracker keeps of it: its flattened
    keys (``train/loss`` …) and the step it was logged at; None when the keys are not
    a train or a validation dict (the run's hyperparameters, a tracker's own keys)."""
    d = unflatten(flat)
    kind = "train" if isinstance(d.get("train"), dict) else "val"
    if not isinstance(d.get(kind), dict):
        return None
    if kind == "train" and "global_step" not in d and step is not None:
        d["global_step"] = step
    if kind == "val" and step is not None:
        d.setdefault("global_step", step)
    return d


def key_values(text: str) -> list[tuple[str, Any]] | None:
    """The ``key=value`` pairs ``text`` consists of (numbers only kept), None when it
    carries anything else."""
    pairs = _KV.findall(text)
    if not pairs or _KV.sub("", text).strip(" ,"):
        return None
    out: list[tuple[str, Any]] = []
    for key, raw in pairs:
        if raw.startswith("'"):
            continue
        value = float(raw)
        out.append((key, int(raw) if raw.lstrip("-").isdigit() else value))
    return out


class KeyValueBlock:
    """One metric dict as the library's CLI prints it, over the lines rich wraps it in:
    opened by a line whose message starts with ``train/…=`` or ``val/…=`` (after a
    level, a time, a logger), continued by indented lines of ``key=value`` only (other
    lines may come between: another rank's), ended by its last key (``global_step`` for
    a train dict, ``epoch`` for a val dict); one that a new dict cuts short is dropped."""

    def __init__(self) -> None:
        self.pairs: list[tuple[str, Any]] = []
        self.kind: str | None = None

    def start(self, line: str) -> bool:
        m = _KV.search(line)
        if m is None or not m.group(1).startswith(("train/", "val/")) or "=" in line[: m.start()]:
            return False
        pairs = key_values(_SOURCE_COLUMN.sub("", line[m.start() :]))
        if pairs is None:
            return False
        self.kind = m.group(1).split("/", 1)[0]
        self.pairs = pairs
        return True

    def more(self, line: str) -> bool:
        if not line[:1].isspace():
            return False
        pairs = key_values(_SOURCE_COLUMN.sub("", line).strip())
        if pairs is None:
            return False
        self.pairs.extend(pairs)
        return True

    def complete(self) -> bool:
        last = self.pairs[-1][0] if self.pairs else ""
        return last == ("global_step" if self.kind == "train" else "epoch")

    def take(self) -> list[Parsed]:
        pairs, self.pairs, kind, self.kind = self.pairs, [], self.kind, None
        d = unflatten(pairs)
        if kind is None or not isinstance(d.get(kind), dict):
            return []
        return [metric_record(d, None)]


class LineParser:
    """Turns a training's output into records, line by line. Its only state (which
    ``Epoch N`` bars were seen) travels in the observe cursor, so a reconnect resumes
    with the same answers (a printed dict cut by a reconnect is lost).

    ``key_values``: whether dicts printed as ``key=value`` become records (off when the
    metrics are read from a file of their own: they would come twice)."""

    def __init__(self, state: dict[str, Any] | None = None, key_values: bool = True) -> None:
        bars = (state or {}).get("bars") or {}
        self.bars: dict[str, int] = {str(k): int(v) for k, v in bars.items()}
        self.key_values = key_values
        self.block = KeyValueBlock()

    @property
    def state(self) -> dict[str, Any]:
        return {"bars": dict(self.bars)}

    def parse(self, raw: str) -> list[Parsed]:
        line = clean(raw)
        if not line.strip():
            return []
        out: list[Parsed] = []
        if self.block.kind is not None and not self.key_values:
            self.block = KeyValueBlock()  # the metrics come from a file of their own now
        if self.block.kind is not None and self.block.more(line):
            return self.block.take() if self.block.complete() else []
        # Any other line inside a printed dict (another rank's, a warning) is its own; the
        # dict goes on after it. A dict is a record only whole: one cut short (a new dict
        # began, the process ended) lacks its last keys, its step among them, and would
        # read as a step of its own without them.
        if self.key_values and self.block.start(line):
            return self.block.take() if self.block.complete() else []
        metrics = metric_dict(line)
        if metrics is not None:
            return [*out, self._metrics(metrics, line)]
        figures = self._epoch_bar(line)
        if figures is not None:
            if figures["done"]:
                epoch = str(figures["epoch"])
                self.bars[epoch] = self.bars.get(epoch, 0) + 1
                if len(self.bars) > 64:
                    self.bars.pop(min(self.bars, key=int))
            out.append(("progress", {"bar": figures}, None))
        level, logger, msg, ts = level_of(line)
        out.append(("log", {"level": level, "logger": logger, "msg": msg[:2000]}, ts))
        return out

    def redrawn(self, raw: str) -> dict[str, Any] | None:
        """The figures of an epoch bar not yet done, from a line being redrawn (a bar a
        terminal shows, or rich told it is one: ``TTY_COMPATIBLE``/``FORCE_COLOR``, and
        tqdm always, redraw it after a ``\\r`` at every step, the line ending only with the
        bar); nothing is counted (the line's end is parsed as any line)."""
        figures = self._epoch_bar(clean(raw))
        return figures if figures is not None and not figures["done"] else None

    def _epoch_bar(self, line: str) -> dict[str, Any] | None:
        """An ``Epoch N`` bar's figures with ``epoch``, ``phase`` (the first bar of an
        epoch is its training loop, the next its validation) and ``done``."""
        figures = bar(line)
        m = _EPOCH_DESC.match(figures["desc"]) if figures is not None else None
        if figures is None or m is None:
            return None
        epoch = m.group(1)
        figures.pop("desc")
        done = figures["n"] >= figures["total"] > 0
        phase = "train" if self.bars.get(epoch, 0) == 0 else "val"
        figures.update(epoch=int(epoch), phase=phase, done=done)
        return figures

    @staticmethod
    def _metrics(d: dict[str, Any], line: str) -> Parsed:
        wrapper = handler_line(line)
        ts = _handler_time(wrapper.get("t")) if wrapper is not None else level_of(line)[3]
        return metric_record(d, ts)


def metric_record(d: dict[str, Any], ts: float | None) -> Parsed:
    """The record of one of speculators' metric dicts (``{"train": …}`` or ``{"val": …}``,
    as :func:`metric_dict` finds them), stamped ``ts``."""
    step = d.get("global_step")
    epoch = d.get("epoch")
    if isinstance(d.get("train"), dict):
        payload: dict[str, Any] = {"train": _finite(d["train"])}
        for key in ("profile", "lr", "epoch", "global_step"):
            if key in d:
                payload[key] = _finite(d[key])
        if isinstance(step, int):
            payload["step"] = step
        return ("train", payload, ts)
    payload = {"val": _finite(d["val"])}
    if isinstance(epoch, int):
        payload["epoch"] = epoch
    if isinstance(step, int):
        payload["step"] = step
    return ("val", payload, ts)
