"""The column path: a catch-up's training steps enter the state as columns.

A catch-up meets thousands of training steps at a time. Decoded by the reader's
learned typed decoders (lean :class:`~eagle3_tui.model.records.TrainStep` values) or
sent as columns by the agent (a ``C`` frame, model/segments.py), they are checked
and stored a whole batch at once: a few C-level passes over arrays instead of a
dict of values per step (the 45,000-step log of benchmarks/bench_ingest.py ingests
in ~80 ms). This module cuts such a batch and checks it: the steps' columns, their
order, each writer's sequence numbers (consecutive, continuing the writer's). What
it finds is applied by :class:`~eagle3_tui.model.state.RunState`; a batch that is
not uniform is applied record by record there instead.

Pure: no textual, no asyncssh.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Any, NamedTuple, cast

import numpy as np
import numpy.typing as npt

from eagle3_tui.model.reader import Item, Restarted
from eagle3_tui.model.records import (
    COUNT_LIMIT,
    EPOCH_LIMIT,
    PROFILE_FIELDS,
    SUPPORTED_SCHEMA,
    TS_LIMIT,
    AnyRecord,
    Deferred,
    Malformed,
    TrainMetrics,
    TrainStep,
    accuracies_valid,
    accuracy_keys,
    struct_columns,
)
from eagle3_tui.model.sequences import Spans, Writers

BATCH_MIN = 16
"""Batches at least this big try the column path."""

_W = attrgetter("w")
_V = attrgetter("v")
_SEQ = attrgetter("seq")
_SEQ_F = attrgetter("seq_f")
_KIND = attrgetter("kind")
_STEP = attrgetter("step")
_TS = attrgetter("ts")
_LR = attrgetter("lr")
_EPOCH = attrgetter("epoch")
_ENVELOPE = (("seq", _SEQ), ("step", _STEP), ("ts", _TS), ("lr", _LR), ("epoch", _EPOCH))
_TRAIN = attrgetter("train")
_PROFILE = attrgetter("profile")


@dataclass(slots=True)
class Batch:
    """A batch cut for the column path (:meth:`~eagle3_tui.model.state.RunState.apply_all`)."""

    types: set[type]
    recs: list[AnyRecord]
    """The batch without its malformed lines."""
    trains: list[AnyRecord]
    """Its training steps (``recs`` itself when it holds nothing else)."""
    cols: dict[str, npt.NDArray[np.float64]]
    """The steps' columns (:func:`lean_columns` or :func:`record_columns`)."""
    steps: npt.NDArray[np.int64]
    kinds: npt.NDArray[np.object_] | None = None
    """Each record's kind, when not all are training steps; ``rec_arr`` the records."""
    rec_arr: npt.NDArray[np.object_] | None = None


@dataclass(slots=True)
class StepColumns:
    """Training steps of one writer as columns (a columns frame's, model/segments.py)."""

    w: str
    seqs: npt.NDArray[np.int64]
    steps: npt.NDArray[np.int64]
    ts: npt.NDArray[np.float64]
    epoch: npt.NDArray[np.int64]
    versions: npt.NDArray[np.int64]
    keys: tuple[str, ...]
    """The ``train`` keys, in the lines' order."""
    columns: dict[str, npt.NDArray[Any]]
    """The table's columns: ``train/<key>``, ``profile/<field>``, ``lr``, ``epoch``."""

    def block(self) -> StepBlock:
        return step_block(self.steps, self.ts, self.columns, self.keys)


@dataclass(frozen=True, slots=True)
class Envelopes:
    """Old samples of a columns frame by their envelopes alone (the client keeps the
    newest few hundred of each kind; these only count: records, each writer's sequence
    numbers, the run's first and last time). Arrays, one entry per sample, in file order."""

    at: npt.NDArray[np.int64]
    """Each one's offset in the file."""
    before: npt.NDArray[np.int64]
    """How many of the frame's steps come before each."""
    kind: npt.NDArray[np.int64]
    kinds: tuple[str, ...]
    w: npt.NDArray[np.int64]
    writers: tuple[str, ...]
    seq: npt.NDArray[np.int64]
    ts: npt.NDArray[np.float64]

    @property
    def n(self) -> int:
        return len(self.at)

    def items(self) -> list[Deferred]:
        """Each as a :class:`Deferred` without its line (the record-by-record path)."""
        kinds, writers = self.kinds, self.writers
        return [
            Deferred(kinds[k], seq, writers[w], ts, b"", 0, 0)
            for k, w, seq, ts in zip(
                self.kind.tolist(),
                self.w.tolist(),
                self.seq.astype(np.float64).tolist(),
                self.ts.tolist(),
                strict=True,
            )
        ]


class StepBlock(NamedTuple):
    """Training steps as the table takes them at once: increasing ``steps``, their
    times, the table's columns by key, and the ``train`` keys."""

    steps: npt.NDArray[np.int64]
    ts: npt.NDArray[np.float64]
    columns: dict[str, npt.NDArray[Any]]
    keys: tuple[str, ...]


def step_block(
    steps: npt.NDArray[np.int64],
    ts: npt.NDArray[np.float64],
    columns: dict[str, npt.NDArray[Any]],
    keys: tuple[str, ...],
) -> StepBlock:
    """The block of these columns, without the profile timings no step logged (NaN in
    every row: left out, as a single record's absent timings are)."""
    for k in PROFILE_FIELDS:
        col = columns.get("profile/" + k)
        if col is not None and bool(np.isnan(col).all()):
            del columns["profile/" + k]
    return StepBlock(steps, ts, columns, keys)


def batch_block(batch: Batch) -> StepBlock:
    """The batch's training steps as the table's columns."""
    cols, trains = batch.cols, batch.trains
    keys = cast("TrainMetrics", _TRAIN(trains[0])).__keys__
    columns = {"train/" + k: cols["train/m" + str(i)] for i, k in enumerate(keys)}
    for k in PROFILE_FIELDS:
        col = cols.get("profile/" + k)
        if col is not None:
            columns["profile/" + k] = col
    columns.update((k, v) for k, v in cols.items() if k == "lr" or k.startswith("lr/"))
    columns["epoch"] = cols["epoch"]
    return step_block(batch.steps, cols["ts"], columns, keys)


def others_batch(recs: list[Item], steps: npt.NDArray[np.int64]) -> Batch:
    """A columns frame's other records (not steps), as the batch path applies them."""
    rec_arr = np.fromiter(recs, dtype=object, count=len(recs))
    kinds = np.fromiter(map(_KIND, recs), object, len(recs))
    return Batch(set(), cast("list[AnyRecord]", recs), [], {}, steps, kinds, rec_arr)


def others_apart(recs: list[Item]) -> bool:
    """Whether a columns frame's other records can be applied apart from its steps: no
    restart, no training step among them, each with its writer."""
    return not any(type(r) is Restarted or _KIND(r) == "train" or not _W(r) for r in recs)


def rows_valid(rows: StepColumns) -> bool:
    """:func:`steps_valid` and :func:`record_columns`'s demands, of columns (an
    accuracy outside [0, 1] among them: the rows are checked as records, line by line)."""
    steps, ts, v = rows.steps, rows.ts, rows.versions
    if len(steps) > 1 and not bool((np.diff(steps) > 0).all()):
        return False
    if not bool((v >= 1).all()) or bool((v > SUPPORTED_SCHEMA).any()):
        return False
    if not bool((ts > 0).all()) or not np.isfinite(ts).all():
        return False
    cols, keys = rows.columns, rows.keys
    accuracies = [cols.get("train/" + keys[i]) for i in accuracy_keys(keys)]
    if not accuracies_valid([c for c in accuracies if c is not None]):
        return False
    return int(steps[0]) >= 0 and int(rows.seqs[0]) >= 0


def split_batch(items: list[Item]) -> Batch | None:
    """The training steps of ``items`` and their columns; None when it has a restart,
    fewer than :data:`BATCH_MIN` steps, or steps the typed columns cannot hold."""
    types = set(map(type, items))
    if Restarted in types:
        return None
    recs = cast(
        "list[AnyRecord]",
        [it for it in items if type(it) is not Malformed] if Malformed in types else items,
    )
    kind_arr = rec_arr = None
    if len(types) == 1 and issubclass(next(iter(types)), TrainStep):
        # the common catch-up: nothing but lean training steps (the lean decoder
        # makes TrainStep values of training steps only)
        trains = recs
    else:
        kinds = list(map(_KIND, recs))
        if kinds.count("train") == len(recs):
            trains = recs
        else:
            # object arrays via fromiter: ~10x faster than from a list here
            rec_arr = np.fromiter(recs, dtype=object, count=len(recs))
            kind_arr = np.fromiter(kinds, object, len(kinds))
            trains = rec_arr[kind_arr == "train"].tolist()
    if len(trains) < BATCH_MIN:
        return None
    cols = lean_columns(trains) if isinstance(trains[0], TrainStep) else None
    if cols is None:
        cols = record_columns(trains)
        if cols is None:
            return None
    with np.errstate(invalid="ignore"):  # a step past int64 (steps_valid refuses it)
        steps = cols["step"].astype(np.int64)
    return Batch(types, recs, trains, cols, steps, kind_arr, rec_arr)


def steps_valid(batch: Batch, unnamed_writer: bool) -> bool:
    """Increasing steps, none negative; and what :func:`record_problem` asks of each
    line, for the whole batch at once: our writer's lines (``v``) carry a writer and a
    finite, positive time; accuracies are in [0, 1] (or NaN)."""
    steps, ts = batch.steps, batch.cols["ts"]
    if len(steps) > 1 and not bool((np.diff(steps) > 0).all()):
        return False
    if not bool((ts <= TS_LIMIT).all()) or int(steps[-1]) >= COUNT_LIMIT:
        return False  # the careful path says which line, and why
    if "v" in batch.cols and (
        unnamed_writer or not bool((ts > 0).all()) or not np.isfinite(ts).all()
    ):
        return False
    keys = cast("TrainMetrics", _TRAIN(batch.trains[0])).__keys__
    if not accuracies_valid([batch.cols[f"train/m{i}"] for i in accuracy_keys(keys)]):
        return False  # an accuracy outside [0, 1]: the careful path says which line
    return int(steps[0]) >= 0


def lean_columns(trains: list[AnyRecord]) -> dict[str, npt.NDArray[np.float64]] | None:
    """The columns of lean training steps (see :func:`struct_columns`), keyed as
    :func:`record_columns` keys them; None unless every row has an integral seq,
    step and epoch, a float lr and a learned ``train`` struct."""
    if not isinstance(cast("TrainStep", trains[0]).train, TrainMetrics):
        return None
    cols = struct_columns(trains)
    if cols is None:
        return None
    step = cols.get("step_f", cols.get("global_step_f"))
    seq, epoch = cols.get("seq_f"), cols.get("epoch_f")
    if step is None or seq is None or epoch is None:
        return None
    first_lr = cast("TrainStep", trains[0]).lr_f
    if isinstance(first_lr, TrainMetrics):  # one lr per optimizer, as "lr/<name>"
        for i, name in enumerate(first_lr.__keys__):
            cols["lr/" + name] = cols[f"lr_f/m{i}"]
    elif (lr := cols.get("lr_f")) is not None:
        cols["lr"] = lr
    else:
        return None
    if "v_f" in cols:  # our envelope (its version checked by the decoder)
        cols["v"] = cols["v_f"]
    seq, step, epoch, ts = (a.astype(np.float64) for a in (seq, step, epoch, cols["ts"]))
    ints = np.concatenate((seq, step, epoch))
    with np.errstate(invalid="ignore"):  # inf - inf: NaN, which is not 0
        if not bool((ints - np.floor(ints) == 0).all()):  # False for NaN, ±inf, 2.5
            return None
    if not bool((np.abs(ints) < COUNT_LIMIT).all()) or not bool((epoch < EPOCH_LIMIT).all()):
        return None  # past a float's exact integers: the careful path reads each line
    cols.update(seq=seq, step=step, epoch=epoch, ts=ts)
    return cols


def record_columns(trains: list[AnyRecord]) -> dict[str, npt.NDArray[np.float64]] | None:
    """The columns of training steps decoded as records (or a mix of records and
    lean steps): ``seq``, ``step``, ``ts``, ``lr``, ``epoch``, ``train/m<i>`` and
    ``profile/<field>``; None for a None step or train, a dict lr, a str epoch..."""
    metrics = list(map(_TRAIN, trains))
    if not isinstance(metrics[0], TrainMetrics):
        return None
    train = struct_columns(metrics)
    if train is None:  # a None train, or another run's keys, among them
        return None
    cols = {"train/" + k: v for k, v in train.items()}
    profiles = list(map(_PROFILE, trains))
    if None not in profiles:
        profile = struct_columns(profiles)
        if profile is None:
            return None
        cols.update(("profile/" + k, v) for k, v in profile.items())
    elif any(p is not None for p in profiles):
        return None
    n = len(trains)
    try:
        for name, get in _ENVELOPE:
            cols[name] = np.fromiter(map(get, trains), dtype=np.float64, count=n)
        versions = np.fromiter(map(_V, trains), dtype=np.float64, count=n)
    except (TypeError, ValueError):
        return None
    if bool(versions.all()):  # our envelope on every line, a version this reader reads
        if bool((versions > SUPPORTED_SCHEMA).any()):
            return None
        cols["v"] = versions
    elif bool(versions.any()):  # a mix of plain dicts and enveloped lines
        return None
    return cols


def spans(groups: dict[str, npt.NDArray[np.int64]], writers: Writers) -> Spans | None:
    """Each writer's (first, last) sequence number, from its numbers in file order;
    None unless they are consecutive and continue the writer's (in ``writers``): a
    repeat, a number ahead of the writer's (held until its next record says whose it
    is: model/sequences.py) or a writer with a record ahead are checked record by record."""
    out: Spans = {}
    for writer, mine in groups.items():
        first = int(mine[0])
        if first < 0 or (len(mine) > 1 and not bool((np.diff(mine) == 1).all())):
            return None
        known = writers.get(writer)
        if known is not None and (
            first < known.next_seq
            or known.ahead is not None
            or (first > known.next_seq and not writers.jump_taken(writer))
        ):
            return None
        out[writer] = (first, int(mine[-1]))
    return out


def _exact_seqs(seqs: npt.NDArray[np.float64]) -> bool:
    """Whether every sequence number is one a float64 holds exactly (finite, below
    2**53): a line may say any number of digits, which the careful path counts as the
    line says them."""
    return bool((np.abs(seqs) < 2.0**53).all())  # (NaN compares False)


def batch_spans(batch: Batch, writers: Writers) -> Spans | None:
    """Each writer's first and last sequence number in ``batch``; None unless they
    are consecutive and continue the writer's (a repeat: the careful path drops it)."""
    recs = batch.recs
    if batch.trains is recs:
        seqs = batch.cols["seq"].astype(np.int64)
    else:
        # lean steps and the deferred others have a float seq_f: one C-level pass
        lean = type(batch.trains[0])
        fast = issubclass(lean, TrainStep) and batch.types - {Malformed} <= {lean, Deferred}
        try:
            floats = np.fromiter(
                map(_SEQ_F if fast else _SEQ, recs), dtype=np.float64, count=len(recs)
            )
        except (TypeError, ValueError):  # a missing seq (None)
            return None
        if not _exact_seqs(floats):  # a seq the record did not have (NaN), or not exact
            return None
        seqs = floats.astype(np.int64)
    names = list(map(_W, recs))
    unique = set(names)
    if len(unique) == 1:
        groups = {names[0]: seqs}
    else:
        arr = np.fromiter(names, object, len(names))  # str objects: no str dtype to infer
        groups = {w: seqs[arr == w] for w in unique}
    return spans(groups, writers)


def row_spans(
    rows: StepColumns,
    recs: list[Item],
    before: list[int],
    writers: Writers,
    envelopes: Envelopes | None = None,
    places: list[int] | None = None,
) -> Spans | None:
    """:func:`batch_spans` of a columns frame's steps and its other records, in file
    order (``before[i]``: how many steps come before ``recs[i]``); with ``envelopes``,
    theirs too (``places``: where each record is in the file, to put them in order)."""
    groups = {rows.w: rows.seqs}
    if recs or envelopes is not None:
        try:  # a Deferred's seq_f is None without a seq: the careful path then
            seqs = np.fromiter(
                (r.seq_f if type(r) is Deferred else _SEQ(r) for r in recs),
                np.float64,
                len(recs),
            )
        except (TypeError, ValueError):
            return None
        if not _exact_seqs(seqs):
            return None
        seqs_i = seqs.astype(np.int64)
        names = list(map(_W, recs))
        # each one's writer by number (a few writers; the envelopes' by their index):
        # masks of ints, not of str objects compared one by one
        known = list(dict.fromkeys([*names, *(envelopes.writers if envelopes is not None else ())]))
        number = {w: i for i, w in enumerate(known)}
        codes = np.fromiter(map(number.__getitem__, names), np.int64, len(names))
        at = np.asarray(before, dtype=np.int64)
        if envelopes is not None:
            if places is None or len(places) != len(recs):
                return None
            order = np.argsort(
                np.concatenate((np.asarray(places, dtype=np.int64), envelopes.at)), kind="stable"
            )
            env_codes = np.asarray([number[w] for w in envelopes.writers], dtype=np.int64)
            seqs_i = np.concatenate((seqs_i, envelopes.seq))[order]
            codes = np.concatenate((codes, env_codes[envelopes.w]))[order]
            at = np.concatenate((at, envelopes.before))[order]
        for i, w in enumerate(known):
            mask = codes == i
            if not mask.any():
                continue
            if w == rows.w:  # the steps' own writer: its other records among them
                groups[w] = np.insert(rows.seqs, at[mask], seqs_i[mask])
            else:
                groups[w] = seqs_i[mask]
    return spans(groups, writers)


def batch_startups(
    ts: npt.NDArray[np.float64], starts: list[float]
) -> tuple[list[float], float | None]:
    """The start-ups a batch's steps end: from each process start (``starts``: their
    times, before or in the batch) to its first step in it. Returns those ended, and
    the first step's time of the process still starting (None: none is)."""
    ended: list[float] = []
    if not starts:
        return ended, None
    for start, following in zip(starts, [*starts[1:], None], strict=True):
        mine = ts >= start
        if following is not None:
            mine &= ts < following
        if bool(mine.any()):
            first = float(ts[mine].min())
            if following is None:
                return ended, first
            ended.append(first - start)
    return ended, None
