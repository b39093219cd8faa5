"""Which IPC mappings a receiving worker keeps (cudask.comm.lifetimes) on CPU:
RMM pool slabs recorded as lasting by the sender, their mappings kept between
messages and closed once the sender's process ends; everything else unmapped
after each message. The sender here is this process, its header naming a
child process as the sender (a real process of this host that the test ends);
the GPU proof is tests/comm/test_ipc_gpu.py::test_pool_slabs_stay_mapped."""

from __future__ import annotations

import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from distributed.protocol.serialize import deserialize, serialize

from cudask.comm import ipc, ipc_peers, lifetimes
from cudask.testing.fake_cuda import FakeDeviceArray, FakeIPCBackend, FakeUpstream

REPLY = [ipc.FAMILY, "dask", "pickle", "error"]
LOCAL = {"recipient": {"address": "tcp://127.0.0.1:40000"}}


@pytest.fixture(autouse=True)
def sender_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's pools and kept resources start empty and are dropped after it."""
    monkeypatch.setattr(lifetimes, "_pools", [])
    monkeypatch.setattr(lifetimes, "_kept", [])


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> FakeIPCBackend:
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(ndarray=FakeDeviceArray))
    monkeypatch.setattr(ipc, "_state", ipc._State())
    fake = FakeIPCBackend()
    ipc.enable(fake, min_size=1024)
    return fake


@pytest.fixture
def sender() -> Iterator[subprocess.Popen]:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        yield child
    finally:
        child.kill()
        child.wait()


def _as_sent_by(header: dict[str, Any], child: subprocess.Popen) -> dict[str, Any]:
    import psutil

    mine = lifetimes.this_process()
    named = lifetimes.Process(child.pid, psutil.Process(child.pid).create_time(), mine.pidns)
    return {**header, "sender": named.as_header()}


def _pool_slab(backend: FakeIPCBackend, nbytes: int) -> tuple[lifetimes.Slabs, np.ndarray]:
    """A slab of a recorded pool, which the fake backend exports as handle b"slab"."""
    upstream = FakeUpstream()
    slabs = lifetimes.Slabs(upstream)
    slab = upstream.buffers[slabs.allocate(nbytes, None)]
    backend.allocations[b"slab"] = slab
    return slabs, slab


def test_slabs_are_lasting_while_allocated() -> None:
    upstream = FakeUpstream()
    slabs = lifetimes.Slabs(upstream)
    ptr = slabs.allocate(4096, None)
    assert slabs.bases == {ptr} and not slabs.shared
    slabs.deallocate(ptr, 4096, None)
    assert not lifetimes.sending(ptr) and slabs.bases == set() and upstream.buffers == {}


def test_a_pool_slab_stays_mapped_until_its_sender_ends(
    backend: FakeIPCBackend, sender: subprocess.Popen
) -> None:
    slabs, slab = _pool_slab(backend, 1 << 16)
    slab[:] = np.arange(slab.size) % 251
    pieces = [FakeDeviceArray(slab[i * 8192 : (i + 1) * 8192]) for i in range(3)]
    for piece in pieces:
        header, frames = serialize(piece, serializers=REPLY, context=LOCAL)
        assert header["serializer"] == ipc.FAMILY and header["lasting"]
        out = deserialize(_as_sent_by(header, sender), frames, deserializers=REPLY)
        assert out._array.tobytes() == piece._array.tobytes()
    assert backend.opened == [b"slab"] and backend.closed == []  # opened once, kept
    stats = ipc.stats()
    assert (
        stats["mappings-opened"] == 1
        and stats["mappings-reused"] == 2
        and stats["mappings-kept"] == 1
    )
    assert ipc.sweep() == 0 and ipc.mapped() == 1  # its sender still runs
    sender.kill()
    sender.wait()
    assert ipc.sweep() == 1 and ipc.mapped() == 0 and backend.closed == [slab.ctypes.data]
    slabs.deallocate(slab.ctypes.data, slab.nbytes, None)


def test_other_memory_is_unmapped_after_each_message(
    backend: FakeIPCBackend, sender: subprocess.Popen
) -> None:
    x = backend.allocate(np.arange(4096, dtype="f8"))  # cudaMalloc'd: its sender may free it
    for _ in range(2):
        header, frames = serialize(x, serializers=REPLY, context=LOCAL)
        assert not header["lasting"]
        deserialize(_as_sent_by(header, sender), frames, deserializers=REPLY)
    assert backend.opened == [b"h0", b"h0"] and len(backend.closed) == 2 and ipc.mapped() == 0


def test_a_sender_in_another_pid_namespace_is_not_kept(
    backend: FakeIPCBackend, sender: subprocess.Popen
) -> None:
    slabs, slab = _pool_slab(backend, 8192)
    header, frames = serialize(FakeDeviceArray(slab), serializers=REPLY, context=LOCAL)
    header = _as_sent_by(header, sender)
    header["sender"]["pidns"] += 1
    deserialize(header, frames, deserializers=REPLY)
    assert header["lasting"] and ipc.mapped() == 0 and len(backend.closed) == 1
    slabs.deallocate(slab.ctypes.data, slab.nbytes, None)


def test_a_reused_pid_is_not_the_sender(sender: subprocess.Popen) -> None:
    import psutil

    started = psutil.Process(sender.pid).create_time()
    pidns = lifetimes.this_process().pidns
    assert lifetimes.alive(lifetimes.Process(sender.pid, started, pidns))
    assert not lifetimes.alive(lifetimes.Process(sender.pid, started - 10, pidns))


def test_idle_kept_mappings_beyond_the_limit_close_oldest_first() -> None:
    class Mapper:
        def __init__(self) -> None:
            self.closed: list[int] = []

        def open(self, handle: bytes) -> int:
            return int(handle)

        def close(self, base: int) -> None:
            self.closed.append(base)

    mapper, me = Mapper(), lifetimes.this_process()
    mappings = lifetimes.Mappings(limit=2)
    with mappings.use(mapper, b"1", me):
        for handle in (b"2", b"3", b"4"):
            with mappings.use(mapper, handle, me):
                pass
        assert mapper.closed == [2]  # 1 is in use: never closed under its user
    assert mapper.closed == [2, 3] and len(mappings) == 2
    mappings.close_all(mapper)
    assert sorted(mapper.closed) == [1, 2, 3, 4] and len(mappings) == 0


def test_closing_the_worker_closes_kept_mappings(
    backend: FakeIPCBackend, sender: subprocess.Popen
) -> None:
    slabs, slab = _pool_slab(backend, 8192)
    header, frames = serialize(FakeDeviceArray(slab), serializers=REPLY, context=LOCAL)
    deserialize(_as_sent_by(header, sender), frames, deserializers=REPLY)
    assert ipc.mapped() == 1
    ipc.close_mappings()
    assert ipc.mapped() == 0 and backend.closed == [slab.ctypes.data]
    slabs.deallocate(slab.ctypes.data, slab.nbytes, None)


def test_a_pool_is_kept_once_one_of_its_slabs_was_sent() -> None:
    mine, other = lifetimes.Slabs(FakeUpstream()), lifetimes.Slabs(FakeUpstream())
    ptr, elsewhere = mine.allocate(4096, None), other.allocate(4096, None)
    assert not lifetimes.sending(ptr + 4096)  # not a slab: nothing to keep
    assert lifetimes.sending(ptr) and mine.shared and not other.shared
    # per pool: the other one, never sent, is given back at its teardown
    assert not lifetimes.keep_if_shared(other, "other pool") and lifetimes._kept == []
    assert lifetimes.keep_if_shared(mine, "my pool") and lifetimes._kept == ["my pool"]
    # once given up, a slab is no longer lasting: a closing worker's late send of it
    # is mapped for that message only
    assert not lifetimes.sending(ptr) and not lifetimes.sending(elsewhere)
    assert lifetimes._pools == []
    mine.deallocate(ptr, 4096, None)
    other.deallocate(elsewhere, 4096, None)


def test_a_slab_sent_after_teardown_does_not_keep_the_pool() -> None:
    slabs = lifetimes.Slabs(FakeUpstream())
    ptr = slabs.allocate(4096, None)
    assert not lifetimes.keep_if_shared(slabs, "pool")
    assert not lifetimes.sending(ptr) and not slabs.shared and lifetimes._kept == []
    slabs.deallocate(ptr, 4096, None)


def test_an_offered_slab_is_mapped_ahead_and_found_by_the_first_message(
    backend: FakeIPCBackend, sender: subprocess.Popen
) -> None:
    slabs, slab = _pool_slab(backend, 1 << 16)
    slab[:] = np.arange(slab.size) % 251
    offer = ipc.offer()
    assert offer is not None and offer["handles"] == [b"slab"] and slabs.shared
    offer = _as_sent_by(offer, sender)
    assert ipc.map_ahead(offer) == 1 and ipc.map_ahead(offer) == 0  # once per handle
    assert backend.opened == [b"slab"] and ipc.mapped() == 1
    piece = FakeDeviceArray(slab[8192:16384])
    header, frames = serialize(piece, serializers=REPLY, context=LOCAL)
    out = deserialize(_as_sent_by(header, sender), frames, deserializers=REPLY)
    assert out._array.tobytes() == piece._array.tobytes() and backend.opened == [b"slab"]
    stats = ipc.stats()
    assert stats["mappings-opened-ahead"] == 1 and stats["mappings-opened"] == 0, stats
    assert stats["mappings-reused"] == 1 and stats["mappings-kept"] == 1, stats
    sender.kill()
    sender.wait()
    assert ipc.sweep() == 1 and ipc.mapped() == 0  # kept only while its sender runs
    slabs.deallocate(slab.ctypes.data, slab.nbytes, None)


def test_nothing_is_mapped_ahead_from_another_host_namespace_this_process_or_no_offer(
    backend: FakeIPCBackend, sender: subprocess.Popen
) -> None:
    assert ipc.offer() is None  # no pool, nothing to offer
    slabs, slab = _pool_slab(backend, 8192)
    offered = ipc.offer()
    assert offered is not None and ipc_peers.accepts(_as_sent_by(offered, sender))
    offer = _as_sent_by(offered, sender)
    refused = [
        {**offer, "node": "another host"},
        {**offer, "sender": {**offer["sender"], "pidns": offer["sender"]["pidns"] + 1}},
        offered,  # this process's own: it cannot map its memory by IPC handle
        {**offer, "sender": {"pid": "not a pid"}},
        None,
    ]
    for one in refused:
        assert not ipc_peers.accepts(one) and ipc.map_ahead(one) == 0, one
    assert backend.opened == []
    slabs.deallocate(slab.ctypes.data, slab.nbytes, None)


class _SlowMapper:
    """Opens block until `release` is set (a pool slab's opening takes up to a second)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.opened: list[bytes] = []
        self.closed: list[int] = []

    def open(self, handle: bytes) -> int:
        if handle == b"slow":
            self.started.set()
            assert self.release.wait(60)
        self.opened.append(handle)
        return 1000 + len(self.opened)

    def close(self, base: int) -> None:
        self.closed.append(base)


def _in_thread(fn: Any) -> threading.Thread:
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


def test_an_opening_ahead_holds_up_only_a_use_of_its_own_handle() -> None:
    mappings, mapper = lifetimes.Mappings(), _SlowMapper()
    me = lifetimes.this_process()
    ahead = _in_thread(lambda: mappings.map_ahead(mapper, b"slow", me))
    assert mapper.started.wait(60)
    with mappings.use(mapper, b"other", None) as base:  # not held up by the opening
        assert base and mappings.sweep(mapper) == 0 and len(mappings) == 1
    used: list[int] = []

    def use_slow() -> None:
        with mappings.use(mapper, b"slow", me) as address:
            used.append(address)

    user = _in_thread(use_slow)
    user.join(0.2)
    assert user.is_alive() and not used  # waits for the opening ...
    mapper.release.set()
    ahead.join(60)
    user.join(60)
    # ... and finds it mapped: one opening of b"slow", reused
    assert mapper.opened.count(b"slow") == 1 and used == [mapper.opened.index(b"slow") + 1001]
    assert mappings.counts["mappings-opened-ahead"] == 1 and mappings.counts["mappings-reused"] == 1


def test_an_opening_ahead_that_spans_the_workers_close_is_closed() -> None:
    mappings, mapper = lifetimes.Mappings(), _SlowMapper()
    result: list[bool] = []
    ahead = _in_thread(
        lambda: result.append(mappings.map_ahead(mapper, b"slow", lifetimes.this_process()))
    )
    assert mapper.started.wait(60)
    mappings.close_all(mapper)
    mapper.release.set()
    ahead.join(60)
    assert result == [False] and len(mappings) == 0 and mapper.closed == [1001]
    assert mappings.map_ahead(
        mapper, b"slow", lifetimes.this_process()
    )  # a later worker maps again
