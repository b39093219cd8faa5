"""JIT-unspill on a real GPU with CuPy: cupy dask.array workloads through
LocalCUDACluster(jit_unspill=True), inputs three times the device limit touched
one at a time, and spill on demand turning an out-of-memory into a success
(CuPy's pool and RMM's resource).

A device "capacity" is imposed with CuPy's memory-pool limit (or an RMM pool of
fixed size), so every test stays around 1 GiB of device memory. Not covered:
dask-cuDF (no cuDF in this file), timings (`cudask bench`).
"""

from __future__ import annotations

import sys
from typing import Any

import cloudpickle
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

# Functions below run on the workers: send them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MiB = 1 << 20


def _cluster(**kwargs: Any) -> Any:
    from cudask import LocalCUDACluster

    return LocalCUDACluster(n_workers=1, threads_per_worker=1, dashboard_address=":0", **kwargs)


def _store_metrics(dask_worker: Any) -> dict[str, Any]:
    return {"type": type(dask_worker.data).__name__, **dask_worker.data.metrics()}


def _limit_cupy_pool(nbytes: int) -> None:
    from cudask.comm.leases import current_pool

    current_pool().set_limit(size=nbytes)


def _host(x: Any) -> np.ndarray:
    import cupy

    from cudask.memory.jit.proxy import unproxy

    return cupy.asnumpy(unproxy(x))


@pytest.mark.parametrize("jit", [True, False])
def test_cupy_dask_array_workloads(jit: bool) -> None:
    cupy = pytest.importorskip("cupy")
    import dask
    import dask.array as da
    from distributed import Client

    with (
        _cluster(jit_unspill=jit, device_memory_limit="64MB") as cluster,
        Client(cluster) as client,
    ):
        with dask.config.set({"array.backend": "cupy"}):
            x = da.random.random((4000, 4000), chunks=1000)  # 128 MB of float64
        x = x.persist()
        full = x.map_blocks(cupy.asnumpy, meta=np.empty((0, 0))).compute()
        assert isinstance(full, np.ndarray) and full.shape == (4000, 4000)

        assert np.isclose(float(_host((x + x.T).sum().compute())), (full + full.T).sum())
        dot = _host(x.dot(x.T)[:100, :300].compute())
        assert np.allclose(dot, (full @ full.T)[:100, :300])
        assert np.isclose(float(_host(x.mean().compute())), full.mean())
        assert np.allclose(_host(x[::7, 3:900:5].compute()), full[::7, 3:900:5])
        tall = x[:, :100].rechunk((1000, 100))
        s = _host(da.linalg.svd(tall)[1].compute())
        assert np.allclose(s, np.linalg.svd(full[:, :100], compute_uv=False))

        def stencil(b: Any) -> Any:
            return b * 2 - b.mean()

        got = _host(x.map_overlap(stencil, depth=1, boundary="reflect").sum().compute())
        expected = (
            da.from_array(full, chunks=1000)
            .map_overlap(stencil, depth=1, boundary="reflect")
            .sum()
            .compute(scheduler="sync")
        )
        assert np.isclose(float(got), float(expected))
        (metrics,) = client.run(_store_metrics).values()
        assert metrics["type"] == ("ProxyStore" if jit else "TieredStore")
        assert metrics["spill-device-to-host-count"] > 0
        if jit:
            assert metrics["proxies"] > 0


def _make(i: int, elements: int) -> Any:
    import cupy

    return cupy.full(elements, i, dtype=cupy.float32)


def _touch_one_at_a_time(*chunks: Any) -> tuple[float, int]:
    from distributed import get_worker

    data = get_worker().data
    total, peak = 0.0, 0
    for chunk in chunks:
        total += float(chunk.sum())
        peak = max(peak, int(data.device_bytes))
    return total, peak


@pytest.mark.parametrize("jit", [True, False])
def test_inputs_three_times_the_limit_touched_one_at_a_time(jit: bool) -> None:
    pytest.importorskip("cupy")
    from distributed import Client, wait

    limit, chunk, n = 256 * MiB, 64 * MiB, 12  # 768 MiB of inputs: 3x the limit
    with _cluster(jit_unspill=jit, device_memory_limit=limit) as cluster, Client(cluster) as client:
        client.run(_limit_cupy_pool, 600 * MiB)  # a 600 MiB "device"
        chunks = [client.submit(_make, i, chunk // 4, pure=False) for i in range(n)]
        wait(chunks)  # not gather: that would bring all 768 MiB back at once
        future = client.submit(_touch_one_at_a_time, *chunks, pure=False)
        if jit:
            total, peak = future.result()
            assert total == sum(i * (chunk // 4) for i in range(n))
            assert peak <= limit + chunk
            (metrics,) = client.run(_store_metrics).values()
            assert metrics["unspill-host-to-device-count"] >= n - limit // chunk
        else:
            # Every input is brought back before the task starts: 768 MiB do not fit.
            with pytest.raises(Exception, match="(?i)memory"):
                future.result()


def test_spill_on_demand_in_process(tmp_path: Any) -> None:
    cupy = pytest.importorskip("cupy")
    from cudask.memory.jit.proxy_store import ProxyStore
    from cudask.memory.settings import store_settings

    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    previous_limit = pool.get_limit()
    original = cupy.cuda.get_allocator()
    # cuDF's import routes CuPy's allocations through RMM, where the pool's limit does not
    # apply: this test is about CuPy's own pool, whatever ran before it in this process
    base = pool.malloc
    cupy.cuda.set_allocator(base)
    pool.set_limit(size=1024 * MiB)  # a 1 GiB "device"
    kwargs: dict[str, Any] = {
        "device_memory_limit": None,
        "settings": store_settings(pinned_pool_size="1GB", pinned_preallocate=False),
        "local_directory": str(tmp_path),
    }
    try:
        off = ProxyStore(spill_on_demand=False, **kwargs)
        for i in range(6):
            off[i] = cupy.full(128 * MiB // 4, i, dtype=cupy.float32)  # 768 MiB
        with pytest.raises(cupy.cuda.memory.OutOfMemoryError):
            cupy.empty(512 * MiB, dtype=cupy.uint8)
        off.close()
        del off
        pool.free_all_blocks()

        on = ProxyStore(**kwargs)
        for i in range(6):
            on[i] = cupy.full(128 * MiB // 4, i, dtype=cupy.float32)
        assert on.on_demand is not None and on.on_demand.installed[:1] == ["cupy"]
        big = cupy.empty(512 * MiB, dtype=cupy.uint8)  # fits only after eviction
        big.fill(7)
        assert int(big[-1]) == 7
        assert on.metrics()["spill-on-demand-count"] >= 1
        del big
        for i in range(6):
            assert float(on[i][0]) == i and float(on[i][-1]) == i
        on.close()
        assert cupy.cuda.get_allocator() is base
    finally:
        cupy.cuda.set_allocator(original)
        pool.set_limit(size=previous_limit)
        pool.free_all_blocks()


def _fill_then_allocate(nbytes: int) -> int:
    import cupy

    big = cupy.empty(nbytes, dtype=cupy.uint8)
    big.fill(3)
    return int(big[-1])


def test_spill_on_demand_in_a_cluster() -> None:
    pytest.importorskip("cupy")
    from distributed import Client

    with (
        _cluster(jit_unspill=True, device_memory_limit="4GB") as cluster,
        Client(cluster) as client,
    ):
        client.run(_limit_cupy_pool, 1024 * MiB)
        chunks = [client.submit(_make, i, 128 * MiB // 4, pure=False) for i in range(6)]
        client.gather(chunks)  # 768 MiB held, under the 4 GB limit: nothing spilled
        assert client.submit(_fill_then_allocate, 512 * MiB, pure=False).result() == 3
        (metrics,) = client.run(_store_metrics).values()
        assert metrics["spill-on-demand-count"] >= 1
        back = client.gather([client.submit(lambda c: float(c[0]), c) for c in chunks])
        assert back == [float(i) for i in range(6)]


def test_spill_on_demand_through_rmm() -> None:
    pytest.importorskip("cupy")
    pytest.importorskip("rmm")
    from distributed import Client

    with (
        _cluster(
            jit_unspill=True,
            device_memory_limit="4GB",
            rmm_pool_size="1GiB",
            rmm_maximum_pool_size="1GiB",
            rmm_allocator_external_lib_list="cupy",
        ) as cluster,
        Client(cluster) as client,
    ):
        chunks = [client.submit(_make, i, 128 * MiB // 4, pure=False) for i in range(6)]
        client.gather(chunks)
        assert client.submit(_fill_then_allocate, 512 * MiB, pure=False).result() == 3
        (metrics,) = client.run(_store_metrics).values()
        assert metrics["spill-on-demand-count"] >= 1
