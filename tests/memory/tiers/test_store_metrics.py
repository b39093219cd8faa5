"""The store's metrics and move log: per-tier sizes and moves for Worker.metrics,
copy seconds that are the copies' own, every move logged where a worker shows it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from cudask.memory.store import TieredStore, worker_metrics
from cudask.testing.fake_cuda import FakeCopyBackend, filled

MakeStore = Callable[..., TieredStore]


dev = filled  # a fake device array of n elements, each `fill`


def test_log_spilling_logs_each_move(make_store: MakeStore, caplog: Any) -> None:
    store = make_store(device_memory_limit=100, memory_limit=150, log_spilling=True)
    moves = logging.getLogger("distributed.worker.memory")
    moves.addHandler(caplog.handler)  # distributed's loggers do not propagate to the root
    try:
        with caplog.at_level(logging.INFO, logger=moves.name):
            store["a"] = dev(100, 1)
            store["b"] = dev(100, 2)
            store["c"] = dev(100, 3)
            store["a"]
    finally:
        moves.removeHandler(caplog.handler)
    text = caplog.text
    assert "spilled 'a' device -> host" in text
    assert "host -> disk" in text and "disk -> host" in text
    assert "unspilled 'a' host -> device" in text


def test_spill_log_reaches_a_worker_log() -> None:
    """Workers configure distributed's loggers only: the moves must go to one of
    those at a level it shows, or log_spilling would print nothing."""
    import distributed  # noqa: F401 - sets up distributed's logging

    from cudask.memory.tiers.metrics import moves

    assert moves.name.startswith("distributed.")
    assert moves.isEnabledFor(logging.INFO)


def test_metrics_and_worker_metrics(make_store: MakeStore) -> None:
    store = make_store(device_memory_limit=100, memory_limit=1000)
    store["a"] = dev(100, 1)
    store["b"] = dev(100, 2)
    store["h"] = b"x" * 10
    m = store.metrics()
    assert m["device-bytes"] == 100 and m["device-keys"] == 1
    assert m["host-device-copies"] == 1 and m["host-keys"] == 2
    assert m["spill-device-to-host-count"] == 1 and m["spill-device-to-host-bytes"] == 100
    # the spill found pinned memory made ready ahead of it, or memory faulted in for it
    assert m["pinned-in-use-bytes"] + m["pageable-fallback-bytes"] >= 100
    assert m["pinned-provision-gbps"] >= 0 and "pageable-registered-bytes" in m
    assert all(isinstance(v, float) for v in m.values())
    assert worker_metrics(SimpleNamespace(data=store)) == store.metrics()  # type: ignore[arg-type]
    assert worker_metrics(SimpleNamespace(data={})) == {}  # type: ignore[arg-type]


def test_copy_seconds_are_the_copies_own_not_their_time_in_flight(make_store: MakeStore) -> None:
    # Copies queued for 300 s (of the fake streams' clock) and then run at once
    # took no time on their stream: the seconds give the bus time, so bytes /
    # seconds is a rate.
    now = [0.0]
    backend = FakeCopyBackend(lag=10_000, clock=lambda: now[0])
    store = make_store(device_memory_limit=100, backend=backend)
    for i in range(4):
        store[i] = dev(100, i)
    assert backend.in_flight() > 0
    now[0] = 300.0
    backend.drain()
    value = store[0]  # unspilled, its copy waited for
    assert (value.get() == 0).all()
    m = store.metrics()
    assert m["spill-device-to-host-count"] >= 3
    assert m["spill-device-to-host-seconds"] == 0.0
    assert 0 <= m["unspill-host-to-device-seconds"] <= m["unspill-host-to-device-wait-seconds"]
