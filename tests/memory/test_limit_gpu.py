"""The device limit held on a real GPU: a one-worker cluster at a 1 GiB limit
persists 4 GiB of 64 MiB CuPy chunks, sums them, then runs tasks that each make a
256 MiB temporary; NVML's used memory of the GPU, sampled every 20 ms less the idle
worker's, stays within the limit plus the running task's working set plus 10% in
every phase, and every sum is right (`cudask_bench.limit` runs the phases). A task
asking for more than the GPU has fails with a MemoryError naming its key, the
bytes and the limit, and every other key survives. Each with CuPy allocating from
its own pool, and through RMM (no pool: `rmm_allocator_external_lib_list="cupy"`).

Run on a GPU machine:  python -m pytest tests/memory/test_limit_gpu.py -v
"""

from __future__ import annotations

import os
from typing import Any

import pytest

pytestmark = pytest.mark.gpu

MiB = 1 << 20
GiB = 1 << 30
ALLOCATORS = {"cupy-pool": {}, "rmm": {"rmm_allocator_external_lib_list": "cupy"}}


def _device() -> Any:
    from cudask.devices import discover, parse_visible_devices

    return parse_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), discover())[0]


def _cluster(uuid: str, allocator: str, limit: int) -> Any:
    from cudask import LocalCUDACluster

    pytest.importorskip("cupy")
    if allocator == "rmm":
        pytest.importorskip("rmm")
    return LocalCUDACluster(
        CUDA_VISIBLE_DEVICES=uuid,
        device_memory_limit=limit,
        threads_per_worker=1,
        dashboard_address=":0",
        silence_logs=40,
        **ALLOCATORS[allocator],
    )


def _metrics(dask_worker: Any) -> dict[str, float]:
    return dict(dask_worker.data.metrics())


def _allocate(nbytes: int) -> int:
    import cupy

    return int(cupy.ones(nbytes, dtype=cupy.uint8).sum(dtype=cupy.uint64))


@pytest.mark.parametrize("allocator", list(ALLOCATORS))
def test_peak_within_the_limit_plus_the_working_set(allocator: str) -> None:
    from distributed import Client

    from cudask_bench.gpu_memory import MemorySampler, nvml_used
    from cudask_bench.limit import PHASES, LimitPlan, measure

    uuid = _device().uuid
    plan = LimitPlan(
        gpu=uuid,
        nvml_device=uuid,
        device_memory_limit=GiB,
        chunks=64,
        chunk_size=64 * MiB,
        temporary=256 * MiB,
        warm_runs=0,
    )
    with (
        _cluster(uuid, allocator, plan.device_memory_limit) as cluster,
        Client(cluster) as client,
        MemorySampler(nvml_used(uuid), 0.02) as sampler,
    ):
        figures = measure(client, plan, sampler)
        (m,) = client.run(_metrics).values()
    assert figures["correct"], figures["results"]
    over = {
        p: {k: figures["phases"][p][k] / MiB for k in ("peak_bytes", "bound_bytes")}
        for p in PHASES
        if not figures["phases"][p]["within"]
    }
    assert not over, f"peaks above 1.1 x (limit + working set), MiB: {over}"
    assert sampler.samples > 10 and m["spill-at-limit-count"] >= 1, m


@pytest.mark.parametrize("allocator", list(ALLOCATORS))
def test_a_task_asking_more_than_the_gpu_fails_alone(allocator: str) -> None:
    import dask
    from distributed import Client

    from cudask_bench.limit import LimitPlan, _array, _host_int, expected

    device = _device()
    ask = 2 * int(device.memory_total)
    plan = LimitPlan(chunks=24, chunk_size=64 * MiB)  # 1.5 GiB through a 1 GiB limit
    named = rf"task 'too-big' asked for .*\({ask} bytes\).*out of memory.*\({GiB} bytes\)"
    with _cluster(device.uuid, allocator, GiB) as cluster, Client(cluster) as client:
        held = _array(plan, "cupy", 0).persist()
        with pytest.raises(MemoryError, match=named):
            client.submit(_allocate, ask, key="too-big").result()
        total = client.compute(dask.delayed(_host_int)(held.sum()), sync=True)
        assert total == expected(plan)["sum"]  # every held key is still there, unchanged
        assert client.submit(_allocate, 256 * MiB).result() == 256 * MiB
