"""Copies in flight and ghosts through the store: a spilled object keeps counting
while its copy is under way and while it is referenced elsewhere, and a read
meanwhile returns it without a copy."""

from __future__ import annotations

from collections.abc import Callable

from cudask.memory.store import TieredStore
from cudask.testing.fake_cuda import FakeCopyBackend, filled

MakeStore = Callable[..., TieredStore]


dev = filled  # a fake device array of n elements, each `fill`


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


def test_in_flight_copies_alone() -> None:
    """The part on its own: a source stays readable until its copy is reaped;
    reaped while referenced elsewhere it becomes a ghost counted in the ledger,
    and it is uncounted once it dies."""
    import gc

    from cudask.memory import handlers
    from cudask.memory.accounting import AllocationLedger
    from cudask.memory.tiers.inflight import InFlightCopies

    class Copy:
        nbytes = 100
        done = False

        def ready(self) -> bool:
            return self.done

        def wait(self) -> None:
            self.done = True

    ledger = AllocationLedger()
    inflight = InFlightCopies(ledger)
    value = dev(100, 1)
    copy = Copy()
    inflight.add("k", value, [copy], 100, 1, handlers.allocations(value))  # type: ignore[list-item]
    assert inflight and inflight.nbytes == 100 and inflight.source("k") is value
    assert inflight.uncovered_bytes() == 100  # held by the copy, not in the ledger

    retired: list[object] = []
    inflight.reap(lambda key, gen: True, retired.append)
    assert inflight and not retired  # not done yet
    copy.done = True
    inflight.reap(lambda key, gen: True, retired.append)
    assert not inflight and retired == [[copy]]
    assert "k" in inflight.ghosts and ledger.total == 100 and inflight.source("k") is value
    del value
    gc.collect()
    inflight.reap(lambda key, gen: True, retired.append)
    assert not inflight.ghosts and ledger.total == 0 and inflight.source("k") is None
