"""PinnedPool with a fake backend: blocks carved out of the slabs and taken back
(coalesced, deferred while a copy is in flight), fallbacks without waiting for
pinning, closing, and the constructor's arguments. What the provisioner does
(growth, footprint, fallback blocks registered later, idle slabs given back, wider
slabs): test_provisioner.py, test_provisioner_widening.py."""

from __future__ import annotations

import ctypes
import threading
import warnings

import pytest
from pinned_pool_helpers import Gated, InThreads, KiB, MiB, needs_mappings, ready_pool

from cudask.memory.host.blocks import HostBlock
from cudask.memory.host.copy_engine import TransferEngine
from cudask.memory.host.fallback import PinnedMemoryWarning
from cudask.memory.host.pool import ALIGNMENT, AVAILABLE_FRACTION, SLAB_SIZE, PinnedPool
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


def test_allocate_never_waits_for_pinning() -> None:
    backend = Gated()
    pool = PinnedPool(backend, 256 * KiB, slab_size=16 * KiB)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warming up is expected: no warning
        block = pool.allocate(4 * KiB)  # nothing ready, the gate is closed: no waiting
    assert not block.pinned and pool.stats()["pageable-fallback-warmup-bytes"] == 4 * KiB
    backend.gate.set()
    assert pool.provisioner.wait_ready(timeout=30) and pool.reserved >= 16 * KiB
    assert pool.allocate(4 * KiB).pinned
    assert threading.current_thread().name not in backend.callers
    assert backend.callers == {"cudask-pinned"}
    pool.close()
    assert pool.provisioner._thread is not None and not pool.provisioner._thread.is_alive()


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


def test_zero_capacity_means_pageable_without_warning() -> None:
    backend = FakeCopyBackend()
    pool = PinnedPool(backend, 0, slab_size=16 * KiB)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        block = pool.allocate(KiB)
    assert not block.pinned and backend.pin_calls == 0 and pool.provisioner._thread is None


def test_small_fallback_blocks_are_plain_pageable_memory() -> None:
    pool = PinnedPool(FakeCopyBackend(), 0, slab_size=16 * KiB)
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


def test_close_returns_slabs_to_the_driver() -> None:
    backend = FakeCopyBackend()
    pool = ready_pool(backend, 64 * KiB, 16 * KiB)
    pool.allocate(KiB)
    with pytest.warns(PinnedMemoryWarning, match="full"):
        pool.allocate(20 * KiB)  # larger than a slab, the pool at its capacity
    pool.close()
    assert backend.pinned == {} and backend.registered == {} and pool.reserved == 0


def test_concurrent_allocate_and_release(in_threads: InThreads) -> None:
    pool = PinnedPool(FakeCopyBackend(), 256 * KiB, slab_size=32 * KiB)
    pool.ensure_free(128 * KiB)

    def work(seed: int) -> None:
        for i in range(200):
            block = pool.allocate(((seed * 7 + i) % 13 + 1) * 256)
            block.view[:1] = bytes([seed])
            assert block.view[0] == seed
            block.release()

    errors = in_threads(work, 4)
    assert not errors
    assert pool.provisioner.wait_ready(timeout=30)
    assert pool.in_use == 0
    assert all(slab.free_bytes == slab.size for slab in pool._slabs)
    pool.close()


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        PinnedPool(FakeCopyBackend(), -1, slab_size=10)
    with pytest.raises(ValueError, match="method"):
        PinnedPool(FakeCopyBackend(), 10, slab_size=10, method="mlock")
    with pytest.raises(ValueError, match="available_fraction"):
        PinnedPool(FakeCopyBackend(), 10, slab_size=10, available_fraction=0)
    with pytest.raises(ValueError, match="release_after"):
        PinnedPool(FakeCopyBackend(), 10, release_after=-1)


def test_defaults_are_the_module_constants() -> None:
    pool = PinnedPool(FakeCopyBackend(), 1 << 40, available=lambda: 1 << 40)
    assert pool.provisioner.slab_size == SLAB_SIZE and pool.alignment == ALIGNMENT
    assert pool.provisioner.available_fraction == AVAILABLE_FRACTION
    assert pool.provisioner.release_after is None and pool.method in ("register", "host-alloc")
    pool.close()
