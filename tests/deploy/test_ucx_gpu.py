"""protocol="ucx" on real GPUs (needs distributed-ucxx: `cudask[ucx]`)."""

from __future__ import annotations

import pytest
from distributed import Client

from cudask import LocalCUDACluster
from cudask.testing import workers_info

pytestmark = pytest.mark.gpu


def _device_sum(n: int) -> float:
    import cupy

    return float(cupy.arange(n, dtype="float64").sum())


def _make(n: int):
    import cupy

    return cupy.arange(n, dtype="float64")


def test_ucx_tcp_transport():
    pytest.importorskip("distributed_ucxx")
    pytest.importorskip("cupy")
    with (
        LocalCUDACluster(
            n_workers=1, protocol="ucx", enable_tcp_over_ucx=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        (address,) = workers_info(client)
        assert address.startswith("ucx://")
        assert client.submit(_device_sum, 1000).result() == 499500.0
        config = client.run(lambda: __import__("dask").config.get("distributed-ucxx"))
        assert next(iter(config.values()))["tcp"] is True


@pytest.mark.multigpu
def test_ucx_nvlink_moves_device_arrays_between_gpus():
    pytest.importorskip("distributed_ucxx")
    cupy = pytest.importorskip("cupy")
    with (
        LocalCUDACluster(
            CUDA_VISIBLE_DEVICES="0,1",
            protocol="ucx",
            enable_nvlink=True,
            enable_tcp_over_ucx=True,
            rmm_pool_size="1GB",
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        a, b = sorted(workers_info(client))
        x = client.submit(_make, 10**7, workers=[a], pure=False)
        y = client.submit(lambda v: float(v.sum()), x, workers=[b], pure=False)
        assert y.result() == float(cupy.arange(10**7, dtype="float64").sum().get())
