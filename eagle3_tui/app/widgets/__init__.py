"""The panels. Each reads values handed down by the app (a Snapshot, the link state,
the view) and draws them; none touches the transport or the run state, none
queries a sibling."""
