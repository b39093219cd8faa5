"""Spill on demand on a CPU, with fake `cupy` and `rmm` modules
(`cudask.testing.fake_allocators`): allocations past the device limit give
CuPy's cached blocks back first, then spill only the shortfall; below the limit
they cost one read of the counters; an allocation the store cannot make room
for still runs; a refused one spills what the driver reports missing, then
fails with a MemoryError naming the task; RMM's allocations are counted, large
ones gated, small ones not; the hooks go away on close."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from cudask.memory import ondemand
from cudask.memory.allocators import GATE_MIN_BYTES
from cudask.memory.ondemand import SpillOnDemand
from cudask.memory.store import TieredStore
from cudask.testing import fake_allocators as fakes
from cudask.testing.fake_cuda import FakeCopyBackend, as_numpy, filled

MakeStore = Callable[..., TieredStore]
MiB = 1 << 20


def _store_on_device(
    make_store: MakeStore,
    monkeypatch: pytest.MonkeyPatch,
    *,
    limit: int,
    capacity: int,
    **kwargs: Any,
) -> tuple[TieredStore, Any]:
    """A store whose device objects live on a fake GPU that a fake CuPy allocates
    from; the store's hooks installed (CuPy's allocator wrapped)."""
    holder: list[TieredStore] = []
    device = fakes.FakeDevice(capacity, held=lambda: holder[0].device_bytes if holder else 0)
    cupy = fakes.cupy_module(device)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    backend = FakeCopyBackend(device_memory=device.mem_get_info)
    store = make_store(device_memory_limit=limit, backend=backend, **kwargs)
    holder.append(store)
    store["first"] = filled(1, 0)  # installs the hooks
    del store["first"]
    return store, cupy


def test_past_the_limit_only_the_shortfall_spills(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, cupy = _store_on_device(make_store, monkeypatch, limit=1000, capacity=4000)
    for i in range(8):
        store[i] = filled(100, i)
    allocate = cupy.cuda.get_allocator()
    assert allocate(150) == 150  # 800 + 150 within the limit: nothing spilled
    assert store.keys_on("device") == set(range(8))
    assert allocate(300) == 300  # 800 + 150 + 300: 250 over, so three keys go
    assert store.keys_on("host") == {0, 1, 2} and store.device_bytes == 500
    m = store.metrics()
    assert m["spill-at-limit-count"] == 1 and m["spill-at-limit-bytes"] == 300
    assert m["spill-on-demand-count"] == 0  # the device never refused anything
    assert all((as_numpy(store[i]) == i).all() for i in range(8))


def test_cached_blocks_go_back_before_any_key(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, cupy = _store_on_device(make_store, monkeypatch, limit=1000, capacity=4000)
    for i in range(7):
        store[i] = filled(100, i)
    allocate, pool = cupy.cuda.get_allocator(), cupy.pool
    allocate(250)
    pool.free(250)  # a task's temporary died: its block stays cached
    assert pool.total_bytes() == 950
    assert allocate(280) == 280  # 950 + 280 over: the cache goes, no key does
    assert pool.device.cached == 0 and store.keys_on("device") == set(range(7))
    assert store.metrics()["spill-at-limit-count"] == 0


def test_with_nothing_to_spill_the_cache_stays_for_the_task(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, cupy = _store_on_device(make_store, monkeypatch, limit=1000, capacity=4000)
    allocate, pool = cupy.cuda.get_allocator(), cupy.pool
    allocate(900)
    allocate(300)  # a task past the limit with an empty store: it runs
    pool.free(300)  # its temporary died: cached
    assert allocate(300) == 300 and pool.device.cached == 0  # served from the cache
    pool.free(300)
    assert allocate(200) == 200 and pool.device.cached == 100  # not given back: no use
    assert pool.device.mallocs == [900, 300]  # no cudaMalloc past the first two


def test_below_the_limit_one_read_and_no_spill(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, cupy = _store_on_device(make_store, monkeypatch, limit=10_000, capacity=40_000)
    store["a"] = filled(100, 1)
    allocate, pool = cupy.cuda.get_allocator(), cupy.pool
    before = pool.total_calls
    for _ in range(50):
        allocate(10)
    assert pool.total_calls - before == 50  # one counter read per allocation
    assert store.metrics()["spill-at-limit-count"] == 0 and store.where("a") == "device"


def test_more_than_the_limit_runs_once_the_store_is_empty(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, cupy = _store_on_device(make_store, monkeypatch, limit=1000, capacity=4000)
    for i in range(8):
        store[i] = filled(100, i)
    held = store[7]  # a running task's input: spilling it frees nothing
    assert cupy.cuda.get_allocator()(2500) == 2500  # over the limit, within the GPU
    assert store.keys_on("device") == set()
    assert all((as_numpy(store[i]) == i).all() for i in range(8)) and held is not None


def test_refused_allocation_spills_what_the_driver_reports_missing(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spilling at the limit off: the store holds half the GPU, a task asks for
    60%: only the difference (and one key's rounding) is spilled, not the tier."""
    chunk = 100
    store, cupy = _store_on_device(
        make_store, monkeypatch, limit=16 * chunk, capacity=32 * chunk, spill_at_limit=False
    )
    for i in range(16):
        store[i] = filled(chunk, i)
    ask = int(32 * chunk * 0.6)  # 1920: 320 more than the 1600 free
    assert cupy.cuda.get_allocator()(ask) == ask
    m = store.metrics()
    assert m["spill-on-demand-count"] == 1 and m["spill-at-limit-count"] == 0
    assert 320 <= m["spill-device-to-host-bytes"] <= 4 * chunk  # not the whole tier
    assert len(store.keys_on("device")) >= 12
    assert all((as_numpy(store[i]) == i).all() for i in range(16))


def test_shortfall_without_a_driver_figure_is_the_request() -> None:
    hook = SpillOnDemand(lambda n: n, free_memory=lambda: None)
    assert hook.shortfall(500) == 500
    hook = SpillOnDemand(lambda n: n, free_memory=lambda: 10 << 30)  # says enough is free
    assert hook.shortfall(500) == 500  # e.g. an RMM pool at its maximum: ask for all
    hook = SpillOnDemand(lambda n: n, free_memory=lambda: 100 << 20)
    assert hook.shortfall(300 << 20) == (200 << 20) + (2 << 20)


class _Refused(Exception):
    pass


def _refuse(nbytes: int) -> int:
    raise _Refused(f"out of memory allocating {nbytes}")


def test_a_failed_spill_names_what_it_spilled_and_what_was_free() -> None:
    hook = SpillOnDemand(lambda n: 1000, attempts=2, free_memory=lambda: 4096)
    with pytest.raises(MemoryError) as info:
        hook.wrap_allocator(_refuse, (_Refused,))(8192)
    assert "(1.95 kiB spilled for it, 4.00 kiB free on the GPU after that; " in str(info.value)
    assert isinstance(info.value.__cause__, _Refused)
    hook = SpillOnDemand(lambda n: 0, free_memory=None)  # nothing spillable, no driver figure
    with pytest.raises(
        MemoryError,
        match=r"\(0 B spilled for it: every device key in use, or the "
        r"store busy; device_memory_limit=None\)",
    ):
        hook.wrap_allocator(_refuse, (_Refused,))(8192)
    broken = SpillOnDemand(lambda n: 0, free_memory=lambda: 1 // 0)  # a failing figure
    assert "(0 B spilled for it: every device key in use, or the store busy; " in broken.refusal(
        8192, _Refused("refused")
    )


def test_allocation_made_while_spilling_does_not_spill_again() -> None:
    calls: list[int] = []

    def spill(n: int) -> int:
        calls.append(n)
        allocate(64)  # the store allocates (a compaction, say) while spilling
        return n

    hook = SpillOnDemand(spill, limit=1000)
    reserved = [990]
    allocate = hook.wrap_allocator(lambda n: n, (MemoryError,), lambda: reserved[0])
    assert allocate(100) == 100
    assert calls == [90] and hook.limit_count == 1


def _task_allocates(nbytes: int) -> int:
    import cupy

    return int(cupy.cuda.get_allocator()(nbytes))


def test_task_asking_more_than_the_gpu_fails_naming_itself(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a worker (threads): the error names the task's key, the bytes and the
    limit; the original error is its cause; every held key survives."""
    from distributed import Client, LocalCluster

    device = fakes.FakeDevice(4000)
    monkeypatch.setitem(sys.modules, "cupy", fakes.cupy_module(device))
    data = (
        TieredStore,
        {
            "device_memory_limit": 1000,
            "memory_limit": None,
            "backend": FakeCopyBackend(device_memory=device.mem_get_info),
        },
    )
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=False,
            dashboard_address=":0",
            data=data,
            local_directory=str(tmp_path),
        ) as cluster,
        Client(cluster) as client,
    ):
        (worker,) = cluster.workers.values()
        store = worker.data
        device.held = lambda: int(store.device_bytes)
        held = [client.submit(filled, 100, i, key=f"held-{i}") for i in range(12)]
        client.gather(held)
        big = client.submit(_task_allocates, 5000, key="too-big")
        with pytest.raises(
            MemoryError,
            match=r"task 'too-big' asked for .*\(5000 bytes\).*"
            r"out of memory.*device_memory_limit=.*\(1000 bytes\)",
        ):
            big.result()
        assert client.submit(_task_allocates, 500, key="fits").result() == 500
        values = client.gather(held)
        assert [int(as_numpy(v)[0]) for v in values] == list(range(12))


# ------------------------------------------------------------------------------ RMM
def _rmm_only(monkeypatch: pytest.MonkeyPatch, device: fakes.FakeDevice) -> Any:
    """A fake rmm as the only allocator the hook finds imported (a real CuPy installed
    on a machine without a GPU, imported by an earlier test, is hidden)."""
    rmm = fakes.rmm_module(device)
    monkeypatch.setitem(sys.modules, "rmm", rmm)
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    return rmm


def test_rmm_allocations_are_counted_and_large_ones_gated(monkeypatch: pytest.MonkeyPatch) -> None:
    rmm = _rmm_only(monkeypatch, fakes.FakeDevice(64 * MiB))
    upstream = rmm.mr.get_current_device_resource()
    spilled: list[int] = []

    def spill(n: int) -> int:
        spilled.append(n)
        return n

    hook = SpillOnDemand(spill, limit=8 * MiB)
    hook.install()
    assert hook.installed == ["rmm"]
    resource = rmm.mr.get_current_device_resource()
    assert isinstance(resource, fakes.Binning)  # over the counter over the failure callback
    assert isinstance(resource.bins[GATE_MIN_BYTES].upstream, fakes.FailureCallback)
    small = [resource.allocate(GATE_MIN_BYTES) for _ in range(10)]  # 10 MiB, past the limit
    assert spilled == [] and hook.reserved() == 10 * MiB  # counted, not gated
    resource.allocate(2 * MiB)  # gated: 10 + 2 - 8 MiB over
    assert spilled == [4 * MiB] and hook.limit_count == 1
    resource.deallocate(small[0], GATE_MIN_BYTES)
    assert hook.reserved() == 11 * MiB
    hook.uninstall()
    assert rmm.mr.get_current_device_resource() is upstream


def test_rmm_without_a_limit_only_spills_on_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    device = fakes.FakeDevice(4 * MiB)
    rmm = _rmm_only(monkeypatch, device)
    freed = iter([MiB, 0])

    def spill(n: int) -> int:
        got = next(freed)
        device.allocated -= got  # the spilled key's memory
        return got

    hook = SpillOnDemand(spill)
    hook.install()
    resource = rmm.mr.get_current_device_resource()
    resource.allocate(3 * MiB)
    assert resource.allocate(MiB + 1) == MiB + 1  # ran after one spill
    assert hook.count == 1 and hook.reserved() == 0  # no counter without a limit
    with pytest.raises(MemoryError):
        resource.allocate(8 * MiB)  # nothing more to spill: the callback gives up
    hook.uninstall()


def test_rmm_refusal_of_a_gated_allocation_reaches_the_failure_callback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rmm = _rmm_only(monkeypatch, fakes.FakeDevice(4 * MiB))
    asked: list[int] = []

    def spill(n: int) -> int:
        asked.append(n)
        return 0  # nothing left to spill

    hook = SpillOnDemand(spill, limit=64 * MiB)
    hook.install()
    with pytest.raises(MemoryError):
        rmm.mr.get_current_device_resource().allocate(8 * MiB)  # below the limit, above the GPU
    assert asked == [8 * MiB] and hook.limit_count == 0  # the failure callback's spill
    assert hook.reserved() == 0  # nothing was counted for the refused allocation
    hook.uninstall()


def test_an_allocation_waits_for_a_busy_store_only_a_bounded_time(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch, store_busy: Any
) -> None:
    # cuDF holds a buffer's lock while it unspills the buffer (an allocation), and a thread
    # spilling that buffer holds the store's lock and waits for the buffer's: spilling on
    # demand waits for the store's lock a bounded time, then lets the allocation go ahead
    monkeypatch.setattr(ondemand, "STORE_LOCK_WAIT", 0.2)
    held = [0]  # what the fake device holds for the store, read without the store's lock
    cupy = fakes.cupy_module(fakes.FakeDevice(4000, held=lambda: held[0]))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    store = make_store(device_memory_limit=1000, backend=FakeCopyBackend())
    for i in range(8):
        store[i] = filled(100, i)
    held[0] = store.device_bytes
    allocate = cupy.cuda.get_allocator()
    with store_busy(store):
        assert allocate(300) == 300  # past the limit, the store busy: it goes ahead
    assert store.keys_on("device") == set(range(8))  # nothing spilled for it
    assert allocate(300) == 300 and store.keys_on("host")  # the store free again: spilled
    held[0] = 0
