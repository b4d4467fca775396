"""``python -m eagle3_tui``: the command line."""

from eagle3_tui.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
