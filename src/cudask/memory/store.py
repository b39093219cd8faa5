"""The tiered device -> host -> disk store used as every cudask worker's `data=`.

Covers: `TieredStore`, the thread-safe MutableMapping[Key, object] a worker
holds its data in, built from the parts in `cudask.memory.tiers`: device objects
go to a device tier limited to `device_memory_limit`, everything else to a host
tier (distributed's SpillBuffer, over disk past `memory_limit`); least recently
used device keys are copied to the host past the limit (in a background thread
past `spill-target`) and back when read, keeping their host copy (`tiers.buffer`,
`tiers.clean`); keys holding the same device object, or `Linked`, share one entry
(`tiers.names`). Without a device limit nothing spills by the limit, but device
keys are still accounted, so JIT-unspill's spilling on demand can move them (a
worker without a limit gets `cudask.memory.unlimited` instead). It
spills on an allocator's out-of-memory (`cudask.memory.ondemand`), implements
distributed's `ManualEvictProto` (checked statically at the end) and reports
`metrics()` (`worker_metrics` for `Worker.metrics`). Settings: a
`cudask.memory.settings.StoreSettings`. How and why: docs/design/store.md.

Does not cover: proxies and JIT-unspill (`cudask.memory.jit.proxy_store` wraps
this store), the RMM pool, or the cluster that constructs the store.

Threading: every public method is thread-safe. One RLock (`lock`) guards every
tier; device -> host copies are enqueued under it, host -> device copies are
waited for without it. `evict()` takes it only when free, to drop a kept host
copy; the host tier's SpillBuffer locks itself. Spilling for an allocation waits for the lock a
bounded time (cudask.memory.ondemand), then lets the allocation go ahead.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Collection, Iterator, MutableMapping, Sized
from typing import TYPE_CHECKING, Literal, cast

from dask.typing import Key
from dask.utils import format_bytes
from distributed.spill import ManualEvictProto, SpilledSize

from cudask.memory import handlers
from cudask.memory.accounting import AllocationLedger
from cudask.memory.backend import CopyBackend
from cudask.memory.host.copy_engine import TransferEngine
from cudask.memory.ondemand import SpillOnDemand
from cudask.memory.settings import StoreSettings, store_limit, store_settings
from cudask.memory.tiers import background
from cudask.memory.tiers.buffer import DeviceBuffer, Unspill
from cudask.memory.tiers.device import DeviceTier
from cudask.memory.tiers.engine import LazyEngine
from cudask.memory.tiers.host import HostTier
from cudask.memory.tiers.inflight import InFlightCopies
from cudask.memory.tiers.metrics import snapshot
from cudask.memory.tiers.names import EntryNames, Linked

if TYPE_CHECKING:
    from distributed import Worker

logger = logging.getLogger("cudask.memory")


class TieredStore(MutableMapping[Key, object]):
    """Device -> host -> disk store; see the module docstring.

    Parameters
    ----------
    device_memory_limit:
        Bytes of the device tier; None: no limit (nothing is spilled by the limit;
        `spill_device` still moves keys, for JIT-unspill's spilling on demand).
    memory_limit:
        Bytes of the host tier before values go to disk; None: no disk.
    log_spilling:
        Log every move between tiers at INFO on distributed's worker-memory logger
        ("distributed.worker.memory"), so they appear in the worker's log.
    max_spill:
        Bytes allowed on disk (False: no limit), as distributed's max-spill.
    worker_local_directory:
        Given by distributed; spilled files go to `<dir>/storage`.
    settings:
        The `cudask.memory.*` settings, e.g. `store_settings(device_memory_limit,
        memory_limit, pinned_pool_size=...)`; default: the config's, for these
        limits. Spill on demand acts only with a device limit.
    local_directory:
        Directory for spilled files when not run by a worker (default: a new
        temporary directory, removed by `close()`).
    backend:
        The CUDA boundary (`cudask.memory.backend.CopyBackend`); default: CuPy,
        created when the first copy is needed. Tests inject a fake one.
    """

    def __init__(
        self,
        device_memory_limit: int | None = None,
        memory_limit: int | None = None,
        log_spilling: bool = False,
        max_spill: int | Literal[False] = False,
        worker_local_directory: str | None = None,
        *,
        settings: StoreSettings | None = None,
        local_directory: str | None = None,
        backend: CopyBackend | None = None,
    ) -> None:
        self.device_memory_limit = store_limit(device_memory_limit, "device_memory_limit")
        self.memory_limit = store_limit(memory_limit, "memory_limit")
        self.log_spilling = bool(log_spilling)
        self.max_spill = max_spill if max_spill else False
        self.settings = settings or store_settings(self.device_memory_limit, self.memory_limit)
        self.background = self.settings.background
        self.lock = threading.RLock()
        self._cv = threading.Condition(self.lock)
        self._closed = False

        ledger = self._ledger = AllocationLedger()
        self._device = DeviceTier(ledger, self.device_memory_limit)
        self._host = HostTier(
            self.memory_limit,
            self.max_spill,
            local_directory or worker_local_directory,
            self.log_spilling,
        )
        self._lazy = LazyEngine(
            self.settings, self.device_memory_limit, backend, self.lock, lambda: ledger.total
        )
        self._buffer = DeviceBuffer(
            self._device,
            self._host,
            InFlightCopies(ledger),
            self._lazy,
            settings=self.settings,
            memory_limit=self.memory_limit,
            log_spilling=self.log_spilling,
            notify=self._cv.notify_all,
        )
        self._names = EntryNames()  # keys holding the same device object share one entry
        self._device.shared = self._names.users
        self._thread: threading.Thread | None = None
        # Spill on demand, hooked at the first device object (after the worker's RMM
        # plugin has set its resource); it holds the store weakly.
        self.on_demand = (
            SpillOnDemand.for_store(
                self, limit=self.device_memory_limit if self.settings.spill_at_limit else None
            )
            if self.settings.spill_on_demand and self.device_memory_limit is not None
            else None
        )
        self._hooked = False
        if self.settings.pinned_preallocate:
            # Pin ahead of the first spill, without delaying the worker's start.
            self._lazy.start_warm_up()

    @property
    def engine(self) -> TransferEngine:
        """The transfer engine (creates the backend, e.g. CuPy, on first use)."""
        return self._lazy.get()

    # ------------------------------------------------------------------ mapping
    def __setitem__(self, key: Key, value: object) -> None:
        if isinstance(value, Linked):  # an alias of a spilled key (cudask.worker.gpu_worker)
            return self._link(key, value.target)
        ranges = handlers.allocations(value) if handlers.is_device_object(value) else None
        with self.lock:
            # one entry for every key of one device object (an Alias task's second key)
            name, dropped, held = self._names.assign(
                key, value, self._device.data, device_object=ranges is not None
            )
            if ranges is not None and self.device_memory_limit is not None:
                self._start_background()
                if not self._hooked and self.on_demand is not None:
                    self._hooked = True
                    self.on_demand.install()
            self._buffer.place(name, value, ranges, held=held, replacing=dropped)

    def _link(self, key: Key, target: Key) -> None:
        """Make `key` a second name of `target`'s entry; no data moves."""
        with self.lock:
            if not self._has(target):
                raise KeyError(target)
            dropped = self._names.join(key, cast(Key, self._names.visible(target)))
            if dropped is not None:
                self._drop(dropped)

    def _drop(self, name: Key) -> None:
        self._buffer.discard(name)  # the entry, lock held
        self._names.forget(name)

    def _has(self, key: object) -> bool:  # lock held, or a racy read
        name = self._names.visible(key)
        return name is not None and (name in self._device or name in self._host)

    def __getitem__(self, key: Key) -> object:
        with self.lock:
            name = self._names.visible(key)
            if name is None:
                raise KeyError(key)
            found = self._buffer.read(name)
        if not isinstance(found, Unspill):
            return found
        waited = found.wait()  # for the host -> device copies, without the lock
        with self.lock:
            value = self._buffer.finish(name, found, waited)
            if self._device.data.get(name) is value:
                self._names.note(name, value)
            return value

    def __delitem__(self, key: Key) -> None:
        with self.lock:
            if not self._has(key):
                raise KeyError(key)
            dropped = self._names.release(key)
            if dropped is not None:
                self._drop(dropped)
            self._buffer.reap()

    def __contains__(self, key: object) -> bool:
        if not self._names and key in self._device:
            return True
        with self.lock:
            return self._has(key)

    def __len__(self) -> int:
        with self.lock:
            entries = len(self._device) + len(self._host)
            return self._names.count(entries) if self._names else entries

    def __iter__(self) -> Iterator[Key]:
        with self.lock:
            keys = list(self._device) + list(self._host)
            if self._names:
                keys = self._names.public(keys)
        return iter(keys)

    def keys_on(self, tier: str) -> set[Key]:
        """Keys held on `tier`: "device", "host" (in host memory) or "disk"."""
        with self.lock:
            keys = set(self._device) if tier == "device" else self._host.keys_on(tier)
            if keys is not None and self._names:
                keys = set(self._names.public(keys))
        if keys is None:
            raise ValueError(f"tier={tier!r}; accepted: 'device', 'host', 'disk'")
        return keys

    def where(self, key: Key) -> str:
        """The tier holding `key`: "device", "host" or "disk"."""
        with self.lock:
            name = self._names.visible(key)
            tier = (
                None
                if name is None
                else ("device" if name in self._device else self._host.tier_of(name))
            )
        if tier is None:
            raise KeyError(key)
        return tier

    def is_spilled_device_object(self, key: Key) -> bool:
        """Whether `key` holds a device object currently moved to host or disk."""
        return self._names.entry(key) in self._buffer.spilled

    def prefetch(self, keys: Collection[Key]) -> int:
        """Start copying spilled device keys among `keys` back to the device, as
        far as the device limit allows without spilling; return how many were
        started. A later read waits only for what is left of the copy."""
        with self.lock:
            return self._buffer.prefetch([self._names.entry(k) for k in keys])

    # ------------------------------------------------------------------ background
    def _start_background(self) -> None:
        if self._thread is None and self.background and self.device_memory_limit is not None:
            self._thread = background.start(
                self, TieredStore._background_step, TieredStore._background_idle, "cudask-spill"
            )

    def _background_step(self) -> bool:
        """One step of background spilling; return whether there is more to do."""
        with self.lock:
            return not self._closed and self._buffer.background_step()

    def _background_idle(self) -> bool:
        """Wait for a write past the spill target (or for copies); False once closed."""
        with self._cv:
            if self._closed:
                return False
            self._cv.wait(timeout=0.005 if self._buffer.inflight else 0.25)
            self._buffer.reap()
        return True

    # ------------------------------------------------------------------ ManualEvictProto
    @property
    def fast(self) -> Sized | bool:
        """Host values the memory manager may push to disk; True while copies are kept."""
        return self._host.fast or self._buffer.has_kept_copies()

    def evict(self) -> int:
        """Drop a host copy kept for a key back on the device (`tiers.clean`; not while
        the lock is busy: the event loop never waits on a copy), else move the least
        recently used host value to disk; its size, or -1 (nothing to move, no disk, or
        the move failed). Then the pinned pool gives its free slabs back."""
        freed = self._buffer.drop_kept_copy(self.lock)
        freed = freed if freed >= 0 else self._host.evict()
        self._lazy.trim()
        return freed

    @property
    def spilled_total(self) -> SpilledSize:
        """Bytes moved out of process memory to disk, as SpillBuffer reports."""
        return self._host.spilled_total

    @property
    def cumulative_metrics(self) -> defaultdict[tuple[str, str], float]:
        """(label, unit) -> cumulative value, unit in bytes/count/seconds: the host
        tier's disk metrics plus device-to-host, host-to-device and device-read
        (`tiers.metrics.MoveCounters`)."""
        out: defaultdict[tuple[str, str], float] = defaultdict(float)
        out.update(self._host.cumulative_metrics)
        with self.lock:
            for k, v in self._buffer.metrics.values.items():
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
            self._buffer.reap()
            return self._held_bytes()

    @property
    def committed_device_bytes(self) -> int:
        """What the device limit is enforced on: `device_bytes` less the memory of
        copies to the host still in flight (counted as released when issued)."""
        with self.lock:
            self._buffer.reap()
            return self._ledger.total

    def _held_bytes(self) -> int:
        """`device_bytes` (lock held)."""
        return self._buffer.held_bytes()

    def metrics(self) -> dict[str, float]:
        """Per-tier sizes, moves and pinned-pool state, for Worker.metrics."""
        with self.lock:
            self._buffer.reap()
            cumulative = self.cumulative_metrics
            host_bytes, host_keys, disk_keys, disk_bytes = self._host.sizes()
            held = float(self._held_bytes())
            inflight = self._buffer.inflight
            tiers = {
                "device-bytes": held,
                "device-committed-bytes": float(self._ledger.total),
                "device-keys": float(len(self._device)),
                "device-limit-bytes": float(self.device_memory_limit or 0),
                "device-inflight-bytes": float(inflight.nbytes),
                "device-ghost-keys": float(len(inflight.ghosts)),
                "host-bytes": host_bytes,
                "host-keys": float(host_keys),
                **self._buffer.host_figures(),
                "disk-bytes": disk_bytes,
                "disk-keys": float(disk_keys),
            }
            engine = self._lazy.current
            return snapshot(
                tiers,
                cumulative,
                self.on_demand,
                engine.pool.stats() if engine is not None else None,
            )

    # ------------------------------------------------------------------ for proxies
    def spill_device(self, nbytes: int, lock_wait: float | None = None) -> int:
        """Move least recently used device keys to the host until `nbytes` of
        device memory are released (or nothing more can move), and wait for the
        copies, so the memory is really free when this returns; return the bytes
        released (possibly more than asked: in-flight copies also complete).
        The caller must not hold device objects of the keys it wants freed.
        `lock_wait`: at most this many seconds waiting for the store's lock, then
        nothing is spilled (0); None waits as long as it takes."""
        if nbytes <= 0:
            return 0
        if not self.lock.acquire(timeout=-1 if lock_wait is None else lock_wait):
            logger.debug(
                "cudask: spilling %s on demand skipped: the store stayed busy for %.1f s",
                format_bytes(nbytes),
                lock_wait,
            )
            return 0
        try:
            return self._buffer.spill(nbytes)
        finally:
            self.lock.release()

    @property
    def closed(self) -> bool:
        return self._closed

    def free_device_memory(self) -> int | None:
        """Device memory the driver reports free (creating the copy backend if need
        be); None when it cannot tell."""
        try:
            return self._lazy.get().backend.mem_get_info()[0]
        except Exception:  # noqa: BLE001 - no backend: unknown
            return None

    def peek_host_copy(self, key: Key) -> handlers.AnyHostCopy | None:
        """The host copy of `key` when it is a device object moved to host or disk,
        without bringing it back to the device (read from disk into host memory
        if need be); None when `key` is on the device, a host value or absent.
        The copy may still be filling: call its `wait()` before reading blocks."""
        with self.lock:
            name = self._names.entry(key)
            if name not in self._buffer.spilled or not self._has(key):
                return None
            return cast(handlers.AnyHostCopy, self._host[name])

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Stop background spilling, wait for copies, drop every key and give the
        pinned memory back."""
        with self.lock:
            if self._closed:
                return
            self._closed = self._lazy.closed = True
            self._cv.notify_all()
            if self.on_demand is not None:
                self.on_demand.uninstall()
            self._buffer.drain()
            for name in list(self._device) + list(self._host):
                self._drop(name)
            self._host.close()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        self._lazy.close()

    def __repr__(self) -> str:
        limit = (
            "None" if self.device_memory_limit is None else format_bytes(self.device_memory_limit)
        )
        return (
            f"<TieredStore: {len(self._device)} on device ({format_bytes(self._ledger.total)}"
            f"/{limit}), {len(self._host)} on host/disk>"
        )


def worker_metrics(worker: Worker) -> dict[str, float]:
    """`Worker.metrics` callable: the metrics of the worker's data store when it has
    them (TieredStore, ProxyStore), else {} (a plain dict)."""
    metrics = getattr(worker.data, "metrics", None)
    return dict(metrics()) if callable(metrics) else {}


# Static check that TieredStore implements distributed's public protocol.
_manual_evict: type[ManualEvictProto] = TieredStore

__all__ = ["TieredStore", "worker_metrics"]
