"""What happened in a run's history stays said after its end: stretches of non-finite
loss, loss spikes, resumes, steps missing (issue 28, item 9)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np

from eagle3_tui.exits import BY_HEALTH as EXIT_BY_HEALTH
from eagle3_tui.model.run import Run
from eagle3_tui.model.snapshot import ViewParams, build_snapshot
from eagle3_tui.model.summary import format_text, summarize
from tests.records import Lines

T0 = 1_800_000_000.0


def run_of(*parts: bytes) -> Run:
    run = Run()
    run.feed(0, b"".join(parts))
    return run


def loss_at(step: int, noise: random.Random) -> float:
    """A tiny training's loss: falling fast, then slowly, with batch-to-batch noise."""
    return 1.5 + 6.0 * math.exp(-step / 40) + noise.gauss(0.0, 0.25)


def nan_step(lines: Lines, step: int, value: str = "NaN") -> bytes:
    """A step whose loss the trainer logged as non-finite, as the telemetry writes it
    (the schema's strings: ``"NaN"``, ``"Infinity"``)."""
    metrics = {"loss": value, "loss_0": value, "full_acc_0": 0.3, "cond_acc_0": 0.3}
    return lines.make("train", step=step, global_step=step, epoch=0, train=metrics, lr=1e-3)


def nan_then_recovered() -> tuple[Run, Lines]:
    lines = Lines(t0=T0, dt=0.5)
    noise = random.Random(1)
    data = lines.event("start", pid=4242)
    for s in range(120):
        if 40 <= s < 55:  # 15 steps of NaN loss mid-run, then finite again
            data += nan_step(lines, s)
        else:
            data += lines.train(s, loss_at(s, noise))
    data += lines.event("finish", step=120)
    return run_of(data), lines


def test_a_nan_stretch_that_recovered_is_kept_in_the_summary() -> None:
    run, lines = nan_then_recovered()
    summary = summarize(run.state, lines.ts + 600)
    json.dumps(summary, allow_nan=False)
    # the verdict is the run's end (its loss is finite again): finished, exit 0...
    assert summary["health"] == "finished" and EXIT_BY_HEALTH["finished"] == 0
    # ...and what happened on the way is said: steps 41 to 55 as "step N" shows them
    stretches = summary["anomalies"]["nonfinite"]
    assert stretches == [
        {
            "metric": "train/loss",
            "first_step": 41,
            "last_step": 55,
            "logged_steps": 15,
            "values": ["NaN"],
            "to_end": False,
            "said": "loss NaN from step 41 to 55 (15 logged steps), finite again after",
        }
    ]
    assert summary["anomalies"]["spikes"] == []
    text = format_text(summary)
    assert "history  loss NaN from step 41 to 55 (15 logged steps)" in text, text


def test_an_inf_stretch_to_the_end_and_the_values_it_took() -> None:
    lines = Lines(t0=T0, dt=0.5)
    noise = random.Random(2)
    data = b"".join(lines.train(s, loss_at(s, noise)) for s in range(50))
    data += nan_step(lines, 50, "Infinity") + nan_step(lines, 51, "NaN")
    summary = summarize(run_of(data).state, lines.ts)
    (stretch,) = summary["anomalies"]["nonfinite"]
    assert (stretch["first_step"], stretch["last_step"], stretch["logged_steps"]) == (51, 52, 2)
    assert stretch["values"] == ["Infinity", "NaN"] and stretch["to_end"] is True
    assert summary["health"] == "diverged"  # still non-finite at the end: the verdict says it


def spiky(spike_at: int | None, steps: int = 400, seed: int = 3) -> Run:
    lines = Lines(t0=T0, dt=0.5)
    noise = random.Random(seed)
    data = b""
    for s in range(steps):
        loss = loss_at(s, noise)
        if s == spike_at:
            loss *= 6.0
        data += lines.train(s, loss)
    return run_of(data)


def test_a_loss_spike_is_found_against_its_rolling_median() -> None:
    summary = summarize(spiky(spike_at=300).state, T0 + 1000)
    (spike,) = summary["anomalies"]["spikes"]
    assert spike["first_step"] == spike["last_step"] == 301
    assert spike["factor"] > 4.0 and spike["z"] > 10.0
    assert spike["peak"] > 4 * spike["baseline"]
    assert spike["said"].startswith("loss spike at step 301: ")
    assert "loss spike at step 301" in format_text(summary)


def test_noisy_runs_without_a_spike_raise_no_alarm() -> None:
    """Noise, the fast early fall, a rising tail: none of it is a spike (seeds 0-19)."""
    for seed in range(20):
        summary = summarize(spiky(spike_at=None, seed=seed).state, T0 + 1000)
        assert summary["anomalies"]["spikes"] == [], (seed, summary["anomalies"]["spikes"])


def test_a_resume_that_died_before_its_first_step_is_credited_with_none() -> None:
    """Steps 1-100, a resume that crashed before any step (pid 2), then one that went
    on from step 91 (pid 3). The first resume was said to be "resumed at step 91 (steps
    91 to 100 done again)" and the one that did it "resumed at step 91"."""
    lines = Lines(t0=T0, dt=0.5)
    data = lines.event("start", pid=1)
    data += b"".join(lines.train(s, 2.0) for s in range(100))
    data += lines.event("interrupt", step=100)
    lines.at(lines.ts + 300)
    data += lines.event("resume", pid=2, step=90)
    data += lines.event("crash", error="RuntimeError: CUDA error")
    lines.at(lines.ts + 300)
    data += lines.event("resume", pid=3, step=90)
    data += b"".join(lines.train(s, 2.0) for s in range(90, 130))
    summary = summarize(run_of(data).state, lines.ts)
    died, went_on = summary["anomalies"]["resumes"]
    assert died["said"] == "resumed, no step logged before the next start", died
    assert died["first_step"] is None and died["redone"] is None
    assert went_on["said"] == "resumed at step 91 (steps 91 to 100 done again)", went_on


def test_resumes_and_missing_steps_are_said() -> None:
    lines = Lines(t0=T0, dt=0.5)
    noise = random.Random(4)
    data = lines.event("start", pid=1)
    data += b"".join(lines.train(s, loss_at(s, noise)) for s in range(60))
    data += b"".join(lines.train(s, loss_at(s, noise)) for s in range(70, 100))  # 60-69 missing
    data += lines.event("interrupt", step=100)
    lines.at(lines.ts + 300)
    data += lines.event("resume", pid=2, step=90)
    data += b"".join(lines.train(s, loss_at(s, noise)) for s in range(90, 130))  # 91-100 redone
    data += lines.event("finish", step=130)
    summary = summarize(run_of(data).state, lines.ts)
    anomalies = summary["anomalies"]
    (resume,) = anomalies["resumes"]
    assert resume["first_step"] == 91 and resume["redone"] == {"first_step": 91, "last_step": 100}
    assert resume["said"] == "resumed at step 91 (steps 91 to 100 done again)"
    (gap,) = anomalies["gaps"]
    assert gap == {
        "after_step": 60,
        "next_step": 71,
        "missing": 10,
        "said": "10 steps not logged between step 60 and 71",
    }
    text = format_text(summary)
    assert "history  resumed at step 91" in text and "history  10 steps not logged" in text


def test_the_snapshot_carries_them_for_the_screen() -> None:
    run, lines = nan_then_recovered()
    snap = build_snapshot(run.state, lines.ts, ViewParams())
    assert [a.said for a in snap.anomalies] == [
        "loss NaN from step 41 to 55 (15 logged steps), finite again after"
    ]


def test_a_real_tiny_training_has_no_anomaly(tiny_run: Path) -> None:
    """A real speculators training (tiny, CPU), noisy as small batches make it: nothing
    to say."""
    run = Run()
    run.feed(0, (tiny_run / "metrics.jsonl").read_bytes())
    summary = summarize(run.state, run.state.last_ts or 0.0)
    assert summary["health"] == "finished"
    assert summary["anomalies"] == {"nonfinite": [], "spikes": [], "resumes": [], "gaps": []}


def spikes_by_definition(losses: list[float]) -> set[int]:
    """The steps (1-based) the module's definition calls spikes, one median at a time."""
    finite = [(s, x) for s, x in enumerate(losses) if math.isfinite(x)]
    out = set()
    for p in range(20, len(finite)):
        window = np.array([x for _, x in finite[max(0, p - 50) : p]])
        med = float(np.median(window))
        scale = max(1.4826 * float(np.median(np.abs(window - med))), 1e-3 * abs(med))
        step, x = finite[p]
        if (x - med) / scale >= 10.0 and (med <= 0 or x >= 2.0 * med):
            out.add(step + 1)
    return out


def test_spikes_are_those_of_the_definition_scanned_whole_or_as_they_come() -> None:
    """The scan's shortcut (a bound on each window's median) drops no spike, and a scan
    of the new rows at each build finds what one scan of the whole column finds."""
    from eagle3_tui.model.snapshot import SnapshotCache

    for seed in range(6):
        rng = random.Random(seed)
        losses = [abs(loss_at(s, rng)) * (rng.choice((2.5, 4.0, 9.0)) if rng.random() < 0.02
                  else 1.0) for s in range(600)]  # fmt: skip
        for s in rng.sample(range(600), 5):
            losses[s] = math.nan
        lines = Lines(t0=T0, dt=0.5)
        chunks = [lines.train(s, x) for s, x in enumerate(losses)]
        run, cache = Run(), SnapshotCache()
        offset = 0
        for i in range(0, len(chunks), 37):  # builds as the lines arrive
            part = b"".join(chunks[i : i + 37])
            run.feed(offset, part)
            offset += len(part)
            live = build_snapshot(run.state, lines.ts, ViewParams(), cache=cache)
        whole = summarize(run_of(*chunks).state, lines.ts)["anomalies"]["spikes"]
        found = {s for a in whole for s in range(a["first_step"], a["last_step"] + 1)}
        assert found == spikes_by_definition(losses), seed
        assert found, seed  # the premise: spikes were made
        from_live = [a for a in live.anomalies if a.said.startswith("loss spike")]
        assert [a.said for a in from_live] == [a["said"] for a in whole], seed


def test_the_spike_candidates_hold_every_loss_far_above_its_window_median() -> None:
    """The candidates' bound (each pair of blocks' lower half) never drops a position
    whose loss is at least SPIKE_FACTOR times its window's median, from any first
    position on, whatever the column's length; and names no position before it."""
    from eagle3_tui.model.anomalies import SPIKE_FACTOR, SPIKE_WINDOW, _candidates

    rng = np.random.default_rng(5)
    w = SPIKE_WINDOW
    for trial in range(400):
        n = int(rng.integers(0, 7 * w))
        f = rng.random(n) * 2 - (0.5 if trial % 4 == 0 else 0.0)  # some at or below 0
        f[rng.random(n) < 0.05] *= 12
        first = int(rng.integers(0, n + 2))
        got = _candidates(f, first).tolist()
        assert got == sorted(set(got)) and all(first <= p < n for p in got), (n, first)
        for p in range(max(first, 1), n):
            med = float(np.median(f[max(0, p - w) : p]))
            if med <= 0 or f[p] >= SPIKE_FACTOR * med:
                assert p in got, (trial, n, first, p)


def test_steps_to_be_done_again_are_not_said_done_before_they_are() -> None:
    """Resumed from step 90 of 100: at step 96 the history said "resumed at step 91
    (steps 91 to 100 done again)" of steps 97 to 100 not yet done again."""
    lines = Lines(t0=T0, dt=0.5)
    data = lines.event("start", pid=1)
    data += b"".join(lines.train(s, 2.0) for s in range(100))
    data += lines.event("interrupt", step=100)
    lines.at(lines.ts + 300)
    data += lines.event("resume", pid=2, step=90)
    data += b"".join(lines.train(s, 2.0) for s in range(90, 96))
    (resume,) = summarize(run_of(data).state, lines.ts)["anomalies"]["resumes"]
    assert (
        resume["said"] == "resumed at step 91 (steps 91 to 100 to be done again: up to 96 so far)"
    )
    data += b"".join(lines.train(s, 2.0) for s in range(96, 104))
    (resume,) = summarize(run_of(data).state, lines.ts)["anomalies"]["resumes"]
    assert resume["said"] == "resumed at step 91 (steps 91 to 100 done again)", resume
