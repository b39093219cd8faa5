"""Pinning ahead waits for this process's device traffic to pause (memory.host.traffic),
within a bound; a fake backend stands in for CUDA."""

from __future__ import annotations

import threading

import pytest

from cudask.memory.host import traffic
from cudask.memory.host.pool import PinnedPool
from cudask.testing import wait_for
from cudask.testing.fake_cuda import FakeCopyBackend

KiB = 1024


def test_quiet_only_once_no_transfer_has_run_for_a_while() -> None:
    with traffic.moving(), traffic.moving():
        assert not traffic.quiet(0)
    assert not traffic.quiet(3600)  # one just ended
    assert wait_for(lambda: traffic.quiet(0.05), timeout=60)


def test_no_wait_is_counted_when_quiet() -> None:
    assert wait_for(traffic.quiet, timeout=60)
    pool = PinnedPool(FakeCopyBackend(), 64 * KiB, slab_size=16 * KiB)
    pool.ensure_free(32 * KiB)
    assert pool.provisioner.wait_ready(timeout=60)
    assert pool.provisioner.counters.deferred_seconds == 0.0  # nothing moved: no wait counted
    pool.close()


def test_a_slab_waits_for_the_traffic_to_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(traffic, "MOST_DEFERRED_SECONDS", 600.0)
    pool = PinnedPool(FakeCopyBackend(), 64 * KiB, slab_size=16 * KiB)
    pause = threading.Event()

    def transfer() -> None:
        with traffic.moving():
            pause.wait(60)

    mover = threading.Thread(target=transfer)
    mover.start()
    try:
        pool.ensure_free(16 * KiB)
        assert wait_for(
            lambda: pool.provisioner._thread is not None and not traffic.quiet(0), timeout=60
        )
        assert pool.reserved == 0  # nothing pinned while the transfer runs
    finally:
        pause.set()
        mover.join()
    assert pool.provisioner.wait_ready(timeout=60)
    assert pool.reserved >= 16 * KiB  # pinned after the pause
    assert 0 < pool.stats()["pinned-deferred-seconds"] < 60
    pool.close()


def test_continuous_traffic_defers_a_slab_only_so_long(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(traffic, "MOST_DEFERRED_SECONDS", 0.3)
    pool = PinnedPool(FakeCopyBackend(), 64 * KiB, slab_size=16 * KiB)
    with traffic.moving():  # never pauses while the slab is asked for
        pool.ensure_free(16 * KiB)
        assert pool.provisioner.wait_ready(timeout=60) and pool.reserved >= 16 * KiB
    assert pool.provisioner.counters.deferred_seconds >= 0.3
    pool.close()
