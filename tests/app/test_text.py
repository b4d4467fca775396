def test_a_short_backoff_never_reads_in_0_s() -> None:
    from eagle3_tui.app.widgets.header import link_text
    from eagle3_tui.transport.base import Link, LinkChanged

    assert link_text(LinkChanged(Link.RECONNECTING, "lost", retry_in=0.2)).plain.endswith("in 1 s")
    assert link_text(LinkChanged(Link.RECONNECTING, "lost", retry_in=2.0)).plain.endswith("in 2 s")
    # the attempt under way (an ssh connection may take 15 s): not "in 1 s" all along
    assert link_text(LinkChanged(Link.RECONNECTING, "lost")).plain == "◌ reconnecting…"
    # counted down from when it was said (it read "in 15 s" for as long as it waited)
    wait = LinkChanged(Link.RECONNECTING, "lost", retry_in=15.0)
    assert link_text(wait, 6.5).plain.endswith("in 9 s")
    assert link_text(wait, 15.2).plain == "◌ reconnecting…"


def test_the_header_names_where_a_run_without_telemetrys_metrics_come_from() -> None:
    import dataclasses

    from eagle3_tui.app.widgets.header import _source
    from eagle3_tui.model.snapshot import EMPTY, ObservedView

    def observed(handler: str | None) -> object:
        view = ObservedView(1, True, (), None, None, None, None, None, (), handler=handler)
        return _source(dataclasses.replace(EMPTY, observed=view))

    assert observed("tensorboard") == "metrics from TensorBoard event files"
    assert observed("printed") == "metrics from its log"
    assert observed("json") == "metrics from its own JSON handler"
    assert observed(None) is None and _source(EMPTY) is None  # nowhere; telemetry
