"""The exchange of pool slabs between the workers of a host (cudask.comm.ahead)
on CPU: two workers in this process over real TCP comms, a recorded pool slab
behind the fake backend; each worker offers it to the other through the
handler, the slab is mapped once, before any transfer, and the first transfer
finds it mapped. The GPU proof is
tests/comm/test_ipc_gpu.py::test_pool_slabs_stay_mapped."""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np
import pytest
from distributed import Client, LocalCluster, WorkerPlugin

from cudask.comm import ahead, ipc, lifetimes
from cudask.testing import wait_for, workers_info
from cudask.testing.fake_cuda import FakeDeviceArray, FakeIPCBackend, FakeUpstream

REPLY = [ipc.FAMILY, "dask", "pickle", "error"]
_BACKEND = FakeIPCBackend()


class _StartMapAhead(WorkerPlugin):
    name = "test-map-ahead"

    def setup(self, worker: Any) -> None:
        self.exchange = ahead.MapAhead(worker)
        self.exchange.start()

    def teardown(self, worker: Any) -> None:
        self.exchange.stop()


def _slab_piece() -> FakeDeviceArray:
    """A piece of the slab (the workers run in this process)."""
    return FakeDeviceArray(_BACKEND.allocations[b"slab"][4096:12288])


def _sum(x: FakeDeviceArray) -> float:
    return float(x._array.astype("f8").sum())


def test_the_workers_of_a_host_map_each_others_slabs_before_any_transfer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(ndarray=FakeDeviceArray))
    monkeypatch.setattr(ipc, "_state", ipc._State())
    monkeypatch.setattr(lifetimes, "_pools", [])
    monkeypatch.setattr(lifetimes, "_kept", [])
    ipc.enable(_BACKEND, min_size=1024)
    upstream = FakeUpstream()
    slabs = lifetimes.Slabs(upstream)
    slab = upstream.buffers[slabs.allocate(1 << 16, None)]
    slab[:] = np.arange(slab.size) % 251
    _BACKEND.allocations[b"slab"] = slab
    mapped_from: list[str] = []  # who offered what was mapped: a peer's address, or "its offer"
    original = ahead.MapAhead._map

    async def recording(self: ahead.MapAhead, offer: Any, source: str) -> None:
        if offer is not None:
            mapped_from.append(source)
        await original(self, offer, source)

    monkeypatch.setattr(ahead.MapAhead, "_map", recording)
    with LocalCluster(n_workers=2, processes=False, protocol="tcp", dashboard_address=":0",
                      threads_per_worker=1, serializers=REPLY,
                      deserializers=REPLY) as cluster, Client(cluster) as client:
        client.register_plugin(_StartMapAhead())
        assert wait_for(lambda: ipc.stats()["mappings-opened-ahead"] == 1, timeout=120)
        a, b = list(workers_info(client))
        # both sides mapped: the handler an introducer's offer, an introducer the answer
        assert wait_for(lambda: "its offer" in mapped_from and bool(set(mapped_from) & {a, b}),
                        timeout=120), mapped_from
        x = client.submit(_slab_piece, workers=[a])
        assert client.submit(_sum, x, workers=[b]).result(timeout=120) == float(
            slab[4096:12288].astype("f8").sum())
        stats = ipc.stats()
    # Both workers offered the same slab (one process here); it was opened once, ahead.
    assert _BACKEND.opened.count(b"slab") == 1 and slabs.shared
    assert stats["mappings-opened"] == 0 and stats["mappings-reused"] == 1, stats
    slabs.deallocate(slab.ctypes.data, slab.nbytes, None)
