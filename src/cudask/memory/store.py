"""The tiered device -> host -> disk store used as every cudask worker's `data=`.

Covers: `TieredStore`, a MutableMapping[Key, object] composed of

- a device tier: an LRU-ordered dict of device objects whose size is the
  union of their allocations (`cudask.memory.accounting.AllocationLedger`, so
  views and aliases count once), bounded by `device_memory_limit`;
- host copies: device objects moved out of the device tier become `HostCopy`
  images (`cudask.memory.handlers`), filled by raw copies into a pinned pool
  (`cudask.memory.host.pool`) on a dedicated stream (`cudask.memory.backend`, `cudask.memory.host.transfer`);
- a host tier: `distributed.spill.SpillBuffer` (a zict.Buffer over
  zict.Func(pickle) over zict.File), holding host objects and host copies alike
  and spilling them to disk past `memory_limit` with distributed's
  compression, max-spill, disk-full and pickling-error handling. Without a
  `memory_limit` the host tier is a zict.LRU that never evicts.

Keys live in exactly one of the device tier and the host tier. Device objects
enter the device tier; everything else goes straight to the host tier.

Without a device limit nothing is spilled, and device objects take a dict's
path: no ledger, no generations, no background thread, lock-free reads;
`device_bytes` is then computed when asked. The first `spill_device` call (the
JIT-unspill store's spill on demand) switches the store to full accounting.

Speed: moving a key out of the device tier only enqueues its copy (no host
synchronisation); the device object is kept in an in-flight list until the copy
completes, and a read of the key meanwhile returns it without any copy. A
background thread spills least-recently-used keys once the device tier passes
`memory.spill-target` of its limit, so task threads rarely spill themselves
(they do when the tier passes the limit itself). Host -> device copies are
waited for before a value is handed out, outside the store's lock; `prefetch`
starts them early. A spilled object keeps counting in `device_bytes` while its
copy is in flight and, when still referenced elsewhere (by a running task,
say), until it dies; a read of it returns it without a copy. The device limit
is enforced on `committed_device_bytes`, which counts in-flight copies as
released (they complete within milliseconds), so spilling never waits for them.

With a device limit, an allocation that fails for want of device memory (CuPy's
allocator, the RMM resource) first spills least recently used keys and is
tried again (`cudask.memory.ondemand`, `memory.spill-on-demand`), so a task
that needs memory the store's idle keys hold runs instead of failing.

Pinned memory is made ready ahead of the spills, never on their path: once
the device tier passes `memory.pinned-headroom-from` of its limit (half by
default), the store asks the
pool (`cudask.memory.host.pool`) to keep free pinned memory ahead of use, ramping
up to `memory.pinned-headroom` as the tier reaches its limit; the pool's
thread faults memory in and registers it at memory speed. The first such
request creates the copy backend in a thread of its own, off the task's path.
Work that keeps the tier below that pins nothing. A spill that
finds no pinned range ready copies into memory faulted in for it, which the
pool registers later. With `memory.pinned-preallocate` (default off) that
much is pinned when the store starts. Slabs left wholly free for
`memory.pinned-release-after` (default 60 s) go back to the operating
system. The `cudask.memory.*` keys are parsed by `cudask.memory.settings`.

For the JIT-unspill store (`cudask.memory.jit.proxy_store`): `spill_device(n)`
evicts until n bytes are free and waits for the copies; `peek_host_copy(key)`
gives a spilled key's host copy without unspilling it.

Integration: implements `distributed.spill.ManualEvictProto` (`fast`,
`evict()` act on the host tier, since distributed's memory manager watches host
memory), exposes `spilled_total` and `cumulative_metrics` like SpillBuffer, and
`metrics()` for `Worker.metrics` (see `worker_metrics`).

Does not cover: proxies and JIT-unspill (issue 5 builds on this store), the
RMM pool, or the cluster that constructs the store.

Threading: every public method is thread-safe. One RLock (`lock`) guards the
routing, the device tier, the ledger and the in-flight list; device -> host
copies are enqueued under it (microseconds). Host -> device copies are waited
for with the lock released. Writes to the host tier may spill older host
values to disk under the lock, as SpillBuffer itself does; `evict()` (the
memory manager's path) goes to the host tier without the store lock, relying
on SpillBuffer's own locking. Reads of device keys without a device limit take
no lock (a dict read). The copy engine is created under its own lock, never
while holding it when taking the store lock.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections import defaultdict, deque
from collections.abc import Collection, Iterator, MutableMapping, Sized
from typing import TYPE_CHECKING, Any, Literal, cast

import zict
from dask.typing import Key
from dask.utils import format_bytes
from distributed.sizeof import safe_sizeof
from distributed.spill import ManualEvictProto, MaxSpillExceeded, SpillBuffer, SpilledSize

from cudask.errors import OptionError
from cudask.memory import handlers
from cudask.memory.accounting import AllocationLedger, union_bytes
from cudask.memory.backend import Copy, CopyBackend, default_backend, is_out_of_memory
from cudask.memory.handlers import AnyHostCopy, ContainerCopy, UnspillableError
from cudask.memory.host.pool import PinnedPool
from cudask.memory.host.transfer import TransferEngine
from cudask.memory.ondemand import SpillOnDemand
from cudask.memory.settings import store_settings

if TYPE_CHECKING:
    from distributed import Worker

logger = logging.getLogger("cudask.memory")
# log_spilling's lines go where distributed logs its own spilling: a worker process
# shows them at INFO, and Client.get_worker_logs() returns them ("cudask.memory" has
# no handler in a worker, so its INFO lines would be dropped).
moves = logging.getLogger("distributed.worker.memory")


class _InFlight:
    """A device object whose copy to the host is under way."""

    __slots__ = ("copy", "gen", "key", "nbytes", "ranges", "value")

    def __init__(
        self, key: Key, value: object, copy: AnyHostCopy, gen: int, ranges: list[tuple[int, int]]
    ) -> None:
        self.key = key
        self.value: object | None = value
        self.copy = copy
        self.gen = gen
        self.nbytes = copy.nbytes
        self.ranges = ranges  # device memory held until the copy completes


def _copies(copy: AnyHostCopy) -> list[Copy]:
    parts = copy.parts() if isinstance(copy, ContainerCopy) else [copy]
    return [c for p in parts for c in p.copies if isinstance(c, Copy)]


def _host_weight(key: Key, value: object) -> int:
    return safe_sizeof(value)


class TieredStore(MutableMapping[Key, object]):
    """Device -> host -> disk store; see the module docstring.

    Parameters
    ----------
    device_memory_limit:
        Bytes of the device tier; None: no limit (nothing is ever spilled from the
        device, and the store costs about what a dict does).
    memory_limit:
        Bytes of the host tier before values go to disk; None: no disk.
    log_spilling:
        Log every move between tiers at INFO on distributed's worker-memory logger
        ("distributed.worker.memory"), so they appear in the worker's log.
    max_spill:
        Bytes allowed on disk (False: no limit), as distributed's max-spill.
    worker_local_directory:
        Given by distributed; spilled files go to `<dir>/storage`.
    local_directory:
        Directory for spilled files when not run by a worker (default: a new
        temporary directory, removed by `close()`).
    backend:
        The CUDA boundary (`cudask.memory.backend.CopyBackend`); default: CuPy,
        created when the first copy is needed. Tests inject a fake one.
    pinned_pool_size, pinned_slab_size, pinned_preallocate, pinned_release_after,
    pinned_method, pinned_headroom, pinned_available_fraction, pinned_duty_cycle,
    pinned_headroom_from, populate_threads, spill_target, background, spill_on_demand:
        Override the `cudask.memory.*` config keys of the same names
        (`background` is `memory.background-spill`). Spill on demand acts only
        with a device limit.
    """

    # ManualEvictProto: distributed checks `fast` and `evict`; checked statically
    # below with `_: type[ManualEvictProto] = TieredStore`.

    def __init__(
        self,
        device_memory_limit: int | None = None,
        memory_limit: int | None = None,
        log_spilling: bool = False,
        max_spill: int | Literal[False] = False,
        worker_local_directory: str | None = None,
        *,
        local_directory: str | None = None,
        backend: CopyBackend | None = None,
        pinned_pool_size: float | str | None = None,
        pinned_slab_size: int | str | None = None,
        pinned_preallocate: bool | float | str | None = None,
        pinned_release_after: float | str | bool | None = None,
        pinned_method: str | None = None,
        pinned_headroom: int | str | None = None,
        pinned_available_fraction: float | None = None,
        pinned_duty_cycle: float | None = None,
        pinned_headroom_from: float | None = None,
        populate_threads: int | str | None = None,
        spill_target: float | None = None,
        background: bool | None = None,
        spill_on_demand: bool | None = None,
    ) -> None:
        self.device_memory_limit = _positive_or_none(device_memory_limit, "device_memory_limit")
        self.memory_limit = _positive_or_none(memory_limit, "memory_limit")
        self.log_spilling = bool(log_spilling)
        self.max_spill = max_spill if max_spill else False
        self.settings = store_settings(
            self.device_memory_limit, self.memory_limit,
            spill_target=spill_target, background=background,
            pinned_pool_size=pinned_pool_size, pinned_slab_size=pinned_slab_size,
            pinned_preallocate=pinned_preallocate, pinned_release_after=pinned_release_after,
            pinned_method=pinned_method, pinned_headroom=pinned_headroom,
            pinned_available_fraction=pinned_available_fraction,
            pinned_duty_cycle=pinned_duty_cycle, pinned_headroom_from=pinned_headroom_from,
            populate_threads=populate_threads, spill_on_demand=spill_on_demand,
        )
        self.spill_target = self.settings.spill_target  # read on every write
        self.background = self.settings.background

        self.lock = threading.RLock()
        self._cv = threading.Condition(self.lock)
        self._closed = False

        # -- the CUDA boundary (created lazily: no context until a copy is needed)
        self._backend = backend
        self._engine: TransferEngine | None = None
        self._engine_lock = threading.Lock()
        self._warming = False  # a thread is creating the engine ahead of spills
        self._provision_from = (
            self.settings.pinned_headroom_from * self.device_memory_limit
            if self.device_memory_limit is not None and self.settings.pinned_headroom
            else math.inf
        )
        # No device limit: nothing is ever spilled, so device values skip the
        # ledger, the generations and the background thread (a dict's cost).
        self._unlimited = self.device_memory_limit is None

        # -- tiers
        self._device: dict[Key, object] = {}  # LRU order: least recently used first
        self._ledger = AllocationLedger()
        self._spilled: set[Key] = set()  # keys of the host tier holding host copies
        self._gen: dict[Key, int] = {}
        self._next_gen = 0
        self._inflight: deque[_InFlight] = deque()
        self._inflight_by_key: dict[Key, _InFlight] = {}
        # spilled keys whose objects are alive elsewhere: (generation, weak refs to
        # the device leaves, weak ref to the whole value when it is a leaf)
        self._ghosts: dict[Key, tuple[int, list[weakref.ref[Any]], weakref.ref[Any] | None]] = {}
        self._dead_ghosts: deque[tuple[Key, int]] = deque()
        self._prefetched: dict[Key, tuple[object, list[Copy], int]] = {}
        self._host_used = False  # whether a host value was ever stored (unlimited path)
        self._unspillable: set[Key] = set()
        self._warned_over_limit = False
        self._warned_disk = False

        self._tmpdir: str | None = None
        self._host: MutableMapping[Key, object]
        if self.memory_limit is not None:
            directory = local_directory or worker_local_directory
            if directory is None:
                directory = self._tmpdir = tempfile.mkdtemp(prefix="cudask-spill-")
            else:
                directory = os.path.join(directory, "storage")
            self._host = SpillBuffer(directory, target=self.memory_limit, max_spill=self.max_spill)
            self._host.fast_to_slow_callbacks.append(self._log_host_to_disk)
            self._host.slow_to_fast_callbacks.append(self._log_disk_to_host)
        else:
            self._host = zict.LRU(math.inf, {}, weight=_host_weight)

        # -- statistics
        self._metrics: defaultdict[tuple[str, str], float] = defaultdict(float)
        self._thread: threading.Thread | None = None
        # Spill on demand, hooked at the first device object (after the worker's RMM
        # plugin has set its resource); a weak reference, so the hook never keeps the
        # store alive.
        self.on_demand = (
            SpillOnDemand(_weak_spill(weakref.ref(self)))
            if self.settings.spill_on_demand and self.device_memory_limit is not None else None
        )
        self._hooked = False
        self._finalizer = weakref.finalize(self, TieredStore._cleanup, self._tmpdir)
        if self.settings.pinned_preallocate:
            # Pin ahead of the first spill, without delaying the worker's start.
            self._start_warm_up()

    # ------------------------------------------------------------------ setup
    @property
    def engine(self) -> TransferEngine:
        """The transfer engine (creates the backend, e.g. CuPy, on first use)."""
        engine = self._engine
        if engine is None:
            engine = self._make_engine()
        return engine

    def _make_engine(self) -> TransferEngine:
        # Not under the store lock: the background warm-up creates the engine (and
        # imports CuPy) while task threads keep using the store.
        with self._engine_lock:
            if self._engine is None:
                backend = self._backend if self._backend is not None else default_backend()
                self._backend = backend
                settings = self.settings
                pool = PinnedPool(
                    backend, settings.pinned_pool_size, settings.pinned_slab_size,
                    release_after=settings.pinned_release_after, method=settings.pinned_method,
                    available_fraction=settings.pinned_available_fraction,
                    duty_cycle=settings.pinned_duty_cycle,
                    populate_threads=settings.populate_threads,
                )
                if not self._closed:
                    pool.start_background(settings.pinned_preallocate, headroom=settings.pinned_headroom)
                self._engine = TransferEngine(backend, pool)
            return self._engine

    def _start_warm_up(self) -> None:
        """Create the engine (and start its pool) in a thread of its own, once."""
        if self._warming or self._engine is not None:
            return
        self._warming = True
        threading.Thread(
            target=_warm_up, args=(weakref.ref(self),), name="cudask-pinned-start", daemon=True
        ).start()

    def _provide_ahead(self) -> None:
        """Have free pinned memory made ready for the spills the device tier is
        about to make: nothing below `pinned_headroom_from` of the limit, ramping
        up in proportion to the headroom at the limit (lock held; cheap, called
        on writes)."""
        assert self.device_memory_limit is not None  # else _provision_from is infinite
        headroom = self.settings.pinned_headroom
        past = (self._ledger.total - self._provision_from) / (self.device_memory_limit - self._provision_from)
        want = min(headroom, int(headroom * past))
        if want <= 0:
            return
        engine = self._engine
        if engine is None:
            self._start_warm_up()
        else:
            engine.pool.ensure_free(want)

    def _start_background(self) -> None:
        if self._thread is None and self.background and self.device_memory_limit is not None:
            self._thread = threading.Thread(
                target=_background_loop, args=(weakref.ref(self),),
                name="cudask-spill", daemon=True,
            )
            self._thread.start()

    # ------------------------------------------------------------------ mapping
    def __setitem__(self, key: Key, value: object) -> None:
        if self._unlimited and self._set_unlimited(key, value):
            return
        device = handlers.is_device_object(value)
        ranges = handlers.allocations(value) if device else None
        with self.lock:
            self._reap()
            self._discard(key)
            self._next_gen += 1
            self._gen[key] = self._next_gen
            if not device:
                self._host[key] = value
                return
            self._device[key] = value
            self._ledger.add(("d", key), ranges or ())
            if self.device_memory_limit is not None:
                self._start_background()
                if not self._hooked and self.on_demand is not None:
                    self._hooked = True
                    self.on_demand.install()
                if self._ledger.total > self._provision_from:
                    self._provide_ahead()
                if union_bytes(ranges or ()) > self.device_memory_limit:
                    # Larger than the whole tier: straight to host, sparing the rest.
                    self._evict_key(key)
                if self._ledger.total > self.device_memory_limit:
                    self._evict_until(self.device_memory_limit)
                if self._ledger.total > self.spill_target * self.device_memory_limit:
                    self._cv.notify_all()

    def _set_unlimited(self, key: Key, value: object) -> bool:
        """__setitem__ without a device limit: a dict write, plus moving the key
        between tiers when its kind changes. The new place is written before
        the old one is cleared, so lock-free readers always find the key.
        Return False (nothing done) when the store has left this path."""
        device = self._device
        if handlers.is_device_object(value):
            with self.lock:
                if not self._unlimited:
                    return False
                device[key] = value
                if self._host_used and key in self._host:
                    del self._host[key]
        else:
            with self.lock:
                if not self._unlimited:
                    return False
                self._host[key] = value
                self._host_used = True
                device.pop(key, None)
        return True

    def _leave_fast_path(self) -> None:
        """Start accounting device keys in the ledger (lock held): needed once
        something spills without a device limit (`spill_device`, on demand)."""
        if not self._unlimited:
            return
        for key, value in self._device.items():
            self._next_gen += 1
            self._gen[key] = self._next_gen
            self._ledger.add(("d", key), handlers.allocations(value))
        for key in self._host:
            self._next_gen += 1
            self._gen[key] = self._next_gen
        self._unlimited = False

    def __getitem__(self, key: Key) -> object:
        if self._unlimited:
            # No device limit: nothing moves, so no LRU order, no lock for device
            # values (a dict read is atomic).
            value = self._device.get(key, _MISSING)
            if value is not _MISSING:
                return value
        with self.lock:
            if self._unlimited:
                value = self._device.get(key, _MISSING)
                return self._host_read(key) if value is _MISSING else value
            self._reap()
            value = self._device.get(key, _MISSING)
            if value is not _MISSING:
                # least recently used first: move to the end
                del self._device[key]
                self._device[key] = value
                self._metrics["device-read", "count"] += 1
                return value
            if key not in self._spilled:
                return self._host_read(key)
            gen = self._gen[key]
            prefetched = self._prefetched.pop(key, None)
            if prefetched is not None:
                self._ledger.discard(("p", key))
                value, copies, _ = prefetched
            else:
                shortcut = self._alive_copy_source(key)
                if shortcut is not _MISSING:
                    self._install(key, shortcut, copied=0)
                    return shortcut
                host_copy = cast(AnyHostCopy, self._host_read(key))
                value, copies = self._start_unspill(key, host_copy)
        # Wait for the host -> device copies without holding the lock.
        started = time.perf_counter()
        for c in copies:
            c.wait()
        waited = time.perf_counter() - started
        with self.lock:
            nbytes = sum(c.nbytes for c in copies)
            self._metrics["host-to-device", "count"] += 1
            self._metrics["host-to-device", "bytes"] += nbytes
            self._metrics["host-to-device", "seconds"] += sum(
                self.engine.stream_seconds(c) for c in copies
            )
            self._metrics["host-to-device-wait", "seconds"] += waited
            if self._gen.get(key) == gen and key in self._spilled:
                self._install(key, value, copied=nbytes)
            elif key in self._device:
                return self._device[key]
        return value

    def _host_read(self, key: Key) -> object:
        """`key` from the host tier. Reading a key back from disk makes room for it
        by moving older keys to disk; when that fails (disk full, max-spill
        reached) zict has already put the key in host memory, and distributed's
        SpillBuffer lets the error out of the read: take the key from host memory
        and leave the failed move to a later eviction."""
        host = self._host
        try:
            return host[key]
        except (OSError, MaxSpillExceeded):
            if not isinstance(host, SpillBuffer) or key not in host.fast:
                raise
            if not self._warned_disk:
                self._warned_disk = True
                logger.warning("cudask: the disk tier is full (no space left, or max-spill "
                               "reached); keys read back from disk stay in host memory")
            return host.fast[key]

    def __delitem__(self, key: Key) -> None:
        with self.lock:
            if self._unlimited:
                if self._device.pop(key, _MISSING) is _MISSING:
                    del self._host[key]  # KeyError when absent
                return
            if key not in self._device and key not in self._host:
                raise KeyError(key)
            self._discard(key)
            self._reap()

    def __contains__(self, key: object) -> bool:
        if key in self._device:
            return True
        with self.lock:
            return key in self._device or key in self._host

    def __len__(self) -> int:
        with self.lock:
            return len(self._device) + len(self._host)

    def __iter__(self) -> Iterator[Key]:
        with self.lock:
            keys = list(self._device) + list(self._host)
        return iter(keys)

    def keys_on(self, tier: str) -> set[Key]:
        """Keys held on `tier`: "device", "host" (in host memory) or "disk"."""
        with self.lock:
            if tier == "device":
                return set(self._device)
            if isinstance(self._host, SpillBuffer):
                if tier == "host":
                    return set(self._host.fast)
                if tier == "disk":
                    return set(self._host.slow)
            elif tier == "host":
                return set(self._host)
            elif tier == "disk":
                return set()
        raise ValueError(f"tier={tier!r}; accepted: 'device', 'host', 'disk'")

    def where(self, key: Key) -> str:
        """The tier holding `key`: "device", "host" or "disk"."""
        with self.lock:
            if key in self._device:
                return "device"
            if isinstance(self._host, SpillBuffer) and key in self._host.slow:
                return "disk"
            if key in self._host:
                return "host"
        raise KeyError(key)

    def is_spilled_device_object(self, key: Key) -> bool:
        """Whether `key` holds a device object currently moved to host or disk."""
        return key in self._spilled

    # ------------------------------------------------------------------ internals
    def _discard(self, key: Key) -> None:
        """Forget `key` wherever it is (lock held)."""
        self._gen.pop(key, None)
        if self._device.pop(key, _MISSING) is not _MISSING:
            self._ledger.discard(("d", key))
        if key in self._host:
            del self._host[key]
        self._spilled.discard(key)
        if self._ghosts.pop(key, None) is not None:
            self._ledger.discard(("g", key))
        if self._prefetched.pop(key, None) is not None:
            self._ledger.discard(("p", key))
        self._inflight_by_key.pop(key, None)
        self._unspillable.discard(key)

    def _install(self, key: Key, value: object, *, copied: int) -> None:
        """Move a spilled key back into the device tier (lock held)."""
        del self._host[key]
        self._spilled.discard(key)
        self._inflight_by_key.pop(key, None)
        if self._ghosts.pop(key, None) is not None:
            self._ledger.discard(("g", key))
        self._device[key] = value
        self._ledger.add(("d", key), handlers.allocations(value))
        if self.log_spilling:
            how = f"copied {format_bytes(copied)}" if copied else "no copy: still in device memory"
            moves.info("cudask: unspilled %r host -> device (%s)", key, how)
        if self.device_memory_limit is not None:
            if self._ledger.total > self.device_memory_limit:
                self._evict_until(self.device_memory_limit, keep=key)
            if self._ledger.total > self.spill_target * self.device_memory_limit:
                self._cv.notify_all()

    def _alive_copy_source(self, key: Key) -> object:
        """The original device object of a spilled key, when it is still alive
        (copy in flight, or referenced elsewhere); else _MISSING."""
        inflight = self._inflight_by_key.get(key)
        if inflight is not None and inflight.value is not None:
            return inflight.value
        ghost = self._ghosts.get(key)
        if ghost is not None and ghost[2] is not None:
            obj = ghost[2]()
            if obj is not None:
                return obj
        return _MISSING

    def _start_unspill(self, key: Key, host_copy: AnyHostCopy) -> tuple[object, list[Copy]]:
        """Allocate device memory and enqueue the copies back (lock held)."""
        limit = self.device_memory_limit
        if limit is not None:
            self._evict_until(max(limit - host_copy.nbytes, 0))
        try:
            return handlers.to_device(host_copy, self.engine)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
        # Out of device memory: let in-flight copies finish (freeing their sources)
        # and retry once.
        self._drain()
        try:
            return handlers.to_device(host_copy, self.engine)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            raise MemoryError(
                f"cudask: cannot bring {key!r} ({format_bytes(host_copy.nbytes)}) back to the "
                f"device: out of device memory with {format_bytes(self._ledger.total)} held by "
                f"this store (device_memory_limit="
                f"{'None' if limit is None else format_bytes(limit)}). The key stays in host "
                "memory; lower device_memory_limit or free device memory held outside the store."
            ) from exc

    def _evictable(self, keep: Key | None = None) -> Key | None:
        for key in self._device:
            if key != keep and key not in self._unspillable:
                return key
        return None

    def _evict_until(self, target: float, keep: Key | None = None) -> None:
        """Spill least recently used keys until the device tier is at most `target`
        bytes or nothing more can be spilled (lock held)."""
        while self._ledger.total > target:
            key = self._evictable(keep)
            if key is None:
                if not self._warned_over_limit and self.device_memory_limit is not None:
                    self._warned_over_limit = True
                    logger.warning(
                        "cudask: the device tier holds %s, above its target of %s "
                        "(device_memory_limit=%s), and nothing more can be spilled: the rest "
                        "is referenced outside the store or cannot be copied.",
                        format_bytes(self._ledger.total), format_bytes(int(target)),
                        format_bytes(self.device_memory_limit),
                    )
                return
            if self._evict_key(key) < 0:
                return
        self._warned_over_limit = False

    def _evict_key(self, key: Key) -> int:
        """Move one key from the device tier to the host tier (lock held).
        Return the device bytes released from the tier's count, or -1."""
        value = self._device.pop(key)
        before = self._ledger.total
        ranges = self._ledger.ranges(("d", key))
        self._ledger.discard(("d", key))
        try:
            engine = self.engine
            engine.order_after_producers(handlers.producer_streams(value))
            host_copy = handlers.to_host(value, engine)
        except UnspillableError as exc:
            self._restore_device(key, value, ranges, front=False)
            self._unspillable.add(key)
            logger.warning("cudask: %r stays on the device: %s", key, exc)
            return 0
        except Exception as exc:  # noqa: BLE001 - keep the key, log, stop spilling
            self._restore_device(key, value, ranges, front=True)
            logger.error(
                "cudask: could not spill %r from the device (device_memory_limit=%s): %s. "
                "It stays on the device.",
                key, _fmt(self.device_memory_limit), exc,
            )
            return -1
        try:
            self._host[key] = host_copy
        except Exception as exc:  # noqa: BLE001 - keep the key, log, stop spilling
            self._restore_device(key, value, ranges, front=True)
            logger.error(
                "cudask: could not store the host copy of %r (memory_limit=%s): %s. "
                "It stays on the device.",
                key, _fmt(self.memory_limit), exc,
            )
            return -1
        self._spilled.add(key)
        inflight = _InFlight(key, value, host_copy, self._gen[key], ranges)
        self._inflight.append(inflight)
        self._inflight_by_key[key] = inflight
        nbytes = host_copy.nbytes
        self._metrics["device-to-host", "count"] += 1
        self._metrics["device-to-host", "bytes"] += nbytes
        if self.log_spilling:
            moves.info(
                "cudask: spilled %r device -> host (%s, %s)",
                key, format_bytes(nbytes), "pinned" if host_copy.pinned() else "pageable",
            )
        return before - self._ledger.total

    def _restore_device(
        self, key: Key, value: object, ranges: list[tuple[int, int]], *, front: bool
    ) -> None:
        if front:
            rest = self._device
            self._device = {key: value}
            self._device.update(rest)
        else:
            self._device[key] = value
        self._ledger.add(("d", key), ranges)

    def _reap(self, wait: bool = False) -> None:
        """Retire completed device -> host copies: drop our reference to their
        sources; a source still alive elsewhere keeps counting as a ghost
        (lock held)."""
        inflight = self._inflight
        while inflight:
            head = inflight[0]
            if wait:
                head.copy.wait()
            elif not head.copy.ready():
                break
            inflight.popleft()
            engine = self._engine
            if engine is not None:
                self._metrics["device-to-host", "seconds"] += sum(
                    engine.stream_seconds(c) for c in _copies(head.copy)
                )
            current = (
                self._inflight_by_key.get(head.key) is head
                and self._gen.get(head.key) == head.gen
                and head.key in self._spilled
            )
            if current:
                del self._inflight_by_key[head.key]
            if not current or head.value is None:
                head.value = None
                continue
            self._track_ghost(head)
        while self._dead_ghosts:
            key, gen = self._dead_ghosts.popleft()
            ghost = self._ghosts.get(key)
            if ghost is not None and ghost[0] == gen and all(r() is None for r in ghost[1]):
                del self._ghosts[key]
                self._ledger.discard(("g", key))

    def _track_ghost(self, head: _InFlight) -> None:
        """Drop the in-flight reference to a spilled object; if it is still alive
        elsewhere, keep counting its allocations until it dies."""
        key, gen = head.key, head.gen
        value, head.value = head.value, None
        ranges = handlers.allocations(value)
        callback = _ghost_callback(weakref.ref(self), key, gen)
        refs: list[weakref.ref[Any]] = []
        for leaf, _ in handlers.device_leaves(value):
            try:
                refs.append(weakref.ref(leaf, callback))
            except TypeError:
                return  # cannot tell whether it dies: assume it does
        # the value itself, when it is a leaf that can be handed out again as it is
        whole = refs[0] if len(refs) == 1 and refs[0]() is value else None
        del value, leaf
        if any(r() is not None for r in refs):
            self._ghosts[key] = (gen, refs, whole)
            self._ledger.add(("g", key), ranges)

    def _drain(self) -> None:
        self._reap(wait=True)

    # ------------------------------------------------------------------ prefetch
    def prefetch(self, keys: Collection[Key]) -> int:
        """Start copying spilled device keys among `keys` back to the device, as
        far as the device limit allows without spilling; return how many were
        started. A later read waits only for what is left of the copy."""
        started = 0
        with self.lock:
            self._reap()
            for key in keys:
                if key not in self._spilled or key in self._prefetched:
                    continue
                if self._alive_copy_source(key) is not _MISSING:
                    continue
                host_copy = cast(AnyHostCopy, self._host_read(key))
                limit = self.device_memory_limit
                if limit is not None and self._ledger.total + host_copy.nbytes > limit:
                    break
                try:
                    value, copies = handlers.to_device(host_copy, self.engine)
                except Exception as exc:  # noqa: BLE001 - prefetch is best effort
                    logger.debug("cudask: prefetch of %r skipped: %s", key, exc)
                    break
                self._prefetched[key] = (value, copies, self._gen[key])
                self._ledger.add(("p", key), handlers.allocations(value))
                started += 1
        return started

    # ------------------------------------------------------------------ background
    def _background_step(self) -> bool:
        """One step of background spilling; return whether there is more to do."""
        with self.lock:
            if self._closed:
                return False
            self._reap()
            limit = self.device_memory_limit
            if limit is None:
                return False
            target = self.spill_target * limit
            if self._ledger.total <= target:
                return False
            key = self._evictable()
            if key is None:
                return False
            self._evict_key(key)
            return self._ledger.total > target

    # ------------------------------------------------------------------ ManualEvictProto
    @property
    def fast(self) -> Sized | bool:
        """Host-memory values distributed's memory manager may push to disk."""
        host = self._host
        return host.fast if isinstance(host, SpillBuffer) else False

    def evict(self) -> int:
        """Move the least recently used host-memory value to disk; return its size
        or -1 (nothing to move, no disk tier, or the move failed: the value then
        stays in host memory). Also asks the pinned pool to give its free slabs
        back now (`PinnedPool.trim`). Never raises."""
        host = self._host
        engine = self._engine
        if engine is not None:
            # Process memory is high: free pinned slabs go back too, or the memory
            # moved to disk would stay resident in them.
            engine.pool.trim()
        if not isinstance(host, SpillBuffer) or not host.fast:
            return -1
        try:
            return host.evict()
        except Exception:
            logger.exception("cudask: eviction to disk failed")
            return -1

    @property
    def spilled_total(self) -> SpilledSize:
        """Bytes moved out of process memory to disk, as SpillBuffer reports."""
        host = self._host
        return host.spilled_total if isinstance(host, SpillBuffer) else SpilledSize(0, 0)

    @property
    def cumulative_metrics(self) -> defaultdict[tuple[str, str], float]:
        """(label, unit) -> cumulative value, unit in bytes/count/seconds: the host
        tier's disk metrics plus device-to-host, host-to-device and device-read.

        The seconds of device-to-host and host-to-device are the copies' time on
        their streams (bytes / seconds is the bus rate); host-to-device-wait is
        how long tasks waited for unspilled data."""
        out: defaultdict[tuple[str, str], float] = defaultdict(float)
        host = self._host
        if isinstance(host, SpillBuffer):
            out.update(host.cumulative_metrics)
        with self.lock:
            for k, v in self._metrics.items():
                out[k] += v
        return out

    # ------------------------------------------------------------------ metrics
    @property
    def device_bytes(self) -> int:
        """Device memory held by the store: the union of the allocations of device
        keys, prefetched keys, objects whose copy to the host is still in flight
        and spilled objects still alive elsewhere. (The device limit is enforced
        on the same union less the in-flight copies, which release their memory
        as soon as they complete: see `committed_device_bytes`.)"""
        with self.lock:
            self._reap()
            return self._held_bytes()

    @property
    def committed_device_bytes(self) -> int:
        """What the device limit is enforced on: `device_bytes` less the memory of
        copies to the host still in flight (counted as released when issued)."""
        with self.lock:
            if self._unlimited:
                return self._held_bytes()
            self._reap()
            return self._ledger.total

    def _held_bytes(self) -> int:
        """`device_bytes` (lock held)."""
        if self._unlimited:
            # no ledger on this path: computed on demand
            return union_bytes(r for v in self._device.values() for r in handlers.allocations(v))
        inflight = [r for i in self._inflight if i.value is not None for r in i.ranges]
        extra = self._ledger.uncovered_bytes(inflight) if inflight else 0
        return self._ledger.total + extra

    # ------------------------------------------------------------------ for proxies
    def spill_device(self, nbytes: int) -> int:
        """Move least recently used device keys to the host until `nbytes` of
        device memory are released (or nothing more can move), and wait for the
        copies, so the memory is really free when this returns; return the bytes
        released (possibly more than asked: in-flight copies also complete).
        The caller must not hold device objects of the keys it wants freed."""
        if nbytes <= 0:
            return 0
        with self.lock:
            self._leave_fast_path()
            self._reap()
            before = self._held_bytes()
            self._evict_until(max(self._ledger.total - nbytes, 0))
            self._drain()
            return max(before - self._held_bytes(), 0)

    def peek_host_copy(self, key: Key) -> AnyHostCopy | None:
        """The host copy of `key` when it is a device object moved to host or disk,
        without bringing it back to the device (read from disk into host memory
        if need be); None when `key` is on the device, a host value or absent.
        The copy may still be filling: call its `wait()` before reading blocks."""
        with self.lock:
            if key not in self._spilled:
                return None
            return cast(AnyHostCopy, self._host_read(key))

    def metrics(self) -> dict[str, float]:
        """Per-tier sizes, moves and pinned-pool state, for Worker.metrics."""
        with self.lock:
            self._reap()
            cm = self.cumulative_metrics
            host = self._host
            if isinstance(host, SpillBuffer):
                host_bytes = float(host.fast.total_weight)
                host_keys = len(host.fast)
                disk_keys = len(host.slow)
                disk_bytes = float(host.spilled_total.disk)
            else:
                lru = cast(zict.LRU[Key, object], host)
                host_bytes, host_keys, disk_keys, disk_bytes = float(lru.total_weight), len(lru), 0, 0.0
            out: dict[str, float] = {
                "device-bytes": float(self._held_bytes()),
                "device-committed-bytes": float(
                    self._held_bytes() if self._unlimited else self._ledger.total
                ),
                "device-keys": float(len(self._device)),
                "device-limit-bytes": float(self.device_memory_limit or 0),
                "device-inflight-bytes": float(sum(i.nbytes for i in self._inflight)),
                "device-ghost-keys": float(len(self._ghosts)),
                "host-bytes": host_bytes,
                "host-keys": float(host_keys),
                "host-device-copies": float(len(self._spilled)),
                "disk-bytes": disk_bytes,
                "disk-keys": float(disk_keys),
            }
            for label, name in (
                ("device-to-host", "spill-device-to-host"),
                ("host-to-device", "unspill-host-to-device"),
                ("disk-write", "spill-host-to-disk"),
                ("disk-read", "unspill-disk-to-host"),
            ):
                for unit in ("count", "bytes", "seconds"):
                    out[f"{name}-{unit}"] = float(cm.get((label, unit), 0.0))
            out["unspill-host-to-device-wait-seconds"] = float(cm.get(("host-to-device-wait", "seconds"), 0.0))
            if self.on_demand is not None:
                out["spill-on-demand-count"] = float(self.on_demand.count)
                out["spill-on-demand-bytes"] = float(self.on_demand.freed)
            engine = self._engine
            if engine is not None:
                out.update(engine.pool.stats())
            return out

    # ------------------------------------------------------------------ logging
    def _log_host_to_disk(self, key: Key, value: object) -> None:
        if self.log_spilling:
            moves.info("cudask: spilled %r host -> disk", key)

    def _log_disk_to_host(self, key: Key, value: object) -> None:
        if self.log_spilling:
            moves.info("cudask: unspilled %r disk -> host", key)

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Stop background spilling, wait for copies, drop every key and give the
        pinned memory back."""
        with self.lock:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
            if self.on_demand is not None:
                self.on_demand.uninstall()
            self._drain()
            for key in list(self._device) + list(self._host):
                self._discard(key)
            self._ledger = AllocationLedger()
            host = self._host
            if isinstance(host, SpillBuffer):
                host.close()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        with self._engine_lock:  # a warm-up creating the engine sees _closed
            engine = self._engine
        if engine is not None:
            import gc

            gc.collect()  # host copies kept by reference cycles release their blocks
            engine.pool.close()
        self._finalizer()

    @staticmethod
    def _cleanup(tmpdir: str | None) -> None:
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)

    def __repr__(self) -> str:
        return (
            f"<TieredStore: {len(self._device)} on device "
            f"({format_bytes(self._ledger.total)}/{_fmt(self.device_memory_limit)}), "
            f"{len(self._host)} on host/disk>"
        )


_MISSING: Any = object()

def _warm_up(store_ref: weakref.ref[TieredStore]) -> None:
    """Create the copy engine and start its pinned pool (the start goal, then
    the headroom the device tier asks for), off the task's path. Failures
    only log: the first spill retries."""
    store = store_ref()
    if store is None or store._closed:
        return
    try:
        store._make_engine()
    except Exception as exc:  # noqa: BLE001 - e.g. no CuPy / no GPU: spills will say
        logger.debug("cudask: pinned memory not prepared ahead: %s", exc)
    else:
        with store.lock:
            if store._ledger.total > store._provision_from and not store._closed:
                store._provide_ahead()
    del store


def _weak_spill(store_ref: weakref.ref[TieredStore]) -> Any:
    def spill(nbytes: int) -> int:
        store = store_ref()
        return 0 if store is None or store._closed else store.spill_device(nbytes)

    return spill


def _ghost_callback(store_ref: weakref.ref[TieredStore], key: Key, gen: int) -> Any:
    def callback(_: weakref.ref[Any]) -> None:
        store = store_ref()
        if store is not None:
            store._dead_ghosts.append((key, gen))  # deque.append is atomic

    return callback


def _background_loop(store_ref: weakref.ref[TieredStore]) -> None:
    """Spill in the background while the device tier is above its target."""
    while True:
        store = store_ref()
        if store is None or store._closed:
            return
        if not store._background_step():
            with store._cv:
                if store._closed:
                    return
                store._cv.wait(timeout=0.005 if store._inflight else 0.25)
                store._reap()
        del store


def _positive_or_none(value: int | None, name: str) -> int | None:
    if value is None or value is False:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise OptionError(f"{name}={value!r}: give a number of bytes (int >= 0) or None")
    return value or None


def _fmt(nbytes: int | None) -> str:
    return "None" if nbytes is None else format_bytes(nbytes)


def worker_metrics(worker: Worker) -> dict[str, float]:
    """`Worker.metrics` callable: the metrics of the worker's data store when it has
    them (TieredStore, ProxyStore), else {} (a plain dict)."""
    metrics = getattr(worker.data, "metrics", None)
    return dict(metrics()) if callable(metrics) else {}


# Static check that TieredStore implements distributed's public protocol.
_manual_evict: type[ManualEvictProto] = TieredStore

__all__ = ["TieredStore", "worker_metrics"]
