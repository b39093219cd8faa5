"""The store's copy engine, created when first needed, and pinned memory made ready ahead.

Covers: `LazyEngine`, which creates the `TransferEngine` (the copy backend,
CuPy by default, and its `PinnedPool`) on first use, so a store that never
spills creates no CUDA context; warms it up in a thread of its own
(`start_warm_up`: at the start with `pinned-preallocate`, else once the device
tier nears its limit), off the task's path; and ramps up the pinned memory
kept free ahead of spills (`provide_ahead`): nothing below half the device
limit (`settings.HEADROOM_FROM`), up to the headroom at it.

Does not cover: the copies (`cudask.memory.host.copy_engine`), the pool's slabs
(`cudask.memory.host.pool`) and thread (`cudask.memory.host.provision`), when the device tier spills
(`cudask.memory.store`).

Threading: `get()` may be called from any thread; the engine is created under
this part's own lock, never while holding it when taking the store's lock.
`provide_ahead` is called with the store's lock held; the warm-up thread takes
that lock (given at construction) only after the engine exists.
"""

from __future__ import annotations

import gc
import logging
import math
import threading
import weakref
from collections.abc import Callable

from cudask.memory.backend import CopyBackend, default_backend
from cudask.memory.host.copy_engine import TransferEngine
from cudask.memory.host.pool import PinnedPool
from cudask.memory.settings import StoreSettings

logger = logging.getLogger("cudask.memory")


class LazyEngine:
    """A `TransferEngine` made on first use, with pinned memory made ready ahead.

    `lock` is the store's lock and `used()` the device bytes its tier holds
    (read under that lock), for the ramp once the warm-up has made the engine.
    """

    def __init__(
        self,
        settings: StoreSettings,
        device_memory_limit: int | None,
        backend: CopyBackend | None,
        lock: threading.RLock,
        used: Callable[[], int],
    ) -> None:
        self.settings = settings
        self.limit = device_memory_limit
        self.backend = backend
        self.current: TransferEngine | None = None
        self.closed = False  # set by the store, under its lock
        self._lock = threading.Lock()
        self._warming = False  # a thread is creating the engine ahead of spills
        self._store_lock = lock
        self._used = used
        self._idle_cap: int | None = None  # free pinned memory allowed (`limit_idle`)
        self.provision_from = (
            settings.pinned_headroom_from * device_memory_limit
            if device_memory_limit is not None and settings.pinned_headroom
            else math.inf
        )

    def get(self) -> TransferEngine:
        """The transfer engine (creates the backend, e.g. CuPy, on first use)."""
        engine = self.current
        if engine is None:
            engine = self._make()
        return engine

    def _make(self) -> TransferEngine:
        # Not under the store lock: the background warm-up creates the engine (and
        # imports CuPy) while task threads keep using the store.
        with self._lock:
            if self.current is None:
                backend = self.backend if self.backend is not None else default_backend()
                self.backend = backend
                settings = self.settings
                pool = PinnedPool(
                    backend,
                    settings.pinned_pool_size,
                    slab_size=settings.pinned_slab_size,
                    release_after=settings.pinned_release_after,
                )
                if self._idle_cap is not None:
                    pool.limit_idle(self._idle_cap)
                if not self.closed:
                    pool.start_background(
                        settings.pinned_preallocate, headroom=settings.pinned_headroom
                    )
                self.current = TransferEngine(backend, pool)
            return self.current

    def start_warm_up(self) -> None:
        """Create the engine (and start its pool) in a thread of its own, once."""
        if self._warming or self.current is not None:
            return
        self._warming = True
        threading.Thread(
            target=_warm_up, args=(weakref.ref(self),), name="cudask-pinned-start", daemon=True
        ).start()

    def provide_ahead(self, used: int) -> None:
        """Have free pinned memory made ready for the spills the device tier is
        about to make, `used` bytes being held: nothing below `provision_from`,
        ramping up in proportion to the headroom at the limit (store lock held;
        cheap, called on writes)."""
        assert self.limit is not None  # else provision_from is infinite
        headroom = self.settings.pinned_headroom
        past = (used - self.provision_from) / (self.limit - self.provision_from)
        want = min(headroom, int(headroom * past))
        if want <= 0:
            return
        engine = self.current
        if engine is None:
            self.start_warm_up()
        else:
            engine.pool.ensure_free(want)

    def limit_idle(self, nbytes: int) -> None:
        """Hold the pool's free pinned memory to `nbytes` (`PinnedPool.limit_idle`),
        from when the engine is made if it does not exist yet."""
        self._idle_cap = nbytes
        engine = self.current
        if engine is not None:
            engine.pool.limit_idle(nbytes)

    def trim(self) -> None:
        """Give the pool's free slabs back now (process memory is high)."""
        engine = self.current
        if engine is not None:
            # Process memory is high: free pinned slabs go back too, or the memory
            # moved to disk would stay resident in them.
            engine.pool.trim()

    def close(self) -> None:
        """Give the pinned memory back (after the store dropped its keys)."""
        with self._lock:  # a warm-up creating the engine sees `closed`
            engine = self.current
        if engine is not None:
            gc.collect()  # host copies kept by reference cycles release their blocks
            engine.pool.close()


def _warm_up(ref: weakref.ref[LazyEngine]) -> None:
    """Create the copy engine and start its pinned pool (the start goal, then
    the headroom the device tier asks for), off the task's path. Failures
    only log: the first spill retries."""
    lazy = ref()
    if lazy is None or lazy.closed:
        return
    try:
        lazy._make()
    except Exception as exc:  # noqa: BLE001 - e.g. no CuPy / no GPU: spills will say
        logger.debug("cudask: pinned memory not prepared ahead: %s", exc)
    else:
        with lazy._store_lock:
            used = lazy._used()
            if used > lazy.provision_from and not lazy.closed:
                lazy.provide_ahead(used)
    del lazy


__all__ = ["LazyEngine"]
