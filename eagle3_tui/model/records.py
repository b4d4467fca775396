"""Decoding JSON lines into typed records, or into :class:`Malformed` values.

The fast path is one typed msgspec decoder for every kind (unknown fields are
ignored, so newer writers stay readable). It accepts the schema's ``"NaN"``,
``"Infinity"`` and ``"-Infinity"`` strings as floats. A line it rejects but
stdlib ``json`` accepts (a bare ``NaN`` written by ``json.dumps`` elsewhere, a
number where a string was expected) takes a slow, tolerant path; anything else
becomes a ``Malformed`` value carrying the reason. Nothing here raises on bad
input.

Pure: no textual, no asyncssh.

Over 600 lines: the schema's record types, their fast decoders and the tolerant slow
path must agree field by field; they are kept in one file so a change to one is seen
next to the others.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import re
from dataclasses import dataclass
from datetime import datetime
from itertools import repeat
from operator import attrgetter
from typing import Annotated, Any, ClassVar, cast

import msgspec
import numpy as np
import numpy.typing as npt

from eagle3_tui.telemetry.columns import MONITOR_PROFILE
from eagle3_tui.telemetry.schema import Kind

DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)
"""What a decode of a line another process wrote may raise: msgspec raises
``RecursionError`` for one nested past its stack (``[`` 100,000 times), not a
DecodeError, and that line is malformed like any other."""


SUPPORTED_SCHEMA = 1
"""The major version of the JSON-lines schema this reader reads: a line with a higher
``v`` is reported as malformed (upgrade eagle3-tui), never applied as version 1."""
KINDS = Kind.ALL
"""Every kind of record (one list, the writer's: ``telemetry/schema.py``)."""

Number = float | None


class GpuDevice(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """One device in a ``gpu`` record."""

    index: int = 0
    uuid: str = ""
    name: str = ""
    util: Number = None
    mem_used: Number = None
    mem_total: Number = None
    power_w: Number = None
    temp_c: Number = None
    pids: list[int] = []
    local_rank: int | None = None
    """Under torchrun: the local rank using it (a node's sampler reads every device)."""
    host: str = ""
    """Not in the JSON device: the record's ``host``, set when the record is applied."""


class IoWorker(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """One process in an ``io`` record: what it read in the interval."""

    pid: int = 0
    role: str = ""
    read_bytes: Number = None
    read_total: Number = None
    files: list[str] = []
    rank: int = 0
    """Not in the JSON worker: the record's ``rank``, set when the record is applied."""
    host: str = ""


PROFILE_FIELDS = MONITOR_PROFILE


class Profile(msgspec.Struct, kw_only=True, gc=False):
    """The per-step timings of speculators' ``_StepTimer.profile`` that the monitor uses.

    Step time, throughput and data starvation (the share of the step spent
    waiting for data); the others (fetch_ms, fwd_ms, bwd_ms, opt_ms, queue_ms,
    h2d_ms, clip_ms, memory_mb) are skipped at decode time: each kept field costs
    ~1 % of a catch-up.
    """

    __float_fields__: ClassVar[frozenset[str]] = frozenset(PROFILE_FIELDS)
    """Fields typed plain ``float``: a float in every instance (see :func:`struct_columns`)."""

    step_ms: float = math.nan
    tokens_per_s: float = math.nan
    fetch_frac: float = math.nan


_NO_RAW = msgspec.Raw(b"")
_STEP_NAMES = {f"{name}_f": name for name in ("seq", "step", "global_step", "epoch", "lr", "v")}
"""The lean step's float fields and their JSON names (see :class:`TrainStep`)."""


class Record(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """One line of ``metrics.jsonl`` (schema v1), any kind.

    The envelope first; the other fields are present only for some kinds (see
    docs/ARCHITECTURE.md). Fields this reader does not know are ignored.
    """

    kind: str = ""
    seq: int = -1
    w: str = ""
    ts: float = 0.0
    step: int | None = None
    global_step: int | None = None
    epoch: int | str | None = None
    profile: Profile | None = None
    lr: float | dict[str, Number] | None = None
    v: int = 0
    rank: int = 0
    # train / val
    train: dict[str, Number] | None = None
    val: dict[str, Number] | None = None
    # hparams
    hparams: dict[str, Any] | None = None
    # log
    level: str | None = None
    logger: str | None = None
    msg: str | dict[str, Any] | None = None
    """The message of a ``log`` record; a dict in a line of a user's own JSON handler
    (``{"t", "logger", "level", "msg": {speculators metrics}}``), unwrapped on decode."""
    t: float | str | None = None
    """The time of such a handler's line (epoch seconds or ISO 8601): no ``ts`` there."""
    # lifecycle and ckpt
    event: str | None = None
    pid: int | None = None
    error: str | None = None
    path: str | None = None
    duration_s: Number = None
    written_at: Number = None
    """A save seen by polling (``inferred``): its files' newest time on the host."""
    training_state: dict[str, Any] | None = None
    """A numbered checkpoint's ``training_state.json`` (``epoch``, ``local_step``,
    ``global_step``: the steps done), with its ``save_finished`` and ``completed``."""
    complete: bool | None = None
    checkpoints: Any = None
    """An ``inventory``'s checkpoints found when telemetry began (a run resumed, or a
    training attached to mid-way): ``[{"name", "epoch", "bytes", "complete",
    "written_at"}, ...]``, with ``best`` the one ``checkpoint_best`` names."""
    best: Any = None
    # gpu
    status: str | None = None
    host: str | None = None
    devices: msgspec.Raw = _NO_RAW
    """``list[GpuDevice]`` as raw JSON: decoded only when applied (see :func:`gpu_devices`)."""
    # io
    interval_s: Number = None
    workers: msgspec.Raw = _NO_RAW
    """``list[IoWorker]`` as raw JSON: decoded only when applied (see :func:`io_workers`)."""
    files_read: int | None = None
    # io / ckpt / heartbeat: bytes read, checkpoint size, bytes written
    bytes: Number = None
    # heartbeat
    written: int | None = None
    dropped: int | None = None
    errors: dict[str, int] | None = None
    overhead_us: dict[str, Number] | None = None
    stats_age_s: Number = None
    """How old the trainer's own figures are: grows while its interpreter is stuck."""
    trainer: dict[str, Any] | None = None
    """The sidecar's look at the trainer process: ``pid``, ``alive``, ``state``, ``cpu_s``."""
    # proc / progress: written by the agent observing a run without telemetry
    alive: bool | None = None
    """``proc``: whether the trainer still runs."""
    process: dict[str, Any] | None = None
    """``proc``: the trainer (see ``model/observed.py``: ``ProcessInfo``)."""
    processes: msgspec.Raw = _NO_RAW
    """``proc``: its process tree, decoded when applied (``observed.decode_members``)."""
    bar: dict[str, Any] | None = None
    """``progress``: an epoch progress bar of its output (``observed.Bar``)."""
    # stack
    thread: str | None = None
    frames: msgspec.Raw = _NO_RAW
    """A ``stack`` record's frames as raw JSON (see ``model/stack.py``)."""
    quiet_s: Number = None
    last_step: int | None = None
    """The step this rank logged last (every rank's heartbeat has it)."""
    where: dict[str, Any] | None = None
    """Under torchrun: the rank's main thread (``frame``, ``collective``, ``for_s``)."""
    exit_status: int | None = None
    """A ``crash`` event from a sidecar: how the trainer ended (-N: signal N), when known."""
    run_id: str | None = None
    """``start``, ``resume``, ``file``: the run the writer belongs to."""
    sidecar: dict[str, Any] | None = None
    """A sidecar's heartbeat: its own writer's figures (``dropped``...)."""
    # lifecycle ``file``: the writer found its file deleted, replaced, truncated, or
    # refused what was there, and wrote this first in the file it (re)created
    change: str | None = None
    file: str | None = None
    noticed: float | None = None
    previous: dict[str, Any] | None = None
    moved_to: str | None = None
    found: str | None = None
    written_before: int | None = None
    # lifecycle ``write_gap``: records a stretch of failed writes never wrote
    reason: str | None = None
    records: int | None = None
    first_seq: int | None = None
    last_seq: int | None = None
    since: float | None = None
    until: float | None = None

    @property
    def step_or_global(self) -> int | None:
        return self.step if self.step is not None else self.global_step


_FIELDS = frozenset(Record.__struct_fields__)


@dataclass(frozen=True, slots=True)
class Malformed:
    """A line that is not a record: where it was and why."""

    line_no: int
    offset: int
    reason: str
    excerpt: str


_decoder = msgspec.json.Decoder(Record, strict=False)
_KIND = attrgetter("kind")
_SEQ_F = attrgetter("seq_f")
_W = attrgetter("w")
_TS = attrgetter("ts")


def infer_kind(rec: Record) -> str:
    """The kind of a line written without our envelope: a plain speculators dict
    (``train`` or ``val``), or a message line of a user's JSON handler (``logger``
    and a text ``msg``); ``unknown`` otherwise (not applied: counted as malformed)."""
    if rec.train is not None:
        return "train"
    if rec.val is not None:
        return "val"
    if isinstance(rec.msg, str) and rec.logger is not None:
        return "log"
    return "unknown"


def _time_of(t: float | str | None) -> float:
    """Epoch seconds from a handler's ``t`` (a number or ISO 8601 text); 0.0 if neither."""
    if isinstance(t, (int, float)) and math.isfinite(t):
        return float(t)
    if isinstance(t, str):
        with contextlib.suppress(ValueError):
            return datetime.fromisoformat(t.replace(",", ".")).timestamp()
    return 0.0


def _plain(rec: Record) -> Record:
    """A line without ``kind``: its kind inferred, a handler-wrapped speculators dict
    (``msg`` an object) unwrapped, a handler's ``t`` as ``ts``."""
    if isinstance(rec.msg, dict):
        inner = rec.msg
        if isinstance(inner.get("train"), dict) or isinstance(inner.get("val"), dict):
            rec = _coerce({k: v for k, v in inner.items() if k != "t"} | {"t": rec.t})
    if not rec.kind:
        rec.kind = infer_kind(rec)
    if not rec.ts and rec.t is not None:
        rec.ts = _time_of(rec.t)
    return rec


def _no_kind(line: bytes, line_no: int, offset: int) -> Malformed:
    """A JSON object that is not a record of ours: say what it looks like."""
    try:
        keys = ", ".join(list(json.loads(line))[:8])
    except (ValueError, RecursionError, TypeError):
        keys = "?"
    return Malformed(
        line_no,
        offset,
        f"a JSON object without 'kind' (keys: {keys}): not eagle3-tui's schema"[:200],
        _excerpt(line),
    )


def to_float(v: Any) -> float | None:
    """A metric value as float: numbers, numeric strings (the schema's ``"NaN"``,
    ``"Infinity"``, ``"-Infinity"``, as the typed decoders take them), or None (a
    boolean, an object, any other text: not a metric value)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        try:
            return float(v)
        except OverflowError:  # an integer past a float's range
            return None
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
    except DECODE_ERRORS:
        rec_or_bad = _slow_path(line, line_no, offset)
        if isinstance(rec_or_bad, Malformed):
            return rec_or_bad
        rec = rec_or_bad
    if not rec.kind or rec.kind == "unknown":
        try:
            rec = _plain(rec)
        except (msgspec.ValidationError, ValueError, TypeError) as e:
            return Malformed(line_no, offset, f"unexpected field type: {e}"[:200], _excerpt(line))
        if rec.kind == "unknown":
            return _no_kind(line, line_no, offset)
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
        kind = type(obj).__name__
        return Malformed(line_no, offset, f"not a JSON object ({kind})", _excerpt(line))
    try:
        return _coerce(obj)
    except (msgspec.ValidationError, ValueError, TypeError) as e:
        return Malformed(line_no, offset, f"unexpected field type: {e}"[:200], _excerpt(line))


_ENVELOPE_TYPES: dict[str, tuple[type, ...]] = {
    "kind": (str,),
    "seq": (int,),
    "w": (str,),
    "ts": (int, float),
    "v": (int,),
    "step": (int,),
    "global_step": (int,),
}
"""Fields a line is judged by: a wrong type makes the line malformed, never dropped."""


def _envelope_problem(obj: dict[str, Any]) -> str | None:
    for name, types in _ENVELOPE_TYPES.items():
        value = obj.get(name)
        if value is None:
            continue
        if isinstance(value, float) and int in types and value.is_integer():
            continue  # 3.0 written by another tool: an integer
        if isinstance(value, bool) or not isinstance(value, types):
            want = "an integer" if int in types and float not in types else types[0].__name__
            if types == (int, float):
                want = "a number"
            return f"'{name}' is {value!r:.40}, not {want}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"'{name}' is {value}, not a finite number"
    return None


def _coerce(obj: dict[str, Any]) -> Record:
    """Build a Record from a generic dict. A wrong type in the envelope (``seq``,
    ``w``, ``ts``, ``v``, ``kind``, ``step``) makes it malformed (ValueError); other
    fields of the wrong type are dropped."""
    problem = _envelope_problem(obj)
    if problem is not None:
        raise ValueError(problem)
    known = {k: v for k, v in obj.items() if k in _FIELDS}
    for numeric_map in ("train", "val"):
        m = known.get(numeric_map)
        if m is not None:
            if not isinstance(m, dict):
                raise ValueError(f"'{numeric_map}' is not an object")
            values = {str(k): to_float(v) for k, v in m.items()}
            for k, f in values.items():
                if f is None and m[k] is not None:  # null: not logged this step
                    raise ValueError(f"'{numeric_map}.{k[:40]}' is {m[k]!r:.40}, not a number")
            known[numeric_map] = values
    for raw_field in ("devices", "workers", "processes", "frames"):
        if raw_field in known:
            known[raw_field] = msgspec.Raw(msgspec.json.encode(known[raw_field]))
    prof = known.get("profile")
    if isinstance(prof, dict):
        known["profile"] = {
            k: math.nan if (f := to_float(v)) is None else f
            for k, v in prof.items()
            if k in PROFILE_FIELDS
        }
    try:
        rec = msgspec.convert(known, Record, strict=False)
    except msgspec.ValidationError:
        # keep what is usable: drop each field that does not convert on its own
        usable: dict[str, Any] = {}
        for k, v in known.items():
            try:
                msgspec.convert({**usable, k: v}, Record, strict=False)
            except msgspec.ValidationError:
                continue
            usable[k] = v
        if "kind" in known and "kind" not in usable:
            raise ValueError("'kind' is not a string") from None
        rec = msgspec.convert(usable, Record, strict=False)
    return rec


_devices_decoder = msgspec.json.Decoder(list[GpuDevice], strict=False)
_workers_decoder = msgspec.json.Decoder(list[IoWorker], strict=False)


def gpu_devices(rec: Record) -> list[GpuDevice]:
    """The devices of a ``gpu`` record (raises msgspec errors on a bad list)."""
    return _devices_decoder.decode(rec.devices) if len(rec.devices) else []


def io_workers(rec: Record) -> list[IoWorker]:
    """The processes of an ``io`` record (raises msgspec errors on a bad list)."""
    return _workers_decoder.decode(rec.workers) if len(rec.workers) else []


# ---- specialised decoding of training steps ---------------------------------------


def _NAMEABLE(name: str) -> bool:  # noqa: N802 (a predicate, named as the rule it checks)
    """Whether msgspec can decode a JSON key of this name into a struct field."""
    return not any(c in '"\\' or ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in name)


class TrainMetrics(msgspec.Struct, gc=False):
    """Base of the per-run typed ``train`` structs (see :func:`train_metrics_type`)."""

    __keys__: ClassVar[tuple[str, ...]] = ()
    __float_fields__: ClassVar[frozenset[str]] = frozenset()


def train_metrics_type(keys: tuple[str, ...]) -> type[TrainMetrics]:
    """A Struct whose fields are exactly these ``train`` keys (a missing one is NaN).

    Decoding into it is ~2× faster than into a dict, and ``astuple`` hands the
    values to numpy in one C-level pass. An unknown key fails the decode, so a run
    whose metrics change falls back to the general decoder and is re-learned.
    """
    fields = [(f"m{i}", float, math.nan) for i in range(len(keys))]
    # a name msgspec cannot rename to (a quote, a backslash, a control character: a
    # user's handler may log one) leaves the struct unnamed: its lines then fail the
    # typed decode (an unknown field) and take the general decoder, as a new key does
    named = all(_NAMEABLE(k) for k in keys)
    cls = msgspec.defstruct(
        "TrainMetricsOf",
        fields,  # type: ignore[arg-type, unused-ignore]  # older msgspec stubs: a narrower type
        bases=(TrainMetrics,),
        rename={f"m{i}": k for i, k in enumerate(keys)} if named else None,
        forbid_unknown_fields=True,
        gc=False,
    )
    metrics = cast("type[TrainMetrics]", cls)
    metrics.__keys__ = keys
    metrics.__float_fields__ = frozenset(metrics.__struct_fields__)
    return metrics


def train_items(train: dict[str, Number] | TrainMetrics) -> dict[str, Number]:
    """The ``train`` mapping of a record, whichever decoder produced it."""
    if isinstance(train, TrainMetrics):
        return dict(zip(train.__keys__, msgspec.structs.astuple(train), strict=True))
    return train


# ---- columns out of many decoded structs ----------------------------------------

_msgpack = msgspec.msgpack.Encoder()
_FLOAT64 = 0xCB  # msgpack's marker of a float64: msgspec writes every float as one
_NIL = 0xC0


@functools.cache
def _key_sizes(cls: type[msgspec.Struct]) -> tuple[int, tuple[tuple[str, int, bool], ...]]:
    """Size of a ``cls`` map header, and each field: its name, the size of its
    encoded key, and whether its type makes it a float in every instance."""
    names = cls.__struct_encode_fields__
    header = 1 if len(names) < 16 else 3  # fixmap / map16
    floats: frozenset[str] = getattr(cls, "__float_fields__", frozenset())
    sure = tuple(name in floats for name in cls.__struct_fields__)
    sizes = tuple(len(_msgpack.encode(name)) for name in names)
    return header, tuple(zip(cls.__struct_fields__, sizes, sure, strict=True))


Layout = tuple[int, list[tuple[str, int]], list[int], list[int]]
"""Size of one encoded struct; each float field's column name and where its value
sits; where the header bytes of values that may vary sit, and what they must be."""


def _layout(sample: msgspec.Struct) -> Layout | None:
    """Where everything sits in the msgpack encoding of ``sample``; None if it holds
    a value whose size is not fixed by its header (an int, a list, a dict...)."""
    columns: list[tuple[str, int]] = []
    heads: list[int] = []
    expect: list[int] = []

    def walk(obj: msgspec.Struct, at: int, prefix: str) -> int | None:
        header, fields = _key_sizes(type(obj))
        at += header
        for attr, key_size, sure in fields:
            at += key_size
            value = getattr(obj, attr)
            if type(value) is float:
                columns.append((prefix + attr, at + 1))
                if not sure:  # a `float` field holds a float: only others need a look
                    heads.append(at)
                    expect.append(_FLOAT64)
                at += 9
            elif value is None:
                heads.append(at)
                expect.append(_NIL)
                at += 1
            elif type(value) is str:
                raw = _msgpack.encode(value)
                size = 1 if raw[0] >> 5 == 0b101 else {0xD9: 2, 0xDA: 3, 0xDB: 5}[raw[0]]
                heads.extend(range(at, at + size))  # the length is in the header
                expect.extend(raw[:size])
                at += len(raw)
            elif isinstance(value, msgspec.Struct):
                heads.append(at)  # the map header: a struct, not None
                expect.append(_msgpack.encode(value)[0])
                end = walk(value, at, prefix + attr + "/")
                if end is None:
                    return None
                at = end
            else:
                return None
        return at

    size = walk(sample, 0, "")
    if size is None or size != len(_msgpack.encode(sample)):
        return None
    return size, columns, heads, expect


def struct_columns(structs: list[Any]) -> dict[str, npt.NDArray[np.float64]] | None:
    """Every float field of many structs of one type, as a column each, keyed by
    field name (``parent/field`` inside nested structs); None unless they all share
    one layout (same type, same places for the same kinds of values).

    One msgpack encode (C) writes each float as a big-endian float64 at a fixed
    place of each struct's encoding, and each column is a strided big-endian view of
    that buffer (convert it once, where it is stored): ~2× faster than handing numpy
    the values as Python floats. The header byte of every value that may vary (a
    float or None, a string's length) is checked in every row, so a struct whose
    layout differs yields None, never shifted data.
    """
    n = len(structs)
    if not n or len(set(map(type, structs))) != 1:
        return None
    layout = _layout(structs[0])
    if layout is None:
        return None
    size, columns, heads, expect = layout
    head = 1 if n < 16 else 3 if n < 65536 else 5  # the array header
    buf = bytearray(head + n * size)  # sized: no regrowth while encoding
    _msgpack.encode_into(structs, buf)
    if len(buf) != head + n * size:
        return None
    if heads:
        rows = np.frombuffer(buf, np.uint8, n * size, head).reshape(n, size)
        if not bool((rows[:, heads] == np.array(expect, dtype=np.uint8)).all()):
            return None
    return {name: np.ndarray((n,), ">f8", buf, head + at, (size,)) for name, at in columns}


def _as_int(v: float | None) -> int | None:
    return None if v is None or v != v or v in (math.inf, -math.inf) else int(v)


class TrainStep(msgspec.Struct, kw_only=True, gc=False, rename=_STEP_NAMES):
    """A training step decoded by the lean decoder: only a step's fields, and every
    number a float (``seq_f`` is JSON ``seq``...), so that a batch of them encodes to
    one fixed layout and :func:`struct_columns` reads all its columns in one pass.
    Faster to decode than a :class:`Record`. Built by :class:`Decoders` once the
    run's training keys are known; ``train`` is then a learned :class:`TrainMetrics`.
    The properties give the envelope's usual view (ints, ``-1`` for no seq).
    """

    __float_fields__: ClassVar[frozenset[str]] = frozenset({"ts"})

    # in the order the writer writes them: msgspec then finds each key at first try
    # (~4 % faster decoding than another order)
    v_f: Annotated[float, msgspec.Meta(ge=1, le=SUPPORTED_SCHEMA)] | None = None
    """The schema version: a newer one fails the lean decode (the line is then judged,
    and reported, by :func:`record_problem`), so it is never read as this version."""
    seq_f: float | None = None
    w: str = ""
    ts: float = 0.0
    kind: str = ""
    train: Any = None
    profile: Profile | None = None
    epoch_f: float | None = None
    lr_f: Any = None
    """A float; a learned struct of floats when the run logs one ``lr`` per optimizer."""
    global_step_f: float | None = None
    step_f: float | None = None

    @property
    def seq(self) -> int:
        seq = _as_int(self.seq_f)
        return -1 if seq is None else seq

    @property
    def v(self) -> int:
        """The schema version (0: a line without our envelope)."""
        return 0 if self.v_f is None else int(self.v_f)

    @property
    def step(self) -> int | None:
        return _as_int(self.step_f)

    @property
    def global_step(self) -> int | None:
        return _as_int(self.global_step_f)

    @property
    def step_or_global(self) -> int | None:
        step = self.step
        return step if step is not None else self.global_step

    @property
    def epoch(self) -> int | None:
        return _as_int(self.epoch_f)

    @property
    def lr(self) -> float | dict[str, Number] | None:
        lr = self.lr_f
        return train_items(lr) if isinstance(lr, TrainMetrics) else lr


COUNT_LIMIT = 1 << 53
"""A ``step`` or ``global_step`` at or past this is no count a trainer reaches (nor one
a float holds exactly): the line is malformed, not a run of 2**53 steps (it overflowed
the step table). A ``seq`` of any size is counted as its digits say."""
EPOCH_LIMIT = 1 << 31
TS_LIMIT = 4_102_444_800.0
"""2100-01-01: a ``ts`` past it is no clock's reading (it made a run's pace 0 steps/s)."""


def _counts_problem(rec: Record | TrainStep) -> str | None:
    """A count past what a writer reaches, an epoch past any, a time past 2100."""
    for name, value in (("step", rec.step), ("global_step", rec.global_step)):
        if value is not None and value >= COUNT_LIMIT:
            return f"'{name}' is {value:.6g}: past any count a writer reaches"
    epoch = rec.epoch
    if isinstance(epoch, int) and not 0 <= epoch < EPOCH_LIMIT:
        return f"'epoch' is {epoch:.6g}, not an epoch"
    if rec.ts > TS_LIMIT:
        return f"'ts' is {rec.ts:.6g}: past the year 2100"
    return None


_ACCURACY_RE = re.compile(r"(?:full|cond)_acc_\d+(?:_epoch)?")
"""An acceptance metric (``full_acc_k``, ``cond_acc_k``; ``…_epoch`` in validation):
a probability. One outside [0, 1] is no accuracy (``full_acc_0: 50`` made τ 51)."""


@functools.lru_cache(maxsize=256)
def accuracy_keys(keys: tuple[str, ...]) -> tuple[int, ...]:
    """Where the accuracies are among a ``train`` or ``val`` object's keys."""
    return tuple(i for i, k in enumerate(keys) if _ACCURACY_RE.fullmatch(k))


def _accuracy_problem(values: dict[str, Number] | TrainMetrics | None, where: str) -> str | None:
    """An accuracy outside [0, 1] (NaN is a value a diverged step logs, as a loss is)."""
    if values is None:
        return None
    if isinstance(values, TrainMetrics):
        keys = values.__keys__
        at = accuracy_keys(keys)
        if not at:
            return None
        numbers: tuple[Any, ...] = msgspec.structs.astuple(values)
    else:
        keys = tuple(values)
        at = accuracy_keys(keys)
        if not at:
            return None
        numbers = tuple(values.values())
    for i in at:
        v = numbers[i]
        if v is not None and not 0.0 <= v <= 1.0 and v == v:
            return f"'{where}.{keys[i][:40]}' is {v:.6g}: an accuracy outside [0, 1]"
    return None


def accuracies_valid(columns: list[npt.NDArray[Any]]) -> bool:
    """:func:`_accuracy_problem` of columns of values: none outside [0, 1] (NaN allowed)."""
    for col in columns:
        if not col.dtype.isnative:  # a lean batch's big-endian view: native once (faster)
            col = col.astype(col.dtype.newbyteorder("="))
        if not (col.min() >= 0.0 and col.max() <= 1.0):  # (False too for a NaN among them)
            with np.errstate(invalid="ignore"):
                if bool(((col < 0.0) | (col > 1.0)).any()):
                    return False
    return True


def _integral(x: float | None) -> bool:
    return x is not None and math.isfinite(x) and x == int(x)


def record_problem(rec: Record | TrainStep) -> str | None:
    """Why a decoded line must not move the state (None: it may).

    Every line: a known ``kind`` (a JSON object without one, and without a
    ``train``/``val`` object, is not a record), a schema version ``v`` this reader
    reads. A line of our writer (``v`` present) has the whole envelope: an integer
    ``seq``, a writer ``w``, a finite ``ts``. Each kind has what it is applied by:
    ``train`` a metrics object and an integral step, ``val`` its values, ``log`` a
    text message, ``lifecycle``/``ckpt`` an event, ``hparams`` its object. A
    ``train`` or ``val`` accuracy (``full_acc_k``, ``cond_acc_k``) is in [0, 1] (or NaN).
    """
    if isinstance(rec, TrainStep):
        return _step_problem(rec) or _counts_problem(rec) or _accuracy_problem(rec.train, "train")
    v = rec.v
    if v > SUPPORTED_SCHEMA:
        return (
            f"schema version {v}: this eagle3-tui reads version {SUPPORTED_SCHEMA} "
            "(upgrade eagle3-tui to read it)"
        )
    if v < 0:
        return f"'v' is {v}, not a schema version"
    kind = rec.kind
    if kind not in KINDS:
        if kind in ("", "unknown"):
            return "a JSON object without 'kind': not eagle3-tui's schema"
        return f"unknown kind {kind[:40]!r}"
    if v:
        if rec.seq < 0:
            return f"a {kind} record without 'seq'"
        if not rec.w:
            return f"a {kind} record without 'w' (writer)"
        if not (rec.ts > 0 and math.isfinite(rec.ts)):
            return f"a {kind} record without a valid 'ts'"
    if kind == "train":
        if not isinstance(rec.train, (dict, TrainMetrics)):
            return "a train record without its 'train' metrics"
        step = rec.step_or_global
        if step is None or step < 0:
            return "a train record without 'step' or 'global_step'"
    elif kind == "val" and rec.val is None:
        return "a val record without its 'val' values"
    elif kind == "log" and not isinstance(rec.msg, str):
        return "a log record without a text 'msg'"
    elif kind in ("lifecycle", "ckpt") and not rec.event:
        return f"a {kind} record without 'event'"
    elif kind == "hparams" and rec.hparams is None:
        return "an hparams record without 'hparams'"
    problem = _counts_problem(rec)
    if problem is None and kind == "train":
        return _accuracy_problem(rec.train, "train")
    if problem is None and kind == "val":
        return _accuracy_problem(rec.val, "val")
    return problem


def _step_problem(rec: TrainStep) -> str | None:
    """:func:`record_problem` for a lean training step (its numbers are floats)."""
    if rec.kind != "train":
        return f"unknown kind {rec.kind[:40]!r}" if rec.kind else "a JSON object without 'kind'"
    if rec.v_f is not None:
        if not (_integral(rec.seq_f) and cast("float", rec.seq_f) >= 0):
            return "a train record without an integral 'seq'"
        if not rec.w:
            return "a train record without 'w' (writer)"
        if not (rec.ts > 0 and math.isfinite(rec.ts)):
            return "a train record without a valid 'ts'"
    elif rec.seq_f is not None and not _integral(rec.seq_f):
        return "'seq' is not an integer"
    if rec.train is None:
        return "a train record without its 'train' metrics"
    step = rec.step_f if rec.step_f is not None else rec.global_step_f
    if not (_integral(step) and cast("float", step) >= 0):
        return "a train record without an integral 'step' or 'global_step'"
    if rec.epoch_f is not None and not _integral(rec.epoch_f):
        return "'epoch' is not an integer"
    return None


class Deferred(msgspec.Struct, gc=False):
    """A record of another kind met in a batch of training steps: its envelope is
    known, its payload is decoded only if it is used (:meth:`resolve`). A catch-up
    keeps only the newest few hundred sampler records, so most are never decoded,
    nor even copied out of the chunk they came in."""

    kind: str
    seq_f: float | None
    """As in :class:`TrainStep`, so that a batch's sequence numbers come in one pass."""
    w: str
    ts: float
    buf: bytes
    start: int
    end: int

    @property
    def seq(self) -> int:
        seq = _as_int(self.seq_f)
        if seq is not None and abs(seq) >= 1 << 53 and not self.stub:
            full = self.resolve()  # past a float's exact integers: the line's own digits
            seq = full.seq if isinstance(full, Record) else None
        return -1 if seq is None else seq

    @property
    def line(self) -> bytes:
        return self.buf[self.start : self.end]

    @property
    def stub(self) -> bool:
        """An envelope without its line (an old sample of a columns catch-up, whose
        payload no history keeps): it counts, it is never applied."""
        return self.end == self.start

    def resolve(self) -> Record | Malformed:
        if self.stub:
            return Record(kind=self.kind, seq=self.seq, w=self.w, ts=self.ts, v=1)
        return decode_line(self.line, 0, self.start)


AnyRecord = Record | TrainStep | Deferred


@functools.lru_cache(maxsize=64)
def _typed_decoders(
    keys: tuple[str, ...], lr_keys: tuple[str, ...]
) -> tuple[msgspec.json.Decoder[Record], msgspec.json.Decoder[TrainStep]]:
    """:meth:`Decoders.learn`'s decoders, built once a process for the same keys (each
    run read, a glance's and its whole read's, ~2 ms of struct building each)."""
    metrics = train_metrics_type(keys)
    lean_fields: list[tuple[str, Any, Any]] = [("train", metrics | None, None)]
    if lr_keys:  # a dict of floats as a struct of them: columns in the same pass
        lean_fields.append(("lr_f", float | train_metrics_type(lr_keys) | None, None))
    else:
        lean_fields.append(("lr_f", float | None, None))
    fast = msgspec.defstruct(
        "FastRecord",
        [("train", metrics | None, None)],  # type: ignore[list-item, unused-ignore]  # as above
        bases=(Record,),
        kw_only=True,
        omit_defaults=True,
        gc=False,
    )
    lean = msgspec.defstruct(
        "LeanTrainStep",
        lean_fields,
        bases=(TrainStep,),
        kw_only=True,
        gc=False,
    )
    return (
        msgspec.json.Decoder(cast("type[Record]", fast), strict=False),
        msgspec.json.Decoder(lean, strict=False),
    )


class Decoders:
    """The general decoders, plus faster ones learned from the run's training keys."""

    def __init__(self) -> None:
        self.keys: tuple[str, ...] | None = None
        self.lr_keys: tuple[str, ...] = ()
        self._fast: msgspec.json.Decoder[Record] | None = None
        self._lean: msgspec.json.Decoder[TrainStep] | None = None

    def learn(self, keys: tuple[str, ...], lr_keys: tuple[str, ...] = ()) -> None:
        """Build the typed decoders for training steps with these ``train`` keys (and,
        for a run with several optimizers, e.g. Muon, these ``lr`` keys)."""
        if (keys, lr_keys) == (self.keys, self.lr_keys) or not keys:
            return
        self.keys, self.lr_keys = keys, lr_keys
        self._fast, self._lean = _typed_decoders(keys, lr_keys)

    def saw(self, keys: tuple[str, ...], lr_keys: tuple[str, ...] = ()) -> None:
        """Training steps with these keys were read another way (a columns frame):
        learn as decoding their lines would have, so that the lines after them decode
        the same way (a learned key a step lacks decodes as NaN; a key not learned
        fails the typed decode, which re-learns)."""
        new_keys = self.keys is None or not set(keys) <= set(self.keys)
        if new_keys or not set(lr_keys) <= set(self.lr_keys):
            self.learn(keys, lr_keys)

    def _learn_from(self, data: bytes, start: int, end: int) -> None:
        """Learn the training keys from the first lines of ``data[start:end]``, so that
        a run's first batch is decoded lean too (decoding all of it generically first
        would cost twice)."""
        cut = start
        for _ in range(_PROBE_LINES):
            cut = data.find(b"\n", cut, end) + 1
            if not cut:
                return
        try:
            recs = _decoder.decode_lines(memoryview(data)[start:cut])
        except DECODE_ERRORS:
            return
        for rec in recs:
            if rec.kind == "train" and isinstance(rec.train, dict):
                self.learn(tuple(rec.train), _lr_keys(rec))
                return

    def one(self, line: bytes, line_no: int = 0, offset: int = 0) -> Record | Malformed:
        """Decode one line, typed when it fits the learned training keys. Never raises."""
        if self._fast is not None:
            try:
                rec = self._fast.decode(line)
            except DECODE_ERRORS:
                pass
            else:
                if rec.kind:
                    return rec
        return decode_line(line, line_no, offset)

    def batch(self, lines: list[bytes]) -> list[AnyRecord] | None:
        """Decode many lines in one call; None if any line fails."""
        data = b"\n".join(lines)
        return self.lines(data, 0, len(data), np.frombuffer(data, dtype=np.uint8) == 10)

    def lines(
        self, data: bytes, start: int, end: int, newlines: npt.NDArray[np.bool_]
    ) -> list[AnyRecord] | None:
        """Decode the newline-separated JSON objects of ``data[start:end]``; None unless
        there is exactly one per line. ``newlines`` marks that range's newline bytes
        (counted only once the decode succeeded, and only as much as needed).

        Training steps come back as lean :class:`TrainStep` values when the learned
        keys fit; the other kinds as :class:`Deferred` (envelope now, payload on use).
        """
        buf = memoryview(data)[start:end]
        if self._lean is None:
            self._learn_from(data, start, end)
        if self._lean is not None:
            try:
                lean: list[AnyRecord] = self._lean.decode_lines(buf)  # type: ignore[assignment]
            except DECODE_ERRORS:
                pass
            else:
                count = len(lean)
                kinds = list(map(_KIND, lean))
                if kinds.count("train") == count:
                    if count == int(np.count_nonzero(newlines)) + 1:
                        return lean
                else:
                    # where the other kinds' lines start and end (from the newlines)
                    ends = np.flatnonzero(newlines)
                    if count == len(ends) + 1:
                        return self._defer_others(lean, kinds, ends, data, start, end)
        recs: list[Record] | None = None
        if self._fast is not None:
            try:
                recs = self._fast.decode_lines(buf)
            except DECODE_ERRORS:
                recs = None
        if recs is None:
            try:
                recs = _decoder.decode_lines(buf)
            except DECODE_ERRORS:
                return None
            for rec in reversed(recs):  # re-learn from the newest training step
                if rec.kind == "train" and isinstance(rec.train, dict):
                    keys, lr_keys = tuple(rec.train), _lr_keys(rec)
                    if (keys, lr_keys) != (self.keys, self.lr_keys):
                        self.learn(keys, lr_keys)
                        assert self._fast is not None
                        # decode again, typed: the column path then takes this batch
                        with contextlib.suppress(*DECODE_ERRORS):
                            recs = self._fast.decode_lines(buf)
                    break
        if len(recs) != int(np.count_nonzero(newlines)) + 1:  # e.g. two values on a line
            return None
        if "" in map(_KIND, recs):
            try:
                recs = [rec if rec.kind else _plain(rec) for rec in recs]
            except (msgspec.ValidationError, ValueError, TypeError):
                return None  # line by line: the bad one becomes Malformed with its reason
            if "unknown" in map(_KIND, recs):
                return None  # line by line: each object without kind is reported as such
        return recs  # type: ignore[return-value]

    @staticmethod
    def _defer_others(
        lean: list[AnyRecord],
        kinds: list[str],
        ends: npt.NDArray[np.intp],
        data: bytes,
        start: int,
        end: int,
    ) -> list[AnyRecord]:
        """``lean`` with its lines of other kinds as :class:`Deferred` records."""
        count = len(lean)
        bounds = np.empty(count + 1, dtype=np.intp)
        bounds[0] = -1
        bounds[1:count] = ends
        bounds[count] = end - start
        # object arrays built with fromiter: from a list, numpy would look into every
        # element for a shape (~10x slower)
        others = np.flatnonzero(np.fromiter(kinds, object, count) != "train")
        items = np.fromiter(lean, dtype=object, count=count)
        envs = items[others].tolist()
        # one Deferred per other line, built in C-level passes (no Python loop)
        deferred = map(
            Deferred,
            map(_KIND, envs),
            map(_SEQ_F, envs),
            map(_W, envs),
            map(_TS, envs),
            repeat(data, len(envs)),
            (bounds[others] + (start + 1)).tolist(),
            (bounds[others + 1] + start).tolist(),
        )
        items[others] = np.fromiter(deferred, dtype=object, count=len(envs))
        return cast("list[AnyRecord]", items.tolist())


def _lr_keys(rec: Record) -> tuple[str, ...]:
    """The optimizers of a step whose ``lr`` is a dict of them (else none)."""
    return tuple(rec.lr) if isinstance(rec.lr, dict) else ()


_PROBE_LINES = 64
"""A run's first batch learns its training keys from this many lines, not all."""


def _excerpt(line: bytes, n: int = 120) -> str:
    text = line[:n].decode("utf-8", errors="replace")
    return text + ("…" if len(line) > n else "")
