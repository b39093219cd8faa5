"""PinnedPool's thread between requests, with a fake backend: idle slabs given back
(release_after, trim, limit_idle) or kept."""

from __future__ import annotations

from pinned_pool_helpers import KiB, MiB, WaitFor, ready_pool, waits_until_woken

from cudask.memory.host.pool import PinnedPool
from cudask.testing.fake_cuda import FakeCopyBackend


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


def test_no_slab_is_made_ready_that_the_idle_cap_would_give_back(wait_for: WaitFor) -> None:
    backend = FakeCopyBackend()
    pool = PinnedPool(backend, MiB, 16 * KiB)
    pool.limit_idle(10 * KiB)  # less free pinned memory than one slab
    pool.ensure_free(5 * KiB)
    assert wait_for(lambda: waits_until_woken(pool), timeout=60)
    assert pool.reserved == 0 and pool.stats()["pinned-released-bytes"] == 0
    pool.close()
