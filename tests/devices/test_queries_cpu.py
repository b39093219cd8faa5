"""cudask.utils' GPU questions (cudask.devices.queries) on fake machines: dask-cuda's
names, arguments and return types, answered from discovery."""

from __future__ import annotations

import pytest

from cudask import utils
from cudask.devices import queries
from cudask.errors import DeviceError, NoGPUError
from cudask.testing import FakeBackend, fake_gpu

GiB = 1 << 30


@pytest.fixture
def two() -> FakeBackend:
    return FakeBackend(
        [fake_gpu(0, cpus=[0, 1]), fake_gpu(1, cpus=[2, 3], mig=2)], cpus={0, 1, 2, 3}
    )


def test_the_names_dask_cuda_utils_exports_are_there():
    for name in (
        "get_n_gpus",
        "get_gpu_count",
        "get_gpu_count_mig",
        "get_device_total_memory",
        "get_gpu_uuid",
        "has_device_memory_resource",
        "get_cpu_affinity",
        "get_cluster_configuration",
        "print_cluster_config",
        "parse_device_memory_limit",
        "parse_device_bytes",
        "get_ucx_config",
        "get_preload_options",
        "wait_workers",
        "cuda_visible_devices",
        "nvml_device_index",
        "parse_cuda_visible_device",
        "unpack_bitmask",
        "all_to_all",
        "get_rmm_device_memory_usage",
    ):
        assert callable(getattr(utils, name)), name


def test_counts(two, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert queries.get_gpu_count(two) == 2
    assert queries.get_n_gpus(two) == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0,3")
    assert queries.get_n_gpus(two) == 3  # what the environment says, as in dask-cuda
    count, uuids = queries.get_gpu_count_mig(return_uuids=True, backend=two)
    assert count == 2 and all(u.startswith("MIG-") for u in uuids)
    with pytest.raises(NoGPUError):
        queries.get_gpu_count(FakeBackend.no_nvml())


def test_one_gpu_by_index_or_uuid(two):
    uuid = queries.get_gpu_uuid(1, two)
    assert uuid == fake_gpu(1).uuid
    assert queries.get_gpu_uuid(uuid, two) == uuid
    assert queries.get_device_total_memory(0, two) == 80 * GiB
    assert queries.has_device_memory_resource(0, two) is True
    assert queries.get_cpu_affinity(1, two) == [2, 3]
    mig = queries.get_gpu_count_mig(return_uuids=True, backend=two)[1][0]
    assert queries.get_device_total_memory(mig, two) == 40 * GiB
    with pytest.raises(DeviceError, match="names no GPU"):
        queries.get_gpu_uuid(7, two)
    with pytest.warns(UserWarning, match="every CPU"):
        assert len(queries.get_cpu_affinity(7, two)) >= 1


def test_soc_parts_have_no_dedicated_memory():
    soc = FakeBackend([fake_gpu(0, memory_total=None, cpus=[0])], cpus={0})
    assert queries.get_device_total_memory(0, soc) is None
    assert queries.has_device_memory_resource(0, soc) is False
    assert queries.parse_device_memory_limit("default", backend=soc) is None
    with pytest.raises(ValueError, match="without dedicated memory"):
        queries.parse_device_bytes(0.5, backend=soc)


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, None),
        (0, None),
        ("0", None),
        (0.0, None),
        ("0.0", None),
        ("0 GiB", None),
        (1, 1),
        ("1", 1),
        (1000000000, 1000000000),
        ("1GB", 1000000000),
        (1.0, 80 * GiB),
        ("1.0", 80 * GiB),
        (0.5, 40 * GiB),
        ("auto", 80 * GiB),
        ("default", int(80 * GiB * 0.8)),
    ],
)
def test_device_memory_limits(two, value, expected):
    assert queries.parse_device_memory_limit(value, backend=two) == expected


def test_alignment(two):
    assert (
        queries.parse_device_memory_limit(0.3, alignment_size=256, backend=two)
        == int(80 * GiB * 0.3) // 256 * 256
    )


def test_visible_device_entries(monkeypatch):
    assert queries.parse_cuda_visible_device(2) == 2
    assert queries.parse_cuda_visible_device("2") == 2
    assert queries.parse_cuda_visible_device("GPU-9baca7f5") == "GPU-9baca7f5"
    with pytest.raises(ValueError):
        queries.parse_cuda_visible_device("Foo")
    with pytest.raises(TypeError):
        queries.parse_cuda_visible_device(None)
    assert queries.cuda_visible_devices(0, range(4)) == "0,1,2,3"
    assert queries.cuda_visible_devices(3, range(8)) == "3,4,5,6,7,0,1,2"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-a,GPU-b,GPU-c")
    assert queries.cuda_visible_devices(1) == "GPU-b,GPU-c,GPU-a"
    assert queries.nvml_device_index(1, "1,2,3,0") == 2
    assert queries.nvml_device_index(0, "MIG-1,MIG-2") == "MIG-1"
    assert queries.nvml_device_index(1, [1, 2]) == 2
    with pytest.raises(ValueError):
        queries.nvml_device_index(1, 2)  # type: ignore[arg-type]


def test_unpack_bitmask():
    assert queries.unpack_bitmask([1 + 2 + 8]) == [0, 1, 3]
    assert queries.unpack_bitmask([1 + 2 + 16, 2 + 4]) == [0, 1, 4, 65, 66]
    assert queries.unpack_bitmask([1 + 2 + 16, 2 + 4], mask_bits=32) == [0, 1, 4, 33, 34]
    assert queries.unpack_bitmask([0, 2**64 - 1]) == list(range(64, 128))
    with pytest.raises(TypeError):
        queries.unpack_bitmask(1)  # type: ignore[arg-type]
