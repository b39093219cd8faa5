"""Unspilling through the store: one retry after an out-of-memory, then an error
that names the limit; prefetching copies ahead."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from cudask.memory.store import TieredStore
from cudask.testing.fake_cuda import FakeCopyBackend, filled

MakeStore = Callable[..., TieredStore]


dev = filled  # a fake device array of n elements, each `fill`


class OOMOnce(FakeCopyBackend):
    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def alloc_device(self, nbytes: int, device: int) -> tuple[int, Any]:
        if self.failures:
            self.failures -= 1
            raise MemoryError("fake out of memory")
        return super().alloc_device(nbytes, device)


def test_unspill_out_of_memory_retries_then_names_the_limit(make_store: MakeStore) -> None:
    backend = OOMOnce(failures=1)
    store = make_store(device_memory_limit=100, backend=backend)
    store["a"] = dev(100, 1)
    store["b"] = dev(100, 2)
    assert (store["a"].get() == 1).all()  # first allocation failed, the retry worked
    backend.failures = 2
    with pytest.raises(MemoryError, match="device_memory_limit=100 B"):
        store["b"]
    assert store.where("b") == "host"  # not lost
    assert (store["b"].get() == 2).all()


def _spilled(make_store: MakeStore, keys: int, kept: int) -> tuple[TieredStore, FakeCopyBackend]:
    """A store with room for three 100 B keys, `keys` of them written, those from `kept`
    on deleted (the earliest went to the host, their copies completed); new copies stay
    queued until waited for."""
    backend = FakeCopyBackend(lag=10_000)
    store = make_store(device_memory_limit=300, backend=backend)
    for i in range(keys):
        store[i] = dev(100, i)
    backend.drain()
    for i in range(kept, keys):
        del store[i]
    return store, backend


def test_prefetch_starts_copies_ahead(make_store: MakeStore) -> None:
    store, backend = _spilled(make_store, 6, 3)  # room for three
    store[99] = b"host"
    assert store.prefetch([0, 1, 99, "missing", 2]) == 3
    assert store.device_bytes == 300
    assert store.prefetch([0]) == 0  # already under way
    for i in range(3):
        assert (store[i].get() == i).all()
    assert sum(d == "h2d" for d, _ in backend.copies) == 3


def test_host_copy_outlives_the_copy_back_while_the_key_goes_to_disk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read waits for its host -> device copy without the store's lock; if the
    memory manager meanwhile moves the key's host copy to disk (evict) and new
    spills take pinned memory, the copy back must still read the old host copy."""
    import gc

    import numpy

    from cudask.memory.backend import Copy
    from cudask.memory.settings import store_settings
    from cudask.testing.fake_cuda import FakeCopyBackend, FakeDeviceArray

    kib = 1024
    backend = FakeCopyBackend(lag=3)  # copies complete only when waited for or drained
    settings = store_settings(
        100 * kib,
        1 << 20,
        background=False,
        pinned_pool_size=1 << 20,
        pinned_slab_size=64 * kib,
        spill_on_demand=False,
    )
    store = TieredStore(100 * kib, 1 << 20, settings=settings, backend=backend)
    try:
        store.engine.pool.provisioner.preallocate(256 * kib)
        for i in range(4):
            store[f"k{i}"] = FakeDeviceArray(numpy.full(60 * kib, i + 1, dtype="u1"))
        backend.drain()
        assert store.where("k0") == "host"
        original_wait = Copy.wait
        interfered: list[str] = []
        started: list[bool] = []

        def wait(copy: Copy) -> None:
            if not started:  # once, at the first wait: the read's copy back
                started.append(True)
                while store.evict() > 0:  # distributed's memory manager, without the lock
                    pass
                gc.collect()
                interfered.append(store.where("k0"))
                store["other"] = FakeDeviceArray(numpy.full(60 * kib, 99, dtype="u1"))
                store["other2"] = FakeDeviceArray(numpy.full(60 * kib, 98, dtype="u1"))
                backend.drain()  # the new device -> host copies run first
            original_wait(copy)

        monkeypatch.setattr(Copy, "wait", wait)
        value = store["k0"]
        backend.drain()
        assert interfered == ["disk"]
        assert (value.get() == 1).all()
    finally:
        store.close()


def test_a_prefetch_dropped_or_deleted_lets_its_copies_finish_first(make_store: MakeStore) -> None:
    # a prefetched value's copies write into its device memory and read the key's host
    # copy: dropping the value (the limit needs the room) or deleting the key (its host
    # copy goes) must not free either under a copy still running
    store, _ = _spilled(make_store, 5, 3)  # room for two
    assert store.prefetch([0, 1]) == 2
    copies = {k: list(v[1]) for k, v in store._buffer.prefetched.items()}
    assert all(not c.ready() for cs in copies.values() for c in cs)
    del store[0]
    assert all(c.ready() for c in copies[0])  # waited for before the key went
    store[5] = dev(250, 5)  # over the limit with the prefetch: 5 goes to the host
    assert (store[5].get() == 5).all()  # read back: the limit needs the prefetch's room
    assert 1 not in store._buffer.prefetched and all(c.ready() for c in copies[1])
    assert (store[1].get() == 1).all()
