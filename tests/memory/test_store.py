"""TieredStore on a CPU with fake device objects: the dict path without limits,
overwrites and deletes across tiers, threads, bad arguments, spill_device and
peek_host_copy for proxies, spill on demand. The tiers' own behaviour is
tested in tests/memory/tiers/."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from cudask.errors import OptionError
from cudask.memory.store import TieredStore
from cudask.testing.fake_cuda import FakeCopyBackend, as_numpy, filled

MakeStore = Callable[..., TieredStore]
InThreads = Callable[[Callable[[int], None], int], list[BaseException]]


dev = filled  # a fake device array of n elements, each `fill`


def test_behaves_like_a_dict_without_limits(make_store: MakeStore) -> None:
    store = make_store(backend=None)  # no limit: no backend, no copies, ever
    values = {"a": dev(100, 1), "b": [dev(10, 2), 3], "c": b"host", ("x", 1): np.arange(3)}
    for k, v in values.items():
        store[k] = v
    assert len(store) == 4 and set(store) == set(values)
    for k, v in values.items():
        assert store[k] is v
    assert store.device_bytes == 110
    assert store.keys_on("device") == {"a", "b"} and store.where("c") == "host"
    del store["a"]
    assert "a" not in store and store.device_bytes == 10
    with pytest.raises(KeyError):
        store["a"]
    with pytest.raises(KeyError):
        del store["a"]
    store["b"] = b"now on host"
    assert store.device_bytes == 0 and store.where("b") == "host"
    assert store._lazy.current is None  # nothing created a CUDA backend


def test_overwrite_and_delete_in_every_tier(make_store: MakeStore) -> None:
    store = make_store(device_memory_limit=200, memory_limit=400)
    for i in range(8):
        store[i] = dev(100, i)
    tiers = {store.where(i) for i in range(8)}
    assert tiers == {"device", "host", "disk"}
    for i in range(8):
        if i % 2:
            del store[i]
        else:
            store[i] = dev(100, 100 + i) if i % 4 else b"host value %d" % i
    assert len(store) == 4
    for i in range(0, 8, 2):
        got = store[i]
        if i % 4:
            assert (got.get() == 100 + i).all()
        else:
            assert got == b"host value %d" % i
    store.close()
    assert store._lazy.current is not None and store._lazy.current.pool.reserved == 0


def test_concurrent_access(make_store: MakeStore, in_threads: InThreads) -> None:
    store = make_store(
        device_memory_limit=2000,
        memory_limit=4000,
        spill_target=0.9,
        backend=FakeCopyBackend(lag=3),
        background=True,
    )

    def work(t: int) -> None:
        for i in range(60):
            key = (t, i % 15)
            store[key] = dev(97, (t * 31 + i) % 250)
            got = store[key].get()
            assert (got == (t * 31 + i) % 250).all()
            if i % 7 == 0:
                del store[key]

    errors = in_threads(work, 4)
    assert not errors
    for key in list(store):
        store[key].get()
    # the limit holds for what is committed; copies still in flight hold memory too
    assert store.committed_device_bytes <= 2000
    assert store.device_bytes >= store.committed_device_bytes


def test_bad_arguments_are_refused(make_store: MakeStore) -> None:
    with pytest.raises(OptionError, match="spill-target"):
        make_store(spill_target=1.5)
    with pytest.raises(OptionError, match="device_memory_limit"):
        make_store(device_memory_limit=-1)


def test_no_device_limit_takes_the_dict_path(make_store: MakeStore) -> None:
    """A worker without a device limit gets UnlimitedStore: device objects in a dict."""
    from cudask.memory.unlimited import UnlimitedStore

    store = make_store(UnlimitedStore)
    a = dev(100, 1)
    store["a"] = a
    store["v"] = a.view(slice(0, 10))
    store["h"] = b"host"
    store["h"] = dev(20, 2)  # host -> device
    store["a2"] = b"x"
    assert isinstance(store, UnlimitedStore) and store.spill_device(100) == 0
    assert store.device_bytes == 120 and store.metrics()["device-bytes"] == 120
    assert store.keys_on("device") == {"a", "v", "h"} and store.where("a2") == "host"
    store["h"] = b"back to host"
    assert store.where("h") == "host" and store.device_bytes == 100
    del store["v"], store["h"]
    assert set(store) == {"a", "a2"} and "v" not in store and "h" not in store
    with pytest.raises(KeyError):
        del store["v"]
    with pytest.raises(KeyError):
        store["v"]


def test_spill_device_and_peek_host_copy(make_store: MakeStore) -> None:
    backend = FakeCopyBackend(lag=10_000)
    store = make_store(device_memory_limit=1000, backend=backend)
    for i in range(4):
        store[i] = dev(100, i)
    store["h"] = b"host value"
    assert store.peek_host_copy(0) is None and store.peek_host_copy("h") is None
    assert store.peek_host_copy("missing") is None
    assert store.spill_device(150) == 200  # two least recently used keys
    assert backend.in_flight() == 0  # waited for: the memory is free
    assert store.where(0) == "host" and store.where(1) == "host" and store.device_bytes == 200
    copy = store.peek_host_copy(1)
    assert copy is not None and bytes(copy.blocks[0].view) == bytes([1]) * 100
    assert store.where(1) == "host"  # peeking did not unspill
    assert (store[1].get() == 1).all() and store.where(1) == "device"
    assert store.spill_device(0) == 0


def test_spill_device_without_a_limit_moves_keys(make_store: MakeStore) -> None:
    """A TieredStore without a device limit (JIT-unspill's inner store) accounts its
    device keys, so spilling on demand can move them."""
    store = make_store()
    values = {i: dev(100, i) for i in range(3)}
    store.update(values)
    store["h"] = b"host"
    del values
    assert store.spill_device(100) == 100
    assert store.where(0) == "host" and store.device_bytes == 200
    store[5] = dev(50, 5)
    assert store.device_bytes == 250 and store._ledger.total == 250
    for i in (0, 1, 2, 5):
        assert (store[i].get() == i).all()
    assert store["h"] == b"host"


class _OutOfMemory(Exception):
    pass


def test_spill_on_demand_in_the_tiered_store(make_store: MakeStore) -> None:
    """With a device limit the plain store spills its idle keys when an allocation
    fails, and the allocation is tried again; without one, or with the key off, no hook."""
    store = make_store(device_memory_limit=1000)
    assert store.on_demand is not None
    for i in range(8):
        store[i] = dev(100, i)
    held = store[7]  # a running task's input: spilling it releases nothing

    def malloc(nbytes: int) -> str:
        if store.device_bytes + nbytes > 1000:
            raise _OutOfMemory(f"out of memory allocating {nbytes}")
        return f"ptr-{nbytes}"

    allocate = store.on_demand.wrap_allocator(malloc, (_OutOfMemory,))
    assert allocate(450) == "ptr-450" and store.device_bytes <= 550
    assert store.metrics()["spill-on-demand-count"] >= 1
    refused = (
        r"\(950 bytes\).*\([\d.]+ \w*B spilled for it(, .* free on the GPU after that)?; "
        r"device_memory_limit=.* \(1000 bytes\)"
    )
    with pytest.raises(MemoryError, match=refused) as info:
        allocate(950)  # more than the store can release while `held` is used
    assert isinstance(info.value.__cause__, _OutOfMemory)
    assert all((as_numpy(store[i]) == i).all() for i in range(8)) and held is not None
    assert make_store(device_memory_limit=None).on_demand is None
    assert make_store(device_memory_limit=1000, spill_on_demand=False).on_demand is None


def test_prefetched_copies_give_way_to_the_limit(make_store: MakeStore) -> None:
    """A prefetch holds device memory for a key about to be read; when the limit
    needs that room and no key is left to spill, the prefetched copy is dropped
    (the key stays on the host and is read back when asked for)."""
    store = make_store(device_memory_limit=1000)
    store["a"] = dev(600, 1)
    store.spill_device(600)
    assert store.prefetch(["a"]) == 1 and store.committed_device_bytes == 600
    store["b"] = dev(500, 2)  # over the limit: b, the one key on the device, goes
    assert store.where("b") == "host" and store.committed_device_bytes == 600
    assert (store["b"].get() == 2).all()  # read back: the prefetch gives way
    assert store.committed_device_bytes == 500 and store.where("a") == "host"
    assert (store["a"].get() == 1).all() and store.committed_device_bytes <= 1000
