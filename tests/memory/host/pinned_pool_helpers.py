"""Shared by the PinnedPool and Provisioner tests (test_pinned_pool.py,
test_provisioner*.py): sizes, the fixtures' types, a skip where there are no Linux
mappings, a backend whose pinning waits for a gate, a pool made ready, and whether
the provisioner's thread sleeps until woken."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

import pytest

from cudask.memory.host import faulting
from cudask.memory.host.pool import PinnedPool
from cudask.testing.fake_cuda import FakeCopyBackend

WaitFor = Callable[..., bool]

InThreads = Callable[[Callable[[int], None], int], list[BaseException]]

KiB = 1024
MiB = 1 << 20
needs_mappings = pytest.mark.skipif(not faulting.available(), reason="needs Linux mappings")


class Gated(FakeCopyBackend):
    """Registration (and allocation) wait for `gate`; `callers`: the threads that pinned."""

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


def waits_until_woken(pool: PinnedPool) -> bool:
    """Whether the provisioner's thread waits, with no timer, for a caller to wake it:
    it found nothing to pin, register or give back, now or later. Read under the
    pool's lock: a notify takes the thread off the condition's waiters at once,
    so such a wait seen after an action is one that took the action into account."""
    thread = pool.provisioner._thread
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
    pool = PinnedPool(backend, capacity, slab_size=slab, **kwargs)  # type: ignore[arg-type]
    pool.provisioner.preallocate()
    return pool
