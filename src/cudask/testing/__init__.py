"""Public test helpers for cudask and the projects built on it.

- FakeBackend / fake_gpu: describe any machine to discovery (cudask.devices).
- real_gpu_count(): how many GPUs NVML really sees (0 without NVML); the
  pytest markers `gpu` and `multigpu` skip on it.
- wait_for(condition, timeout): poll until background work (a heartbeat, a
  pool's thread) has made `condition()` true, with a generous bound.
- workers_info(client): every worker's entry in the scheduler's identity,
  fetched now (`Client.scheduler_info()` hands back a cache that the client's
  periodic refresh may replace, at any moment, with one listing no workers).
Fake device objects for the store live in cudask.testing.fake_cuda; a Worker
subclass for `worker_class` checks in cudask.testing.workers, and a preload
for `--preload` checks in cudask.testing.preload. Does not cover: test fixtures
(tests/conftest.py); runtime code never imports this package. Threading: the helpers
keep no state; `wait_for` polls from the caller's thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cudask.testing.devices import FakeBackend, fake_gpu


def real_gpu_count() -> int:
    """GPUs that NVML reports on this machine; 0 with no NVML library or driver."""
    from cudask.devices import discover

    return len(discover().gpus)


__all__ = [
    "FakeBackend",
    "cpu_affinity",
    "current_gpu_uuid",
    "fake_gpu",
    "real_gpu_count",
    "wait_for",
    "workers_info",
]


def wait_for(condition: Callable[[], bool], timeout: float = 60.0, interval: float = 0.05) -> bool:
    """Poll `condition()` until it holds or `timeout` seconds pass; return its last
    value. For tests waiting on threads or heartbeats on a busy machine."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


def current_gpu_uuid() -> str:
    """UUID of CUDA device 0 of the calling process: run it on a worker to check
    which GPU the worker really uses."""
    from cudask.worker.context import device0_uuid

    return device0_uuid()


def cpu_affinity() -> list[int]:
    """The CPUs the calling process may run on (run it on a worker)."""
    import os

    return sorted(os.sched_getaffinity(0))


def workers_info(client: Any) -> dict[str, dict[str, Any]]:
    """{address: the scheduler's information on that worker} for every worker,
    asked of the scheduler now (synchronous clients)."""
    return dict(client.sync(client.scheduler.identity, n_workers=-1)["workers"])
