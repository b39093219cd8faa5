from __future__ import annotations

import pytest

from cudask.devices import (
    discover,
    parse_visible_devices,
    require_gpus,
    rotate,
    worker_visible_devices,
)
from cudask.errors import DeviceError, NoGPUError
from cudask.testing import FakeBackend, fake_gpu


def test_dgx_machine():
    m = discover(FakeBackend.dgx(8))
    assert len(m.gpus) == 8
    assert m.gpus[0].cpu_affinity == tuple(range(64))
    assert m.gpus[7].cpu_affinity == tuple(range(64, 128))
    assert m.gpus[3].nics == ("mlx5_3",)
    assert m.gpus[5].numa_node == 1
    assert all(g.dedicated_memory for g in m.gpus)
    assert m.driver_version and m.cuda_version


def test_affinity_intersected_with_cpuset():
    b = FakeBackend.dgx(2, cores=16)
    b.cpus = {2, 3, 12}
    m = discover(b)
    assert m.gpus[0].cpu_affinity == (2, 3)
    assert m.gpus[1].cpu_affinity == (12,)


def test_empty_intersection_falls_back_with_warning():
    b = FakeBackend([fake_gpu(0, cpus=[0, 1])], cpus={4, 5})
    with pytest.warns(RuntimeWarning, match="outside the CPUs"):
        m = discover(b)
    assert m.gpus[0].cpu_affinity == (4, 5)


def test_unknown_affinity_falls_back_with_warning():
    b = FakeBackend([fake_gpu(0, cpus=None)], cpus={0, 1, 2})
    with pytest.warns(RuntimeWarning, match="no CPU affinity"):
        m = discover(b)
    assert m.gpus[0].cpu_affinity == (0, 1, 2)


def test_no_nvml_is_an_empty_machine_not_an_error():
    m = discover(FakeBackend.no_nvml())
    assert m.gpus == () and "Not Found" in m.nvml_error
    with pytest.raises(NoGPUError, match="no NVIDIA GPU found"):
        require_gpus(m)


def test_soc_without_dedicated_memory():
    m = discover(FakeBackend([fake_gpu(0, name="NVIDIA GB10", memory_total=None, cpus=[0])]))
    assert not m.gpus[0].dedicated_memory and m.gpus[0].memory_total is None


@pytest.fixture
def machine():
    return discover(FakeBackend.dgx(4, cores=8))


def test_visible_devices_forms(machine):
    uuids = [g.uuid for g in machine.gpus]
    assert [d.gpu.index for d in parse_visible_devices(None, machine)] == [0, 1, 2, 3]
    assert parse_visible_devices("", machine) == []
    assert [d.gpu.index for d in parse_visible_devices("2,0", machine)] == [2, 0]
    assert [d.gpu.index for d in parse_visible_devices([3, "1"], machine)] == [3, 1]
    assert [d.gpu.index for d in parse_visible_devices(1, machine)] == [1]
    assert [d.gpu.index for d in parse_visible_devices(f"{uuids[2]},{uuids[1][:14]}", machine)] == [
        2,
        1,
    ]


@pytest.mark.parametrize("bad", ["7", "GPU-nothere", "0,0", "0,,1", "-1"])
def test_bad_visible_devices_name_entry_and_list_gpus(machine, bad):
    with pytest.raises(DeviceError) as err:
        parse_visible_devices(bad, machine)
    msg = str(err.value)
    assert "CUDA_VISIBLE_DEVICES" in msg
    if bad not in ("0,0", "0,,1"):
        assert repr(bad) in msg and machine.gpus[0].uuid in msg


def test_ambiguous_prefix():
    m = discover(FakeBackend([fake_gpu(0, cpus=[0]), fake_gpu(1, cpus=[0])]))
    with pytest.raises(DeviceError, match="prefix of several"):
        parse_visible_devices("GPU-0000000", m)


def test_mig_instances():
    m = discover(FakeBackend([fake_gpu(0, mig=2, cpus=[0]), fake_gpu(1, cpus=[0])]))
    devices = parse_visible_devices(None, m)
    assert [d.label for d in devices] == ["GPU 0 MIG 0", "GPU 0 MIG 1", "GPU 1"]
    assert devices[0].memory_total == 40 * 2**30
    assert parse_visible_devices(devices[1].uuid, m) == [devices[1]]
    assert worker_visible_devices(devices, 1).split(",")[0] == devices[1].uuid


def test_rotate():
    assert rotate(["0", "1", "2", "3"], 0) == ["0", "1", "2", "3"]
    assert rotate(["0", "1", "2", "3"], 2) == ["2", "3", "0", "1"]
    assert rotate(["5", "7"], 3) == ["7", "5"]
    assert rotate([], 1) == []


def test_transfer_counters_read_nvml_fields_and_leave_the_missing_ones_none() -> None:
    import types

    from cudask.devices.nvml import NVMLBackend, transfer_counters

    def field(ret: int, value: int) -> object:
        return types.SimpleNamespace(nvmlReturn=ret, value=types.SimpleNamespace(ullVal=value))

    asked: list[object] = []

    class FakeNV:
        def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
            asked.append(uuid)
            return "h"

        def nvmlDeviceGetFieldValues(self, handle: str, ids: list[object]) -> list[object]:
            asked.append(ids)
            return [
                field(0, 100),
                field(0, 200),
                field(0, 3),
                field(3, 0),
            ]  # RX NVLink: not supported

    backend = NVMLBackend()
    backend._init = lambda: FakeNV()  # type: ignore[method-assign]
    got = transfer_counters("GPU-1", backend)
    assert got == {
        "pcie-tx-bytes": 100,
        "pcie-rx-bytes": 200,
        "nvlink-tx-bytes": 3 * 1024,
        "nvlink-rx-bytes": None,
    }
    assert asked[0] == "GPU-1"
    broken = NVMLBackend()
    broken._init = lambda: (_ for _ in ()).throw(RuntimeError("no NVML"))  # type: ignore[method-assign]
    assert set(transfer_counters("GPU-1", broken).values()) == {None}


def test_gpu_model_names_the_gpu_or_none() -> None:
    from cudask.devices.nvml import NVMLBackend, gpu_model

    class FakeNV:
        def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
            if uuid != "GPU-1":
                raise KeyError(uuid)
            return "h"

        def nvmlDeviceGetName(self, handle: str) -> bytes:
            return b"NVIDIA H100 80GB HBM3"

    backend = NVMLBackend()
    backend._init = lambda: FakeNV()  # type: ignore[method-assign]
    assert gpu_model("GPU-1", backend) == "NVIDIA H100 80GB HBM3"
    assert gpu_model("GPU-2", backend) is None
