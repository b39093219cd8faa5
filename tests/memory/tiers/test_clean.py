"""Host copies kept for keys read back: spilling such a key again copies nothing,
a write drops the copy, and host memory limits bound the copies."""

from __future__ import annotations

from collections.abc import Callable

from cudask.memory.store import TieredStore
from cudask.testing.fake_cuda import FakeCopyBackend, filled

MakeStore = Callable[..., TieredStore]

dev = filled  # a fake device array of n elements, each `fill`


def _d2h(backend: FakeCopyBackend) -> int:
    return sum(1 for direction, _ in backend.copies if direction == "d2h")


def _read_back(store: TieredStore, key: str, fill: int) -> None:
    got = store[key]
    assert store.where(key) == "device" and (got.get() == fill).all()


def _a_read_back(store: TieredStore) -> None:
    """ "a" spilled by "b", then read back: "b" on the host, "a"'s host copy kept."""
    store["a"] = dev(100, 1)
    store["b"] = dev(100, 2)
    _read_back(store, "a", 1)
    assert store.metrics()["host-kept-copies"] == 1


def test_a_key_read_back_goes_to_the_host_again_without_a_copy(make_store: MakeStore) -> None:
    backend = FakeCopyBackend()
    store = make_store(device_memory_limit=100, backend=backend)
    store["a"] = dev(100, 1)
    store["b"] = dev(100, 2)  # "a" is copied to the host
    assert _d2h(backend) == 1
    _read_back(store, "a", 1)  # "b" is copied to the host; "a" keeps its host copy
    _read_back(store, "b", 2)  # "a" goes back to the host as it was: no copy
    _read_back(store, "a", 1)
    assert _d2h(backend) == 2
    metrics = store.metrics()
    assert metrics["spill-device-to-host-count"] == 2
    assert metrics["spill-device-to-host-kept-count"] >= 2
    assert (
        metrics["spill-device-to-host-kept-bytes"]
        == 100 * metrics["spill-device-to-host-kept-count"]
    )
    assert metrics["host-kept-copies"] == 1 and metrics["host-kept-bytes"] == 100  # "a"'s


def test_a_key_written_after_read_back_is_copied_again(make_store: MakeStore) -> None:
    backend = FakeCopyBackend()
    store = make_store(device_memory_limit=100, backend=backend)
    store["a"] = dev(100, 1)
    store["b"] = dev(100, 2)
    _read_back(store, "a", 1)
    store["a"] = dev(100, 7)  # the kept copy holds the old value: dropped
    assert store.metrics()["host-kept-copies"] == 0
    _read_back(store, "b", 2)  # the new "a" is copied to the host
    _read_back(store, "a", 7)  # "b" goes back with its kept copy
    assert _d2h(backend) == 3
    _read_back(store, "b", 2)  # "a" too
    assert _d2h(backend) == 3 and store.metrics()["host-kept-copies"] == 1  # "b"'s
    del store["b"]
    assert store.metrics()["host-kept-copies"] == 0


def test_without_kept_copies_every_spill_copies(make_store: MakeStore) -> None:
    backend = FakeCopyBackend()
    store = make_store(device_memory_limit=100, backend=backend, keep_host_copies=False)
    store["a"] = dev(100, 1)
    store["b"] = dev(100, 2)
    for key, fill in (("a", 1), ("b", 2), ("a", 1)):
        _read_back(store, key, fill)
    assert _d2h(backend) == 4
    assert store.metrics()["spill-device-to-host-kept-count"] == 0


def test_kept_copies_fit_the_room_the_host_limit_leaves(make_store: MakeStore) -> None:
    backend = FakeCopyBackend()
    store = make_store(device_memory_limit=200, memory_limit=700, backend=backend)
    for key, fill in (("a", 1), ("b", 2), ("c", 3)):
        store[key] = dev(100, fill)  # "a" to the host
    _read_back(store, "a", 1)  # "b" to the host; "a" keeps its copy: there is room
    metrics = store.metrics()
    assert metrics["host-kept-copies"] == 1
    assert metrics["host-kept-bytes"] <= 700 - metrics["host-bytes"]
    store["d"] = dev(100, 4)  # "c" to the host: no room left for "a"'s copy
    metrics = store.metrics()
    assert metrics["host-kept-copies"] == 0
    copies = _d2h(backend)
    store["e"] = dev(100, 5)  # "a" is copied again
    assert _d2h(backend) == copies + 1
    _read_back(store, "a", 1)


def test_the_memory_manager_takes_kept_copies_before_the_disk(make_store: MakeStore) -> None:
    store = make_store(device_memory_limit=100, memory_limit=10_000)
    _a_read_back(store)
    assert store.evict() == 100  # the kept copy of "a", not "b" to disk
    assert store.metrics()["host-kept-copies"] == 0 and store.where("b") == "host"
    _read_back(store, "b", 2)  # "a" is copied again
    _read_back(store, "a", 1)


def test_spilling_a_held_key_with_its_kept_copy_lets_eviction_go_on(make_store: MakeStore) -> None:
    """A key spilled with its kept copy while a task still holds it frees nothing yet;
    the eviction loop goes on to the next key, as it does for a fresh copy."""
    for keep in (True, False):
        store = make_store(device_memory_limit=300, keep_host_copies=keep)
        for key, fill in (("a", 1), ("b", 2), ("c", 3), ("z", 4)):
            store[key] = dev(100, fill)  # "a" to the host
        held = [store["a"]]  # back; "b" to the host
        store["c"]  # device order: z, a, c
        store["x"] = dev(100, 5)  # "z" to the host: device holds a, c, x
        held.append(store["x"])
        held.append(store["a"])
        store["c"]  # least recently used first: x (held), a (held, kept copy), c
        store["e"] = dev(250, 6)  # x, a and c must all go
        assert list(store._device) == ["e"], keep
        assert store.committed_device_bytes == 450  # e, and x and a still held (ghosts)
        assert [(h.get() == f).all() for h, f in zip(held, (1, 5, 1))] == [True] * 3
        store.close()


def test_kept_copies_are_visible_to_the_memory_manager(make_store: MakeStore) -> None:
    import threading

    store = make_store(device_memory_limit=200, memory_limit=10_000)
    for key, fill in (("a", 1), ("b", 2), ("c", 3)):
        store[key] = dev(100, fill)  # "a" to the host
    del store["c"]
    _read_back(store, "a", 1)  # the host tier is empty; "a"'s copy is kept
    assert store.where("b") == "device" and store.metrics()["host-bytes"] == 0
    assert store.fast  # distributed's memory manager calls evict() only when this is true
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store.lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(30)
        assert store.evict() == -1  # the lock is busy: evict does not wait for it
    finally:
        release.set()
        holder.join(30)
    assert store.evict() == 100 and not store.fast
    _read_back(store, "a", 1)


def test_host_writes_trim_kept_copies(make_store: MakeStore) -> None:
    import numpy as np

    store = make_store(device_memory_limit=100, memory_limit=2000)
    _a_read_back(store)
    store["h"] = np.zeros(1600, "u1")  # a host value: the kept copy no longer fits
    metrics = store.metrics()
    assert metrics["host-kept-copies"] == 0
    assert metrics["host-bytes"] + metrics["host-kept-bytes"] <= 2000
    assert (store["h"] == 0).all() and store.where("b") == "host"
