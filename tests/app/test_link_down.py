"""While the link is down, the header and the banner say so, with the last known health
and step, and no alarm comes from the client's clock alone (issue 13, item 1); the GPU
and data panels say their figures are the last that arrived."""

from __future__ import annotations

from eagle3_tui.app.text import clock_time
from eagle3_tui.app.widgets.header import HealthBanner, RunHeader
from eagle3_tui.app.widgets.panels import DataPanel, GpuPanel
from eagle3_tui.model.verdict import Health
from eagle3_tui.transport.base import Link, LinkChanged
from tests.app.conftest import text_of, training
from tests.app.test_pilot import app_with
from tests.conftest import until


async def test_the_header_and_banner_say_link_down_not_stalled() -> None:
    lines, data = training(steps=120)
    now = [lines.ts + 1.0]
    app, source = app_with(data, now=now)
    async with app.run_test(size=(120, 40)) as pilot:
        header, banner = app.query_one(RunHeader), app.query_one(HealthBanner)
        await until(pilot, lambda: app.snapshot.health == Health.RUNNING, what="running")
        source.push(LinkChanged(Link.RECONNECTING, "gpu-box: connection refused", retry_in=4.0))
        await until(pilot, lambda: app.pipeline.run.link_down_since is not None, what="down")
        now[0] += 45.0  # 45 s without data: the run would look hung on the client's clock
        await until(pilot, lambda: "LINK DOWN" in text_of(header), what="link down")
        assert "STALLED" not in text_of(header) and "DEAD" not in text_of(header)
        assert "LINK DOWN  last known  RUNNING " in text_of(header)
        assert "step 120" in text_of(header)
        await until(pilot, lambda: banner.display, what="the banner")
        shown = text_of(banner)
        assert "LINK DOWN" in shown and "link to the host is down" in shown
        assert "connection refused" in shown and "Last known: running at step 120" in shown
        # the GPU and data panels kept the last samples: they say so, and when
        gpu, io = app.query_one(GpuPanel), app.query_one(DataPanel)
        down = app.pipeline.run.link_down_since
        assert down is not None
        sampled = clock_time(app.snapshot.gpus_at or 0.0)
        assert gpu.border_subtitle == f"link down; sampled {sampled}", gpu.border_subtitle
        assert io.border_subtitle == f"link down since {clock_time(down)}; the last read"
        # back, and what was written meanwhile read: judged again
        more = b"".join(lines.train(s, 0.5) for s in range(120, 130))
        sent = len(data)
        source.push(LinkChanged(Link.CONNECTED, "gpu-box", size=sent + len(more)))
        source.push(more)
        now[0] = lines.ts + 1.0
        await until(pilot, lambda: "LINK DOWN" not in text_of(header), what="running again")
        assert "RUNNING" in text_of(header)
        assert "step 130" in text_of(header) and not banner.display
        assert not gpu.border_subtitle and not io.border_subtitle


async def test_an_alarm_keeps_its_label_and_says_the_link_is_down() -> None:
    """A stalled run whose link drops keeps STALLED in the header, in its colours (an alarm
    never turns grey), after LINK DOWN and said to be the last known (as for a running
    run: it said "STALLED last stalled", then "STALLED last known · LINK DOWN")."""
    lines, data = training(steps=120)
    now = [lines.ts + 1.0]
    app, source = app_with(data, now=now)
    async with app.run_test(size=(120, 40)) as pilot:
        header, banner = app.query_one(RunHeader), app.query_one(HealthBanner)
        await until(pilot, lambda: app.snapshot.health == Health.RUNNING, what="running")
        now[0] += 300.0  # five minutes without a record: stalled
        await until(pilot, lambda: app.snapshot.health == Health.STALLED, what="stalled")
        source.push(LinkChanged(Link.RECONNECTING, "gpu-box: connection refused", retry_in=4.0))
        await until(pilot, lambda: "LINK DOWN" in text_of(header), what="link down")
        shown = text_of(header)
        assert "LINK DOWN  last known  STALLED " in shown, shown
        assert "last stalled" not in shown and shown.count("STALLED") == 1, shown
        assert "step 120" in shown, shown
        # the banner: red, saying the link is down and the run was last known stalled
        await until(pilot, lambda: "LINK DOWN" in text_of(banner), what="the banner")
        said = text_of(banner)
        assert said.startswith(" LINK DOWN  No data since"), said
        assert "Last known: stalled at step 120" in said, said
        assert banner.has_class("-alarm") and not banner.has_class("-calm")


async def test_a_silent_agents_link_went_down_with_its_last_byte() -> None:
    """A frozen agent is noticed 20 s after its last byte: the banner said "No data since"
    the moment it was noticed (18 s of nothing, shown as current). The link is down
    since the last byte."""
    lines, data = training(steps=120)
    now = [lines.ts + 1.0]
    app, source = app_with(data, now=now)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.health == Health.RUNNING, what="running")
        now[0] += 20.0
        source.push(LinkChanged(Link.RECONNECTING, "not a byte", retry_in=0.2, silent_s=20.0))
        await until(pilot, lambda: app.pipeline.run.link_down_since is not None, what="down")
        assert app.pipeline.run.link_down_since == lines.ts + 1.0


async def test_samples_that_stopped_coming_are_not_shown_as_current() -> None:
    """The sidecar held (a SIGSTOP of it alone) while the trainer logs on: the data panel
    said "read 77.6 KiB/s" of a sample a minute old, as if current. Past three of the
    samplers' intervals (and 10 s) without one, the GPU and data panels say since when."""
    lines, data = training(steps=120)  # a GPU and a read sample every 10 steps (5 s)
    app, source = app_with(data, now=[lines.ts + 1.0])
    async with app.run_test(size=(120, 40)) as pilot:
        gpu, io = app.query_one(GpuPanel), app.query_one(DataPanel)
        await until(pilot, lambda: app.snapshot.global_step == 119, what="step 120")
        assert not gpu.border_subtitle and not io.border_subtitle
        sampled = app.snapshot.io_at
        assert sampled is not None
        more = b"".join(lines.train(s, 0.5) for s in range(120, 160))  # no sample: 20 s
        source.push(more)
        app.clock = lambda: lines.ts + 1.0
        await until(pilot, lambda: app.snapshot.global_step == 159, what="step 160")
        await until(pilot, lambda: bool(io.border_subtitle), what="the data panel's note")
        assert io.border_subtitle == f"no sample since {clock_time(sampled)}; the last read"
        assert gpu.border_subtitle == f"no sample since {clock_time(app.snapshot.gpus_at or 0)}"
        assert app.snapshot.health is Health.RUNNING


async def test_a_refusal_longer_than_the_banner_ends_where_it_is_cut() -> None:
    """A one-sentence banner (a refusal, a path) longer than its three lines stopped
    mid-word on the last line, as if that were all it said: it ends in "…" there."""
    _, data = training(steps=10)
    app, source = app_with(data)
    detail = "gpu-box: " + " ".join(f"/home/someone/runs/exp{i}/metrics.jsonl" for i in range(30))
    async with app.run_test(size=(80, 24)) as pilot:
        banner = app.query_one(HealthBanner)
        source.push(LinkChanged(Link.REFUSED, detail))
        await until(pilot, lambda: "REFUSED" in text_of(banner), what="refused")
        shown = text_of(banner)
        rows = banner.render().wrap(app.console, banner.content_size.width)
        assert len(rows) <= 3, shown
        assert shown.rstrip().endswith("…"), shown
        assert "gpu-box: /home/someone/runs/exp0/metrics.jsonl" in " ".join(shown.split())


def test_a_banner_cut_in_its_middle_cuts_between_clauses() -> None:
    """The SILENT banner at 120 columns read "its CPU is busy … complete in its output":
    the cut dropped "(81%), epochs" mid-clause. Each side of the "…" is whole clauses."""
    from eagle3_tui.app.widgets.header import keep_the_remedy

    sentence = (
        "The trainer (pid 4242) has run 5m10s: its CPU is busy (81%), epochs complete in "
        "its output, data files are read, yet no metric has been logged: the "
        "speculators.metrics logger has no handler. Attach live (a, or eagle3-tui attach) "
        "or restart it with telemetry."
    )
    for room in range(120, len(sentence), 7):  # (a clause ends within the head's room)
        head, _, tail = keep_the_remedy(sentence, room).partition(" … ")
        assert sentence.startswith(head) and sentence.endswith(tail), (room, head, tail)
        before = sentence[: len(sentence) - len(tail)]
        assert before.endswith((". ", "; ", ": ", ", ")), (room, tail)
        assert sentence[len(head)] in ".;:,", (room, head)
