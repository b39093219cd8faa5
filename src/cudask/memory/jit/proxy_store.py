"""The JIT-unspill store: tasks receive proxies that stay spilled until touched.

Covers: `ProxyStore`, a worker's `data=` when `jit_unspill` is on: a
MutableMapping[Key, object] that wraps every device object put into it (alone,
or inside lists, tuples and dicts) in a ProxyObject (host objects stay plain),
hands tasks the proxies, and keeps each proxy's object in an inner
`TieredStore` under a private key, so spilling device -> host -> disk is the
tiered store's. A proxy lives as long as some key or task holds it; its object
leaves the store when the proxy dies. Shared objects count once (one proxy
under several keys; the same device object put twice gets the same proxy).
Proxies received from other workers are adopted in their host form, without
touching the device. Spills on demand (`cudask.memory.ondemand`, installed at
the first device object put into the store, removed on close).

Integration: implements `distributed.spill.ManualEvictProto` (`fast`, `evict`),
`spilled_total`, `cumulative_metrics` and `metrics()` like TieredStore, adding
proxy counts and spill-on-demand counters; implements the cells' `ProxyHome`.

Does not cover: the proxy type (cudask.memory.jit.proxy), how objects are
copied (cudask.memory.handlers / host.copy_engine), PyTorch's allocator (its
out-of-memory errors are not intercepted).

Threading: every public method is thread-safe. The store shares the inner
tiered store's RLock; a proxy's own lock is always taken before that lock,
never after.
"""

from __future__ import annotations

import itertools
import logging
import uuid
import weakref
from collections import defaultdict, deque
from collections.abc import Callable, Collection, Iterator, MutableMapping, Sized
from dataclasses import replace
from typing import Any

from dask.typing import Key
from dask.utils import typename
from distributed.spill import ManualEvictProto, SpilledSize

from cudask.memory import handlers
from cudask.memory.jit.cell import (
    HOSTCOPY,
    OBJECT,
    ProxyCell,
    ProxyError,
    ProxyHome,
    materialize,
    new_cell,
)
from cudask.memory.jit.proxy import ProxyObject, register_dask_dispatch
from cudask.memory.ondemand import SpillOnDemand
from cudask.memory.settings import spill_on_demand_setting, store_settings
from cudask.memory.store import TieredStore

logger = logging.getLogger("cudask.memory")

_MISSING: Any = object()
_CONTAINERS = (list, tuple, dict)


def _dead_callback(dead: deque[Key], pkey: Key) -> Callable[[Any], None]:
    def callback(_: Any) -> None:
        dead.append(pkey)  # deque.append is atomic; reaped by the store

    return callback


class ProxyStore(MutableMapping[Key, object]):
    """The JIT-unspill store; see the module docstring.

    Parameters are TieredStore's (`device_memory_limit`, `memory_limit`,
    `log_spilling`, `max_spill`, `worker_local_directory` and the keyword-only
    ones such as `backend`), plus `spill_on_demand` (default: `cudask.memory.spill-on-demand`, true): hook
    CuPy's allocator and RMM's resource to spill when they run out of memory.
    """

    def __init__(
        self,
        device_memory_limit: int | None = None,
        memory_limit: int | None = None,
        log_spilling: bool = False,
        max_spill: int | bool = False,
        worker_local_directory: str | None = None,
        *,
        spill_on_demand: bool | None = None,
        **tiered: Any,
    ) -> None:
        # The proxies' spill on demand is this store's (it counts what it frees).
        settings = tiered.pop("settings", None) or store_settings(device_memory_limit, memory_limit)
        self._inner = TieredStore(
            device_memory_limit,
            memory_limit,
            log_spilling,
            max_spill if max_spill else False,
            worker_local_directory,
            settings=replace(settings, spill_on_demand=False),
            **tiered,
        )
        spill_on_demand = spill_on_demand_setting(spill_on_demand)
        self.lock = self._inner.lock
        self.device_memory_limit = self._inner.device_memory_limit
        self.memory_limit = self._inner.memory_limit
        self._values: dict[Key, object] = {}  # values holding proxies
        self._host_keys: set[Key] = set()  # plain host values, kept by the inner store
        self._cells: dict[Key, weakref.ref[ProxyObject]] = {}  # pkey -> its proxy
        self._dead: deque[Key] = deque()
        self._identity: dict[int, tuple[weakref.ref[Any], weakref.ref[ProxyObject]]] = {}
        self._prefix = f"cudask-proxy-{uuid.uuid4().hex[:12]}"
        self._counter = itertools.count()
        self._closed = False
        limit = self.device_memory_limit if settings.spill_at_limit else None
        self.on_demand = SpillOnDemand.for_store(self, limit) if spill_on_demand else None
        self._hooked = False
        self._metrics: defaultdict[tuple[str, str], float] = defaultdict(float)
        register_dask_dispatch()

    # ------------------------------------------------------------------ mapping
    def __setitem__(self, key: Key, value: object) -> None:
        self._reap()
        proxied, found = self._proxify(value)
        with self.lock:
            self._discard(key)
            if found:
                self._values[key] = proxied
            else:
                self._inner[key] = value
                self._host_keys.add(key)
        del proxied, value
        self._reap()

    def __getitem__(self, key: Key) -> object:
        with self.lock:
            value = self._values.get(key, _MISSING)
            if value is not _MISSING:
                return value
            if key not in self._host_keys:
                raise KeyError(key)
        return self._inner[key]

    def __delitem__(self, key: Key) -> None:
        with self.lock:
            if key not in self._values and key not in self._host_keys:
                raise KeyError(key)
            self._discard(key)
        self._reap()

    def __contains__(self, key: object) -> bool:
        with self.lock:
            return key in self._values or key in self._host_keys

    def __len__(self) -> int:
        with self.lock:
            return len(self._values) + len(self._host_keys)

    def __iter__(self) -> Iterator[Key]:
        with self.lock:
            keys = list(self._values) + list(self._host_keys)
        return iter(keys)

    def _discard(self, key: Key) -> None:
        """Forget `key` (lock held); its proxies die with their last holder."""
        if self._values.pop(key, _MISSING) is _MISSING and key in self._host_keys:
            self._host_keys.discard(key)
            del self._inner[key]

    # ------------------------------------------------------------------ proxies
    def _proxify(self, value: Any) -> tuple[Any, bool]:
        """`value` with device objects replaced by proxies of this store; and
        whether it holds any proxy."""
        t = type(value)
        if t is ProxyObject:
            return self._own(value), True
        if t in _CONTAINERS:
            items = value.items() if t is dict else enumerate(value)
            out: list[tuple[Any, Any]] = []
            changed = found = False
            for k, v in items:
                p, f = self._proxify(v)
                changed |= p is not v
                found |= f
                out.append((k, p))
            if not changed:
                return value, found
            if t is dict:
                return {k: v for k, v in out}, found
            return t(v for _, v in out), found
        if handlers.is_device_object(value):
            return self._wrap(value), True
        return value, False

    def _own(self, proxy: ProxyObject) -> ProxyObject:
        """A proxy of this store for `proxy`: itself when it is ours or detached
        (then adopted in its current form), a new one for another store's."""
        cell = proxy._pxy
        with cell.lock:
            store = cell.store
            if store is self:
                return proxy
            if store is None:
                self._bind(proxy, cell.form, cell.payload)
                cell.payload = None
                return proxy
        # Another store's proxy (two workers in one process): take its object.
        return self._wrap(cell.obtain("moving a proxy between workers"))

    def _wrap(self, obj: Any) -> ProxyObject:
        with self.lock:
            found = self._identity.get(id(obj))
            if found is not None and found[0]() is obj:
                proxy = found[1]()
                if proxy is not None:
                    return proxy
        proxy = ProxyObject(new_cell(obj))
        cell = proxy._pxy
        with cell.lock:
            self._bind(proxy, OBJECT, obj)
            cell.payload = None
        return proxy

    def _bind(self, proxy: ProxyObject, form: str, payload: Any) -> None:
        """Put a proxy's content into the inner store (cell lock held)."""
        if self._closed:
            raise ProxyError("cannot store a proxy: the store is closed")
        cell = proxy._pxy
        pkey = (self._prefix, next(self._counter))
        device = form == OBJECT and handlers.is_device_object(payload)
        if device:
            self._hook()
        with self.lock:
            self._cells[pkey] = weakref.ref(proxy, _dead_callback(self._dead, pkey))
            self._inner[pkey] = payload
            cell.store, cell.pkey, cell.form = self, pkey, form
            if device:
                self._remember(payload, proxy)
            self._metrics["proxies", "count"] += 1

    def _remember(self, obj: Any, proxy: ProxyObject) -> None:
        """Map a device object to its proxy while the object lives (lock held)."""
        oid = id(obj)
        found = self._identity.get(oid)
        if found is not None and found[0]() is obj:
            return
        identity = self._identity

        def forget(ref: weakref.ref[Any]) -> None:
            entry = identity.get(oid)
            if entry is not None and entry[0] is ref:
                identity.pop(oid, None)

        try:
            self._identity[oid] = (weakref.ref(obj, forget), weakref.ref(proxy))
        except TypeError:
            pass  # no weak references: the same object put twice gets two proxies

    def obtain(self, cell: ProxyCell, op: str) -> Any:
        """The object of a bound proxy, unspilled if need be (called by the proxy)."""
        form = cell.form
        try:
            value = self._inner[cell.pkey]
        except KeyError:
            raise ProxyError(
                f"cannot use a proxy of {typename(cell.cls)} for {op}: its worker's store "
                "was closed"
            ) from None
        except Exception as exc:
            exc.add_note(f"cudask: while unspilling a proxy of {typename(cell.cls)} for {op}")
            raise
        if form == OBJECT:
            return value
        # Host form (received from another worker): rebuild it on the device once.
        with cell.lock:
            if cell.form == OBJECT:
                return self._inner[cell.pkey]
            value = self._inner[cell.pkey]
            try:
                obj = materialize(
                    cell.form, value, self._inner.engine if cell.form == HOSTCOPY else None
                )
            except Exception as exc:
                exc.add_note(f"cudask: while rebuilding a proxy of {typename(cell.cls)} for {op}")
                raise
            del value
            if handlers.is_device_object(obj):
                self._hook()
            with self.lock:
                self._inner[cell.pkey] = obj
                cell.form = OBJECT
                proxy = self._cells[cell.pkey]()
                if proxy is not None:
                    self._remember(obj, proxy)
            self._metrics["proxy-rebuilds", "count"] += 1
            return obj

    def host_form(self, cell: ProxyCell) -> tuple[str, Any] | None:
        """(form, payload) of a bound proxy that is not on the device, without
        unspilling it; None when it is on the device (called by the proxy)."""
        with self.lock:
            if cell.form != OBJECT:
                return cell.form, self._inner[cell.pkey]
            copy = self._inner.peek_host_copy(cell.pkey)
            return None if copy is None else (HOSTCOPY, copy)

    def where_proxy(self, cell: ProxyCell) -> str:
        """'device', 'host' or 'disk': where a bound proxy's data is."""
        with self.lock:
            try:
                tier = self._inner.where(cell.pkey)
            except KeyError:
                return "closed"
        return tier

    def proxies(self, key: Key) -> list[ProxyObject]:
        """The proxies in the value of `key` (empty for a host value)."""
        with self.lock:
            value = self._values.get(key, _MISSING)
            if value is _MISSING:
                if key in self._host_keys:
                    return []
                raise KeyError(key)
        out: list[ProxyObject] = []
        _collect(value, out)
        return out

    def where(self, key: Key) -> str:
        """The tier of `key`: its proxies' ('device', 'host', 'disk'; 'mixed' when
        they differ) or its host value's."""
        with self.lock:
            if key in self._host_keys:
                return self._inner.where(key)
            tiers = {self.where_proxy(p._pxy) for p in self.proxies(key)}
        return tiers.pop() if len(tiers) == 1 else "mixed"

    def _reap(self) -> None:
        """Drop the objects of proxies that died."""
        dead = self._dead
        if not dead:
            return
        with self.lock:
            while dead:
                pkey = dead.popleft()
                ref = self._cells.get(pkey)
                if ref is not None and ref() is None:
                    del self._cells[pkey]
                    if pkey in self._inner:
                        del self._inner[pkey]

    def _hook(self) -> None:
        if not self._hooked and self.on_demand is not None and not self._closed:
            with self.lock:
                if not self._hooked:
                    self._hooked = True
                    self.on_demand.install()

    # ------------------------------------------------------------------ spilling
    def spill_device(self, nbytes: int, lock_wait: float | None = None) -> int:
        """Spill least recently used proxies' objects to the host until `nbytes`
        of device memory are released; return the bytes released (objects still
        used by a running task are not released). `lock_wait`: at most this many
        seconds waiting for the store's lock, then nothing is spilled (0), as the
        tiered store does for spilling on demand (SpillOnDemand.for_store)."""
        if not self.lock.acquire(timeout=-1 if lock_wait is None else lock_wait):
            return 0
        try:
            self._reap()
            return self._inner.spill_device(nbytes)
        finally:
            self.lock.release()

    def prefetch(self, keys: Collection[Key]) -> int:
        """Start bringing the spilled proxies of `keys` back to the device, as far
        as the device limit allows; return how many were started."""
        pkeys = [
            p._pxy.pkey for k in keys if k in self for p in self.proxies(k) if p._pxy.form == OBJECT
        ]
        return self._inner.prefetch(pkeys)

    @property
    def device_bytes(self) -> int:
        """Device memory held by the store's proxies (each allocation once)."""
        self._reap()
        return self._inner.device_bytes

    # ------------------------------------------------------------------ ManualEvictProto
    @property
    def fast(self) -> Sized | bool:
        return self._inner.fast

    def evict(self) -> int:
        return self._inner.evict()

    @property
    def spilled_total(self) -> SpilledSize:
        return self._inner.spilled_total

    @property
    def cumulative_metrics(self) -> defaultdict[tuple[str, str], float]:
        out = self._inner.cumulative_metrics
        with self.lock:
            for k, v in self._metrics.items():
                out[k] += v
        return out

    def metrics(self) -> dict[str, float]:
        """The tiered store's metrics plus proxy counts and spill on demand."""
        self._reap()
        out = self._inner.metrics()
        with self.lock:
            out["proxies"] = float(len(self._cells))
            out["proxied-keys"] = float(len(self._values))
            out["host-value-keys"] = float(len(self._host_keys))
        hook = self.on_demand
        if hook is not None:
            out["spill-on-demand-count"] = float(hook.count)
            out["spill-on-demand-bytes"] = float(hook.freed)
            out["spill-at-limit-count"] = float(hook.limit_count)
            out["spill-at-limit-bytes"] = float(hook.limit_freed)
        return out

    def free_device_memory(self) -> int | None:
        """Device memory the driver reports free; None when it cannot tell."""
        return self._inner.free_device_memory()

    # ------------------------------------------------------------------ lifecycle
    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Remove the allocator hooks and close the inner store; proxies still
        alive raise ProxyError when used."""
        with self.lock:
            if self._closed:
                return
            self._closed = True
            if self.on_demand is not None:
                self.on_demand.uninstall()
            self._values.clear()
            self._host_keys.clear()
            self._identity.clear()
        self._inner.close()

    def __repr__(self) -> str:
        return (
            f"<ProxyStore: {len(self._values)} proxied keys, {len(self._host_keys)} host "
            f"keys, {len(self._cells)} proxies, {self._inner!r}>"
        )


def _collect(value: Any, out: list[ProxyObject]) -> None:
    t = type(value)
    if t is ProxyObject:
        out.append(value)
    elif t in _CONTAINERS:
        for v in value.values() if t is dict else value:
            _collect(v, out)


# Static check that ProxyStore implements distributed's public protocol.
_manual_evict: type[ManualEvictProto] = ProxyStore
_home: type[ProxyHome] = ProxyStore

__all__ = ["ProxyStore"]
