"""PinnedPool with a fake backend: slabs, carving, fallback, deferred release."""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable

import pytest

from cudask.memory.pinned import HostBlock, PinnedMemoryWarning, PinnedPool
from cudask.memory.transfer import TransferEngine
from cudask.testing.fake_cuda import FakeCopyBackend

WaitFor = Callable[..., bool]

InThreads = Callable[[Callable[[int], None], int], list[BaseException]]

KiB = 1024


def test_grows_in_slabs_and_reuses_memory() -> None:
    backend = FakeCopyBackend()
    pool = PinnedPool(backend, 64 * KiB, 16 * KiB)
    blocks = [pool.allocate(4 * KiB) for _ in range(4)]
    assert pool.slabs == 1 and backend.pin_calls == 1 and pool.reserved == 16 * KiB
    assert all(b.pinned and backend.is_pinned(b.ptr) for b in blocks)
    assert len({b.ptr for b in blocks}) == 4
    more = pool.allocate(1)
    assert pool.slabs == 2 and more.pinned
    for b in blocks:
        b.release()
    again = pool.allocate(16 * KiB)  # the freed ranges coalesced into one
    assert again.ptr == blocks[0].ptr and pool.slabs == 2


def test_block_memory_is_writable_and_distinct() -> None:
    pool = PinnedPool(FakeCopyBackend(), 64 * KiB, 16 * KiB)
    a, b = pool.allocate(100), pool.allocate(100)
    a.view[:] = b"a" * 100
    b.view[:] = b"b" * 100
    assert bytes(a.view) == b"a" * 100 and bytes(b.view) == b"b" * 100
    assert a.nbytes == 100 and abs(a.ptr - b.ptr) >= 100


def test_large_request_gets_its_own_slab() -> None:
    pool = PinnedPool(FakeCopyBackend(), 64 * KiB, 16 * KiB)
    big = pool.allocate(40 * KiB)
    assert big.pinned and pool.reserved == 48 * KiB


def test_exhausted_pool_falls_back_to_pageable_with_one_warning() -> None:
    pool = PinnedPool(FakeCopyBackend(), 32 * KiB, 16 * KiB)
    held = [pool.allocate(16 * KiB), pool.allocate(16 * KiB)]
    with pytest.warns(PinnedMemoryWarning, match="pinned-pool-size") as record:
        extra = [pool.allocate(8 * KiB) for _ in range(3)]
    assert len(record) == 1
    assert not any(b.pinned for b in extra)
    assert pool.stats()["pageable-fallback-count"] == 3
    held[0].release()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pool.allocate(8 * KiB).pinned  # room again, no new warning


def test_driver_refusal_falls_back_and_stops_asking() -> None:
    backend = FakeCopyBackend(pin_limit=16 * KiB)
    pool = PinnedPool(backend, 1 << 20, 16 * KiB)
    assert pool.allocate(16 * KiB).pinned
    with pytest.warns(PinnedMemoryWarning, match="driver refused"):
        block = pool.allocate(KiB)
    assert not block.pinned and backend.pin_refusals == 1
    pool.allocate(KiB)
    assert backend.pin_refusals == 1  # not asked again


def test_zero_capacity_means_pageable_without_warning() -> None:
    backend = FakeCopyBackend()
    pool = PinnedPool(backend, 0, 16 * KiB)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        block = pool.allocate(KiB)
    assert not block.pinned and backend.pin_calls == 0


def test_release_waits_for_the_copy_in_flight() -> None:
    backend = FakeCopyBackend(lag=1000)
    pool = PinnedPool(backend, 16 * KiB, 16 * KiB)
    engine = TransferEngine(backend, pool)
    src = HostBlock.pageable(16 * KiB)
    block, copy = engine.to_host(src.ptr, 16 * KiB)
    block.release(after=copy)
    assert not block.released and pool.in_use == 16 * KiB
    # While the copy is pending, the range stays out of the free lists...
    assert pool._pending and all(slab.free_bytes == 0 for slab in pool._slabs)
    # ...and allocate() waits for pending copies before falling back.
    again = pool.allocate(16 * KiB)
    assert again.pinned and copy.ready() and again.ptr == block.ptr


def test_preallocate_reserves_up_to_capacity() -> None:
    backend = FakeCopyBackend()
    pool = PinnedPool(backend, 40 * KiB, 16 * KiB)
    assert pool.preallocate() == 40 * KiB  # two slabs and a 8 KiB remainder
    assert pool.slabs == 3
    calls = backend.pin_calls
    pool.allocate(8 * KiB)
    assert backend.pin_calls == calls


def test_close_returns_slabs_to_the_driver() -> None:
    backend = FakeCopyBackend()
    pool = PinnedPool(backend, 64 * KiB, 16 * KiB)
    pool.allocate(KiB)
    pool.allocate(20 * KiB)
    pool.close()
    assert backend.pinned == {} and pool.reserved == 0


def test_concurrent_allocate_and_release(in_threads: InThreads) -> None:
    pool = PinnedPool(FakeCopyBackend(), 256 * KiB, 32 * KiB)

    def work(seed: int) -> None:
        for i in range(200):
            block = pool.allocate(((seed * 7 + i) % 13 + 1) * 256)
            block.view[:1] = bytes([seed])
            assert block.view[0] == seed
            block.release()

    errors = in_threads(work, 4)
    assert not errors
    assert pool.in_use == 0
    assert all(slab.free_bytes == slab.size for slab in pool._slabs)


def test_rejects_negative_sizes() -> None:
    with pytest.raises(ValueError):
        PinnedPool(FakeCopyBackend(), -1, 10)


class _Gated(FakeCopyBackend):
    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def alloc_pinned(self, nbytes: int) -> int:
        self.gate.wait()
        return super().alloc_pinned(nbytes)


def test_background_growth_never_pins_on_the_allocating_thread() -> None:
    backend = _Gated()
    pool = PinnedPool(backend, 256 * KiB, 16 * KiB)
    pool.start_background(32 * KiB, headroom=16 * KiB)
    with pytest.warns(PinnedMemoryWarning, match="still being reserved"):
        block = pool.allocate(4 * KiB)  # the gate is closed: no waiting, pageable
    assert not block.pinned and pool.stats()["pageable-fallback-warmup-bytes"] == 4 * KiB
    backend.gate.set()
    assert pool.wait_ready(timeout=30) and pool.reserved >= 32 * KiB
    held = [pool.allocate(8 * KiB) for _ in range(4)]  # uses the 32 KiB, asks for more
    assert all(b.pinned for b in held)
    assert pool.wait_ready(timeout=30)
    assert pool.reserved - pool.in_use >= 16 * KiB  # headroom kept ahead of use
    big = pool.allocate(40 * KiB)  # larger than a slab: pageable now, a big slab next
    assert not big.pinned and pool.wait_ready(timeout=30)
    assert pool.allocate(40 * KiB).pinned
    stats = pool.stats()
    assert stats["pinned-ready"] == 1 and stats["pinned-capacity-bytes"] == 256 * KiB
    pool.close()
    assert backend.pinned == {} and pool._thread is not None and not pool._thread.is_alive()


def test_background_growth_stops_at_the_capacity() -> None:
    backend = FakeCopyBackend()
    pool = PinnedPool(backend, 32 * KiB, 16 * KiB)
    pool.start_background(1 << 30)
    assert pool.wait_ready(timeout=30) and pool.reserved == 32 * KiB
    held = [pool.allocate(16 * KiB), pool.allocate(16 * KiB)]
    with pytest.warns(PinnedMemoryWarning, match="pinned-pool-size"):
        assert not pool.allocate(KiB).pinned  # full: the "full" cause, not warm-up
    assert pool.stats()["pageable-fallback-warmup-bytes"] == 0 and len(held) == 2
    pool.close()


def test_idle_slabs_go_back_to_the_driver_after_release_after(wait_for: WaitFor) -> None:
    backend = FakeCopyBackend()
    pool = PinnedPool(backend, 256 * KiB, 16 * KiB, release_after=0.05)
    blocks = [pool.allocate(16 * KiB) for _ in range(3)]  # three slabs, pinned inline
    assert all(b.pinned for b in blocks) and pool.reserved == 48 * KiB
    kept = blocks.pop()
    for b in blocks:
        b.release()
    # the two wholly free slabs go; the one holding `kept` stays
    assert wait_for(lambda: pool.reserved == 16 * KiB)
    assert backend.pinned_bytes == 16 * KiB and pool.stats()["pinned-released-bytes"] == 32 * KiB
    kept.view[:4] = b"kept"
    assert bytes(kept.view[:4]) == b"kept"
    kept.release()
    assert wait_for(lambda: pool.reserved == 0) and backend.pinned == {}
    again = pool.allocate(8 * KiB)  # pinned again when needed
    assert again.pinned and pool.reserved == 16 * KiB
    pool.close()
    assert backend.pinned == {}


def test_slabs_stay_pinned_without_release_after() -> None:
    backend = FakeCopyBackend()
    pool = PinnedPool(backend, 256 * KiB, 16 * KiB)
    pool.allocate(16 * KiB).release()
    time.sleep(0.2)
    assert pool.reserved == 16 * KiB and pool._thread is None  # inline: no thread at all
    pool.close()


def test_background_growth_keeps_its_start_goal_and_headroom_when_releasing(
    wait_for: WaitFor,
) -> None:
    backend = FakeCopyBackend()
    pool = PinnedPool(backend, 256 * KiB, 16 * KiB, release_after=0.05)
    pool.start_background(16 * KiB, headroom=16 * KiB)
    assert pool.wait_ready(timeout=30)
    held = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PinnedMemoryWarning)  # pageable while it grows
        while len(held) < 6:  # grows ahead of use, up to 6 slabs in use
            block = pool.allocate(16 * KiB)
            if block.pinned:
                held.append(block)
            else:
                assert pool.wait_ready(timeout=30)
    assert pool.reserved >= 7 * 16 * KiB
    for b in held:
        b.release()
    # keeps max(start goal, in use + headroom) = one slab, and does not grow back
    assert wait_for(lambda: pool.reserved == 16 * KiB)
    time.sleep(0.2)
    assert pool.reserved == 16 * KiB and pool.goal == 16 * KiB
    assert pool.allocate(16 * KiB).pinned
    pool.close()
    assert backend.pinned == {}
