"""PinnedPool with a fake backend when a block finds no range to fit it: fallbacks
counted as fragmentation, slabs widened to hold two such blocks, a slab of its own
past the widest, and growth bounded by the memory available."""

from __future__ import annotations

import time
import warnings

import pytest
from pinned_pool_helpers import KiB, MiB, WaitFor, waits_until_woken

from cudask.memory.host import slabs
from cudask.memory.host.pool import PinnedPool
from cudask.testing.fake_cuda import FakeCopyBackend


def test_a_fallback_the_free_bytes_would_have_held_is_counted_as_fragmented() -> None:
    pool = PinnedPool(FakeCopyBackend(), 64 * KiB, slab_size=16 * KiB)
    assert pool.provisioner.preallocate(32 * KiB) == 32 * KiB  # two 16 KiB slabs, all free
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
    pool = PinnedPool(FakeCopyBackend(), MiB, slab_size=16 * KiB)
    assert pool.provisioner.preallocate(64 * KiB) == 64 * KiB  # four 16 KiB slabs, all free
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = pool.allocate(24 * KiB)  # no 24 KiB range in any slab: a fallback
    assert not first.pinned and pool.provisioner.slab_size == 48 * KiB
    assert wait_for(lambda: pool.slabs == 5, timeout=30)  # the thread adds one wide slab
    blocks = [pool.allocate(24 * KiB) for _ in range(2)]
    assert all(b.pinned for b in blocks) and blocks[0]._slab is blocks[1]._slab
    stats = pool.stats()
    assert stats["pageable-fallback-fragmented-bytes"] == 24 * KiB  # the first one only
    assert stats["pinned-reserved-bytes"] == 64 * KiB + 48 * KiB
    pool.close()


def test_slabs_widen_no_further_than_the_capacity() -> None:
    pool = PinnedPool(FakeCopyBackend(), 40 * KiB, slab_size=16 * KiB)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pool.allocate(24 * KiB)
    assert pool.provisioner.slab_size == 40 * KiB and pool.provisioner.wait_ready(timeout=30)
    assert pool.allocate(24 * KiB).pinned
    pool.close()


def test_a_block_past_the_widest_slab_gets_a_slab_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(slabs, "WIDEST", 32 * KiB)  # 1 GiB, scaled down
    pool = PinnedPool(FakeCopyBackend(), MiB, slab_size=16 * KiB)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert not pool.allocate(40 * KiB).pinned
    assert pool.provisioner.slab_size == 16 * KiB and pool.provisioner.wait_ready(timeout=30)
    assert pool.allocate(40 * KiB).pinned  # its own 48 KiB slab
    pool.close()


def test_free_pieces_too_small_for_a_block_make_the_pool_grow(wait_for: WaitFor) -> None:
    pool = PinnedPool(FakeCopyBackend(), 256 * KiB, slab_size=8 * KiB)
    assert pool.provisioner.preallocate(32 * KiB) == 32 * KiB
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
    wait_for: WaitFor,
) -> None:
    pool = PinnedPool(FakeCopyBackend(), MiB, slab_size=16 * KiB)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert not pool.allocate(20 * KiB).pinned  # slabs for two: 48 KiB
        assert pool.provisioner.slab_size == 48 * KiB
        assert wait_for(lambda: pool.slabs == 1, timeout=30)
        assert pool.allocate(20 * KiB).pinned  # 28 KiB left in the slab
        assert not pool.allocate(30 * KiB).pinned  # smaller than a slab, larger than any range
    assert pool.provisioner.slab_size == 64 * KiB
    pool.close()


def test_a_slab_too_large_for_the_memory_available_gives_way_to_what_is_missing() -> None:
    calls = []

    def available() -> int:
        calls.append(1)
        return 30 * KiB  # with the whole of it allowed: any 30 KiB more fits

    pool = PinnedPool(
        FakeCopyBackend(), MiB, slab_size=16 * KiB, available=available, available_fraction=1.0
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert not pool.allocate(24 * KiB).pinned  # slabs widen to 48 KiB: more than available
    assert pool.provisioner.slab_size == 48 * KiB
    assert pool.provisioner.wait_ready(timeout=30) and pool.reserved == 24 * KiB  # what was asked
    deadline = time.monotonic() + 60
    while not waits_until_woken(pool):  # the thread settles: it does not retry in a loop
        assert time.monotonic() < deadline, f"the pool's thread never settled ({len(calls)} checks)"
        time.sleep(0.01)
    pool.close()
