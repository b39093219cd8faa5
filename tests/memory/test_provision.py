"""The store while pinned memory is being made ready: no key lost and values
byte-identical when provisioning races with spills, when registration fails,
when the driver stops pinning mid-way, and when idle memory goes back while
copies are in flight."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from cudask.memory.host.fallback import PinnedMemoryWarning
from cudask.memory.store import TieredStore
from cudask.testing.fake_cuda import FakeCopyBackend, FakeDeviceArray

MakeStore = Callable[..., TieredStore]
InThreads = Callable[[Callable[[int], None], int], list[BaseException]]
KiB = 1024


class SlowPinning(FakeCopyBackend):
    """Every registration or allocation waits a little, so spills run while
    slabs are still being made ready."""

    def __init__(self, delay: float = 0.002, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.delay = delay

    def register_host(self, ptr: int, nbytes: int) -> None:
        threading.Event().wait(self.delay)
        super().register_host(ptr, nbytes)

    def alloc_pinned(self, nbytes: int) -> int:
        threading.Event().wait(self.delay)
        return super().alloc_pinned(nbytes)


def value(seed: int, n: int = 3000) -> FakeDeviceArray:
    rng = np.random.default_rng(seed)
    return FakeDeviceArray.from_numpy(rng.integers(0, 255, n, dtype=np.uint8))


def expected(seed: int, n: int = 3000) -> bytes:
    return np.random.default_rng(seed).integers(0, 255, n, dtype=np.uint8).tobytes()


def churn(store: TieredStore, in_threads: InThreads, threads: int = 4, rounds: int = 60) -> None:
    """Threads writing, reading back and deleting keys through a small device tier;
    every read must give the bytes written."""

    def work(t: int) -> None:
        for i in range(rounds):
            key = f"{t}-{i}"
            store[key] = value(t * 1000 + i)
            if i >= 3:
                old = f"{t}-{i - 3}"
                assert store[old].get().tobytes() == expected(t * 1000 + i - 3), old
                if i % 2:
                    del store[old]

    errors = in_threads(work, threads)
    assert not errors, errors[0]
    for t in range(threads):
        for i in range(rounds):
            key = f"{t}-{i}"
            if i >= rounds - 3 or (i + 3) % 2 == 0:  # kept keys
                assert store[key].get().tobytes() == expected(t * 1000 + i), key


@pytest.mark.parametrize("lag", [0, 3])
def test_spills_racing_provisioning_lose_nothing(
    make_store: MakeStore, in_threads: InThreads, wait_for: Callable[..., bool], lag: int
) -> None:
    backend = SlowPinning(lag=lag)
    store = make_store(
        device_memory_limit=20 * KiB,
        backend=backend,
        background=True,
        spill_target=0.9,
        pinned_pool_size=256 * KiB,
        pinned_slab_size=16 * KiB,
        pinned_release_after=0.01,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PinnedMemoryWarning)
        churn(store, in_threads)
    assert store.metrics()["spill-device-to-host-count"] > 0
    # the spills asked for pinned memory; the pool's thread pins it in its own time
    assert wait_for(lambda: store.metrics()["pinned-provision-bytes"] > 0, timeout=60)


def test_registration_failure_falls_back_with_one_warning_and_loses_nothing(
    make_store: MakeStore, in_threads: InThreads
) -> None:
    backend = FakeCopyBackend(refuse_register="cudaErrorNotSupported")
    store = make_store(
        device_memory_limit=20 * KiB,
        backend=backend,
        background=True,
        spill_target=0.9,
        pinned_pool_size=256 * KiB,
        pinned_slab_size=16 * KiB,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PinnedMemoryWarning)
        churn(store, in_threads)
        store.engine.pool.provisioner.wait_ready(timeout=30)
    named = [w for w in caught if "cudaErrorNotSupported" in str(w.message)]
    assert len(named) == 1 and "cudaHostAlloc" in str(named[0].message)
    assert store.engine.pool.method == "host-alloc" and backend.pin_calls > 0


def test_driver_refusing_mid_provisioning_loses_nothing(
    make_store: MakeStore, in_threads: InThreads
) -> None:
    backend = SlowPinning(pin_limit=48 * KiB)  # three slabs, then "out of memory"
    store = make_store(
        device_memory_limit=20 * KiB,
        backend=backend,
        background=True,
        spill_target=0.9,
        pinned_pool_size=1 << 20,
        pinned_slab_size=16 * KiB,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PinnedMemoryWarning)
        churn(store, in_threads)
    assert backend.pin_refusals >= 1 and backend.pinned_bytes <= 48 * KiB
    assert store.metrics()["pageable-fallback-count"] > 0


def test_idle_memory_given_back_while_copies_are_in_flight(
    make_store: MakeStore, in_threads: InThreads, wait_for: Callable[..., bool]
) -> None:
    backend = SlowPinning(lag=5)  # copies stay in flight across several queries
    store = make_store(
        device_memory_limit=20 * KiB,
        backend=backend,
        background=True,
        spill_target=0.9,
        pinned_pool_size=256 * KiB,
        pinned_slab_size=8 * KiB,
        pinned_release_after=0.001,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PinnedMemoryWarning)
        churn(store, in_threads, rounds=80)
        # Two 3000-byte blocks share an 8 KiB slab, of whichever threads spilled at the
        # time: only slabs holding no survivor's block are sure to fall idle, and a
        # survivor holds one block at most.
        survivors = {f"{t}-{i}": t * 1000 + i for t in (2, 3) for i in range(77, 80)}
        for key in [k for k in list(store) if k not in survivors]:
            del store[key]  # blocks go back once their copies complete, then idle slabs

        def reserved() -> float:
            return store.metrics()["pinned-reserved-bytes"]

        assert wait_for(lambda: reserved() <= len(survivors) * 8 * KiB, timeout=30), store.metrics()
        for key, seed in survivors.items():
            assert store[key].get().tobytes() == expected(seed), key
        for key in survivors:
            del store[key]
        assert wait_for(lambda: reserved() == 0, timeout=30), store.metrics()
        assert store.metrics()["pinned-released-bytes"] > 0
