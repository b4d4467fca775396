"""The one seam between telemetry and NVML: four calls, two adapters.

:class:`Nvml` is all the GPU sampler knows of NVML. :class:`PynvmlApi` implements
it over ``pynvml`` (package ``nvidia-ml-py``); :class:`RecordedNvml` replays
readings recorded in a JSON file (tests, demos on machines without a GPU).

Errors are values here: ``init`` raises :class:`NvmlUnavailable` with a kind
(``no_driver`` when there is no library or no driver, ``error`` otherwise); a
reading that one device does not support (power on some boards) is ``None``.

Standard library only; ``pynvml`` is imported lazily by :class:`PynvmlApi`.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from eagle3_tui.telemetry.parsing import parse_json

FIXTURE_ENV = "EAGLE3_TUI_NVML_FIXTURE"
"""A recorded-readings file to use instead of the real NVML (tests, demos)."""


class NvmlUnavailable(Exception):  # noqa: N818 - a state, not a bug
    """NVML cannot be used: ``kind`` is ``no_driver`` or ``error``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_memory: int | None = None


@dataclass(frozen=True)
class DeviceReading:
    """One device at one moment; ``None`` where the device does not say."""

    index: int
    uuid: str = ""
    name: str = ""
    util: float | None = None
    mem_util: float | None = None
    mem_used: int | None = None
    mem_total: int | None = None
    power_w: float | None = None
    temp_c: float | None = None
    processes: tuple[GpuProcess, ...] = field(default_factory=tuple)
    error: str | None = None


class Nvml(Protocol):
    """What the GPU sampler needs from NVML."""

    def init(self) -> None:
        """Start NVML; raises :class:`NvmlUnavailable`."""

    def device_count(self) -> int: ...

    def read(self, index: int) -> DeviceReading:
        """Read one device (per-field failures become ``None``; may raise for a lost device)."""

    def shutdown(self) -> None: ...


# ---- the real adapter ---------------------------------------------------------------

DRIVER_FILES: tuple[str, ...] = ("/proc/driver/nvidia/version", "/dev/nvidiactl")
"""Present when the NVIDIA kernel driver is loaded (no NVML needed to tell)."""
NO_DRIVER = "no NVIDIA driver on the training host (CPU only)"
NO_BINDING = "nvidia-ml-py missing on the training host: pip install nvidia-ml-py"


def driver_loaded() -> bool:
    return any(os.path.exists(p) for p in DRIVER_FILES)


_NO_DRIVER_ERRORS = (
    "NVMLError_LibraryNotFound",
    "NVMLError_DriverNotLoaded",
    "NVMLError_FunctionNotFound",
)


class PynvmlApi:
    """:class:`Nvml` over ``pynvml``."""

    def __init__(self) -> None:
        self._nv: Any = None
        self._handles: dict[int, Any] = {}

    def init(self) -> None:
        # Each message names the cause first and its fix, in one line: the monitor
        # shows it as the GPU panel's only line.
        try:
            import pynvml
        except ImportError as e:
            if not driver_loaded():  # nothing to sample: the binding is not the cause
                raise NvmlUnavailable("no_driver", NO_DRIVER) from e
            raise NvmlUnavailable("error", NO_BINDING) from e
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            if type(e).__name__ not in _NO_DRIVER_ERRORS:
                raise NvmlUnavailable("error", f"NVML failed on the training host: {e}") from e
            if not driver_loaded():
                raise NvmlUnavailable("no_driver", NO_DRIVER) from e
            raise NvmlUnavailable(
                "no_driver", f"the NVIDIA driver does not answer on the training host: {e}"
            ) from e
        except OSError as e:  # a broken library
            raise NvmlUnavailable(
                "no_driver", f"the NVIDIA driver's library is broken on the training host: {e}"
            ) from e
        self._nv = pynvml

    def device_count(self) -> int:
        return int(self._nv.nvmlDeviceGetCount())

    def _handle(self, index: int) -> Any:
        h = self._handles.get(index)
        if h is None:
            h = self._handles[index] = self._nv.nvmlDeviceGetHandleByIndex(index)
        return h

    def read(self, index: int) -> DeviceReading:
        nv = self._nv
        h = self._handle(index)

        def get(fn: Any, *args: Any) -> Any:
            try:
                return fn(h, *args)
            except nv.NVMLError:
                return None

        uuid = _text(get(nv.nvmlDeviceGetUUID))
        name = _text(get(nv.nvmlDeviceGetName))
        rates = get(nv.nvmlDeviceGetUtilizationRates)
        mem = get(nv.nvmlDeviceGetMemoryInfo)
        power_mw = get(nv.nvmlDeviceGetPowerUsage)
        temp = get(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)
        procs = get(nv.nvmlDeviceGetComputeRunningProcesses) or []
        return DeviceReading(
            index=index,
            uuid=uuid,
            name=name,
            util=float(rates.gpu) if rates is not None else None,
            mem_util=float(rates.memory) if rates is not None else None,
            mem_used=int(mem.used) if mem is not None else None,
            mem_total=int(mem.total) if mem is not None else None,
            power_w=round(power_mw / 1000.0, 1) if power_mw is not None else None,
            temp_c=float(temp) if temp is not None else None,
            processes=tuple(
                GpuProcess(int(p.pid), _memory(getattr(p, "usedGpuMemory", None))) for p in procs
            ),
        )

    def shutdown(self) -> None:
        if self._nv is not None:
            with contextlib.suppress(Exception):  # shutting down anyway
                self._nv.nvmlShutdown()
            self._nv = None


def _text(v: Any) -> str:
    if v is None:
        return ""
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _memory(v: Any) -> int | None:
    # NVML reports "not available" as a huge sentinel value
    return int(v) if isinstance(v, int) and 0 <= v < (1 << 62) else None


# ---- the recorded adapter -----------------------------------------------------------


class RecordedNvml:
    """:class:`Nvml` replaying readings from a JSON file or dict.

    Format: ``{"error": {"kind": "no_driver", "message": "..."}}`` for a host
    without NVML, or ``{"samples": [[device, ...], ...]}`` (or ``{"devices":
    [device, ...]}`` for one sample), each device an object with the fields of
    :class:`DeviceReading` and ``processes`` as ``[{"pid", "used_memory"}]``.
    Each call of ``read(0)`` moves to the next sample (the last one repeats).
    """

    def __init__(self, source: str | os.PathLike[str] | dict[str, Any]) -> None:
        data = source if isinstance(source, dict) else parse_json(Path(source).read_text())
        self._error = data.get("error")
        samples = data.get("samples") or ([data["devices"]] if "devices" in data else [[]])
        self._samples: list[list[dict[str, Any]]] = samples
        self._i = -1
        self.pid_map: dict[int, int] = {}
        """Replace recorded PIDs (e.g. with a live test process's)."""

    def init(self) -> None:
        if self._error:
            raise NvmlUnavailable(self._error.get("kind", "error"), self._error.get("message", ""))

    def device_count(self) -> int:
        return len(self._samples[max(self._i, 0)])

    def read(self, index: int) -> DeviceReading:
        if index == 0:
            self._i = min(self._i + 1, len(self._samples) - 1)
        d = dict(self._samples[max(self._i, 0)][index])
        if d.get("lost"):
            raise RuntimeError(f"NVMLError_GpuIsLost: device {index} fell off the bus")
        procs = tuple(
            GpuProcess(self.pid_map.get(p["pid"], p["pid"]), p.get("used_memory"))
            for p in d.pop("processes", [])
        )
        known = DeviceReading.__dataclass_fields__
        return DeviceReading(
            **{k: v for k, v in d.items() if k in known and k != "processes"}, processes=procs
        )

    def shutdown(self) -> None:
        pass


def nvml_from_env() -> Nvml:
    """The recorded readings named by ``EAGLE3_TUI_NVML_FIXTURE``, else the real NVML."""
    fixture = os.environ.get(FIXTURE_ENV)
    return RecordedNvml(fixture) if fixture else PynvmlApi()
