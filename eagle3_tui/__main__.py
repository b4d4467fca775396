from eagle3_tui.cli import main

# Guarded: the catch-up worker process (multiprocessing forkserver) imports the
# main module, which must then not run the program again.
if __name__ == "__main__":
    raise SystemExit(main())
