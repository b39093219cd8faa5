"""The process's device allocators as spill on demand hooks them: CuPy's and RMM's.

Covers: `CupyHook`, CuPy's current allocator replaced by a wrapper, with a
reader of what CuPy's default memory pool reserves (`total_bytes`: its cached
free blocks included) and a way to give those cached blocks back, when that
pool is the allocator; `RmmHook`, the current RMM resource under a
`FailureCallbackResourceAdaptor`, then a byte counter (a `LimitingResourceAdaptor`
whose limit is never reached: an atomic counter read as one integer), then a
`BinningMemoryResource` sending allocations above `GATE_MIN_BYTES` through a
Python gate (a `CallbackMemoryResource`) and smaller ones straight to the
counter; `current_task`, the key of the task
running in the calling thread. Each hook restores what was there on `remove`,
when it is still ours. Why this shape, and its cost per allocation:
docs/design/store.md ("Holding the device limit").

Does not cover: when to spill or how much (`cudask.memory.ondemand`), PyTorch's
and Numba's own allocators (not hooked), the RMM resource the worker builds
(`cudask.worker.rmm`).

Threading: hooks are installed and removed by one thread; the wrapped
allocators, the gate and the readers run in any thread. The gate of RMM runs
with the GIL, taken by RMM for each allocation above `GATE_MIN_BYTES`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from dask.typing import Key

logger = logging.getLogger("cudask.memory")

# RMM allocations up to this size skip the Python gate (they are still counted).
GATE_MIN_BYTES = 1 << 20
# The counter's "limit": never reached, so the adaptor only counts.
_NO_LIMIT = 1 << 62

Allocator = Callable[[int], Any]


class CupyHook:
    """CuPy's allocator replaced by `wrap(current allocator, reserved, release)`.

    `reserved`, `cached` and `release` are given when CuPy allocates from a
    memory pool of its own (`cupy.get_default_memory_pool().malloc`, or the
    `malloc` of another `cupy.cuda.MemoryPool`): the pool's total bytes, its
    cached free bytes, and `free_all_blocks`; None for any other allocator
    (RMM's, say, whose memory the RMM hook counts).
    """

    def __init__(self, wrap: Callable[[Allocator, Callable[[], int] | None], Allocator]) -> None:
        import cupy

        self._cupy = cupy
        self.previous = cupy.cuda.get_allocator()
        pool: Any = getattr(self.previous, "__self__", None)
        # CuPy's default pool, or another CuPy memory pool (cudask.comm.leases')
        own = pool is not None and (
            pool is cupy.get_default_memory_pool()
            or isinstance(pool, getattr(cupy.cuda, "MemoryPool", ()))
        )
        self.reserved: Callable[[], int] | None = pool.total_bytes if own else None
        self.cached: Callable[[], int] | None = pool.free_bytes if own else None
        self.release: Callable[[], None] | None = pool.free_all_blocks if own else None
        self.wrapped = wrap(self.previous, self.reserved)
        cupy.cuda.set_allocator(self.wrapped)

    def remove(self) -> None:
        try:
            if self._cupy.cuda.get_allocator() is self.wrapped:
                self._cupy.cuda.set_allocator(self.previous)
        except Exception:
            logger.debug("cudask: could not restore CuPy's allocator", exc_info=True)


class RmmHook:
    """The current RMM resource under a failure callback, a counter and a gate.

    `on_failure(nbytes)` is called when the resource refuses an allocation and
    returns whether to try again; `gate(nbytes)` (None: no gate, no counter) is
    called before each allocation above `GATE_MIN_BYTES`. From the bottom: the
    worker's resource, the failure callback (it catches the resource's own
    out-of-memory, in C++), the counter, then the binning of allocations between
    the counter (small ones) and the Python gate in front of it (large ones).
    """

    def __init__(
        self, gate: Callable[[int], None] | None, on_failure: Callable[[int], bool]
    ) -> None:
        import rmm

        self._rmm = rmm
        self.upstream = rmm.mr.get_current_device_resource()
        self.counter: Any = None
        top = rmm.mr.FailureCallbackResourceAdaptor(self.upstream, on_failure)
        if gate is not None:
            counter = self.counter = rmm.mr.LimitingResourceAdaptor(top, _NO_LIMIT)

            def allocate(nbytes: int, stream: Any) -> int:
                gate(nbytes)
                return int(counter.allocate(nbytes, stream))

            def deallocate(ptr: int, nbytes: int, stream: Any) -> None:
                counter.deallocate(ptr, nbytes, stream)

            top = rmm.mr.BinningMemoryResource(rmm.mr.CallbackMemoryResource(allocate, deallocate))
            top.add_bin(GATE_MIN_BYTES, counter)
        self.adaptor = top
        rmm.mr.set_current_device_resource(top)

    def reserved(self) -> int:
        """Bytes allocated through the hooked resource (0 without a counter)."""
        counter = self.counter
        return 0 if counter is None else int(counter.get_allocated_bytes())

    def remove(self) -> None:
        try:
            if self._rmm.mr.get_current_device_resource() is self.adaptor:
                self._rmm.mr.set_current_device_resource(self.upstream)
        except Exception:
            logger.debug("cudask: could not restore the RMM resource", exc_info=True)


def current_task() -> Key | None:
    """The key of the task running in the calling thread of a worker; None
    elsewhere (another thread, or no worker)."""
    try:
        from distributed import get_worker

        return get_worker().get_current_task()
    except Exception:  # noqa: BLE001 - not in a task of a worker
        return None


__all__ = ["GATE_MIN_BYTES", "CupyHook", "RmmHook", "current_task"]
