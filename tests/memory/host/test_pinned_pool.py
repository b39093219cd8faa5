"""PinnedPool with a fake backend: growth in the background only, registration of
faulted-in memory, fallbacks, footprint limits, deferred and idle release."""

from __future__ import annotations

import ctypes
import sys
import threading
import time
import warnings
from collections.abc import Callable

import pytest

from cudask.memory.host import faulting, slabs
from cudask.memory.host.blocks import HostBlock
from cudask.memory.host.fallback import PinnedMemoryWarning
from cudask.memory.host.pool import PinnedPool
from cudask.memory.host.transfer import TransferEngine
from cudask.testing.fake_cuda import FakeCopyBackend

WaitFor = Callable[..., bool]

InThreads = Callable[[Callable[[int], None], int], list[BaseException]]

KiB = 1024
MiB = 1 << 20
needs_mappings = pytest.mark.skipif(not faulting.available(), reason="needs Linux mappings")


def waits_until_woken(pool: PinnedPool) -> bool:
    """Whether the pool's thread waits, with no timer, for a caller to wake it: it
    found nothing to pin, register or give back, now or later. Read under the
    pool's lock: a notify takes the thread off the condition's waiters at once,
    so such a wait seen after an action is one that took the action into account."""
    thread = pool._thread
    if thread is None:
        return False
    with pool._lock:
        if not pool._wake._waiters:  # type: ignore[attr-defined]
            return False
        frame = sys._current_frames().get(thread.ident or 0)
        while frame is not None and frame.f_code is not threading.Condition.wait.__code__:
            frame = frame.f_back
        return frame is not None and frame.f_locals["timeout"] is None


def ready_pool(backend: FakeCopyBackend, capacity: int, slab: int, **kwargs: object) -> PinnedPool:
    pool = PinnedPool(backend, capacity, slab, **kwargs)  # type: ignore[arg-type]
    pool.preallocate()
    return pool


@needs_mappings
def test_slabs_are_registered_mappings_by_default_and_reused() -> None:
    backend = FakeCopyBackend()
    pool = ready_pool(backend, 32 * KiB, 16 * KiB)
    assert pool.method == "register" and pool.slabs == 2
    assert backend.register_calls == 2 and backend.pin_calls == 0
    blocks = [pool.allocate(4 * KiB) for _ in range(4)]
    assert all(b.pinned and backend.is_pinned(b.ptr) for b in blocks)
    assert len({b.ptr for b in blocks}) == 4
    for b in blocks:
        b.release()
    again = pool.allocate(16 * KiB)  # the freed ranges coalesced into one
    assert again.ptr == blocks[0].ptr
    pool.close()
    assert backend.registered == {} and backend.pinned_bytes == 0


def test_block_memory_is_writable_and_distinct() -> None:
    pool = ready_pool(FakeCopyBackend(), 64 * KiB, 16 * KiB)
    a, b = pool.allocate(100), pool.allocate(100)
    a.view[:] = b"a" * 100
    b.view[:] = b"b" * 100
    assert bytes(a.view) == b"a" * 100 and bytes(b.view) == b"b" * 100
    assert a.nbytes == 100 and abs(a.ptr - b.ptr) >= 100
    pool.close()


def test_host_alloc_method_uses_the_drivers_allocation() -> None:
    backend = FakeCopyBackend()
    pool = ready_pool(backend, 32 * KiB, 16 * KiB, method="host-alloc")
    assert backend.pin_calls == 2 and backend.register_calls == 0
    assert pool.allocate(KiB).pinned
    pool.close()
    assert backend.pinned == {}


@needs_mappings
def test_registration_failure_warns_once_and_falls_back_to_host_alloc() -> None:
    backend = FakeCopyBackend(refuse_register="operation not supported")
    pool = PinnedPool(backend, 64 * KiB, 16 * KiB)
    with pytest.warns(PinnedMemoryWarning, match="operation not supported") as record:
        pool.preallocate(32 * KiB)
    assert len(record) == 1 and pool.method == "host-alloc"
    assert backend.register_calls == 1 and backend.pin_calls == 2 and pool.slabs == 2
    assert pool.allocate(KiB).pinned
    pool.close()
    assert backend.pinned == {} and backend.registered == {}


class _Gated(FakeCopyBackend):
    """Registration (and allocation) wait for `gate`."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.callers: set[str] = set()

    def register_host(self, ptr: int, nbytes: int) -> None:
        self.callers.add(threading.current_thread().name)
        self.gate.wait()
        super().register_host(ptr, nbytes)

    def alloc_pinned(self, nbytes: int) -> int:
        self.callers.add(threading.current_thread().name)
        self.gate.wait()
        return super().alloc_pinned(nbytes)


def test_allocate_never_waits_for_pinning() -> None:
    backend = _Gated()
    pool = PinnedPool(backend, 256 * KiB, 16 * KiB)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warming up is expected: no warning
        block = pool.allocate(4 * KiB)  # nothing ready, the gate is closed: no waiting
    assert not block.pinned and pool.stats()["pageable-fallback-warmup-bytes"] == 4 * KiB
    backend.gate.set()
    assert pool.wait_ready(timeout=30) and pool.reserved >= 16 * KiB
    assert pool.allocate(4 * KiB).pinned
    assert threading.current_thread().name not in backend.callers
    assert backend.callers == {"cudask-pinned"}
    pool.close()
    assert pool._thread is not None and not pool._thread.is_alive()


def test_ensure_free_makes_memory_ready_ahead_up_to_the_capacity() -> None:
    backend = FakeCopyBackend()
    pool = PinnedPool(backend, 96 * KiB, 16 * KiB)
    pool.ensure_free(40 * KiB)
    assert pool.wait_ready(timeout=30) and pool.reserved >= 40 * KiB
    held = [pool.allocate(16 * KiB) for _ in range(3)]
    assert all(b.pinned for b in held)
    pool.ensure_free(40 * KiB)  # beyond the 48 KiB in use, capped at 96 KiB
    assert pool.wait_ready(timeout=30) and pool.reserved == 96 * KiB
    stats = pool.stats()
    assert stats["pinned-provision-bytes"] == 96 * KiB and stats["pinned-provision-seconds"] > 0
    assert stats["pinned-provision-gbps"] > 0
    pool.close()


def test_large_request_gets_its_own_slab_from_the_thread() -> None:
    pool = PinnedPool(FakeCopyBackend(), 128 * KiB, 16 * KiB)
    big = pool.allocate(40 * KiB)  # larger than a slab: fallback now, a big slab next
    assert not big.pinned and pool.wait_ready(timeout=30)
    again = pool.allocate(40 * KiB)
    assert again.pinned
    pool.close()


def test_full_pool_falls_back_with_one_warning() -> None:
    pool = ready_pool(FakeCopyBackend(), 32 * KiB, 16 * KiB)
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
    pool.close()


def test_available_memory_caps_what_is_pinned() -> None:
    total = [200 * KiB]  # host memory available without the pool
    backend = FakeCopyBackend()
    pool = PinnedPool(backend, 1 << 30, 16 * KiB, available_fraction=0.5,
                      available=lambda: total[0] - backend.pinned_bytes)
    pool.ensure_free(1 << 20)
    # at most half of what would be available without the pool: 6 slabs of 16 KiB
    assert not pool.wait_ready(timeout=30)
    assert pool.reserved == 96 * KiB and backend.pinned_bytes == 96 * KiB
    for _ in range(6):
        assert pool.allocate(16 * KiB).pinned
    with pytest.warns(PinnedMemoryWarning, match="pinned-available-fraction"):
        assert not pool.allocate(16 * KiB).pinned
    total[0] = 1 << 30  # memory freed elsewhere: the next request grows again
    pool.allocate(16 * KiB)
    assert pool.wait_ready(timeout=30) and pool.reserved > 96 * KiB
    pool.close()


def test_driver_refusal_falls_back_and_stops_asking(wait_for: WaitFor) -> None:
    backend = FakeCopyBackend(pin_limit=16 * KiB)
    pool = PinnedPool(backend, 1 << 20, 16 * KiB)
    with pytest.warns(PinnedMemoryWarning, match="refused"):
        pool.preallocate(64 * KiB)
    assert pool.reserved == 16 * KiB and backend.pin_refusals == 1
    assert pool.allocate(16 * KiB).pinned
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the cause was given once already
        block = pool.allocate(KiB)
    assert not block.pinned and pool.stats()["pageable-fallback-count"] == 1
    pool.allocate(KiB)
    pool.preallocate(64 * KiB)  # asked here, in this thread
    pool.ensure_free(64 * KiB)  # and of the pool's thread
    assert wait_for(lambda: waits_until_woken(pool))
    assert backend.pin_refusals == 1 and pool.reserved == 16 * KiB  # not asked again
    pool.close()


def test_zero_capacity_means_pageable_without_warning() -> None:
    backend = FakeCopyBackend()
    pool = PinnedPool(backend, 0, 16 * KiB)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        block = pool.allocate(KiB)
    assert not block.pinned and backend.pin_calls == 0 and pool._thread is None


@needs_mappings
def test_large_fallback_blocks_are_faulted_in_and_registered_later(wait_for: WaitFor) -> None:
    backend = _Gated()
    pool = PinnedPool(backend, 64 * MiB, 4 * MiB)
    block = pool.allocate(2 * MiB)  # the gate is closed: a fallback mapping
    assert not block.pinned and not backend.is_pinned(block.ptr)
    block.view[:5] = b"spill"
    backend.gate.set()
    # registered by the pool's thread
    assert wait_for(lambda: pool.stats()["pageable-registered-bytes"] >= 2 * MiB, timeout=30)
    assert block.pinned and backend.is_pinned(block.ptr) and bytes(block.view[:5]) == b"spill"
    registered = len(backend.registered)
    block.release()
    del block
    assert wait_for(lambda: len(backend.registered) == registered - 1)
    pool.close()
    assert backend.registered == {} and pool._fallbacks.registered == 0


def test_small_fallback_blocks_are_plain_pageable_memory() -> None:
    pool = PinnedPool(FakeCopyBackend(), 0, 16 * KiB)
    block = pool.allocate(KiB)
    assert not block.pinned and isinstance(block._keepalive, object)
    block.view[:3] = b"abc"
    assert bytes(block.view[:3]) == b"abc"


@needs_mappings
def test_mapped_blocks_hold_zeroed_writable_memory() -> None:
    block = HostBlock.mapped(3 * MiB + 5, threads=2)
    data = (ctypes.c_uint8 * (3 * MiB + 5)).from_address(block.ptr)
    assert data[0] == 0 and data[3 * MiB + 4] == 0
    block.view[-1:] = b"\x07"
    assert data[3 * MiB + 4] == 7
    block.release()


def test_release_waits_for_the_copy_in_flight() -> None:
    backend = FakeCopyBackend(lag=1000)
    pool = ready_pool(backend, 16 * KiB, 16 * KiB)
    engine = TransferEngine(backend, pool)
    src = HostBlock.pageable(16 * KiB)
    block, copy = engine.to_host(src.ptr, 16 * KiB)
    block.release(after=copy)
    assert not block.released and pool.in_use == 16 * KiB
    # While the copy is pending, the range stays out of the free lists...
    assert pool._deferred._items and all(slab.free_bytes == 0 for slab in pool._slabs)
    # ...and allocate() waits for pending copies (milliseconds) before falling back.
    again = pool.allocate(16 * KiB)
    assert again.pinned and copy.ready() and again.ptr == block.ptr
    pool.close()


def test_preallocate_reserves_up_to_capacity() -> None:
    backend = FakeCopyBackend()
    pool = PinnedPool(backend, 40 * KiB, 16 * KiB)
    assert pool.preallocate() == 40 * KiB  # two slabs and a 8 KiB remainder
    assert pool.slabs == 3
    pool.close()


def test_close_returns_slabs_to_the_driver() -> None:
    backend = FakeCopyBackend()
    pool = ready_pool(backend, 64 * KiB, 16 * KiB)
    pool.allocate(KiB)
    with pytest.warns(PinnedMemoryWarning, match="full"):
        pool.allocate(20 * KiB)  # larger than a slab, the pool at its capacity
    pool.close()
    assert backend.pinned == {} and backend.registered == {} and pool.reserved == 0


def test_concurrent_allocate_and_release(in_threads: InThreads) -> None:
    pool = PinnedPool(FakeCopyBackend(), 256 * KiB, 32 * KiB)
    pool.ensure_free(128 * KiB)

    def work(seed: int) -> None:
        for i in range(200):
            block = pool.allocate(((seed * 7 + i) % 13 + 1) * 256)
            block.view[:1] = bytes([seed])
            assert block.view[0] == seed
            block.release()

    errors = in_threads(work, 4)
    assert not errors
    assert pool.wait_ready(timeout=30)
    assert pool.in_use == 0
    assert all(slab.free_bytes == slab.size for slab in pool._slabs)
    pool.close()


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        PinnedPool(FakeCopyBackend(), -1, 10)
    with pytest.raises(ValueError, match="method"):
        PinnedPool(FakeCopyBackend(), 10, 10, method="mlock")
    with pytest.raises(ValueError, match="available_fraction"):
        PinnedPool(FakeCopyBackend(), 10, 10, available_fraction=0)


def test_start_goal_is_reserved_and_kept_while_idle(wait_for: WaitFor) -> None:
    backend = FakeCopyBackend()
    pool = PinnedPool(backend, 256 * KiB, 16 * KiB, release_after=0.05)
    pool.start_background(16 * KiB, headroom=16 * KiB)
    assert pool.wait_ready(timeout=30)
    held = []
    while len(held) < 6:  # grows ahead of use, up to 6 slabs in use
        block = pool.allocate(16 * KiB)
        if block.pinned:
            held.append(block)
        else:
            assert pool.wait_ready(timeout=30)
    assert pool.reserved >= 7 * 16 * KiB
    for b in held:
        b.release()
    # idle slabs go back; the start goal (one slab) stays, and it does not grow back
    assert wait_for(lambda: pool.reserved == 16 * KiB)
    assert wait_for(lambda: waits_until_woken(pool))  # no timer left for the one kept
    assert pool.reserved == 16 * KiB and pool.goal == 16 * KiB
    assert pool.stats()["pinned-released-bytes"] >= 6 * 16 * KiB
    assert pool.allocate(16 * KiB).pinned
    pool.close()
    assert backend.pinned == {} and backend.registered == {}


def test_slabs_stay_pinned_without_release_after(wait_for: WaitFor) -> None:
    backend = FakeCopyBackend()
    pool = ready_pool(backend, 256 * KiB, 16 * KiB)
    pool.allocate(16 * KiB).release()  # starts the pool's thread; every slab idle
    assert wait_for(lambda: waits_until_woken(pool))  # no timer to give them back
    assert pool.reserved == 256 * KiB
    pool.close()


def test_trim_gives_free_slabs_back_at_once(wait_for: WaitFor) -> None:
    backend = FakeCopyBackend()
    pool = ready_pool(backend, 128 * KiB, 16 * KiB)  # no release_after: kept while idle
    pool.keep = 16 * KiB
    held = pool.allocate(16 * KiB)
    assert held.pinned
    pool.allocate(16 * KiB).release()
    pool.trim()
    # every wholly free slab goes, beyond the start goal; the one in use stays
    assert wait_for(lambda: pool.reserved == 16 * KiB)
    assert pool.stats()["pinned-released-bytes"] == 112 * KiB
    held.release()
    pool.close()
    assert backend.pinned == {} and backend.registered == {}


def test_limit_idle_gives_free_slabs_back_now_and_caps_what_is_made_ready(wait_for: WaitFor) -> None:
    backend = FakeCopyBackend()
    pool = ready_pool(backend, 128 * KiB, 16 * KiB)
    held = [pool.allocate(16 * KiB) for _ in range(2)]
    pool.limit_idle(32 * KiB)  # 96 KiB free: 64 go back in this call
    assert pool.reserved == 64 * KiB and pool.stats()["pinned-released-bytes"] == 64 * KiB
    pool.ensure_free(96 * KiB)  # asks for more ahead than the cap allows
    assert pool.wait_ready(timeout=30) and pool.reserved == 64 * KiB
    assert wait_for(lambda: waits_until_woken(pool))  # held back by the cap, asleep
    pool.limit_idle(48 * KiB)  # room again (the thread is woken): made ready up to in use + 48 KiB
    pool.ensure_free(96 * KiB)
    assert pool.wait_ready(timeout=30) and pool.reserved == 80 * KiB
    pool.limit_idle(0)
    assert pool.reserved == 32 * KiB and all(b.pinned for b in held)
    for b in held:
        b.release()
    pool.close()


class _SlowPin(FakeCopyBackend):
    """Registration takes `seconds`; the start of each call is recorded."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.starts: list[float] = []

    def register_host(self, ptr: int, nbytes: int) -> None:
        self.starts.append(time.monotonic())
        time.sleep(self.seconds)
        super().register_host(ptr, nbytes)

    def alloc_pinned(self, nbytes: int) -> int:
        self.starts.append(time.monotonic())
        time.sleep(self.seconds)
        return super().alloc_pinned(nbytes)


def test_pinning_ahead_rests_as_long_as_it_worked_at_duty_cycle_one_half(wait_for: WaitFor) -> None:
    backend = _SlowPin(0.05)
    pool = PinnedPool(backend, 256 * KiB, 16 * KiB, duty_cycle=0.5)
    pool.ensure_free(64 * KiB)
    assert pool.wait_ready(timeout=60) and len(backend.starts) == 4
    # after each slab (at least 0.05 s of pinning) the thread rested at least as long
    gaps = [b - a for a, b in zip(backend.starts, backend.starts[1:], strict=False)]
    assert all(gap >= 0.1 for gap in gaps), gaps
    assert wait_for(lambda: pool.stats()["pinned-rest-seconds"] >= 4 * 0.05)
    assert pool._pinner._mapper is None  # no slab faulted in during another's registration
    pool.close()


def test_without_rests_at_duty_cycle_one() -> None:
    pool = PinnedPool(_SlowPin(0.01), 256 * KiB, 16 * KiB)
    pool.ensure_free(64 * KiB)
    assert pool.wait_ready(timeout=60)
    assert pool.stats()["pinned-rest-seconds"] == 0
    pool.close()


def test_close_ends_a_rest_at_once(wait_for: WaitFor) -> None:
    pool = PinnedPool(_SlowPin(0.05), 256 * KiB, 16 * KiB, duty_cycle=0.001)  # rests ~50 s
    pool.ensure_free(64 * KiB)
    assert wait_for(lambda: pool.slabs == 1)
    started = time.monotonic()
    pool.close()
    assert time.monotonic() - started < 30  # not the 50 s rest
    assert pool._thread is not None and not pool._thread.is_alive()


def test_rejects_a_duty_cycle_outside_zero_one() -> None:
    for bad in (0, -0.5, 1.5):
        with pytest.raises(ValueError, match="duty_cycle"):
            PinnedPool(FakeCopyBackend(), 10, 10, duty_cycle=bad)


def test_a_fallback_the_free_bytes_would_have_held_is_counted_as_fragmented() -> None:
    pool = PinnedPool(FakeCopyBackend(), 64 * KiB, 16 * KiB)
    assert pool.preallocate(32 * KiB) == 32 * KiB  # two 16 KiB slabs, all free
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        block = pool.allocate(24 * KiB)  # 32 KiB free, no 24 KiB range in one slab
    assert not block.pinned
    stats = pool.stats()
    assert stats["pageable-fallback-fragmented-bytes"] == 24 * KiB
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pool.allocate(80 * KiB)  # more than the pool can ever hold free: not fragmentation
    assert pool.stats()["pageable-fallback-fragmented-bytes"] == 24 * KiB
    pool.close()


def test_a_block_larger_than_a_slab_widens_later_slabs_to_hold_two(wait_for: WaitFor) -> None:
    pool = PinnedPool(FakeCopyBackend(), MiB, 16 * KiB)
    assert pool.preallocate(64 * KiB) == 64 * KiB  # four 16 KiB slabs, all free
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = pool.allocate(24 * KiB)  # no 24 KiB range in any slab: a fallback
    assert not first.pinned and pool.slab_size == 48 * KiB
    assert wait_for(lambda: pool.slabs == 5, timeout=30)  # the thread adds one wide slab
    blocks = [pool.allocate(24 * KiB) for _ in range(2)]
    assert all(b.pinned for b in blocks) and blocks[0]._slab is blocks[1]._slab
    stats = pool.stats()
    assert stats["pageable-fallback-fragmented-bytes"] == 24 * KiB  # the first one only
    assert stats["pinned-reserved-bytes"] == 64 * KiB + 48 * KiB
    pool.close()


def test_slabs_widen_no_further_than_the_capacity() -> None:
    pool = PinnedPool(FakeCopyBackend(), 40 * KiB, 16 * KiB)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pool.allocate(24 * KiB)
    assert pool.slab_size == 40 * KiB and pool.wait_ready(timeout=30)
    assert pool.allocate(24 * KiB).pinned
    pool.close()


def test_a_block_past_the_widest_slab_gets_a_slab_of_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slabs, "WIDEST", 32 * KiB)  # 1 GiB, scaled down
    pool = PinnedPool(FakeCopyBackend(), MiB, 16 * KiB)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert not pool.allocate(40 * KiB).pinned
    assert pool.slab_size == 16 * KiB and pool.wait_ready(timeout=30)
    assert pool.allocate(40 * KiB).pinned  # its own 48 KiB slab
    pool.close()


def test_free_pieces_too_small_for_a_block_make_the_pool_grow(wait_for: WaitFor) -> None:
    pool = PinnedPool(FakeCopyBackend(), 256 * KiB, 8 * KiB)
    assert pool.preallocate(32 * KiB) == 32 * KiB
    held = [pool.allocate(3 * KiB) for _ in range(8)]  # two per slab, a 2 KiB piece left in each
    assert all(b.pinned for b in held) and pool.slabs == 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert not pool.allocate(3 * KiB).pinned  # 8 KiB free, in 2 KiB pieces
    assert pool.stats()["pageable-fallback-fragmented-bytes"] == 3 * KiB
    assert wait_for(lambda: pool.slabs == 5, timeout=30)  # the pieces did not count as free
    assert pool.allocate(3 * KiB).pinned
    pool.close()


def test_a_block_wider_than_two_of_the_slabs_made_for_another_widens_them_again(
        wait_for: WaitFor) -> None:
    pool = PinnedPool(FakeCopyBackend(), MiB, 16 * KiB)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert not pool.allocate(20 * KiB).pinned  # slabs for two: 48 KiB
        assert pool.slab_size == 48 * KiB and wait_for(lambda: pool.slabs == 1, timeout=30)
        assert pool.allocate(20 * KiB).pinned  # 28 KiB left in the slab
        assert not pool.allocate(30 * KiB).pinned  # smaller than a slab, larger than any range
    assert pool.slab_size == 64 * KiB
    pool.close()


def test_a_slab_too_large_for_the_memory_available_gives_way_to_what_is_missing() -> None:
    calls = []

    def available() -> int:
        calls.append(1)
        return 30 * KiB  # with the whole of it allowed: any 30 KiB more fits

    pool = PinnedPool(FakeCopyBackend(), MiB, 16 * KiB, available=available, available_fraction=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert not pool.allocate(24 * KiB).pinned  # slabs widen to 48 KiB: more than available
    assert pool.slab_size == 48 * KiB
    assert pool.wait_ready(timeout=30) and pool.reserved == 24 * KiB  # what was asked
    deadline = time.monotonic() + 60
    while not waits_until_woken(pool):  # the thread settles: it does not retry in a loop
        assert time.monotonic() < deadline, f"the pool's thread never settled ({len(calls)} checks)"
        time.sleep(0.01)
    pool.close()


def test_no_slab_is_made_ready_that_the_idle_cap_would_give_back(wait_for: WaitFor) -> None:
    backend = FakeCopyBackend()
    pool = PinnedPool(backend, MiB, 16 * KiB)
    pool.limit_idle(10 * KiB)  # less free pinned memory than one slab
    pool.ensure_free(5 * KiB)
    assert wait_for(lambda: waits_until_woken(pool), timeout=60)
    assert pool.reserved == 0 and pool.stats()["pinned-released-bytes"] == 0
    pool.close()
