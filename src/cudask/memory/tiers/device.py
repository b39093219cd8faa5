"""The device tier: device objects in least-recently-used order.

Covers: `DeviceTier`, a read-only Mapping of the device objects a store holds,
least recently used first, whose size is the union of their allocations in
the store's `AllocationLedger` (owner ("d", key): views and aliases count
once), and its eviction loop, `evict_until`, which hands the least recently
used spillable keys to a `spill` callable (as zict.LRU's `on_evict`) until
the ledger is down to a target. Keys that cannot be copied are kept and
skipped (`unspillable`); entries several keys name (`shared`) go last.

Does not cover: moving a key to the host (the store's `spill` callable), the
rest of the ledger's owners (prefetched keys, ghosts), or the dict path of a
store without a device limit (which uses `data` directly, without the ledger).

Threading: not thread-safe; the store calls it under its lock. `data` may be
read without a lock (a dict read); it is replaced, never mutated, when a key
goes back to the front.
"""

from __future__ import annotations

import logging
from collections.abc import (
    Callable,
    Container,
    ItemsView,
    Iterable,
    Iterator,
    KeysView,
    Mapping,
    ValuesView,
)

from dask.typing import Key
from dask.utils import format_bytes

from cudask.memory.accounting import AllocationLedger, Range

logger = logging.getLogger("cudask.memory")


class DeviceTier(Mapping[Key, object]):
    """Device objects in LRU order (least recently used first), accounted in `ledger`.

    Values are device objects, never None.
    """

    def __init__(self, ledger: AllocationLedger, limit: int | None) -> None:
        self.data: dict[Key, object] = {}
        self.ledger = ledger
        self.limit = limit
        self.unspillable: set[Key] = set()  # kept on the device: their copy failed
        self.shared: Container[Key] = ()  # entries named by several keys (tiers.names)
        self._warned_over_limit = False

    # -- Mapping
    def __getitem__(self, key: Key) -> object:
        return self.data[key]

    def __contains__(self, key: object) -> bool:
        return key in self.data

    def __iter__(self) -> Iterator[Key]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def get(self, key: Key, default: object = None) -> object:
        return self.data.get(key, default)

    def keys(self) -> KeysView[Key]:
        return self.data.keys()

    def values(self) -> ValuesView[object]:
        return self.data.values()

    def items(self) -> ItemsView[Key, object]:
        return self.data.items()

    # -- insertion and reads
    def add(self, key: Key, value: object, ranges: Iterable[Range]) -> None:
        """Put `key` last (most recently used) and count its allocations."""
        self.data[key] = value
        self.ledger.add(("d", key), ranges)

    def account(self, key: Key, ranges: Iterable[Range]) -> None:
        """Count the allocations of a key already in `data` (leaving the dict path)."""
        self.ledger.add(("d", key), ranges)

    def touch(self, key: Key) -> object | None:
        """The value of `key`, now the most recently used; None when absent."""
        data = self.data
        value = data.pop(key, None)
        if value is not None:
            data[key] = value
        return value

    def remove(self, key: Key) -> None:
        """Forget `key` and its allocations (no error when absent)."""
        if self.data.pop(key, None) is not None:
            self.ledger.discard(("d", key))

    # -- eviction
    def take(self, key: Key) -> tuple[object, list[Range]]:
        """Remove `key` to spill it: its value and the ranges it was counted with."""
        value = self.data.pop(key)
        ranges = self.ledger.ranges(("d", key))
        self.ledger.discard(("d", key))
        return value, ranges

    def restore(self, key: Key, value: object, ranges: list[Range], *, front: bool) -> None:
        """Put back a key whose spill failed: first in line (`front`), or last."""
        if front:
            rest = self.data
            self.data = {key: value}
            self.data.update(rest)
        else:
            self.data[key] = value
        self.ledger.add(("d", key), ranges)

    def victim(self, keep: Key | None = None) -> Key | None:
        """The least recently used key that may be spilled (not `keep`); keys in
        `shared` only when no other is left, the most recently used of them
        first (their other keys' tasks run soon, in the order they were made)."""
        shared, fallback = self.shared, None
        for key in self.data:
            if key == keep or key in self.unspillable:
                continue
            if shared and key in shared:
                fallback = key
                continue
            return key
        return fallback

    def evict_until(
        self, target: float, spill: Callable[[Key], int], keep: Key | None = None
    ) -> None:
        """Spill least recently used keys until the ledger is at most `target`
        bytes or nothing more can be spilled. `spill(key)` moves a key out and
        returns the bytes it released, or -1 to stop."""
        while self.ledger.total > target:
            key = self.victim(keep)
            if key is None:
                if not self._warned_over_limit and self.limit is not None:
                    self._warned_over_limit = True
                    logger.warning(
                        "cudask: the device tier holds %s, above its target of %s "
                        "(device_memory_limit=%s), and nothing more can be spilled: the rest "
                        "is referenced outside the store or cannot be copied.",
                        format_bytes(self.ledger.total),
                        format_bytes(int(target)),
                        format_bytes(self.limit),
                    )
                return
            if spill(key) < 0:
                return
        self._warned_over_limit = False


__all__ = ["DeviceTier"]
