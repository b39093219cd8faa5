"""The host tier: host values and host copies of device objects, over disk.

Covers: `HostTier`, a MutableMapping over distributed's `SpillBuffer` (a
zict.Buffer over zict.Func(pickle) over zict.File) when the store has a host
limit, so values go to disk past it with distributed's compression,
max-spill, disk-full and pickling-error handling; without a host limit, over
a zict.LRU that never evicts (sizes only). It adds what the store needs on
top: reads that go on when the disk is full, which keys are in memory and
which on disk, the `ManualEvictProto` members (`fast`, `evict`), sizes for
the metrics, logging of moves to and from disk, and the temporary spill
directory of a store run outside a worker.

Does not cover: device objects (the store hands in their host copies),
deciding when to spill to disk (SpillBuffer's target; distributed's memory
manager calls `evict`).

Threading: not thread-safe apart from `evict`, which relies on SpillBuffer's
own locking as distributed's memory manager does; the store calls the rest
under its lock.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import weakref
from collections import defaultdict
from collections.abc import Iterator, MutableMapping, Sized
from typing import Literal

import zict
from dask.typing import Key
from distributed.sizeof import safe_sizeof
from distributed.spill import MaxSpillExceeded, SpillBuffer, SpilledSize

from cudask.memory.tiers.metrics import moves

logger = logging.getLogger("cudask.memory")


class HostTier(MutableMapping[Key, object]):
    """Host memory, then disk past `memory_limit` (None: no disk).

    Spilled files go to `directory/storage`, or to a new temporary directory
    removed by `close()` when `directory` is None.
    """

    def __init__(
        self,
        memory_limit: int | None,
        max_spill: int | Literal[False] = False,
        directory: str | None = None,
        log_spilling: bool = False,
    ) -> None:
        self.data: SpillBuffer | zict.LRU[Key, object]
        self._spill: SpillBuffer | None = None
        self._tmpdir: str | None = None
        self._warned_disk = False
        if memory_limit is not None:
            if directory is None:
                directory = self._tmpdir = tempfile.mkdtemp(prefix="cudask-spill-")
            else:
                directory = os.path.join(directory, "storage")
            self.data = self._spill = SpillBuffer(
                directory, target=memory_limit, max_spill=max_spill
            )
            if log_spilling:
                self._spill.fast_to_slow_callbacks.append(_log_host_to_disk)
                self._spill.slow_to_fast_callbacks.append(_log_disk_to_host)
        else:
            self.data = zict.LRU(math.inf, {}, weight=_host_weight)
        self._finalizer = weakref.finalize(self, _remove, self._tmpdir)

    # -- MutableMapping
    def __getitem__(self, key: Key) -> object:
        """`key`. Reading a key back from disk makes room for it by moving older
        keys to disk; when that fails (disk full, max-spill reached) zict has
        already put the key in host memory, and distributed's SpillBuffer lets
        the error out of the read: take the key from host memory and leave the
        failed move to a later eviction."""
        try:
            return self.data[key]
        except (OSError, MaxSpillExceeded):
            spill = self._spill
            if spill is None or key not in spill.fast:
                raise
            if not self._warned_disk:
                self._warned_disk = True
                logger.warning(
                    "cudask: the disk tier is full (no space left, or max-spill "
                    "reached); keys read back from disk stay in host memory"
                )
            return spill.fast[key]

    def __setitem__(self, key: Key, value: object) -> None:
        self.data[key] = value

    def __delitem__(self, key: Key) -> None:
        del self.data[key]

    def __contains__(self, key: object) -> bool:
        return key in self.data

    def __iter__(self) -> Iterator[Key]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    # -- where keys are
    def keys_on(self, tier: str) -> set[Key] | None:
        """Keys in host memory ("host") or on disk ("disk"); None for another tier."""
        spill = self._spill
        if tier == "host":
            return set(spill.fast) if spill is not None else set(self.data)
        if tier == "disk":
            return set(spill.slow) if spill is not None else set()
        return None

    def tier_of(self, key: Key) -> str | None:
        """The tier holding `key`: "disk" or "host"; None when it is absent."""
        if self._spill is not None and key in self._spill.slow:
            return "disk"
        return "host" if key in self.data else None

    # -- ManualEvictProto and SpillBuffer's counters
    @property
    def fast(self) -> Sized | bool:
        """Host-memory values distributed's memory manager may push to disk."""
        return self._spill.fast if self._spill is not None else False

    def evict(self) -> int:
        """Move the least recently used host-memory value to disk; return its size
        or -1 (nothing to move, no disk tier, or the move failed: the value then
        stays in host memory). Never raises."""
        spill = self._spill
        if spill is None or not spill.fast:
            return -1
        try:
            return spill.evict()
        except Exception:
            logger.exception("cudask: eviction to disk failed")
            return -1

    @property
    def spilled_total(self) -> SpilledSize:
        """Bytes moved out of process memory to disk, as SpillBuffer reports."""
        return self._spill.spilled_total if self._spill is not None else SpilledSize(0, 0)

    @property
    def cumulative_metrics(self) -> defaultdict[tuple[str, str], float]:
        """SpillBuffer's disk counters (empty without a disk tier)."""
        return self._spill.cumulative_metrics if self._spill is not None else defaultdict(float)

    @property
    def memory_bytes(self) -> int:
        """Bytes of the values held in host memory (not on disk)."""
        spill = self._spill
        if spill is not None:
            return int(spill.fast.total_weight)
        lru = self.data
        assert isinstance(lru, zict.LRU)
        return int(lru.total_weight)

    def sizes(self) -> tuple[float, int, int, float]:
        """Bytes and keys in host memory, keys and bytes on disk."""
        spill = self._spill
        if spill is not None:
            return (
                float(spill.fast.total_weight),
                len(spill.fast),
                len(spill.slow),
                float(spill.spilled_total.disk),
            )
        lru = self.data
        assert isinstance(lru, zict.LRU)
        return float(lru.total_weight), len(lru), 0, 0.0

    def close(self) -> None:
        """Close the disk tier and remove a temporary spill directory."""
        if self._spill is not None:
            self._spill.close()
        self._finalizer()


def _host_weight(key: Key, value: object) -> int:
    return safe_sizeof(value)


def _log_host_to_disk(key: Key, value: object) -> None:
    moves.info("cudask: spilled %r host -> disk", key)


def _log_disk_to_host(key: Key, value: object) -> None:
    moves.info("cudask: unspilled %r disk -> host", key)


def _remove(tmpdir: str | None) -> None:
    if tmpdir is not None:
        shutil.rmtree(tmpdir, ignore_errors=True)


__all__ = ["HostTier"]
