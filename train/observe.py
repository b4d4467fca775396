"""A hidden-states transfer that reports every file it loads (dataloader reads panel).

The speculators dataset reads each sample through its ``transfer``
(``get_cached(file_idx)`` → ``hs_connectors`` ``_load_hs_file(path)``). The
transfer object is pickled into every dataloader worker (they are spawned, so
nothing patched in the trainer reaches them), which makes it the one place that
sees every read. :func:`observe_transfer` wraps the transfer a training script
would use; each load sends one datagram to the telemetry sampler
(``eagle3_tui.telemetry.reads.report_read``: never blocks, never raises).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hs_connectors.transfer import FileTransfer, HiddenStatesTransfer

# The ignores below (unused-ignore where hs_connectors is installed) are for a type
# check without it, where these bases are Any.
from eagle3_tui.telemetry.reads import report_read


def _nbytes(tensors: dict[str, Any]) -> int:
    total = 0
    for t in tensors.values():
        n = getattr(t, "nbytes", None)
        total += int(n) if isinstance(n, int) else 0
    return total


def _size(path: Path, tensors: dict[str, Any]) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return _nbytes(tensors)


class ObservedFileTransfer(FileTransfer):  # type: ignore[misc, unused-ignore]
    """``FileTransfer`` that reports each hidden-states file it loads."""

    def get_cached(self, file_idx: int) -> dict[str, Any] | None:
        out = super().get_cached(file_idx)
        if out is not None:
            path = Path(self.hidden_states_path) / f"hs_{file_idx}.safetensors"
            report_read(str(path), _size(path, out))
        return out  # type: ignore[no-any-return, unused-ignore]

    def get_generated(self, hs_transfer_params: dict[str, Any]) -> dict[str, Any] | None:
        out = super().get_generated(hs_transfer_params)
        handle = hs_transfer_params.get("hidden_states_path") or hs_transfer_params.get("handle")
        if out is not None and handle:
            report_read(str(handle), _size(Path(handle), out))
        return out  # type: ignore[no-any-return, unused-ignore]


class ObservedTransfer(HiddenStatesTransfer):  # type: ignore[misc, unused-ignore]
    """Any other transfer, wrapped: reports ``<Transfer>:<index>`` and the tensors' bytes."""

    def __init__(self, inner: HiddenStatesTransfer) -> None:
        self.inner = inner

    def setup(self) -> None:
        self.inner.setup()

    def get_cached(self, file_idx: int) -> dict[str, Any] | None:
        out = self.inner.get_cached(file_idx)
        if out is not None:
            report_read(f"{type(self.inner).__name__}:{file_idx}", _nbytes(out))
        return out  # type: ignore[no-any-return, unused-ignore]

    def get_generated(self, hs_transfer_params: dict[str, Any]) -> dict[str, Any] | None:
        out = self.inner.get_generated(hs_transfer_params)
        if out is not None:
            report_read(f"{type(self.inner).__name__}:generated", _nbytes(out))
        return out  # type: ignore[no-any-return, unused-ignore]

    def delete(self, handle: str) -> None:
        self.inner.delete(handle)


def observe_transfer(transfer: Any, data_path: str | os.PathLike[str]) -> HiddenStatesTransfer:
    """The transfer to pass to ``create_train_val_loaders``: ``transfer`` (None means the
    library's default, a ``FileTransfer`` of ``data_path/hidden_states``), observed."""
    if transfer is None:
        return ObservedFileTransfer(Path(data_path) / "hidden_states")
    if isinstance(transfer, (ObservedFileTransfer, ObservedTransfer)):
        return transfer
    if type(transfer) is FileTransfer:
        return ObservedFileTransfer(transfer.hidden_states_path)
    return ObservedTransfer(transfer)
