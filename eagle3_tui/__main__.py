from eagle3_tui.cli import main

raise SystemExit(main())
