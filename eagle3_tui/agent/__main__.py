"""``python -m eagle3_tui.agent``: the agent, run from an installed package."""

from eagle3_tui.agent.main import main

main()
