"""The exchange of pool slabs between the workers of a host (cudask.comm.ahead)
on CPU: workers in this process over real TCP comms, a recorded pool slab
behind the fake backend, each worker presented as a child process (a process
does not map its own memory); each worker offers the slab to the other through
the handler, the slab is mapped once, before any transfer, and the first
transfer finds it mapped. A worker that did not advertise the exchange is never
asked. The GPU proof is tests/comm/test_ipc_gpu.py::test_pool_slabs_stay_mapped."""

from __future__ import annotations

import logging
import subprocess
import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from distributed import Client, LocalCluster, WorkerPlugin

from cudask.comm import ahead, ipc, lifetimes
from cudask.testing import wait_for, workers_info
from cudask.testing.fake_cuda import FakeDeviceArray, FakeIPCBackend, FakeUpstream

REPLY = [ipc.FAMILY, "dask", "pickle", "error"]
_BACKEND = FakeIPCBackend()


_EXCHANGES: list[ahead.MapAhead] = []  # the workers' exchanges, as started


class _StartMapAhead(WorkerPlugin):
    """Starts the exchange on every worker, or only on the worker named `only`."""

    name = "test-map-ahead"

    def __init__(self, only: str | None = None) -> None:
        self.only = only
        self.exchange: ahead.MapAhead | None = None

    def setup(self, worker: Any) -> None:
        if self.only is None or worker.name == self.only:
            self.exchange = ahead.MapAhead(worker)
            self.exchange.start()
            _EXCHANGES.append(self.exchange)

    def teardown(self, worker: Any) -> None:
        if self.exchange is not None:
            self.exchange.stop()


@pytest.fixture
def as_child(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The workers of this process present themselves as a child process of this
    host (`ipc.identity`), which runs until the test ends."""
    import psutil

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    mine = lifetimes.this_process()
    named = lifetimes.Process(child.pid, psutil.Process(child.pid).create_time(), mine.pidns)
    identity = {"node": ipc.node_identity(), "sender": named.as_header()}
    monkeypatch.setattr(ipc, "identity", lambda: identity)
    _EXCHANGES.clear()
    try:
        yield identity
    finally:
        child.kill()
        child.wait()


def _slab_piece() -> FakeDeviceArray:
    """A piece of the slab (the workers run in this process)."""
    return FakeDeviceArray(_BACKEND.allocations[b"slab"][4096:12288])


def _sum(x: FakeDeviceArray) -> float:
    return float(x._array.astype("f8").sum())


def test_the_workers_of_a_host_map_each_others_slabs_before_any_transfer(
        monkeypatch: pytest.MonkeyPatch, as_child: dict[str, Any]) -> None:
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


def test_a_worker_that_did_not_advertise_the_exchange_is_not_asked(
        monkeypatch: pytest.MonkeyPatch, as_child: dict[str, Any],
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(ipc, "_state", ipc._State())
    asked: list[Any] = []
    monkeypatch.setattr(ahead.MapAhead, "answer", lambda self, **kw: asked.append(kw))
    with caplog.at_level(logging.DEBUG), \
            LocalCluster(n_workers=2, processes=False, protocol="tcp", dashboard_address=":0",
                         threads_per_worker=1) as cluster, Client(cluster) as client:
        first = min(w.name for w in cluster.workers.values())
        client.register_plugin(_StartMapAhead(only=first))
        # done once the one exchange advertised itself and its introduction ended
        assert wait_for(lambda: len(_EXCHANGES) == 1 and not _EXCHANGES[0].tasks, timeout=120)
        advertised = client.run_on_scheduler(
            lambda dask_scheduler: dict(dask_scheduler.task_metadata.get(ahead.KEY, {})))
    assert list(advertised.values()) == [as_child], advertised
    assert asked == [] and "No handler" not in caplog.text
