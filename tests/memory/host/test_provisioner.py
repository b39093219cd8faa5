"""The pinned pool's Provisioner, driven through a PinnedPool with a fake backend:
slabs reserved up to a goal (in the background, ahead of use, or in the caller),
pinning methods and failures, the footprint limits, fallback blocks registered
later, closing while a slab is pinned, and slabs given back between requests
(release_after, trim, limit_idle) or kept. Wider slabs: test_provisioner_widening.py."""

from __future__ import annotations

import threading
import warnings

import pytest
from pinned_pool_helpers import (
    Gated,
    KiB,
    MiB,
    WaitFor,
    needs_mappings,
    ready_pool,
    waits_until_woken,
)

from cudask.memory.host.blocks import DeferredBlocks
from cudask.memory.host.fallback import Fallbacks, PinnedMemoryWarning
from cudask.memory.host.pinning import Pinner
from cudask.memory.host.pool import PinnedPool
from cudask.memory.host.provision import Provisioner
from cudask.memory.host.slabs import Slabs
from cudask.testing.fake_cuda import FakeCopyBackend


def test_a_provisioner_alone_reserves_the_slabs_it_is_given_and_gives_them_back() -> None:
    backend = FakeCopyBackend()
    slabs, wake = Slabs(), threading.Condition()
    fallbacks = Fallbacks(wake, None)
    provisioner = Provisioner(
        slabs,
        wake,
        pinner=Pinner(backend, "auto", populate_threads=None, warn_once=fallbacks.warn_once),
        fallbacks=fallbacks,
        deferred=DeferredBlocks(lambda block: None),
        capacity=64 * KiB,
        slab_size=16 * KiB,
        alignment=256,
        release_after=None,
        available=lambda: 1 << 30,
        available_fraction=0.5,
    )
    assert provisioner.preallocate(40 * KiB) == 48 * KiB and len(slabs) == 3
    assert slabs.take(16 * KiB) is not None and slabs.in_use == 16 * KiB
    provisioner.close()
    assert len(slabs) == 0 and backend.pinned == {} and backend.registered == {}


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
    pool = PinnedPool(backend, 64 * KiB, slab_size=16 * KiB)
    with pytest.warns(PinnedMemoryWarning, match="operation not supported") as record:
        pool.provisioner.preallocate(32 * KiB)
    assert len(record) == 1 and pool.method == "host-alloc"
    assert backend.register_calls == 1 and backend.pin_calls == 2 and pool.slabs == 2
    assert pool.allocate(KiB).pinned
    pool.close()
    assert backend.pinned == {} and backend.registered == {}


def test_ensure_free_makes_memory_ready_ahead_up_to_the_capacity() -> None:
    backend = FakeCopyBackend()
    pool = PinnedPool(backend, 96 * KiB, slab_size=16 * KiB)
    pool.ensure_free(40 * KiB)
    assert pool.provisioner.wait_ready(timeout=30) and pool.reserved >= 40 * KiB
    held = [pool.allocate(16 * KiB) for _ in range(3)]
    assert all(b.pinned for b in held)
    pool.ensure_free(40 * KiB)  # beyond the 48 KiB in use, capped at 96 KiB
    assert pool.provisioner.wait_ready(timeout=30) and pool.reserved == 96 * KiB
    stats = pool.stats()
    assert stats["pinned-provision-bytes"] == 96 * KiB and stats["pinned-provision-seconds"] > 0
    assert stats["pinned-provision-gbps"] > 0
    pool.close()


def test_large_request_gets_its_own_slab_from_the_thread() -> None:
    pool = PinnedPool(FakeCopyBackend(), 128 * KiB, slab_size=16 * KiB)
    big = pool.allocate(40 * KiB)  # larger than a slab: fallback now, a big slab next
    assert not big.pinned and pool.provisioner.wait_ready(timeout=30)
    again = pool.allocate(40 * KiB)
    assert again.pinned
    pool.close()


def test_available_memory_caps_what_is_pinned() -> None:
    total = [200 * KiB]  # host memory available without the pool
    backend = FakeCopyBackend()
    pool = PinnedPool(
        backend,
        1 << 30,
        slab_size=16 * KiB,
        available_fraction=0.5,
        available=lambda: total[0] - backend.pinned_bytes,
    )
    pool.ensure_free(1 << 20)
    # at most half of what would be available without the pool: 6 slabs of 16 KiB
    assert not pool.provisioner.wait_ready(timeout=30)
    assert pool.reserved == 96 * KiB and backend.pinned_bytes == 96 * KiB
    for _ in range(6):
        assert pool.allocate(16 * KiB).pinned
    with pytest.warns(PinnedMemoryWarning, match="half of the host memory available"):
        assert not pool.allocate(16 * KiB).pinned
    total[0] = 1 << 30  # memory freed elsewhere: the next request grows again
    pool.allocate(16 * KiB)
    assert pool.provisioner.wait_ready(timeout=30) and pool.reserved > 96 * KiB
    pool.close()


def test_driver_refusal_falls_back_and_stops_asking(wait_for: WaitFor) -> None:
    backend = FakeCopyBackend(pin_limit=16 * KiB)
    pool = PinnedPool(backend, 1 << 20, slab_size=16 * KiB)
    with pytest.warns(PinnedMemoryWarning, match="refused"):
        pool.provisioner.preallocate(64 * KiB)
    assert pool.reserved == 16 * KiB and backend.pin_refusals == 1
    assert pool.allocate(16 * KiB).pinned
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the cause was given once already
        block = pool.allocate(KiB)
    assert not block.pinned and pool.stats()["pageable-fallback-count"] == 1
    pool.allocate(KiB)
    pool.provisioner.preallocate(64 * KiB)  # asked here, in this thread
    pool.ensure_free(64 * KiB)  # and of the pool's thread
    assert wait_for(lambda: waits_until_woken(pool))
    assert backend.pin_refusals == 1 and pool.reserved == 16 * KiB  # not asked again
    pool.close()


@needs_mappings
def test_large_fallback_blocks_are_faulted_in_and_registered_later(wait_for: WaitFor) -> None:
    backend = Gated()
    pool = PinnedPool(backend, 64 * MiB, slab_size=4 * MiB)
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


def test_preallocate_reserves_up_to_capacity() -> None:
    backend = FakeCopyBackend()
    pool = PinnedPool(backend, 40 * KiB, slab_size=16 * KiB)
    assert pool.provisioner.preallocate() == 40 * KiB  # two slabs and a 8 KiB remainder
    assert pool.slabs == 3
    pool.close()


def test_a_failure_while_the_interpreter_exits_is_not_warned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once the main thread has ended, pinning fails because the interpreter is shutting
    down (executors refuse new work): the pool stops without a warning blaming the driver."""
    backend = FakeCopyBackend(pin_limit=16 * KiB)
    pool = PinnedPool(backend, 1 << 20, slab_size=16 * KiB)
    ended = threading.Thread(target=lambda: None)  # never started: not alive
    monkeypatch.setattr(threading, "main_thread", lambda: ended)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pool.provisioner.preallocate(64 * KiB)
    assert backend.pin_refusals == 1 and pool.reserved == 16 * KiB
    monkeypatch.undo()
    pool.close()


def test_start_goal_is_reserved_and_kept_while_idle(wait_for: WaitFor) -> None:
    backend = FakeCopyBackend()
    pool = PinnedPool(backend, 256 * KiB, slab_size=16 * KiB, release_after=0.05)
    pool.start_background(16 * KiB, headroom=16 * KiB)
    assert pool.provisioner.wait_ready(timeout=30)
    held = []
    while len(held) < 6:  # grows ahead of use, up to 6 slabs in use
        block = pool.allocate(16 * KiB)
        if block.pinned:
            held.append(block)
        else:
            assert pool.provisioner.wait_ready(timeout=30)
    assert pool.reserved >= 7 * 16 * KiB
    for b in held:
        b.release()
    # idle slabs go back; the start goal (one slab) stays, and it does not grow back
    assert wait_for(lambda: pool.reserved == 16 * KiB)
    assert wait_for(lambda: waits_until_woken(pool))  # no timer left for the one kept
    assert pool.reserved == 16 * KiB and pool.provisioner.goal == 16 * KiB
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
    pool.provisioner.keep = 16 * KiB
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


def test_limit_idle_gives_free_slabs_back_now_and_caps_what_is_made_ready(
    wait_for: WaitFor,
) -> None:
    backend = FakeCopyBackend()
    pool = ready_pool(backend, 128 * KiB, 16 * KiB)
    held = [pool.allocate(16 * KiB) for _ in range(2)]
    pool.limit_idle(32 * KiB)  # 96 KiB free: 64 go back in this call
    assert pool.reserved == 64 * KiB and pool.stats()["pinned-released-bytes"] == 64 * KiB
    pool.ensure_free(96 * KiB)  # asks for more ahead than the cap allows
    assert pool.provisioner.wait_ready(timeout=30) and pool.reserved == 64 * KiB
    assert wait_for(lambda: waits_until_woken(pool))  # held back by the cap, asleep
    pool.limit_idle(48 * KiB)  # room again (the thread is woken): made ready up to in use + 48 KiB
    pool.ensure_free(96 * KiB)
    assert pool.provisioner.wait_ready(timeout=30) and pool.reserved == 80 * KiB
    pool.limit_idle(0)
    assert pool.reserved == 32 * KiB and all(b.pinned for b in held)
    for b in held:
        b.release()
    pool.close()


def test_no_slab_is_made_ready_that_the_idle_cap_would_give_back(wait_for: WaitFor) -> None:
    backend = FakeCopyBackend()
    pool = PinnedPool(backend, MiB, slab_size=16 * KiB)
    pool.limit_idle(10 * KiB)  # less free pinned memory than one slab
    pool.ensure_free(5 * KiB)
    assert wait_for(lambda: waits_until_woken(pool), timeout=60)
    assert pool.reserved == 0 and pool.stats()["pinned-released-bytes"] == 0
    pool.close()


def test_a_slab_pinned_while_the_pool_closes_goes_straight_back(wait_for: WaitFor) -> None:
    backend = Gated()
    pool = PinnedPool(backend, 256 * KiB, slab_size=16 * KiB)
    pool.ensure_free(64 * KiB)
    assert wait_for(lambda: "cudask-pinned" in backend.callers)  # pinning, held at the gate
    closing = threading.Thread(target=pool.close)
    closing.start()
    assert wait_for(lambda: pool.provisioner._closed)
    backend.gate.set()  # the slab is pinned after the pool closed
    closing.join(timeout=60)
    assert not closing.is_alive() and pool.slabs == 0
    assert backend.pinned == {} and backend.registered == {}
    thread = pool.provisioner._thread
    assert thread is not None and not thread.is_alive()
