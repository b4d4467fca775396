"""The GPU sampler through the NVML seam: recorded readings of 8 devices, and no driver for real."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from eagle3_tui.telemetry.nvml import NO_DRIVER, NvmlUnavailable, PynvmlApi, RecordedNvml
from eagle3_tui.telemetry.samplers import GpuSampler, own_device_entries
from eagle3_tui.telemetry.writer import JsonlWriter
from tests.conftest import read_jsonl

FIXTURES = Path(__file__).parent / "fixtures"
H200 = FIXTURES / "nvml_8x_h200.json"
RUN_PIDS = {41230 + i for i in range(8)}


def sample(
    tmp_path: Path,
    nvml: Any,
    *,
    times: int = 1,
    spec: str | None = None,
    local_rank: int | None = None,
    world_size: int = 1,
    run_pids: set[int] = RUN_PIDS,
) -> list[dict[str, Any]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    w = JsonlWriter(tmp_path / "m.jsonl", background=False)
    s = GpuSampler(
        w,
        nvml,
        entries=own_device_entries(spec, local_rank, world_size),
        run_pids=lambda: run_pids,
    )
    for _ in range(times):
        s.sample(0.0)
    s.close()
    w.close()
    return [r for r in read_jsonl(tmp_path / "m.jsonl") if r["kind"] == "gpu"]


def test_eight_devices_every_field(tmp_path: Path) -> None:
    (rec,) = sample(tmp_path, RecordedNvml(H200))
    assert rec["status"] == "ok" and "error" not in rec
    devices = rec["devices"]
    assert [d["index"] for d in devices] == list(range(8))
    for i, d in enumerate(devices):
        assert d["name"] == "NVIDIA H200" and d["uuid"].startswith("GPU-")
        assert d["mem_total"] == 143771 << 20 and 0 < d["mem_used"] < d["mem_total"]
        assert 90 <= d["util"] <= 100 and 500 < d["power_w"] < 700 and 40 < d["temp_c"] < 80
        assert d["pids"] == [41230 + i]  # this run's process on it
    assert devices[7]["procs"] == 2 and devices[7]["pids"] == [41237]  # a foreign job too


def test_missing_readings_are_null_and_a_lost_device_is_an_error_not_a_crash(
    tmp_path: Path,
) -> None:
    recs = sample(tmp_path, RecordedNvml(H200), times=3)
    third = recs[2]
    assert third["status"] == "error" and "1 of 8" in third["error"]
    by_index = {d["index"]: d for d in third["devices"]}
    assert "GpuIsLost" in by_index[5]["error"] and "util" not in by_index[5]
    assert by_index[6]["power_w"] is None and by_index[6]["util"] is not None
    assert len(third["devices"]) == 8


def test_each_torchrun_rank_reports_its_own_device(tmp_path: Path) -> None:
    (rec,) = sample(tmp_path, RecordedNvml(H200), spec="4,5,6,7", local_rank=2, world_size=4)
    assert [d["index"] for d in rec["devices"]] == [6]
    (rec,) = sample(tmp_path / "b", RecordedNvml(H200), local_rank=3, world_size=8)
    assert [d["index"] for d in rec["devices"]] == [3]
    (rec,) = sample(tmp_path / "c", RecordedNvml(H200), spec="1,3")  # one process, two GPUs
    assert [d["index"] for d in rec["devices"]] == [1, 3]


def test_devices_named_by_uuid(tmp_path: Path) -> None:
    uuid5 = RecordedNvml(H200).read(5).uuid
    (rec,) = sample(tmp_path, RecordedNvml(H200), spec=uuid5[:12])  # a unique prefix will do
    assert [d["index"] for d in rec["devices"]] == [5]


def test_pids_of_other_runs_are_not_this_runs(tmp_path: Path) -> None:
    (rec,) = sample(tmp_path, RecordedNvml(H200), run_pids={41233})
    assert [d["pids"] for d in rec["devices"]] == [[], [], [], [41233], [], [], [], []]


def test_no_driver_is_recorded_once_then_the_sampler_stops(tmp_path: Path) -> None:
    recs = sample(tmp_path, RecordedNvml(FIXTURES / "nvml_no_driver.json"), times=5)
    assert recs == [
        {
            **recs[0],
            "status": "no_driver",
            "error": "NVMLError_DriverNotLoaded: Driver Not Loaded",
            "devices": [],
        }
    ]


def _have_nvidia_driver() -> bool:
    return any(Path(p).exists() for p in ("/proc/driver/nvidia/version", "/dev/nvidiactl"))


def test_the_real_nvml_without_a_driver(tmp_path: Path) -> None:
    """For real on this machine: pynvml is installed, the driver is not."""
    if _have_nvidia_driver():
        pytest.skip("this machine has an NVIDIA driver: the no-driver path cannot run here")
    api = PynvmlApi()
    with pytest.raises(NvmlUnavailable) as info:
        api.init()
    assert info.value.kind == "no_driver"
    recs = sample(tmp_path, PynvmlApi(), times=3)
    assert len(recs) == 1
    assert recs[0]["status"] == "no_driver" and recs[0]["devices"] == []
    # the cause, not the missing binding: a machine without a driver has nothing to sample
    assert recs[0]["error"] == NO_DRIVER


@pytest.mark.skipif(not _have_nvidia_driver(), reason="needs an NVIDIA driver")
def test_the_real_nvml_with_a_driver(tmp_path: Path) -> None:  # pragma: no cover - GPU hosts
    recs = sample(tmp_path, PynvmlApi(), times=2, run_pids={os.getpid()})
    assert recs and all(r["status"] == "ok" for r in recs)
    for d in recs[-1]["devices"]:
        assert d["mem_total"] > 0 and d["name"]
