"""Decoding one JSON line into a typed record, or into a :class:`Malformed` value.

The fast path is a typed msgspec decoder. It accepts the schema's ``"NaN"``,
``"Infinity"`` and ``"-Infinity"`` strings as floats. Lines that it rejects but
stdlib ``json`` accepts (a bare ``NaN`` written by ``json.dumps`` elsewhere, an
unexpected type in one field) take a slow path; anything else becomes a
``Malformed`` value carrying the reason. Nothing here raises on bad input.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import msgspec

SUPPORTED_SCHEMA = 1

Number = float | None


class Record(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """One line of ``metrics.jsonl`` (schema v1), any kind.

    Envelope fields first; the rest are present only for some kinds.
    """

    kind: str = ""
    v: int = 0
    seq: int = -1
    w: str = ""
    ts: float = 0.0
    rank: int = 0
    # train / val
    step: int | None = None
    global_step: int | None = None
    epoch: int | None = None
    train: dict[str, Number] | None = None
    val: dict[str, Number] | None = None
    profile: dict[str, Any] | None = None
    lr: float | dict[str, Number] | None = None
    # hparams
    hparams: dict[str, Any] | None = None
    # log
    level: str | None = None
    logger: str | None = None
    msg: str | None = None
    # lifecycle / ckpt
    event: str | None = None
    # everything else (gpu, io, ckpt, heartbeat, lifecycle details) stays generic
    data: dict[str, Any] | None = None


_KNOWN = frozenset(Record.__struct_fields__)


@dataclass(frozen=True, slots=True)
class Malformed:
    """A line that is not a record: where it was and why."""

    line_no: int
    offset: int
    reason: str
    excerpt: str


_decoder = msgspec.json.Decoder(Record, strict=False)
_generic = msgspec.json.Decoder(strict=False)


def _coerce(obj: dict[str, Any]) -> Record:
    """Build a Record from a generic dict (slow path); unknown fields go to ``data``."""
    known = {k: v for k, v in obj.items() if k in _KNOWN and k != "data"}
    extra = {k: v for k, v in obj.items() if k not in _KNOWN}
    if not isinstance(known.get("kind", ""), str):
        raise ValueError("'kind' is not a string")
    if not known.get("kind"):
        known["kind"] = infer_kind(obj)
    for numeric_map in ("train", "val"):
        m = known.get(numeric_map)
        if m is not None:
            if not isinstance(m, dict):
                raise ValueError(f"'{numeric_map}' is not an object")
            known[numeric_map] = {str(k): to_float(v) for k, v in m.items()}
    rec = msgspec.convert(known, Record, strict=False)
    if extra:
        rec.data = extra
    return rec


def infer_kind(obj: dict[str, Any]) -> str:
    """The kind of a line written without our envelope (a plain speculators dict)."""
    if "train" in obj:
        return "train"
    if "val" in obj:
        return "val"
    return "unknown"


def to_float(v: Any) -> float | None:
    """A metric value as float: numbers, the non-finite strings, or None."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)  # "NaN", "Infinity", "-Infinity", "1e-3"
        except ValueError:
            return None
    return None


def decode_line(line: bytes, line_no: int = 0, offset: int = 0) -> Record | Malformed:
    """Decode one line (without its newline). Never raises."""
    try:
        rec = _decoder.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError):
        pass
    else:
        if not rec.kind:
            rec.kind = _kind_from_record(rec)
        if rec.data is None and rec.kind not in _TYPED_KINDS:
            # gpu/io/ckpt/heartbeat/lifecycle payloads: keep the untyped fields too
            return _with_extras(line, rec, line_no, offset)
        return rec
    return _slow_path(line, line_no, offset)


_TYPED_KINDS = frozenset({"train", "val", "log", "hparams"})


def _kind_from_record(rec: Record) -> str:
    if rec.train is not None:
        return "train"
    if rec.val is not None:
        return "val"
    return "unknown"


def _with_extras(line: bytes, rec: Record, line_no: int, offset: int) -> Record | Malformed:
    try:
        obj = _generic.decode(line)
    except msgspec.DecodeError as e:  # pragma: no cover - the typed decode succeeded
        return Malformed(line_no, offset, f"invalid JSON: {e}", _excerpt(line))
    extra = {k: v for k, v in obj.items() if k not in _KNOWN}
    if extra:
        rec.data = extra
    return rec


def _slow_path(line: bytes, line_no: int, offset: int) -> Record | Malformed:
    if not line.strip():
        return Malformed(line_no, offset, "empty line", "")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return Malformed(line_no, offset, "not UTF-8", _excerpt(line))
    try:
        obj = json.loads(text)  # accepts NaN / Infinity tokens written by json.dumps
    except (ValueError, RecursionError) as e:
        reason = "truncated or invalid JSON" if isinstance(e, ValueError) else "nested too deeply"
        return Malformed(line_no, offset, f"{reason}: {e}"[:200], _excerpt(line))
    if not isinstance(obj, dict):
        return Malformed(
            line_no, offset, f"not a JSON object ({type(obj).__name__})", _excerpt(line)
        )
    try:
        return _coerce(obj)
    except (msgspec.ValidationError, ValueError, TypeError) as e:
        return Malformed(line_no, offset, f"unexpected field type: {e}"[:200], _excerpt(line))


def _excerpt(line: bytes, n: int = 120) -> str:
    text = line[:n].decode("utf-8", errors="replace")
    return text + ("…" if len(line) > n else "")


def is_finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)
