"""The exchange of pool slabs between the workers of a host (cudask.comm.ahead)
on CPU: workers in this process over real TCP comms, a recorded pool slab
behind the fake backend, each worker presented as a child process (a process
does not map its own memory); each worker offers the slab to the other through
the handler, the slab is mapped once, before any transfer, and the first
transfer finds it mapped. A worker that did not advertise the exchange is never
asked. The GPU proof is tests/comm/test_ipc_gpu.py::test_pool_slabs_stay_mapped."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from distributed import Client, LocalCluster, WorkerPlugin

from cudask.comm import ahead, ipc, ipc_peers, lifetimes
from cudask.testing import wait_for, workers_info
from cudask.testing.fake_cuda import FakeDeviceArray, FakeIPCBackend, FakeUpstream

REPLY = [ipc.FAMILY, "dask", "pickle", "error"]
_BACKEND = FakeIPCBackend()


_EXCHANGES: list[ahead.MapAhead] = []  # the workers' exchanges, as started


_ASKED: list[dict[str, Any]] = []  # what a worker without the exchange was asked


async def _record(**message: Any) -> None:
    _ASKED.append(message)


_PREPARED: list[float] = []  # when a worker's exchange ran its `prepare`


def _prepare() -> None:
    _PREPARED.append(time.monotonic())


class _StartMapAhead(WorkerPlugin):
    """Starts the exchange on every worker, or only on the worker named `only` (the
    others then record what they are asked, as if they had the handler); with
    `prepare`, each exchange records when it runs its `prepare`."""

    name = "test-map-ahead"

    def __init__(self, only: str | None = None, prepare: bool = False) -> None:
        self.only = only
        self.prepare = prepare
        self.exchange: ahead.MapAhead | None = None

    def setup(self, worker: Any) -> None:
        if self.only is None or worker.name == self.only:
            self.exchange = ahead.MapAhead(worker, _prepare if self.prepare else None)
            self.exchange.start()
            _EXCHANGES.append(self.exchange)
        else:
            worker.handlers[ahead.HANDLER] = _record

    def teardown(self, worker: Any) -> None:
        if self.exchange is not None:
            self.exchange.stop()


@pytest.fixture
def as_child(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The workers of this process present themselves as a child process of this
    host (`ipc_peers.identity`), which runs until the test ends."""
    import psutil

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    mine = lifetimes.this_process()
    named = lifetimes.Process(child.pid, psutil.Process(child.pid).create_time(), mine.pidns)
    identity = {"node": ipc_peers.node_identity(), "sender": named.as_header()}
    monkeypatch.setattr(ipc_peers, "identity", lambda: identity)
    _EXCHANGES.clear()
    try:
        yield identity
    finally:
        _EXCHANGES.clear()
        child.kill()
        child.wait()


def _slab_piece() -> FakeDeviceArray:
    """A piece of the slab (the workers run in this process)."""
    return FakeDeviceArray(_BACKEND.allocations[b"slab"][4096:12288])


def _sum(x: FakeDeviceArray) -> float:
    return float(x._array.astype("f8").sum())


def test_the_workers_of_a_host_map_each_others_slabs_before_any_transfer(
    monkeypatch: pytest.MonkeyPatch, as_child: dict[str, Any]
) -> None:
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
    with (
        LocalCluster(
            n_workers=2,
            processes=False,
            protocol="tcp",
            dashboard_address=":0",
            threads_per_worker=1,
            serializers=REPLY,
            deserializers=REPLY,
        ) as cluster,
        Client(cluster) as client,
    ):
        client.register_plugin(_StartMapAhead())
        assert wait_for(lambda: ipc.stats()["mappings-opened-ahead"] == 1, timeout=120)
        a, b = list(workers_info(client))
        # both sides mapped: the handler an introducer's offer, an introducer the answer
        assert wait_for(
            lambda: "its offer" in mapped_from and bool(set(mapped_from) & {a, b}), timeout=120
        ), mapped_from
        x = client.submit(_slab_piece, workers=[a])
        assert client.submit(_sum, x, workers=[b]).result(timeout=120) == float(
            slab[4096:12288].astype("f8").sum()
        )
        stats = ipc.stats()
    # Both workers offered the same slab (one process here); it was opened once, ahead.
    assert _BACKEND.opened.count(b"slab") == 1 and slabs.shared
    assert stats["mappings-opened"] == 0 and stats["mappings-reused"] == 1, stats
    slabs.deallocate(slab.ctypes.data, slab.nbytes, None)


def test_a_worker_that_did_not_advertise_the_exchange_is_not_asked(
    monkeypatch: pytest.MonkeyPatch, as_child: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(ipc, "_state", ipc._State())
    _ASKED.clear()
    with (
        caplog.at_level(logging.DEBUG),
        LocalCluster(
            n_workers=2,
            processes=False,
            protocol="tcp",
            dashboard_address=":0",
            threads_per_worker=1,
        ) as cluster,
        Client(cluster) as client,
    ):
        first = min(w.name for w in cluster.workers.values())
        client.register_plugin(_StartMapAhead(only=first))
        # done once the one exchange advertised itself and its introduction ended
        assert wait_for(lambda: len(_EXCHANGES) == 1 and not _EXCHANGES[0].tasks, timeout=120)
        advertised = client.run_on_scheduler(
            lambda dask_scheduler: dict(dask_scheduler.task_metadata.get(ahead.KEY, {}))
        )
    assert list(advertised.values()) == [as_child], advertised
    assert _ASKED == [] and "No handler" not in caplog.text


class _Scheduler:
    """The scheduler calls `MapAhead._peers` makes: its metadata and its workers."""

    def __init__(self, advertised: dict[str, Any], workers: list[str]) -> None:
        self.metadata = dict(advertised)
        self.workers = workers

    async def set_metadata(self, keys: list[str], value: Any) -> None:
        self.metadata[keys[1]] = value

    async def get_metadata(self, keys: list[str], default: Any = None) -> dict[str, Any]:
        return dict(self.metadata)

    async def ncores(self) -> dict[str, int]:
        return dict.fromkeys(self.workers, 1)


def test_only_running_processes_of_this_host_that_advertised_are_asked(
    as_child: dict[str, Any],
) -> None:
    later = as_child["sender"]["started"] + 100
    ended = {**as_child, "sender": {**as_child["sender"], "started": later}}
    advertised = {
        "tcp://peer:1": as_child,
        "tcp://gone:1": as_child,  # left the cluster: not among the scheduler's workers
        "tcp://reused:1": ended,  # its process ended (the pid now another's)
        "tcp://elsewhere:1": {**as_child, "node": "another host"},
        "tcp://this-process:1": {
            "node": ipc_peers.node_identity(),
            "sender": lifetimes.this_process().as_header(),
        },
        "tcp://junk:1": {"node": ipc_peers.node_identity(), "sender": {"pid": float("inf")}},
        "tcp://none:1": None,
    }
    workers = ["tcp://me:1", *(a for a in advertised if a != "tcp://gone:1")]
    scheduler = _Scheduler(advertised, workers)
    exchange = ahead.MapAhead(types.SimpleNamespace(address="tcp://me:1", scheduler=scheduler))
    assert asyncio.run(exchange._peers()) == ["tcp://peer:1"]
    assert scheduler.metadata["tcp://me:1"] == as_child  # advertised itself first


def test_the_handler_answers_only_a_process_it_may_map(
    monkeypatch: pytest.MonkeyPatch, as_child: dict[str, Any]
) -> None:
    mapped: list[Any] = []

    async def record(self: ahead.MapAhead, offer: Any, source: str) -> None:
        mapped.append(offer)

    monkeypatch.setattr(ahead.MapAhead, "_map", record)
    monkeypatch.setattr(ipc, "offer", lambda: {"handles": [b"mine"]})

    async def answers() -> list[Any]:
        exchange = ahead.MapAhead(types.SimpleNamespace(handlers={}))
        got = [
            await exchange.answer(peer=as_child, offer={"handles": [b"theirs"]}),
            await exchange.answer(peer={**as_child, "node": "another host"}, offer={"x": 1}),
            await exchange.answer(peer=None, offer={"x": 1}),
        ]
        await asyncio.gather(*exchange.tasks)
        return got

    assert asyncio.run(answers()) == [{"handles": [b"mine"]}, None, None]
    assert mapped == [{"handles": [b"theirs"]}]  # only the accepted peer's offer


def test_a_worker_prepares_its_offer_only_once_it_meets_a_peer(
    monkeypatch: pytest.MonkeyPatch, as_child: dict[str, Any]
) -> None:
    """`prepare` (the staging area, cudask.worker.plugins.DeviceIPC) runs when a worker
    first meets a peer of its host, before its offer: a worker alone on its host never
    runs it; once a second joins, both do."""
    monkeypatch.setattr(lifetimes, "_pools", [])
    _PREPARED.clear()
    with (
        LocalCluster(
            n_workers=1,
            processes=False,
            protocol="tcp",
            dashboard_address=":0",
            threads_per_worker=1,
        ) as cluster,
        Client(cluster) as client,
    ):
        client.register_plugin(_StartMapAhead(prepare=True))
        # the lone worker's introduction has ended: it found no peer
        assert wait_for(lambda: len(_EXCHANGES) == 1 and not _EXCHANGES[0].tasks, timeout=120)
        assert _PREPARED == []
        cluster.scale(2)
        client.wait_for_workers(2, timeout=120)
        assert wait_for(lambda: len(_PREPARED) >= 2, timeout=120), _PREPARED  # both sides
