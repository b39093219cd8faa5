"""The store of a worker without a device memory limit: a dict for device objects.

Covers: `UnlimitedStore`, the thread-safe MutableMapping[Key, object] a worker holds
its data in when `device_memory_limit` is off: device objects in a plain dict (they
never leave the device: no accounting, no LRU order, no lock on reads), everything
else in the host tier (distributed's SpillBuffer, over disk past `memory_limit`); a
key written with the other kind of value moves between the two. The members the
worker, the dashboard and distributed's memory manager read of a TieredStore, with
their answers for a store that never spills from the device. Does not cover: spilling
from the device (cudask.memory.store.TieredStore, chosen instead when there is a
device limit, or for JIT-unspill).

Threading: writes and deletions take one lock; a device key is written before the
host tier drops it, so a read without the lock always finds it. The host tier's
SpillBuffer locks itself for `evict`.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Collection, Iterator, MutableMapping, Sized
from typing import Any, Literal

from dask.typing import Key
from distributed.spill import ManualEvictProto, SpilledSize

from cudask.memory import handlers
from cudask.memory.accounting import union_bytes
from cudask.memory.settings import store_limit
from cudask.memory.tiers.host import HostTier
from cudask.memory.tiers.metrics import snapshot
from cudask.memory.tiers.names import Linked

_MISSING: Any = object()


class UnlimitedStore(MutableMapping[Key, object]):
    """Device objects in a dict, other values over disk past `memory_limit` (bytes;
    None: no disk). The parameters are TieredStore's, less those of spilling."""

    device_memory_limit = None
    on_demand = None

    def __init__(
        self,
        memory_limit: int | None = None,
        log_spilling: bool = False,
        max_spill: int | Literal[False] = False,
        worker_local_directory: str | None = None,
        *,
        local_directory: str | None = None,
        **_spilling: Any,
    ) -> None:
        self.memory_limit = store_limit(memory_limit, "memory_limit")
        self.lock = threading.RLock()
        self.closed = False
        self._device: dict[Key, object] = {}
        self._host = HostTier(
            self.memory_limit,
            max_spill if max_spill else False,
            local_directory or worker_local_directory,
            bool(log_spilling),
        )

    def __setitem__(self, key: Key, value: object) -> None:
        if isinstance(value, Linked):  # a second name of a key's value (nothing to share here)
            value = self[value.target]
        with self.lock:
            if handlers.is_device_object(value):
                self._device[key] = value
                if key in self._host:
                    del self._host[key]
            else:
                self._host[key] = value
                self._device.pop(key, None)

    def __getitem__(self, key: Key) -> object:
        value = self._device.get(key, _MISSING)  # a dict read: no lock
        if value is not _MISSING:
            return value
        with self.lock:
            value = self._device.get(key, _MISSING)
            return self._host[key] if value is _MISSING else value

    def __delitem__(self, key: Key) -> None:
        with self.lock:
            if self._device.pop(key, _MISSING) is _MISSING:
                del self._host[key]  # KeyError when absent

    def __contains__(self, key: object) -> bool:
        return key in self._device or key in self._host

    def __len__(self) -> int:
        return len(self._device) + len(self._host)

    def __iter__(self) -> Iterator[Key]:
        with self.lock:
            return iter([*self._device, *self._host])

    # -- where keys are
    def keys_on(self, tier: str) -> set[Key]:
        """Keys held on `tier`: "device", "host" (in host memory) or "disk"."""
        with self.lock:
            keys = set(self._device) if tier == "device" else self._host.keys_on(tier)
        if keys is None:
            raise ValueError(f"tier={tier!r}; accepted: 'device', 'host', 'disk'")
        return keys

    def where(self, key: Key) -> str:
        """The tier holding `key`: "device", "host" or "disk"."""
        with self.lock:
            tier = "device" if key in self._device else self._host.tier_of(key)
        if tier is None:
            raise KeyError(key)
        return tier

    def is_spilled_device_object(self, key: Key) -> bool:
        return False  # device objects never leave the device here

    def prefetch(self, keys: Collection[Key]) -> int:
        return 0

    def spill_device(self, nbytes: int, lock_wait: float | None = None) -> int:
        return 0

    def peek_host_copy(self, key: Key) -> None:
        return None

    # -- ManualEvictProto: distributed's memory manager moves host values to disk
    @property
    def fast(self) -> Sized | bool:
        return self._host.fast

    def evict(self) -> int:
        return self._host.evict()

    @property
    def spilled_total(self) -> SpilledSize:
        return self._host.spilled_total

    @property
    def cumulative_metrics(self) -> defaultdict[tuple[str, str], float]:
        return self._host.cumulative_metrics

    # -- metrics
    @property
    def device_bytes(self) -> int:
        """Device memory the device keys keep alive (their allocations, counted once)."""
        with self.lock:
            values = list(self._device.values())
        return union_bytes(r for v in values for r in handlers.allocations(v))

    committed_device_bytes = device_bytes

    def metrics(self) -> dict[str, float]:
        """Per-tier sizes, under the names TieredStore.metrics gives them."""
        held = float(self.device_bytes)
        with self.lock:
            host_bytes, host_keys, disk_keys, disk_bytes = self._host.sizes()
            tiers = {
                "device-bytes": held,
                "device-committed-bytes": held,
                "device-keys": float(len(self._device)),
                "device-limit-bytes": 0.0,
                "host-bytes": host_bytes,
                "host-keys": float(host_keys),
                "disk-bytes": disk_bytes,
                "disk-keys": float(disk_keys),
            }
            return snapshot(tiers, self._host.cumulative_metrics, None, None)

    def close(self) -> None:
        """Drop every key and close the disk tier."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self._device.clear()
            self._host.clear()
            self._host.close()

    def __repr__(self) -> str:
        return f"<UnlimitedStore: {len(self._device)} on device, {len(self._host)} on host/disk>"


# Static check that UnlimitedStore implements distributed's public protocol.
_manual_evict: type[ManualEvictProto] = UnlimitedStore

__all__ = ["UnlimitedStore"]
