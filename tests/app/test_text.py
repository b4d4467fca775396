def test_a_short_backoff_never_reads_in_0_s() -> None:
    from eagle3_tui.app.widgets.header import link_text
    from eagle3_tui.transport.base import Link, LinkChanged

    assert link_text(LinkChanged(Link.RECONNECTING, "lost", retry_in=0.2)).plain.endswith("in 1 s")
    assert link_text(LinkChanged(Link.RECONNECTING, "lost", retry_in=2.0)).plain.endswith("in 2 s")
