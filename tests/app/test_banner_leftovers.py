"""A finished run's processes that outlived it are said (and that k ends them) for as
long as a look finds them: the banner and the k key's refusal agree."""

from eagle3_tui.app.widgets.header import HealthBanner
from eagle3_tui.transport.replies import LeftoverProcess, Status
from tests.app.conftest import T0, FakeControl, text_of
from tests.app.test_pilot import app_with
from tests.conftest import until
from tests.records import Lines


async def test_a_finished_runs_leftovers_are_said_until_gone() -> None:
    lines = Lines(t0=T0)
    data = b"".join(lines.train(s, 1.0) for s in range(10)) + lines.event("finish", step=10)
    app, _ = app_with(data, control=FakeControl(alive=False))
    async with app.run_test(size=(120, 40)) as pilot:
        banner = app.query_one(HealthBanner)
        await until(pilot, lambda: app.snapshot.health.value == "finished", what="finished")
        assert not banner.display  # a finished run, nothing left: nothing to say
        worker = LeftoverProcess(pid=4242, comm="pt_data_worker", rss_bytes=2**30)
        await app.pipeline.set_status(Status(alive=False, leftovers=[worker], now=T0 + 20), T0)
        await until(pilot, lambda: "still alive" in text_of(banner), what="the leftover said")
        assert "pid 4242 pt_data_worker" in text_of(banner), text_of(banner)
        assert "(k ends them)" in text_of(banner), text_of(banner)
        assert app.refusal("kill") is None  # k opens the kill dialog: it ends them
        await app.pipeline.set_status(Status(alive=False, now=T0 + 30), T0)  # gone
        await until(pilot, lambda: not banner.display, what="the banner gone with them")
        assert app.refusal("kill") == "kill: the run finished: nothing to kill"
