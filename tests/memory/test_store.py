"""TieredStore on a CPU with fake device objects: tiers, accounting, errors,
distributed's protocols and metrics."""

from __future__ import annotations

import logging
import pickle
import shutil
import threading
import time
import warnings
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pytest
from distributed.spill import SpillBuffer

from cudask.errors import OptionError
from cudask.memory.store import TieredStore, worker_metrics
from cudask.testing.fake_cuda import FakeCopyBackend, FakeDeviceArray, as_numpy

MakeStore = Callable[..., TieredStore]
WaitFor = Callable[..., bool]
InThreads = Callable[[Callable[[int], None], int], list[BaseException]]


def dev(n: int, fill: float = 0, dtype: str = "u1") -> FakeDeviceArray:
    a = FakeDeviceArray.empty(n, dtype)
    a.fill(fill)
    return a


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


def test_spills_least_recently_used_and_reads_back(make_store: MakeStore) -> None:
    backend = FakeCopyBackend()
    store = make_store(device_memory_limit=300, backend=backend)
    for i in range(3):
        store[i] = dev(100, i)
    store[0]  # 0 is now the most recently used
    store[3] = dev(100, 3)
    assert store.keys_on("device") == {0, 2, 3}
    assert store.where(1) == "host" and store.is_spilled_device_object(1)
    assert store.device_bytes == 300
    out = store[1]
    assert type(out) is FakeDeviceArray and (out.get() == 1).all()
    assert store.where(1) == "device" and store.device_bytes == 300
    assert backend.copies.count(("h2d", 100)) == 1


def test_value_larger_than_the_limit_goes_to_host(make_store: MakeStore) -> None:
    store = make_store(device_memory_limit=100)
    store["small"] = dev(50, 1)
    store["big"] = dev(500, 2)
    assert store.where("big") == "host" and store.where("small") == "device"
    assert (store["big"].get() == 2).all()


def test_aliases_are_counted_once(make_store: MakeStore) -> None:
    store = make_store(device_memory_limit=10_000)
    a = dev(1000, 7)
    store["a"] = a
    store["view"] = a.view(slice(10, 20))
    store["same"] = a
    assert store.device_bytes == 1000
    del a
    del store["a"]
    assert store.device_bytes == 1000  # the view and the alias still hold it
    del store["same"], store["view"]
    assert store.device_bytes == 0


def test_spilling_an_alias_frees_nothing_until_the_last_holder_goes(make_store: MakeStore) -> None:
    store = make_store(device_memory_limit=1500)
    a = dev(1000, 7)
    store["a"] = a
    store["view"] = a.view(slice(0, 10))
    del a
    store["b"] = dev(1000, 8)
    # "a" and "view" (oldest) had to go for "b" to fit
    assert store.keys_on("device") == {"b"} and store.device_bytes == 1000
    assert (store["view"].get() == 7).all() and store["view"].shape == (10,)


def test_spilled_object_referenced_elsewhere_still_counts(make_store: MakeStore) -> None:
    store = make_store(device_memory_limit=150)
    held = dev(100, 1)
    store["held"] = held
    store["next"] = dev(100, 2)  # spills "held", which we still reference
    assert store.where("held") == "host"
    assert store.device_bytes == 200  # not pretended freed
    assert store.metrics()["device-ghost-keys"] == 1
    assert store["held"] is held  # read back without a copy
    store["next2"] = dev(100, 3)
    del held
    assert store.device_bytes <= 150
    assert store.metrics()["device-ghost-keys"] == 0


def test_read_while_copy_in_flight_returns_the_original(make_store: MakeStore) -> None:
    backend = FakeCopyBackend(lag=10_000)
    store = make_store(device_memory_limit=150, backend=backend)
    a = dev(100, 1)
    store["a"] = a
    store["b"] = dev(100, 2)
    assert store.where("a") == "host" and backend.in_flight() > 0
    assert store.metrics()["device-inflight-bytes"] == 100
    assert store["a"] is a
    assert not any(d == "h2d" for d, _ in backend.copies)
    del a
    backend.drain()
    store["c"] = dev(100, 3)
    assert (store["b"].get() == 2).all()


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


def test_disk_tier_roundtrip_and_protocols(make_store: MakeStore) -> None:
    store = make_store(device_memory_limit=200, memory_limit=300)
    ref = {i: np.arange(100, dtype="f4") * i for i in range(10)}
    for i, arr in ref.items():
        store[i] = FakeDeviceArray.from_numpy(arr)
    assert store.keys_on("disk")
    assert store.spilled_total.disk > 0 and store.spilled_total.memory > 0
    for i, arr in ref.items():
        np.testing.assert_array_equal(store[i].get(), arr)
    cm = store.cumulative_metrics
    assert {unit for _, unit in cm} <= {"bytes", "count", "seconds"}
    for label in ("device-to-host", "host-to-device", "disk-write", "disk-read"):
        assert cm[label, "count"] > 0 and cm[label, "bytes"] > 0
    m = store.metrics()
    assert m["spill-host-to-disk-count"] == cm["disk-write", "count"]
    assert m["unspill-host-to-device-bytes"] == cm["host-to-device", "bytes"]


def test_manual_evict_protocol(make_store: MakeStore) -> None:
    store = make_store(memory_limit=10_000)
    assert not store.fast and store.evict() == -1  # nothing to evict yet
    store["x"] = b"x" * 1000
    store["d"] = dev(100, 5)
    assert store.fast
    assert store.evict() >= 1000
    assert store.where("x") == "disk" and store["x"] == b"x" * 1000
    without_disk = make_store()
    without_disk["x"] = b"x"
    assert not without_disk.fast and without_disk.evict() == -1


def test_max_spill_keeps_keys_in_host_memory(make_store: MakeStore, caplog: Any) -> None:
    store = make_store(device_memory_limit=100, memory_limit=150, max_spill=250)
    for i in range(6):
        store[i] = dev(100, i)
    assert len(store) == 6
    assert store.metrics()["disk-bytes"] <= 250
    for i in range(6):
        assert (store[i].get() == i).all()


def test_disk_failure_keeps_keys(make_store: MakeStore, tmp_path: Any) -> None:
    directory = tmp_path / "gone"
    store = make_store(device_memory_limit=100, memory_limit=150, local_directory=str(directory))
    store[0] = dev(100, 0)
    shutil.rmtree(directory)  # every write to disk now fails with OSError
    for i in range(1, 5):
        store[i] = dev(100, i)  # distributed.spill logs "Spill to disk failed"
    assert store.keys_on("disk") == set() and len(store) == 5
    for i in range(5):
        assert (store[i].get() == i).all()


class Unspillable:
    __cuda_array_interface__: ClassVar[dict[str, Any]] = {
        "shape": (100,), "typestr": "|u1", "data": (1 << 40, False), "version": 3,
        "mask": object(),
    }


def test_unspillable_object_stays_on_device(make_store: MakeStore, caplog: Any) -> None:
    store = make_store(device_memory_limit=150)
    u = Unspillable()
    store["u"] = u
    with caplog.at_level(logging.WARNING, logger="cudask.memory"):
        store["a"] = dev(100, 1)
        store["b"] = dev(40, 2)
    assert "stays on the device" in caplog.text
    assert store.where("u") == "device" and store["u"] is u
    assert (store["a"].get() == 1).all()


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


def test_log_spilling_logs_each_move(make_store: MakeStore, caplog: Any) -> None:
    store = make_store(device_memory_limit=100, memory_limit=150, log_spilling=True)
    moves = logging.getLogger("distributed.worker.memory")
    moves.addHandler(caplog.handler)  # distributed's loggers do not propagate to the root
    try:
        with caplog.at_level(logging.INFO, logger=moves.name):
            store["a"] = dev(100, 1)
            store["b"] = dev(100, 2)
            store["c"] = dev(100, 3)
            store["a"]
    finally:
        moves.removeHandler(caplog.handler)
    text = caplog.text
    assert "spilled 'a' device -> host" in text
    assert "host -> disk" in text and "disk -> host" in text
    assert "unspilled 'a' host -> device" in text


def test_spill_log_reaches_a_worker_log() -> None:
    """Workers configure distributed's loggers only: the moves must go to one of
    those at a level it shows, or log_spilling would print nothing."""
    import distributed  # noqa: F401 - sets up distributed's logging

    from cudask.memory.tiers.metrics import moves

    assert moves.name.startswith("distributed.")
    assert moves.isEnabledFor(logging.INFO)


def test_background_spilling_keeps_the_tier_below_target(
    make_store: MakeStore, wait_for: WaitFor
) -> None:
    store = make_store(device_memory_limit=1000, spill_target=0.5, background=True)
    for i in range(9):
        store[i] = dev(100, i)  # 900 bytes: below the limit, above the target
    wait_for(lambda: store.device_bytes <= 500)
    assert store.device_bytes <= 500
    assert store._thread is not None and store._thread.name == "cudask-spill"
    for i in range(9):
        assert (store[i].get() == i).all()


def test_prefetch_starts_copies_ahead(make_store: MakeStore) -> None:
    backend = FakeCopyBackend(lag=10_000)
    store = make_store(device_memory_limit=300, backend=backend)
    for i in range(6):
        store[i] = dev(100, i)
    backend.drain()
    store[99] = b"host"
    del store[5], store[4], store[3]  # room for three
    assert store.prefetch([0, 1, 99, "missing", 2]) == 3
    assert store.device_bytes == 300
    assert store.prefetch([0]) == 0  # already under way
    for i in range(3):
        assert (store[i].get() == i).all()
    assert sum(d == "h2d" for d, _ in backend.copies) == 3


def test_concurrent_access(make_store: MakeStore, in_threads: InThreads) -> None:
    store = make_store(device_memory_limit=2000, memory_limit=4000,
                       backend=FakeCopyBackend(lag=3), background=True)

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


def test_metrics_and_worker_metrics(make_store: MakeStore) -> None:
    store = make_store(device_memory_limit=100, memory_limit=1000)
    store["a"] = dev(100, 1)
    store["b"] = dev(100, 2)
    store["h"] = b"x" * 10
    m = store.metrics()
    assert m["device-bytes"] == 100 and m["device-keys"] == 1
    assert m["host-device-copies"] == 1 and m["host-keys"] == 2
    assert m["spill-device-to-host-count"] == 1 and m["spill-device-to-host-bytes"] == 100
    # the spill found pinned memory made ready ahead of it, or memory faulted in for it
    assert m["pinned-in-use-bytes"] + m["pageable-fallback-bytes"] >= 100
    assert m["pinned-provision-gbps"] >= 0 and "pageable-registered-bytes" in m
    assert all(isinstance(v, float) for v in m.values())
    assert worker_metrics(SimpleNamespace(data=store)) == store.metrics()  # type: ignore[arg-type]
    assert worker_metrics(SimpleNamespace(data={})) == {}  # type: ignore[arg-type]


def test_copy_seconds_are_the_copies_own_not_their_time_in_flight(make_store: MakeStore) -> None:
    # Copies queued for 0.3 s and then run at once took next to no time on
    # their stream: the seconds give the bus time, so bytes / seconds is a rate.
    backend = FakeCopyBackend(lag=10_000)
    store = make_store(device_memory_limit=100, backend=backend)
    for i in range(4):
        store[i] = dev(100, i)
    assert backend.in_flight() > 0
    time.sleep(0.3)
    backend.drain()
    value = store[0]  # unspilled, its copy waited for
    assert (value.get() == 0).all()
    m = store.metrics()
    assert m["spill-device-to-host-count"] >= 3
    assert m["spill-device-to-host-seconds"] < 0.1
    assert 0 <= m["unspill-host-to-device-seconds"] <= m["unspill-host-to-device-wait-seconds"]


def test_host_tier_is_distributed_spillbuffer(make_store: MakeStore) -> None:
    assert isinstance(make_store(memory_limit=100)._host.data, SpillBuffer)


def test_bad_arguments_are_refused(make_store: MakeStore) -> None:
    with pytest.raises(OptionError, match="spill-target"):
        make_store(spill_target=1.5)
    with pytest.raises(OptionError, match="device_memory_limit"):
        make_store(device_memory_limit=-1)


def test_pinned_pool_size_from_config(make_store: MakeStore) -> None:
    import dask

    with dask.config.set({"cudask.memory.pinned-pool-size": "auto"}):
        store = make_store(device_memory_limit=1000, memory_limit=10_000, pinned_pool_size=None)
    assert store.settings.pinned_pool_size == 5000  # half the host tier, however small the device limit
    with dask.config.set({"cudask.memory.pinned-pool-size": "auto"}):
        store = make_store(device_memory_limit=None, memory_limit=10_000, pinned_pool_size=None)
    assert store.settings.pinned_pool_size == 0  # nothing to spill from the device
    with dask.config.set({"cudask.memory.pinned-pool-size": 0.5}):
        store = make_store(memory_limit=10_000, pinned_pool_size=None)
    assert store.settings.pinned_pool_size == 5000


def test_pinned_memory_is_made_ready_ahead_and_idle_memory_goes_back(
    make_store: MakeStore, wait_for: WaitFor
) -> None:
    backend = FakeCopyBackend()
    store = make_store(device_memory_limit=1 << 16, backend=backend,
                       pinned_release_after="50ms")
    assert store.settings.pinned_headroom == 1 << 16  # "auto": the device limit here
    store[0] = dev(1 << 14, 0)  # a quarter of the limit: nothing is pinned
    time.sleep(0.1)
    assert store._lazy.current is None and backend.pinned_bytes == 0
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
    time.sleep(0.1)
    assert store._lazy.current is None and backend.pinned_bytes == 0
    store[1] = dev(10_000, 1)  # 76%
    assert wait_for(lambda: store.metrics().get("pinned-reserved-bytes", 0) > 0)


def test_pinning_ahead_ramps_up_to_the_headroom_at_the_limit(make_store: MakeStore, wait_for: WaitFor) -> None:
    """Headroom 256 KiB at a 1 MiB limit, from half of it: at 3/4 of the limit half the
    headroom is made ready, not all of it (the ramp spans half the limit to the limit)."""
    store = make_store(device_memory_limit=1 << 20, pinned_headroom=256 << 10, pinned_pool_size=4 << 20,
                       pinned_slab_size=16 << 10)
    store[0] = dev(3 << 18, 0)  # 3/4 of the limit
    assert wait_for(lambda: store._lazy.current is not None and store.metrics().get("pinned-reserved-bytes", 0) > 0)
    assert store.engine.pool.wait_ready(timeout=120)
    assert store.engine.pool.goal == 128 << 10 and store.metrics()["pinned-reserved-bytes"] == 128 << 10


def test_host_copies_pickle_through_the_store(make_store: MakeStore) -> None:
    store = make_store(device_memory_limit=10)
    store["a"] = dev(100, 4)
    copy = store._host["a"]
    loaded = pickle.loads(pickle.dumps(copy))
    assert loaded.blocks[0].view.tobytes() == bytes([4]) * 100
    assert as_numpy([store["a"]])[0].sum() == 400


def test_memory_of_a_copy_in_flight_still_counts(make_store: MakeStore) -> None:
    # The CPU twin of test_referenced_elsewhere_is_not_pretended_freed on a GPU:
    # a spilled object keeps its device memory until its copy completes, and
    # after that while it is referenced elsewhere.
    backend = FakeCopyBackend(lag=10_000)
    store = make_store(device_memory_limit=150, backend=backend)
    held = dev(100, 1)
    store["held"] = held
    store["other"] = dev(100, 2)
    assert store.where("held") == "host" and backend.in_flight() > 0
    assert store.device_bytes == 200  # copy in flight: not freed yet
    assert store.committed_device_bytes == 100  # what the limit is enforced on
    assert store.metrics()["device-bytes"] == 200
    backend.drain()
    assert store.device_bytes == 200  # copied, but still referenced here
    assert store["held"] is held  # back on the device: "other" is spilled for it
    del held
    store["third"] = dev(10, 3)
    backend.drain()
    assert store.device_bytes == store.committed_device_bytes <= 150


def test_copy_in_flight_without_other_references_is_released_when_done(
    make_store: MakeStore,
) -> None:
    backend = FakeCopyBackend(lag=10_000)
    store = make_store(device_memory_limit=150, backend=backend)
    store["a"] = dev(100, 1)
    store["b"] = dev(100, 2)
    assert store.device_bytes == 200
    backend.drain()
    assert store.device_bytes == 100 and store.metrics()["device-ghost-keys"] == 0
    assert (store["a"].get() == 1).all()


def test_no_device_limit_takes_the_dict_path(make_store: MakeStore) -> None:
    store = make_store()
    a = dev(100, 1)
    store["a"] = a
    store["v"] = a.view(slice(0, 10))
    store["h"] = b"host"
    store["h"] = dev(20, 2)  # host -> device
    store["a2"] = b"x"
    assert store._ledger.total == 0 and not store._tiers.gen and store._thread is None
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


def test_spill_device_without_a_limit_leaves_the_dict_path(make_store: MakeStore) -> None:
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
    store = make_store(device_memory_limit=150, backend=backend, pinned_preallocate=1 << 16,
                       pinned_pool_size=1 << 20, pinned_slab_size=1 << 16)
    store["a"] = dev(100, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # memory still being made ready is no cause for alarm
        store["b"] = dev(100, 2)  # spills "a" while no slab is pinned yet
    copy = store.peek_host_copy("a")
    assert copy is not None and not copy.pinned()
    m = store.metrics()
    assert m["pageable-fallback-warmup-bytes"] == 100 and m["pinned-ready"] < 1
    backend.gate.set()
    assert store.engine.pool.wait_ready(timeout=30)
    store["c"] = dev(100, 3)  # spills "b" into the pinned pool
    copy = store.peek_host_copy("b")
    assert copy is not None and copy.pinned()
    m = store.metrics()
    assert m["pinned-ready"] == 1 and m["pinned-reserved-bytes"] >= 1 << 16
    assert m["pageable-fallback-count"] == 1
    assert [(store[k].get() == v).all() for k, v in (("a", 1), ("b", 2), ("c", 3))] == [True] * 3


def test_preallocate_setting(make_store: MakeStore) -> None:
    kw = {"memory_limit": 1 << 30, "pinned_pool_size": 1 << 20}
    assert make_store(device_memory_limit=1 << 16, pinned_preallocate="auto",
                      **kw).settings.pinned_preallocate == 1 << 16  # min(pool, device limit, 4 GiB)
    assert make_store(device_memory_limit=1 << 16, pinned_preallocate=True,
                      **kw).settings.pinned_preallocate == 1 << 20  # the whole pool
    assert make_store(device_memory_limit=1 << 16, pinned_preallocate=0.5,
                      **kw).settings.pinned_preallocate == 1 << 19  # a fraction of the pool
    assert make_store(pinned_preallocate=True, **kw).settings.pinned_preallocate == 0  # no device limit
    store = make_store(device_memory_limit=1 << 16, pinned_preallocate=False, **kw)
    assert store.settings.pinned_preallocate == 0 and store._lazy.current is None  # nothing at start


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
    with pytest.raises(_OutOfMemory) as info:
        allocate(950)  # more than the store can release while `held` is used
    assert "could not free 950 bytes" in str(info.value.__notes__)
    assert all((as_numpy(store[i]) == i).all() for i in range(8)) and held is not None
    assert make_store(device_memory_limit=None).on_demand is None
    assert make_store(device_memory_limit=1000, spill_on_demand=False).on_demand is None


def test_reads_go_on_when_the_disk_tier_is_full(make_store: MakeStore,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """Reading a key back from disk moves older keys to disk; when max-spill (or a
    full disk) refuses them, the read still returns the key, from host memory."""
    store = make_store(device_memory_limit=4000, memory_limit=6000, max_spill=4000)
    for i in range(30):
        store[i] = dev(1000, i)
    assert store.keys_on("disk") and store.keys_on("host")
    with caplog.at_level(logging.WARNING, logger="cudask.memory"):
        for i in range(30):
            assert (as_numpy(store[i]) == i).all(), i
    assert "disk tier is full" in caplog.text


def test_pickled_host_copies_hand_out_numpy_buffers(make_store: MakeStore) -> None:
    """Out-of-band pickle buffers of a host copy are NumPy arrays, never memoryviews:
    a memoryview exported to a PickleBuffer and caught in a reference cycle (the
    traceback of a failed disk write) crashes Python 3.12's garbage collector."""
    store = make_store(device_memory_limit=1000)
    store["a"] = dev(800, 3)
    store["b"] = dev(800, 4)  # spills "a"
    copy = store.peek_host_copy("a")
    assert copy is not None
    buffers: list[pickle.PickleBuffer] = []
    pickle.dumps(copy, protocol=5, buffer_callback=buffers.append)
    assert buffers and all(isinstance(b.raw().obj, np.ndarray) for b in buffers)
    back = pickle.loads(pickle.dumps(copy, protocol=5))
    assert bytes(back.blocks[0].view) == bytes(copy.blocks[0].view)


def test_full_disk_tier_with_garbage_collection_in_a_fresh_process(tmp_path: Any) -> None:
    """Spills refused by max-spill, reads and deletes, with the garbage collector run
    after every step: the process neither crashes nor loses a key."""
    script = f"""
import gc, numpy as np
from cudask.memory.settings import store_settings
from cudask.memory.store import TieredStore
from cudask.testing.fake_cuda import FakeCopyBackend, FakeDeviceArray, as_numpy
s = TieredStore(device_memory_limit=4000, memory_limit=6000, max_spill=4000,
                backend=FakeCopyBackend(), local_directory={str(tmp_path)!r},
                settings=store_settings(4000, 6000, pinned_pool_size=2000, pinned_slab_size=1000))
for i in range(40):
    s[i] = FakeDeviceArray.from_numpy(np.full(1000, i, dtype="u1"))
    gc.collect()
    if i % 3 == 0:
        del s[i // 2]
        gc.collect()
for i in range(40):
    if i in s:
        assert (as_numpy(s[i]) == i).all(), i
    gc.collect()
print("ok")
"""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", script], check=False,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
