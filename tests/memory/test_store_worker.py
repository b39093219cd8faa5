"""A real distributed.Worker (on a CPU) whose data is a TieredStore with fake
device objects: tasks spill and unspill through it, metrics reach the worker."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from distributed import Client, Scheduler, Worker
from distributed.worker import DEFAULT_METRICS

from cudask.memory.settings import store_settings
from cudask.memory.store import TieredStore, worker_metrics
from cudask.testing.fake_cuda import FakeCopyBackend, FakeDeviceArray


def make_chunk(i: int) -> FakeDeviceArray:
    a = FakeDeviceArray.empty(1000, "u1")
    a.fill(i % 251)
    return a


def check(a: FakeDeviceArray, i: int) -> bool:
    return type(a) is FakeDeviceArray and bool((a.get() == i % 251).all())


@pytest.mark.timeout(60)
def test_worker_with_tiered_store(tmp_path: object) -> None:
    async def main() -> None:
        async with Scheduler(dashboard_address=":0", port=0) as scheduler:
            kwargs = {
                "device_memory_limit": 4000,
                "memory_limit": 6000,
                "backend": FakeCopyBackend(lag=2),
                "settings": store_settings(
                    4000, 6000, pinned_preallocate=False, pinned_pool_size=1 << 16
                ),
            }
            async with Worker(
                scheduler.address,
                nthreads=2,
                data=(TieredStore, kwargs),
                metrics={**DEFAULT_METRICS, "cudask-memory": worker_metrics},
                dashboard_address=":0",
            ) as worker:
                store = worker.data
                assert isinstance(store, TieredStore)
                assert str(worker.local_directory) in str(store._host.data.slow.data.d.directory)
                async with Client(scheduler.address, asynchronous=True) as client:
                    chunks = client.map(make_chunk, range(20))
                    await client.gather(chunks)
                    assert len(store) == 20
                    assert store.device_bytes <= 4000
                    assert store.keys_on("disk")  # 16 kB did not fit host + device
                    oks = client.map(check, chunks, range(20))
                    assert all(await client.gather(oks))
                    first = await client.gather(chunks[0])
                    np.testing.assert_array_equal(first.get(), np.zeros(1000, "u1"))

                    metrics = await worker.get_metrics()
                    mine = metrics["cudask-memory"]
                    assert mine["spill-device-to-host-count"] > 0
                    assert mine["unspill-host-to-device-count"] > 0
                    assert mine["disk-keys"] > 0
                    assert metrics["spilled_bytes"]["disk"] > 0  # from spilled_total
                    del chunks, oks
                    while len(store):
                        await asyncio.sleep(0.01)
                    assert store.device_bytes == 0

    asyncio.run(main())
