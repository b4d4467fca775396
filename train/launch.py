"""The speculators training CLI, with telemetry attached before it configures logging.

    python -m eagle3_tui.train.launch --run-dir RUN_DIR [options] -- <speculators train args>
    torchrun --nproc-per-node 8 -m eagle3_tui.train.launch --run-dir RUN_DIR -- <args>

It runs exactly what ``speculators train <args>`` runs (``speculators.train.cli.main``
on ``TrainConfig.resolve(args)``), with four additions:

* telemetry is attached first, so the library's ``setup_metric_logger``
  (``dictConfig``) cannot leave ``speculators.metrics`` without our handler;
* the ``Trainer`` the CLI builds is watched (checkpoint dir, epochs, steps per
  epoch, total steps go into ``run.json``);
* the hidden-states transfer is observed, so the reads panel names the files;
* on a machine without an accelerator the CPU shims are applied (on a GPU host
  the library runs as shipped).

Running the same command again resumes the run (speculators resumes from its
``save_path``; ``run.json`` keeps the run id and records ``resume_command``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from typing import Any

from eagle3_tui.train.common import add_telemetry_args, closing_line, setup_log, telemetry_kwargs


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" in argv:
        i = argv.index("--")
        ours, theirs = argv[:i], argv[i + 1 :]
    else:
        ours, theirs = argv, []
    p = argparse.ArgumentParser(
        prog="python -m eagle3_tui.train.launch",
        description="Run the speculators training CLI with eagle3-tui telemetry attached.",
        epilog="Everything after -- goes to the speculators training CLI "
        "(see: python -m speculators train --help).",
    )
    p.add_argument("--run-dir", type=Path, required=True, help="where metrics and run.json go")
    add_telemetry_args(p, progress_every=50)
    a = p.parse_args(ours)
    if not theirs:
        p.error("no speculators training arguments after --")
    return a, theirs


def _watching_trainer(base: type, telemetry: Any) -> type:
    class WatchedTrainer(base):  # type: ignore[misc]  # a class known at run time only
        """The CLI's Trainer, reporting its bounds to telemetry once built."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            telemetry.watch_trainer(self)

    return WatchedTrainer


def main(argv: list[str] | None = None) -> int:
    a, train_args = parse_args(list(sys.argv[1:] if argv is None else argv))
    a.run_dir.mkdir(parents=True, exist_ok=True)
    log = setup_log(a.run_dir, a.log)

    from eagle3_tui.telemetry import attach, install_dictconfig_hook

    telemetry = attach(
        a.run_dir,
        resume_command=list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]),
        log_file=log.log_file,
        exclude_pids=[log.tee_pid] if log.tee_pid else [],
        **telemetry_kwargs(a),
    )
    try:
        # Any: two of its names are replaced (the Trainer and the loaders' factory)
        cli: Any = importlib.import_module("speculators.train.cli")
        from speculators.train.config import TrainConfig

        from eagle3_tui.train.cpu_shims import trainer_class
        from eagle3_tui.train.observe import observe_transfer

        install_dictconfig_hook()  # in case speculators.train.logger was imported before us
        try:
            cfg = TrainConfig.resolve(train_args)
        except SystemExit as e:  # a configuration error: the CLI printed it
            telemetry.finish("crash", error=f"invalid training arguments (exit status {e.code})")
            telemetry.close()
            raise
        flat = cfg.flatten()
        save_path = flat.get("save_path")
        if save_path:
            telemetry.update_manifest(checkpoint_dir=str(Path(save_path).resolve()))
        if isinstance(flat.get("epochs"), int):
            telemetry.update_manifest(epochs=flat["epochs"])

        cli.Trainer = _watching_trainer(trainer_class(), telemetry)
        create_loaders = cli.create_train_val_loaders

        def create_observed_loaders(**kwargs: Any) -> Any:
            kwargs["transfer"] = observe_transfer(kwargs.get("transfer"), kwargs["data_path"])
            return create_loaders(**kwargs)

        cli.create_train_val_loaders = create_observed_loaders
        cli.main(cfg)
    except SystemExit:
        raise
    except BaseException as e:
        telemetry.finish("crash", error=f"{type(e).__name__}: {e}"[:2000])
        telemetry.close()
        raise
    telemetry.finish(telemetry.final_status())
    telemetry.close()
    if os.environ.get("RANK", "0") == "0":
        print(closing_line(telemetry), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
