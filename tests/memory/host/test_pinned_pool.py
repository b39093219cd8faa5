"""PinnedPool with a fake backend: growth in the background only, registration of
faulted-in memory, fallbacks, footprint limits, deferred release after a copy in flight.
Idle release: test_pinned_pool_idle.py; wider slabs: test_pinned_pool_widening.py."""

from __future__ import annotations

import ctypes
import threading
import warnings

import pytest
from pinned_pool_helpers import (
    InThreads,
    KiB,
    MiB,
    WaitFor,
    needs_mappings,
    ready_pool,
    waits_until_woken,
)

from cudask.memory.host.blocks import HostBlock
from cudask.memory.host.fallback import PinnedMemoryWarning
from cudask.memory.host.pool import PinnedPool
from cudask.memory.host.transfer import TransferEngine
from cudask.testing.fake_cuda import FakeCopyBackend


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
    with pytest.warns(PinnedMemoryWarning, match="half of the host memory available"):
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


def test_a_failure_while_the_interpreter_exits_is_not_warned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the main thread has ended, pinning fails because the interpreter is shutting
    down (executors refuse new work): the pool stops without a warning blaming the driver."""
    backend = FakeCopyBackend(pin_limit=16 * KiB)
    pool = PinnedPool(backend, 1 << 20, 16 * KiB)
    ended = threading.Thread(target=lambda: None)  # never started: not alive
    monkeypatch.setattr(threading, "main_thread", lambda: ended)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pool.preallocate(64 * KiB)
    assert backend.pin_refusals == 1 and pool.reserved == 16 * KiB
    monkeypatch.undo()
    pool.close()
