"""LocalCUDACluster's device memory on real GPUs: RMM resources (pools, managed
memory, logging, tracking, the async resource, allocators of other libraries) and
spilling device -> host -> disk in a worker and between two GPUs' workers
(tests/deploy/test_cluster_gpu.py covers the cluster, devices and CLI)."""

from __future__ import annotations

import os
import sys

import cloudpickle
import pytest
from distributed import Client

from cudask import LocalCUDACluster
from cudask.testing import workers_info

pytestmark = pytest.mark.gpu

# Functions defined here run on LocalCUDACluster workers: send them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _resource_stack() -> str:
    import rmm

    mr = rmm.mr.get_current_device_resource()
    names = []
    while mr is not None:
        names.append(type(mr).__name__)
        mr = getattr(mr, "upstream_mr", None)
    return ">".join(names)


def test_rmm_pool_active():
    pytest.importorskip("rmm")
    with (
        LocalCUDACluster(
            n_workers=1, rmm_pool_size="1GB", rmm_track_allocations=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        stack = next(iter(client.run(_resource_stack).values()))
        assert stack.startswith("TrackingResourceAdaptor>PoolMemoryResource"), stack


def _allocate_through(libs: list[str]) -> int:
    """Allocate 64 MiB with each library; RMM's tracked bytes while they live."""
    import rmm

    held = []
    if "cupy" in libs:
        import cupy

        held.append(cupy.ones(8 << 20, dtype="float64"))
    if "torch" in libs:
        import torch

        held.append(torch.ones(8 << 20, dtype=torch.float64, device="cuda"))
    return int(rmm.mr.get_current_device_resource().get_allocated_bytes())


def test_rmm_managed_pool_logging_tracking_and_external_allocators(tmp_path):
    import importlib.util

    pytest.importorskip("rmm")
    pytest.importorskip("cupy")
    libs = ["cupy"] + (["torch"] if importlib.util.find_spec("torch") else [])
    logs = tmp_path / "rmm-logs"
    with (
        LocalCUDACluster(
            n_workers=1,
            rmm_pool_size="1GB",
            rmm_managed_memory=True,
            rmm_log_directory=str(logs),
            rmm_track_allocations=True,
            rmm_allocator_external_lib_list=",".join(libs),
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        stack = next(iter(client.run(_resource_stack).values()))
        assert stack == (
            "TrackingResourceAdaptor>LoggingResourceAdaptor>PoolMemoryResource>"
            "ManagedMemoryResource"
        ), stack
        allocated = next(iter(client.run(_allocate_through, libs).values()))
        assert allocated >= len(libs) * (64 << 20), (libs, allocated)
        log_file = next(iter(client.run(_flush_rmm_log).values()))
    assert log_file.startswith(str(logs)), log_file
    assert os.path.getsize(log_file) > 0, f"{log_file} is empty"


def _flush_rmm_log() -> str:
    """Flush the worker's RMM logging adaptor; return its file."""
    import rmm

    mr = rmm.mr.get_current_device_resource()
    while not isinstance(mr, rmm.mr.LoggingResourceAdaptor):
        mr = mr.upstream_mr
    mr.flush()
    return mr.get_file_name()


def _device_buffer_bytes(nbytes: int) -> int:
    import rmm

    return rmm.DeviceBuffer(size=nbytes).size


def test_rmm_async_with_release_threshold():
    pytest.importorskip("rmm")
    with (
        LocalCUDACluster(
            n_workers=1,
            rmm_async=True,
            rmm_pool_size="256MB",
            rmm_release_threshold="512MB",
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        assert next(iter(client.run(_resource_stack).values())) == "CudaAsyncMemoryResource"
        assert client.submit(_device_buffer_bytes, 64 << 20).result() == 64 << 20


def test_rmm_async_and_cupy_allocator():
    pytest.importorskip("rmm")
    pytest.importorskip("cupy")

    def check() -> tuple[str, str]:
        import cupy
        import rmm

        return type(rmm.mr.get_current_device_resource()).__name__, repr(cupy.cuda.get_allocator())

    with (
        LocalCUDACluster(
            n_workers=1,
            rmm_async=True,
            rmm_maximum_pool_size="2GB",
            rmm_allocator_external_lib_list="cupy",
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        mr, alloc = next(iter(client.run(check).values()))
        assert mr == "LimitingResourceAdaptor" and "rmm" in alloc


def _chunk(i: int, elements: int):  # a CuPy array
    import cupy

    return cupy.arange(elements, dtype="uint64") + (i << 32)


def _check(chunk, i: int) -> int:
    import cupy

    expected = cupy.arange(chunk.size, dtype="uint64") + (i << 32)
    return int((chunk != expected).sum())


def _spilled(dask_worker) -> float:
    return dask_worker.data.metrics()["spill-device-to-host-bytes"]


@pytest.mark.multigpu
@pytest.mark.parametrize("jit", [False, True])
def test_spilling_on_two_gpus_with_transfers_between_them(jit):
    """Every worker past its limit; each chunk is read back on the other GPU too."""
    pytest.importorskip("cupy")
    elements = 32 << 20  # 256 MiB of uint64
    with (
        LocalCUDACluster(
            CUDA_VISIBLE_DEVICES="0,1",
            device_memory_limit="1GB",
            jit_unspill=jit,
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        a, b = sorted(workers_info(client))
        chunks = [
            client.submit(_chunk, i, elements, workers=[(a, b)[i % 2]], pure=False)
            for i in range(16)
        ]  # 2 GiB per GPU
        local = [
            client.submit(_check, c, i, workers=[(a, b)[i % 2]], pure=False)
            for i, c in enumerate(chunks)
        ]
        crossed = [
            client.submit(_check, c, i, workers=[(b, a)[i % 2]], pure=False)
            for i, c in enumerate(chunks)
        ]
        assert client.gather(local) == [0] * 16
        assert client.gather(crossed) == [0] * 16
        spilled = client.run(_spilled)
        assert spilled[a] > 0 and spilled[b] > 0


def test_log_spilling_local_directory_and_worker_class(tmp_path):
    pytest.importorskip("cupy")
    from distributed import wait

    scratch = tmp_path / "scratch"
    with (
        LocalCUDACluster(
            n_workers=1,
            device_memory_limit="256MB",
            log_spilling=True,
            local_directory=str(scratch),
            worker_class="cudask.testing.workers.TaggedWorker",
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        chunks = [client.submit(_chunk, i, 16 << 20, pure=False) for i in range(4)]  # 4x128 MiB
        wait(chunks)
        checks = [client.submit(_check, c, i, pure=False) for i, c in enumerate(chunks)]
        assert client.gather(checks) == [0] * 4
        (kind,) = client.run(lambda dask_worker: type(dask_worker).__name__).values()
        assert kind == "TaggedWorker"
        (local,) = client.run(lambda dask_worker: dask_worker.local_directory).values()
        assert local.startswith(str(scratch))
        (logs,) = client.get_worker_logs().values()
        moves = [message for _, message in logs if "cudask: spilled" in message]
        assert any("device -> host" in m for m in moves), [m for _, m in logs][-10:]


def _tier_counts(dask_worker) -> dict:
    m = dask_worker.data.metrics()
    return {
        k: m[k]
        for k in (
            "spill-device-to-host-count",
            "spill-host-to-disk-count",
            "unspill-disk-to-host-count",
        )
    }


def test_device_host_disk_in_a_worker(tmp_path):
    """Past the device limit data go to host memory, past the host tier to disk
    (distributed's spill machinery, in the worker's local directory), and every
    value comes back."""
    pytest.importorskip("cupy")
    from distributed import wait

    # host tier: 0.6 x 8 GB (distributed's target); 6 GiB of chunks leave ~1.2 GB for disk,
    # and the worker's memory stays well under the pause (80%) and terminate (95%) lines
    n = 48
    with (
        LocalCUDACluster(
            n_workers=1,
            device_memory_limit="256MB",
            memory_limit="8GB",
            log_spilling=True,
            local_directory=str(tmp_path),
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        chunks = [client.submit(_chunk, i, 16 << 20, pure=False) for i in range(n)]  # 6 GiB
        wait(chunks)
        counts = next(iter(client.run(_tier_counts).values()))
        assert counts["spill-host-to-disk-count"] > 0, counts
        checks = [client.submit(_check, c, i, pure=False) for i, c in enumerate(chunks)]
        assert client.gather(checks) == [0] * n
        counts = next(iter(client.run(_tier_counts).values()))
        assert counts["unspill-disk-to-host-count"] > 0, counts
        (logs,) = client.get_worker_logs(n=100_000).values()
        assert any("host -> disk" in message for _, message in logs)
