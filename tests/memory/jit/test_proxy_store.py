"""ProxyStore on a CPU with fake device objects: proxying, JIT-unspill, shared
objects counted once, proxy lifetime, distributed's protocols and metrics, spill
on demand with injected allocators, and a real distributed cluster (threads,
TCP between workers) using the store as `data=`.

Not covered: real CuPy/RMM allocators and GPUs (tests/memory/jit/test_jit_gpu.py).
"""

from __future__ import annotations

import gc
import random
import sys
import threading
from typing import Any

import numpy as np
import pytest

from cudask.memory import ondemand
from cudask.memory.handlers import register_handler
from cudask.memory.jit.proxy import ProxyObject, asproxy, location, unproxy
from cudask.memory.jit.proxy_store import ProxyStore
from cudask.memory.ondemand import SpillOnDemand
from cudask.memory.settings import store_settings
from cudask.memory.store import TieredStore
from cudask.testing import workers_info
from cudask.testing.fake_cuda import FakeCopyBackend, FakeDeviceArray, FakeHandler


def dev(n: int, fill: int = 0) -> FakeDeviceArray:
    a = FakeDeviceArray.empty(n)
    a.fill(fill)
    return a


@pytest.fixture
def make(make_proxy_store: Any) -> Any:
    return make_proxy_store


def test_device_values_become_proxies_host_values_stay_plain(make: Any) -> None:
    store = make()
    a, b = dev(10, 1), dev(20, 2)
    store["dev"] = a
    store["mixed"] = [b, 3, {"x": dev(5, 5)}, ("s",)]
    store["host"] = np.arange(3)
    store[("t", 1)] = b"bytes"
    assert type(store["dev"]) is ProxyObject and unproxy(store["dev"]) is a
    mixed = store["mixed"]
    assert type(mixed[0]) is ProxyObject and mixed[1] == 3 and mixed[3] == ("s",)
    assert type(mixed[2]["x"]) is ProxyObject and (mixed[2]["x"].get() == 5).all()
    assert type(store["host"]) is np.ndarray and store[("t", 1)] == b"bytes"
    assert len(store) == 4 and set(store) == {"dev", "mixed", "host", ("t", 1)}
    assert "dev" in store and "nope" not in store
    assert store.device_bytes == 35 and store.where("host") == "host"
    with pytest.raises(KeyError):
        store["nope"]
    with pytest.raises(KeyError):
        del store["nope"]
    store["dev"] = b"now host"
    assert store["dev"] == b"now host" and store.device_bytes == 25
    del mixed, store["mixed"], store["host"]
    assert len(store) == 2 and store.device_bytes == 0 and store.metrics()["proxies"] == 0


def test_a_spilled_value_stays_spilled_until_a_task_touches_it(make: Any) -> None:
    backend = FakeCopyBackend()
    store = make(device_memory_limit=300, backend=backend)
    for i in range(4):
        store[i] = dev(100, i)
    assert store.where(0) == "host" and store.device_bytes == 300
    p = store[0]  # what distributed hands the task
    assert store.where(0) == "host" and ("h2d", 100) not in backend.copies
    assert p.shape == (100,) and store.where(0) == "device"  # touched: unspilled
    assert backend.copies.count(("h2d", 100)) == 1 and store.device_bytes == 300
    assert (p.get() == 0).all()


def test_inputs_three_times_the_limit_touched_one_at_a_time(make: Any) -> None:
    inputs = {i: dev(100, i) for i in range(9)}  # 900 B against a 300 B limit

    def task(values: list[Any], store: Any) -> tuple[int, int]:
        peak = total = 0
        for v in values:  # touches one input at a time
            total += int(v.get().sum())
            peak = max(peak, store.device_bytes)
        return total, peak

    jit = make(device_memory_limit=300)
    plain = make(TieredStore, device_memory_limit=300)
    for store in (jit, plain):
        for k, v in inputs.items():
            store[k] = v
    del inputs, v
    gc.collect()
    expected = sum(100 * i for i in range(9))
    total, peak = task([jit[k] for k in range(9)], jit)
    assert total == expected and peak <= 300
    # The plain store unspills every input when the task's inputs are gathered.
    total, peak = task([plain[k] for k in range(9)], plain)
    assert total == expected and peak == 900


def test_shared_objects_are_counted_once(make: Any) -> None:
    store = make(device_memory_limit=10_000)
    a = dev(1000, 7)
    store["a"] = a
    store["same-object"] = a  # the same device object: the same proxy
    assert store["same-object"] is store["a"]
    store["same-proxy"] = [store["a"], 1]  # a task returning its input
    assert store["same-proxy"][0] is store["a"]
    store["view"] = a.view(slice(10, 500))  # a view of the same allocation
    assert store.device_bytes == 1000 and store.metrics()["proxies"] == 2
    del store["a"], store["same-object"]
    assert store.device_bytes == 1000 and (store["same-proxy"][0].get() == 7).all()
    del store["same-proxy"], store["view"]
    assert store.device_bytes == 0 and store.metrics()["proxies"] == 0


def test_a_proxy_held_by_a_task_outlives_its_key(make: Any) -> None:
    store = make(device_memory_limit=200)
    store["x"] = dev(100, 3)
    held = store["x"]
    del store["x"]
    store["y"] = dev(100, 4)
    store["z"] = dev(100, 5)  # spills x's object, still held by the task
    assert location(held) == "host" and (held.get() == 3).all()
    assert store.metrics()["proxies"] == 3
    del held
    store["w"] = 1  # any operation reaps dead proxies
    assert store.metrics()["proxies"] == 2 and store.device_bytes == 100  # y was spilled for x


def test_random_operations_read_back_identical(make: Any) -> None:
    rng = random.Random(4)
    store = make(device_memory_limit=2000, memory_limit=3000)
    truth: dict[int, np.ndarray] = {}
    held: list[Any] = []
    for _ in range(300):
        op, key = rng.random(), rng.randrange(12)
        if op < 0.45:
            value = dev(rng.randrange(1, 900), rng.randrange(256))
            store[key] = [value] if rng.random() < 0.3 else value
            truth[key] = value.get()
        elif op < 0.85 and key in truth:
            got = store[key]
            got = got[0] if isinstance(got, list) else got
            if rng.random() < 0.5:
                assert (got.get() == truth[key]).all()
            else:
                held = (held + [(got, truth[key])])[-3:]
        elif key in truth:
            del store[key]
            del truth[key]
    assert held and truth  # the loops below check something
    for got, expected in held:
        assert (got.get() == expected).all()
    for key, expected in truth.items():
        got = store[key]
        got = got[0] if isinstance(got, list) else got
        assert (got.get() == expected).all()


def test_manual_evict_protocol_disk_and_metrics(make: Any, tmp_path: Any) -> None:
    store = make(
        device_memory_limit=200,
        memory_limit=250,
        local_directory=None,
        worker_local_directory=str(tmp_path / "worker"),
    )
    for i in range(5):
        store[i] = dev(100, i)
    store["h"] = b"x" * 50
    assert (tmp_path / "worker" / "storage").is_dir()
    assert store.where(0) == "disk" and store.spilled_total.disk > 0
    assert store.fast and store.evict() > 0
    assert (store[0].get() == 0).all() and store.where(0) == "device"
    m = store.metrics()
    assert m["proxies"] == 5 and m["proxied-keys"] == 5 and m["host-value-keys"] == 1
    assert m["spill-device-to-host-count"] >= 3 and m["unspill-host-to-device-count"] >= 1
    cm = store.cumulative_metrics
    assert cm["device-to-host", "count"] >= 3 and cm["proxies", "count"] == 5
    assert "ProxyStore" in repr(store)


def test_prefetch_starts_unspilling_proxies(make: Any) -> None:
    backend = FakeCopyBackend()
    store = make(device_memory_limit=300, backend=backend)
    for i in range(3):
        store[i] = dev(100, i)
    store.spill_device(300)
    assert store.device_bytes == 0
    assert store.prefetch([0, 1, "missing"]) == 2
    assert (store[0].get() == 0).all() and backend.copies.count(("h2d", 100)) == 2


def test_proxies_move_between_stores(make: Any) -> None:
    first, second = make(), make()
    first["a"] = dev(10, 1)
    second["b"] = first["a"]  # two workers in one process: a new proxy in `second`
    assert second["b"] is not first["a"] and (second["b"].get() == 1).all()
    detached = asproxy(dev(10, 2))
    second["c"] = detached  # a detached proxy is adopted as it is
    assert second["c"] is detached and location(detached) == "device"


def test_spec_kwargs_build_the_store(make: Any, tmp_path: Any) -> None:
    store = make(
        device_memory_limit=1 << 20,
        memory_limit=1 << 20,
        log_spilling=True,
        worker_local_directory=str(tmp_path),
        local_directory=None,
    )
    assert isinstance(store, ProxyStore) and store.device_memory_limit == 1 << 20


# ----------------------------------------------------------------------------------
# spill on demand
# ----------------------------------------------------------------------------------
class FakeOOM(Exception):
    pass


class FakeAllocator:
    """A device with `capacity` bytes shared by the store and new allocations."""

    def __init__(self, store: ProxyStore, capacity: int) -> None:
        self.store, self.capacity, self.calls = store, capacity, 0

    def __call__(self, nbytes: int) -> str:
        self.calls += 1
        if self.store.device_bytes + nbytes > self.capacity:
            raise FakeOOM(f"out of memory allocating {nbytes}")
        return f"ptr-{nbytes}"


def test_spill_on_demand_turns_out_of_memory_into_success(make: Any) -> None:
    store = make(device_memory_limit=None)  # no limit: only on-demand spilling
    for i in range(8):
        store[i] = dev(100, i)
    malloc = FakeAllocator(store, capacity=1000)
    with pytest.raises(FakeOOM):
        malloc(450)
    allocate = store.on_demand.wrap_allocator(malloc, (FakeOOM,))
    assert allocate(150) == "ptr-150" and store.device_bytes == 800  # fits: no spill
    assert allocate(450) == "ptr-450" and store.device_bytes <= 550
    assert store.metrics()["spill-on-demand-count"] >= 1 and store.on_demand.count >= 1
    assert all((store[i].get() == i).all() for i in range(8))


def test_spill_on_demand_raises_when_nothing_can_be_freed(make: Any) -> None:
    store = make()
    held = dev(100, 1)
    store["x"] = held  # also referenced here: spilling it releases nothing
    allocate = store.on_demand.wrap_allocator(FakeAllocator(store, capacity=120), (FakeOOM,))
    with pytest.raises(MemoryError, match="asked for 50 B .* out of memory") as info:
        allocate(50)
    assert isinstance(info.value.__cause__, FakeOOM)
    assert (held.get() == 1).all() and store.where("x") == "host"


def test_spilling_on_demand_waits_for_a_busy_store_only_a_bounded_time(
    make: Any, monkeypatch: pytest.MonkeyPatch, store_busy: Any
) -> None:
    # as with the tiered store: a thread holding the store's lock may wait for a lock the
    # allocating thread holds (cuDF's buffer lock), so spilling on demand waits a bounded time
    monkeypatch.setattr(ondemand, "STORE_LOCK_WAIT", 0.2)
    store = make(device_memory_limit=None)
    for i in range(8):
        store[i] = dev(100, i)
    device = FakeAllocator(store, capacity=1000)
    busy = threading.Event()

    def malloc(nbytes: int) -> str:  # reads the store's bytes only when its lock is free
        if busy.is_set():
            raise FakeOOM(f"out of memory allocating {nbytes}")
        return device(nbytes)

    allocate = store.on_demand.wrap_allocator(malloc, (FakeOOM,))
    with store_busy(store):
        busy.set()
        with pytest.raises(MemoryError, match="0 B spilled for it"):
            allocate(450)  # the store busy: nothing spilled, the refusal named
        busy.clear()
    assert store.device_bytes == 800
    assert allocate(450) == "ptr-450" and store.device_bytes <= 550  # the store free again


def test_rmm_callback_and_reentrancy() -> None:
    calls: list[int] = []
    freed = iter([64, 0])

    def spill(n: int) -> int:
        calls.append(n)
        return next(freed)

    hook = SpillOnDemand(spill)
    assert hook.rmm_callback(10) is True and hook.rmm_callback(10) is False
    assert calls == [10, 10] and hook.count == 1 and hook.freed == 64

    def nested(n: int) -> int:
        return inner.spill(n)  # an allocation made while spilling

    inner = SpillOnDemand(nested)
    assert inner.spill(5) == 0


def test_install_and_uninstall_hooks(make: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from cudask.testing import fake_allocators as fakes

    device = fakes.FakeDevice(1 << 30)
    cupy, rmm = fakes.cupy_module(device), fakes.rmm_module(device)
    own_malloc, upstream = cupy.cuda.get_allocator(), rmm.mr.get_current_device_resource()
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "rmm", rmm)
    store = make()
    assert store.on_demand.installed == []  # lazily: nothing before a device object
    store["x"] = dev(10)
    assert store.on_demand.installed == ["cupy", "rmm"]
    allocator = cupy.cuda.get_allocator()
    assert allocator(8) == 8 and allocator.__wrapped__ is own_malloc
    resource = rmm.mr.get_current_device_resource()
    assert isinstance(resource, fakes.FailureCallback) and resource.allocate(16) == 16
    assert resource.callback(10) in (True, False)
    store.close()
    assert cupy.cuda.get_allocator() is own_malloc
    assert rmm.mr.get_current_device_resource() is upstream


# ----------------------------------------------------------------------------------
# in a distributed cluster
# ----------------------------------------------------------------------------------
def _make_chunk(i: int) -> FakeDeviceArray:
    return dev(1000, i)


def _total(*chunks: Any) -> int:
    assert all(type(c) is ProxyObject for c in chunks)
    return sum(int(c.get().sum()) for c in chunks)


def test_cluster_with_proxy_store_and_transfers_between_workers(tmp_path: Any) -> None:
    from distributed import Client, LocalCluster

    data = (
        ProxyStore,
        {
            "device_memory_limit": 3000,
            "memory_limit": None,
            "log_spilling": False,
            "backend": FakeCopyBackend(),
            "settings": store_settings(
                3000,
                None,
                background=False,
                pinned_pool_size=1 << 20,
                pinned_slab_size=1 << 16,
                pinned_preallocate=False,
            ),
        },
    )
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=False,
            protocol="tcp",
            dashboard_address=":0",
            data=data,
            local_directory=str(tmp_path),
        ) as cluster,
        Client(cluster) as client,
    ):
        a, b = list(workers_info(client))
        chunks = [client.submit(_make_chunk, i, workers=[a], pure=False) for i in range(9)]
        total = client.submit(_total, *chunks, workers=[b])  # 9000 B moved to b (3x limit)
        assert total.result() == sum(1000 * i for i in range(9))
        stats = client.run(lambda dask_worker: dask_worker.data.metrics())
        assert stats[a]["spill-device-to-host-count"] >= 6
        assert stats[b]["proxies"] == 9 and stats[b]["device-bytes"] <= 3000


class _Allocating(FakeDeviceArray):
    """A fake device array whose compaction allocates through `allocate`."""

    allocate: Any = None


class _AllocatingHandler(FakeHandler):
    name = "fake-allocating"

    def compact(self, obj: Any) -> tuple[Any, tuple[int, ...]] | None:
        try:
            obj.allocate(obj.nbytes)
        except FakeOOM:
            return None  # as CupyHandler.compact: without memory, copy the extent
        return FakeDeviceArray.from_numpy(obj._array), ()


register_handler(_Allocating, _AllocatingHandler())


def test_compaction_out_of_memory_spills_on_demand_inside_an_eviction(make: Any) -> None:
    """Spilling a sparse view compacts it on the device first; when that allocation
    finds the device full, spill on demand evicts other keys from inside the eviction
    already under way (same thread, re-entrant lock), and both finish consistently. Every
    spill here compacts: keys read back do not keep their host copies."""
    backend = FakeCopyBackend()
    store = make(device_memory_limit=700, backend=backend, keep_host_copies=False)
    base = dev(400, 0)
    base._array[:] = np.arange(400) % 251
    view = _Allocating(base._array[::4], base)  # 100 elements over a 400-byte extent
    malloc = FakeAllocator(store, capacity=450)
    _Allocating.allocate = staticmethod(store.on_demand.wrap_allocator(malloc, (FakeOOM,)))
    try:
        store["view"] = view
        del view, base
        store["a"] = dev(100, 1)
        store["b"] = dev(100, 2)
        # 600 B held; "c" takes the tier to 800 B: the eviction of "view" (least recently
        # used) compacts it, and that allocation of 100 B fails until "a" is spilled.
        store["c"] = dev(200, 3)
        assert malloc.calls >= 2 and store.on_demand.count >= 1
        assert store.where("view") == "host" and store.where("a") == "host"
        assert store.device_bytes <= 700
        # the view moved as its 100 elements, not as its 397-byte extent
        assert ("d2h", 100) in backend.copies and ("d2h", 397) not in backend.copies
        got = store["view"]
        assert got.shape == (100,) and (got.get() == (np.arange(0, 400, 4) % 251)).all()
        assert [(store[k].get() == v).all() for k, v in (("a", 1), ("b", 2), ("c", 3))] == [
            True
        ] * 3
        assert store.device_bytes <= 700
    finally:
        _Allocating.allocate = None
