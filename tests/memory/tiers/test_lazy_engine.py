"""The lazy copy engine through the store: pinned memory made ready ahead of the
spills (from where, how much), idle memory given back, the first spill not
waiting for pinning, preallocation."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable

from cudask.memory.store import TieredStore
from cudask.testing.fake_cuda import FakeCopyBackend, filled

MakeStore = Callable[..., TieredStore]
WaitFor = Callable[..., bool]


dev = filled  # a fake device array of n elements, each `fill`


def nothing_started(store: TieredStore) -> bool:
    """Whether the store has neither a copy engine nor a thread making one: then
    nothing can pin memory until the next write asks for it."""
    return store._lazy.current is None and not store._lazy._warming


def test_pinned_memory_is_made_ready_ahead_and_idle_memory_goes_back(
    make_store: MakeStore, wait_for: WaitFor
) -> None:
    backend = FakeCopyBackend()
    store = make_store(device_memory_limit=1 << 16, backend=backend, pinned_release_after="50ms")
    assert store.settings.pinned_headroom == 1 << 16  # "auto": the device limit here
    store[0] = dev(1 << 14, 0)  # a quarter of the limit: nothing is pinned
    assert nothing_started(store) and backend.pinned_bytes == 0
    store[1] = dev(1 << 15, 1)  # past half the limit: made ready ahead, off this thread
    assert wait_for(lambda: store.metrics().get("pinned-reserved-bytes", 0) >= 1 << 15)
    store[2] = dev(1 << 15, 2)  # spills 0 into memory that was ready
    copy = store.peek_host_copy(0)
    assert copy is not None and copy.pinned()
    del copy
    assert store.metrics()["pageable-fallback-count"] == 0
    assert (store[0].get() == 0).all()  # read back (spilling 1) while the pool holds it
    for i in range(3):
        del store[i]
    assert wait_for(lambda: not store.metrics()["pinned-reserved-bytes"])
    m = store.metrics()
    assert m["pinned-released-bytes"] >= 1 << 15 and backend.pinned == {}
    assert backend.registered == {} or store.engine.pool.method == "register"


def test_pinning_ahead_starts_where_configured(make_store: MakeStore, wait_for: WaitFor) -> None:
    """`pinned-headroom-from` 0.75: past half the limit nothing is pinned yet; past 3/4 it is."""
    backend = FakeCopyBackend()
    store = make_store(device_memory_limit=1 << 16, backend=backend, pinned_headroom_from=0.75)
    store[0] = dev(40_000, 0)  # 61% of the limit
    assert nothing_started(store) and backend.pinned_bytes == 0
    store[1] = dev(10_000, 1)  # 76%
    assert wait_for(lambda: store.metrics().get("pinned-reserved-bytes", 0) > 0)


def test_pinning_ahead_ramps_up_to_the_headroom_at_the_limit(
    make_store: MakeStore, wait_for: WaitFor
) -> None:
    """Headroom 256 KiB at a 1 MiB limit, from half of it: at 3/4 of the limit half the
    headroom is made ready, not all of it (the ramp spans half the limit to the limit)."""
    store = make_store(
        device_memory_limit=1 << 20,
        pinned_headroom=256 << 10,
        pinned_pool_size=4 << 20,
        pinned_slab_size=16 << 10,
    )
    store[0] = dev(3 << 18, 0)  # 3/4 of the limit
    assert wait_for(
        lambda: (
            store._lazy.current is not None and store.metrics().get("pinned-reserved-bytes", 0) > 0
        )
    )
    assert store.engine.pool.provisioner.wait_ready(timeout=120)
    assert store.engine.pool.provisioner.goal == 128 << 10
    assert store.metrics()["pinned-reserved-bytes"] == 128 << 10


class GatedBackend(FakeCopyBackend):
    """Pinning (allocation or registration) waits for `gate`, like a slow driver."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def alloc_pinned(self, nbytes: int) -> int:
        self.gate.wait()
        return super().alloc_pinned(nbytes)

    def register_host(self, ptr: int, nbytes: int) -> None:
        self.gate.wait()
        super().register_host(ptr, nbytes)


def test_first_spill_does_not_wait_for_pinning(make_store: MakeStore) -> None:
    backend = GatedBackend()
    store = make_store(
        device_memory_limit=150,
        backend=backend,
        pinned_preallocate=1 << 16,
        pinned_pool_size=1 << 20,
        pinned_slab_size=1 << 16,
    )
    store["a"] = dev(100, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # memory still being made ready is no cause for alarm
        store["b"] = dev(100, 2)  # spills "a" while no slab is pinned yet
    copy = store.peek_host_copy("a")
    assert copy is not None and not copy.pinned()
    m = store.metrics()
    assert m["pageable-fallback-warmup-bytes"] == 100 and m["pinned-ready"] < 1
    backend.gate.set()
    assert store.engine.pool.provisioner.wait_ready(timeout=30)
    store["c"] = dev(100, 3)  # spills "b" into the pinned pool
    copy = store.peek_host_copy("b")
    assert copy is not None and copy.pinned()
    m = store.metrics()
    assert m["pinned-ready"] == 1 and m["pinned-reserved-bytes"] >= 1 << 16
    assert m["pageable-fallback-count"] == 1
    assert [(store[k].get() == v).all() for k, v in (("a", 1), ("b", 2), ("c", 3))] == [True] * 3


def test_preallocate_setting(make_store: MakeStore) -> None:
    kw = {"memory_limit": 1 << 30, "pinned_pool_size": 1 << 20}
    assert (
        make_store(
            device_memory_limit=1 << 16, pinned_preallocate="auto", **kw
        ).settings.pinned_preallocate
        == 1 << 16
    )  # min(pool, device limit, 4 GiB)
    assert (
        make_store(
            device_memory_limit=1 << 16, pinned_preallocate=True, **kw
        ).settings.pinned_preallocate
        == 1 << 20
    )  # the whole pool
    assert (
        make_store(
            device_memory_limit=1 << 16, pinned_preallocate=0.5, **kw
        ).settings.pinned_preallocate
        == 1 << 19
    )  # a fraction of the pool
    assert (
        make_store(pinned_preallocate=True, **kw).settings.pinned_preallocate == 0
    )  # no device limit
    store = make_store(device_memory_limit=1 << 16, pinned_preallocate=False, **kw)
    assert (
        store.settings.pinned_preallocate == 0 and store._lazy.current is None
    )  # nothing at start
