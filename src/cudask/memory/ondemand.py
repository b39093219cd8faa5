"""Spill on demand: an allocator's out-of-memory turned into spilling and a retry.

Covers: `SpillOnDemand`, which wraps CuPy's allocator and puts an
`rmm.mr.FailureCallbackResourceAdaptor` over the current RMM resource, so that
when either runs out of device memory a store spills (its `spill_device`) and
the allocation is tried again, before the error reaches the task. Both stores
use it: the tiered store (`cudask.memory.store`) and the JIT-unspill store
(`cudask.memory.jit.proxy_store`), when `cudask.memory.spill-on-demand` is on.

Does not cover: what is spilled (the store's least recently used keys) or
PyTorch's allocator (its out-of-memory errors are not intercepted).

Threading: a spill on demand runs in the thread whose allocation failed; an
allocation made while that thread is spilling does not spill again.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

from dask.utils import format_bytes

logger = logging.getLogger("cudask.memory")


class SpillOnDemand:
    """Turn an out-of-memory of a device allocator into spilling and a retry.

    `spill(nbytes)` releases device memory and returns how many bytes it freed.
    `wrap_allocator` wraps an allocator function (CuPy's `malloc(nbytes)`);
    `rmm_callback` is a `rmm.mr.FailureCallbackResourceAdaptor` callback.
    `install()` hooks the allocators of the libraries already imported in this
    process (CuPy, RMM); `uninstall()` restores what was there, when it is still
    ours.
    """

    def __init__(self, spill: Callable[[int], int], attempts: int = 4) -> None:
        self._spill = spill
        self.attempts = attempts
        self._local = threading.local()
        self.count = 0
        self.freed = 0
        self._cupy: tuple[Any, Any, Any] | None = None
        self._rmm: tuple[Any, Any, Any] | None = None

    def spill(self, nbytes: int) -> int:
        """Spill at least `nbytes`; 0 when called from within a spill (an
        allocation made while spilling must not spill again)."""
        if getattr(self._local, "busy", False):
            return 0
        self._local.busy = True
        try:
            freed = int(self._spill(max(int(nbytes), 1)))
        except Exception:
            logger.exception("cudask: spilling on demand failed")
            freed = 0
        finally:
            self._local.busy = False
        if freed > 0:
            self.count += 1
            self.freed += freed
        logger.debug("cudask: spill on demand for %s released %s",
                     format_bytes(nbytes), format_bytes(max(freed, 0)))
        return freed

    def wrap_allocator(self, malloc: Callable[[int], Any],
                       oom: tuple[type[BaseException], ...]) -> Callable[[int], Any]:
        """`malloc` that, when it raises one of `oom`, spills and retries (asking
        for twice as much each attempt) before raising the first error."""

        def allocate(nbytes: int) -> Any:
            try:
                return malloc(nbytes)
            except oom as exc:
                first = exc
            want = nbytes
            for _ in range(self.attempts):
                if self.spill(want) <= 0:
                    break
                try:
                    return malloc(nbytes)
                except oom:
                    want *= 2
            first.add_note(f"cudask: spilling on demand could not free {nbytes} bytes")
            raise first

        allocate.__wrapped__ = malloc  # type: ignore[attr-defined]
        return allocate

    def rmm_callback(self, nbytes: int) -> bool:
        """Spill; True (retry the allocation) when something was released."""
        return self.spill(nbytes) > 0

    def install(self) -> None:
        """Hook CuPy's allocator and the current RMM resource, for libraries already
        imported (importing them here would be a cost, not a help)."""
        if self._cupy is None and "cupy" in sys.modules:
            import cupy

            current = cupy.cuda.get_allocator()
            wrapped = self.wrap_allocator(current, (cupy.cuda.memory.OutOfMemoryError,
                                                    MemoryError))
            cupy.cuda.set_allocator(wrapped)
            self._cupy = (cupy, current, wrapped)
        if self._rmm is None and "rmm" in sys.modules:
            import rmm

            upstream = rmm.mr.get_current_device_resource()
            adaptor = rmm.mr.FailureCallbackResourceAdaptor(upstream, self.rmm_callback)
            rmm.mr.set_current_device_resource(adaptor)
            self._rmm = (rmm, upstream, adaptor)

    def uninstall(self) -> None:
        if self._cupy is not None:
            cupy, previous, wrapped = self._cupy
            self._cupy = None
            try:
                if cupy.cuda.get_allocator() is wrapped:
                    cupy.cuda.set_allocator(previous)
            except Exception:
                logger.debug("cudask: could not restore CuPy's allocator", exc_info=True)
        if self._rmm is not None:
            rmm, upstream, adaptor = self._rmm
            self._rmm = None
            try:
                if rmm.mr.get_current_device_resource() is adaptor:
                    rmm.mr.set_current_device_resource(upstream)
            except Exception:
                logger.debug("cudask: could not restore the RMM resource", exc_info=True)

    @property
    def installed(self) -> list[str]:
        return [name for name, hook in (("cupy", self._cupy), ("rmm", self._rmm)) if hook]
