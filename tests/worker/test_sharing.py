"""Several workers per GPU (workers_per_gpu) in the spec builder, on fake machines:
each worker's share of the sizes, of the CPUs and of 'auto' host memory, its name,
and nothing changed with one worker per GPU."""

from __future__ import annotations

from typing import Any

import pytest

from cudask.deploy.local import select_devices
from cudask.devices import discover
from cudask.errors import OptionError
from cudask.options import resolve
from cudask.testing import FakeBackend, fake_gpu
from cudask.worker import plugins as P
from cudask.worker.sharing import cluster_slots, cpu_share, node_slots, share, workers_per_gpu
from cudask.worker.sizing import RMM_ALIGNMENT, device_sizes, host_memory_limit
from cudask.worker.spec import gpu_name, nanny_options, worker_names

GiB = 1 << 30


@pytest.fixture
def dgx():
    return discover(FakeBackend.dgx(2, cores=16))


def test_cpu_share_splits_when_there_are_enough_cpus() -> None:
    cpus = tuple(range(8))
    assert cpu_share(cpus, 1, 0) == cpus
    assert [cpu_share(cpus, 2, k) for k in range(2)] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    parts = [cpu_share(tuple(range(10)), 3, k) for k in range(3)]
    assert parts == [(0, 1, 2, 3), (4, 5, 6), (7, 8, 9)]  # near-even, contiguous, all used
    assert cpu_share((0, 1, 2), 4, 3) == (0, 1, 2)  # fewer CPUs than workers: shared
    assert cpu_share((5, 9), 2, 1) == (9,)  # the GPU's CPUs, whatever their numbers


def test_share_and_slots() -> None:
    assert share(None, 4) is None and share(10, 1) == 10
    assert share(1000, 3) == 333 and share(1000, 3, 256) == 256
    assert workers_per_gpu({}) == 1 and workers_per_gpu({"workers_per_gpu": 3}) == 3
    assert cluster_slots(2, 2) == [(0, 0), (1, 0), (0, 1), (1, 1)]  # every GPU before a second
    assert node_slots([1, 3], 2) == [(1, 0), (1, 1), (3, 0), (3, 1)]  # GPU by GPU


def test_each_worker_gets_its_share_of_the_device_sizes(dgx, monkeypatch) -> None:
    from cudask import options

    monkeypatch.setattr(options, "_library", lambda m: True)
    values = {"device_memory_limit": "40GB", "rmm_pool_size": 0.5, "rmm_maximum_pool_size": "60GB"}
    device = select_devices(dgx, "0", None)[0]
    one = device_sizes(resolve(values, "cluster"), device)
    three = device_sizes(resolve({**values, "workers_per_gpu": 3}, "cluster"), device)
    assert one.device_memory_limit == 40_000_000_000
    assert three.device_memory_limit == 40_000_000_000 // 3
    assert one.rmm_pool_size == 40 * GiB and three.rmm_pool_size is not None
    assert three.rmm_pool_size % RMM_ALIGNMENT == 0 and three.rmm_maximum_pool_size is not None
    assert 3 * three.rmm_pool_size <= 40 * GiB < 3 * three.rmm_pool_size + 3 * RMM_ALIGNMENT
    assert three.rmm_maximum_pool_size % RMM_ALIGNMENT == 0
    assert three.rmm_maximum_pool_size <= (one.rmm_maximum_pool_size or 0) // 3
    asyncs = device_sizes(
        resolve(
            {"rmm_async": True, "rmm_release_threshold": "8GB", "workers_per_gpu": 2}, "cluster"
        ),
        device,
    )
    assert asyncs.rmm_release_threshold == 4_000_000_000 // RMM_ALIGNMENT * RMM_ALIGNMENT
    # a size past the whole device is refused as before (shares are taken after the check)
    with pytest.raises(OptionError, match="device_memory_limit"):
        device_sizes(
            resolve({"device_memory_limit": "100GB", "workers_per_gpu": 2}, "cluster"), device
        )


def test_cudf_spill_keeps_the_store_limit_shared(dgx, monkeypatch) -> None:
    from cudask import options

    monkeypatch.setattr(options, "_library", lambda m: True)
    device = select_devices(dgx, "0", None)[0]

    def sizes(cudf_spill: bool) -> Any:
        return device_sizes(
            resolve(
                {
                    "device_memory_limit": "20GB",
                    "workers_per_gpu": 4,
                    "enable_cudf_spill": cudf_spill,
                },
                "cluster",
            ),
            device,
        )

    # the store holds the limit with cuDF spilling on as off
    assert sizes(True) == sizes(False) and sizes(True).device_memory_limit == 5_000_000_000


def test_specs_of_two_workers_on_each_gpu(dgx) -> None:
    o = resolve({"workers_per_gpu": 2, "device_memory_limit": "10GB"}, "cluster")
    devices = select_devices(dgx, None, 4, per_gpu=2)
    specs = {
        gpu_name(devices[i], k, 2): nanny_options(
            o, devices, i, n_workers=4, name=gpu_name(devices[i], k, 2), k=k
        )
        for i, k in cluster_slots(len(devices), 2)
    }
    assert list(specs) == ["0-0", "1-0", "0-1", "1-1"]
    # the same GPU first in CUDA_VISIBLE_DEVICES for both workers of a GPU
    assert specs["0-0"]["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert specs["0-1"]["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert specs["1-1"]["env"]["CUDA_VISIBLE_DEVICES"] == "1,0"
    affinity = {n: s["plugins"][0] for n, s in specs.items()}
    assert all(isinstance(a, P.CPUAffinity) for a in affinity.values())
    assert affinity["0-0"].cpus == tuple(range(4)) and affinity["0-1"].cpus == tuple(range(4, 8))
    assert affinity["1-0"].cpus == tuple(range(8, 12))
    contexts = {n: s["plugins"][1] for n, s in specs.items()}
    assert contexts["0-0"].expected_uuid == contexts["0-1"].expected_uuid == dgx.gpus[0].uuid
    for spec in specs.values():
        _cls, kwargs = spec["data"]
        assert kwargs["device_memory_limit"] == 5_000_000_000
    assert specs["0-0"]["memory_limit"] == host_memory_limit(o, 4)  # 'auto': 4 workers' share


def test_one_worker_per_gpu_is_unchanged(dgx) -> None:
    o = resolve({"device_memory_limit": "10GB"}, "cluster")
    devices = select_devices(dgx, None, None)
    assert o.workers_per_gpu == 1
    assert [gpu_name(d) for d in devices] == [0, 1] == [gpu_name(d, 0, 1) for d in devices]
    spec = nanny_options(o, devices, 1, n_workers=2, name=1)
    assert spec["plugins"][0].cpus == tuple(range(8, 16))  # all of the GPU's CPUs
    assert spec["data"][1]["device_memory_limit"] == 10_000_000_000
    assert worker_names("node", devices) == ["node-0", "node-1"]
    assert worker_names("node", devices[:1]) == ["node"]


def test_names() -> None:
    machine = discover(FakeBackend([fake_gpu(0, cpus=[0]), fake_gpu(1, cpus=[1], mig=2)]))
    devices = select_devices(machine, None, None)
    assert [gpu_name(d, 1, 2) for d in devices] == [
        "0-1",
        f"{devices[1].uuid}-1",
        f"{devices[2].uuid}-1",
    ]
    assert worker_names("node", devices[:1], 2) == ["node-0", "node-1"]
    assert worker_names("node", devices[:2], 2) == ["node-0", "node-1", "node-2", "node-3"]
    assert worker_names(None, devices[:2], 3) == [None] * 6


def test_n_workers_counts_workers(dgx) -> None:
    assert len(select_devices(dgx, None, 4, per_gpu=2)) == 2
    with pytest.raises(
        OptionError,
        match=r"n_workers=5 is more than the 4 workers of the 2 "
        r"visible GPU\(s\) .* workers_per_gpu=2",
    ):
        select_devices(dgx, None, 5, per_gpu=2)
    with pytest.raises(OptionError, match="one worker per GPU"):  # the message of N = 1
        select_devices(dgx, None, 3)
