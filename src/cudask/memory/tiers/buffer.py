"""The device tier over the host tier, joined by copies: spilling and unspilling.

Covers: `DeviceBuffer`, built from the parts (`DeviceTier`, `HostTier`,
`InFlightCopies`, `LazyEngine`) as zict.Buffer is built from a fast and a slow
mapping. It keeps each key in exactly one tier, with a generation per key so
that a copy that completes late never resurrects an old value; spills least
recently used device keys to the host (`evict_until`, `evict_key`: the copy is
only enqueued; a key read back unchanged goes back with the host copy it kept,
`tiers.clean`, and is not copied again), a key that cannot be copied staying on
the device; reads a spilled key back (`read`, then `finish` once its copies are
waited for), from its still-alive original when there is one, retrying once
after letting in-flight copies finish when the device is out of memory; and
prefetches (dropped again when the limit needs their room and no key is left
to spill).

Does not cover: locking, the dict path of a store without a device limit, the
background thread, spill on demand, the `ManualEvictProto` members
(`cudask.memory.store.TieredStore` does those).

Threading: not thread-safe; every method is called with the store's lock held,
which `notify` (called when the device tier passes its spill target) belongs
to, except `has_kept_copies` (a racy read) and `drop_kept_copy`, which takes the
lock itself when it is free. The copies of an `Unspill` are waited for without
it, between `read` and `finish`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import cast

from dask.typing import Key
from dask.utils import format_bytes

from cudask.memory import handlers
from cudask.memory.accounting import Range, union_bytes
from cudask.memory.backend import Copy, is_out_of_memory
from cudask.memory.settings import StoreSettings
from cudask.memory.tiers.clean import CleanCopies
from cudask.memory.tiers.device import DeviceTier
from cudask.memory.tiers.engine import LazyEngine
from cudask.memory.tiers.host import HostTier
from cudask.memory.tiers.inflight import InFlightCopies
from cudask.memory.tiers.metrics import MoveCounters, copies_of, moves

logger = logging.getLogger("cudask.memory")


class Unspill:
    """A value whose host -> device copies are under way."""

    __slots__ = ("copies", "gen", "value")

    def __init__(self, value: object, copies: list[Copy], gen: int) -> None:
        self.value = value
        self.copies = copies
        self.gen = gen

    def wait(self) -> float:
        """Wait for the copies (without the store's lock); return the seconds waited."""
        started = time.perf_counter()
        for c in self.copies:
            c.wait()
        return time.perf_counter() - started


class DeviceBuffer:
    """Device objects in `device` (LRU, limited), spilled to `host` through copies."""

    def __init__(
        self,
        device: DeviceTier,
        host: HostTier,
        inflight: InFlightCopies,
        lazy: LazyEngine,
        *,
        settings: StoreSettings,
        memory_limit: int | None,
        log_spilling: bool,
        notify: Callable[[], None],
    ) -> None:
        self.device = device
        self.host = host
        self.inflight = inflight
        self.lazy = lazy
        self.ledger = device.ledger
        self.limit = device.limit
        self.spill_target = settings.spill_target
        self.clean = CleanCopies() if settings.keep_host_copies else None
        self.memory_limit = memory_limit  # of the host tier, for messages
        self.log_spilling = log_spilling
        self._notify = notify
        self.metrics = MoveCounters()
        self.spilled: set[Key] = set()  # keys of the host tier holding host copies
        self.gen: dict[Key, int] = {}
        self._next_gen = 0
        self.prefetched: dict[Key, tuple[object, list[Copy], int]] = {}

    # ------------------------------------------------------------------ writes
    def new_generation(self, key: Key) -> None:
        self._next_gen += 1
        self.gen[key] = self._next_gen

    def place(
        self,
        name: Key,
        value: object,
        ranges: list[Range] | None,
        *,
        held: bool,
        replacing: Key | None,
    ) -> None:
        """Store `value` as entry `name` (the store's EntryNames.assign chose it), after
        dropping the entry it replaces, then keep the device tier within its limit.
        `held`: the entry holds `value` already (a second key): it is only touched."""
        if replacing is not None:
            self.discard(replacing)
        if held:
            self.device.touch(name)
        else:
            self.put(name, value, ranges)
        if ranges is not None and self.limit is not None:
            self.fit(name, ranges)

    def put(self, key: Key, value: object, ranges: list[Range] | None) -> None:
        """Store `value` in place of what `key` held: in the device tier when
        `ranges` (its allocations) are given, else in the host tier."""
        self.reap()
        self.discard(key)
        self.new_generation(key)
        if ranges is None:
            self.host[key] = value
            self._trim_clean()
        else:
            self.device.add(key, value, ranges)

    def fit(self, key: Key, ranges: list[Range]) -> None:
        """Keep the device tier within its limit after `key` was written."""
        limit = self.limit
        assert limit is not None
        if self.ledger.total > self.lazy.provision_from:
            self.hold_pinned()
            self.lazy.provide_ahead(self.ledger.total)
        if union_bytes(ranges) > limit:
            # Larger than the whole tier: straight to host, sparing the rest.
            self.evict_key(key)
        if self.ledger.total > limit:
            self.evict_until(limit)
        if self.ledger.total > self.spill_target * limit:
            self._notify()

    def discard(self, key: Key) -> None:
        """Forget `key` wherever it is."""
        self.gen.pop(key, None)
        self._drop_prefetched(key)  # before its host copy goes: the copies read it
        self.device.remove(key)
        if key in self.host:
            del self.host[key]
        self.spilled.discard(key)
        self.inflight.forget(key)
        self.device.unspillable.discard(key)
        if self.clean is not None:
            self.clean.take(key)  # written, deleted or discarded: its copy goes

    # ------------------------------------------------------------------ reads
    def read(self, key: Key) -> object:
        """`key`'s value, or an `Unspill` to wait for and `finish`."""
        self.reap()
        value = self.device.touch(key)
        if value is not None:
            self.metrics.device_read()
            return value
        if key not in self.spilled:
            host_value = self.host[key]
            self._trim_clean()  # read back from disk, it takes host memory again
            return host_value
        gen = self.gen[key]
        prefetched = self.prefetched.pop(key, None)
        if prefetched is not None:
            self.ledger.discard(("p", key))
            return Unspill(prefetched[0], prefetched[1], gen)
        shortcut = self.inflight.source(key)
        if shortcut is not None:
            self.install(key, shortcut, copied=None)
            return shortcut
        host_copy = cast(handlers.AnyHostCopy, self.host[key])
        return Unspill(*self.start_unspill(key, host_copy), gen)

    def finish(self, key: Key, unspill: Unspill, waited: float) -> object:
        """After the copies back were waited for: install the value unless the key
        changed meanwhile; return what the read gets."""
        engine = self.lazy.get()
        nbytes = self.metrics.unspilled(unspill.copies, waited, engine.stream_seconds)
        if self.gen.get(key) == unspill.gen and key in self.spilled:
            self.install(key, unspill.value, copied=nbytes)
        elif key in self.device:
            return self.device[key]
        return unspill.value

    def install(self, key: Key, value: object, *, copied: int | None) -> None:
        """Move a spilled key back into the device tier; its host copy is kept while
        host memory allows (`tiers.clean`) when it is in host memory, not on disk."""
        if self.clean is not None and self.host.tier_of(key) == "host":
            self.clean.keep(key, cast(handlers.AnyHostCopy, self.host[key]))
        del self.host[key]
        self._trim_clean()
        self.spilled.discard(key)
        self.inflight.forget(key)
        self.device.add(key, value, handlers.allocations(value))
        if self.log_spilling:
            how = (
                "no copy: still in device memory"
                if copied is None
                else f"copied {format_bytes(copied)}"
            )
            moves.info("cudask: unspilled %r host -> device (%s)", key, how)
        if self.limit is not None:
            if self.ledger.total > self.limit:
                self.evict_until(self.limit, keep=key)
            if self.ledger.total > self.spill_target * self.limit:
                self._notify()

    def start_unspill(self, key: Key, host_copy: handlers.AnyHostCopy) -> tuple[object, list[Copy]]:
        """Allocate device memory and enqueue the copies back; out of device
        memory, let in-flight copies finish (freeing their sources) and retry once."""
        limit = self.limit
        if limit is not None:
            self.evict_until(max(limit - host_copy.nbytes, 0))
        try:
            return handlers.to_device(host_copy, self.lazy.get())
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
        self.drain()
        with self._out_of_memory(key, host_copy):
            return handlers.to_device(host_copy, self.lazy.get())

    @contextmanager
    def _out_of_memory(self, key: Key, host_copy: handlers.AnyHostCopy) -> Iterator[None]:
        """An out-of-memory becomes a MemoryError that says what to do."""
        try:
            yield
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            limit = self.limit
            raise MemoryError(
                f"cudask: cannot bring {key!r} ({format_bytes(host_copy.nbytes)}) back to the "
                f"device: out of device memory with {format_bytes(self.ledger.total)} held by "
                f"this store (device_memory_limit="
                f"{'None' if limit is None else format_bytes(limit)}). The key stays in host "
                "memory; lower device_memory_limit or free device memory held outside the store."
            ) from exc

    def prefetch(self, keys: Collection[Key]) -> int:
        """Start copying spilled keys among `keys` back, as far as the device limit
        allows without spilling; return how many were started."""
        started = 0
        self.reap()
        for key in keys:
            if key not in self.spilled or key in self.prefetched:
                continue
            if self.inflight.source(key) is not None:
                continue
            host_copy = cast(handlers.AnyHostCopy, self.host[key])
            limit = self.limit
            if limit is not None and self.ledger.total + host_copy.nbytes > limit:
                break
            try:
                value, copies = handlers.to_device(host_copy, self.lazy.get())
            except Exception as exc:  # noqa: BLE001 - prefetch is best effort
                logger.debug("cudask: prefetch of %r skipped: %s", key, exc)
                break
            self.prefetched[key] = (value, copies, self.gen[key])
            self.ledger.add(("p", key), handlers.allocations(value))
            started += 1
        return started

    # ------------------------------------------------------------------ spilling
    def evict_until(self, target: float, keep: Key | None = None) -> None:
        """Spill least recently used keys until the device tier is at most `target`;
        when no key is left to spill, drop prefetched copies (oldest first: they
        are read back again when their key is read)."""
        self.device.evict_until(target, self.evict_key, keep)
        while self.ledger.total > target and self.prefetched:
            key = next(iter(self.prefetched))
            if key == keep:
                break
            self._drop_prefetched(key)

    def _drop_prefetched(self, key: Key) -> None:
        """Drop `key`'s prefetched value, once its copies back have finished (they
        write into its device memory and read the host copy)."""
        prefetched = self.prefetched.pop(key, None)
        if prefetched is not None:
            for copy in prefetched[1]:
                copy.wait()
            self.ledger.discard(("p", key))

    def evict_key(self, key: Key) -> int:
        """Move one key from the device tier to the host tier. Return the device
        bytes released from the tier's count, or -1."""
        before = self.ledger.total
        value, ranges = self.device.take(key)
        kept = self.clean.take(key) if self.clean is not None else None
        try:
            if kept is not None:
                host_copy = kept
            else:
                engine = self.lazy.get()
                engine.order_after_producers(handlers.producer_streams(value))
                host_copy = handlers.to_host(value, engine)
        except Exception as exc:  # noqa: BLE001 - the key stays, see _not_copied
            return self._not_copied(key, value, ranges, exc)
        try:
            self.host[key] = host_copy
        except Exception as exc:  # noqa: BLE001 - the key stays, see _not_stored
            return self._not_stored(key, value, ranges, exc)
        self.spilled.add(key)
        self._trim_clean()
        self.hold_pinned()
        nbytes = host_copy.nbytes
        # a kept copy still filling (read back while its first copy was under way) holds
        # its source like a fresh one; its copies were reported by the spill that made them
        self.inflight.add(
            key, value, copies_of(host_copy), nbytes, self.gen[key], ranges, timed=kept is None
        )
        self.metrics.spilled(nbytes, copied=kept is None)
        if self.log_spilling:
            how = "pinned" if host_copy.pinned() else "pageable"
            moves.info(
                "cudask: spilled %r device -> host (%s, %s)",
                key,
                format_bytes(nbytes),
                how if kept is None else "no copy: its host copy was kept",
            )
        return before - self.ledger.total

    def _not_copied(self, key: Key, value: object, ranges: list[Range], exc: Exception) -> int:
        """A key that cannot be copied to the host stays on the device: skipped from
        now on (0) when it is unspillable, else first in line and spilling stops (-1)."""
        if isinstance(exc, handlers.UnspillableError):
            self.device.restore(key, value, ranges, front=False)
            self.device.unspillable.add(key)
            logger.warning("cudask: %r stays on the device: %s", key, exc)
            return 0
        self.device.restore(key, value, ranges, front=True)
        logger.error(
            "cudask: could not spill %r from the device (device_memory_limit=%s): %s. "
            "It stays on the device.",
            key,
            _fmt(self.limit),
            exc,
        )
        return -1

    def _not_stored(self, key: Key, value: object, ranges: list[Range], exc: Exception) -> int:
        """A host copy the host tier refuses: the key stays on the device, first in
        line, and spilling stops (-1)."""
        self.device.restore(key, value, ranges, front=True)
        logger.error(
            "cudask: could not store the host copy of %r (memory_limit=%s): %s. "
            "It stays on the device.",
            key,
            _fmt(self.memory_limit),
            exc,
        )
        return -1

    def hold_pinned(self) -> None:
        """Free pinned memory is host memory too: hold the pool's to the room the
        host tier has left, so the two together stay within the host limit."""
        if self.memory_limit is not None:
            self.lazy.limit_idle(max(self.memory_limit - self.host_bytes(), 0))

    def host_figures(self) -> dict[str, float]:
        """Spilled device objects and the host copies kept for keys read back."""
        clean = self.clean
        return {
            "host-device-copies": float(len(self.spilled)),
            "host-kept-copies": float(len(clean) if clean is not None else 0),
            "host-kept-bytes": float(clean.nbytes if clean is not None else 0),
        }

    def has_kept_copies(self) -> bool:
        """Whether host copies are kept (a racy read: any thread)."""
        return bool(self.clean)

    def drop_kept_copy(self, lock: threading.RLock) -> int:
        """Give up the oldest kept host copy, taking the store's `lock` if it is free
        (called without it); its bytes, or -1 (none kept, or the lock is busy)."""
        if self.clean is None or not self.clean or not lock.acquire(blocking=False):
            return -1
        try:
            freed = self.clean.drop_oldest()
            if freed >= 0:
                self.hold_pinned()
            return freed
        finally:
            lock.release()

    def host_bytes(self) -> int:
        """Host memory the store's data hold: the host tier's and the kept copies."""
        return self.host.memory_bytes + (self.clean.nbytes if self.clean is not None else 0)

    def _trim_clean(self) -> None:
        """Kept host copies fit in the room the host tier leaves under its limit."""
        if self.clean is not None and self.memory_limit is not None:
            self.clean.trim(self.memory_limit - self.host.memory_bytes)

    def spill(self, nbytes: int) -> int:
        """Spill until `nbytes` of device memory are released, and wait for the
        copies; return the bytes released. Copies already in flight count
        towards `nbytes`: waiting for them releases their sources."""
        self.reap()
        before = self.held_bytes()
        pending = self.inflight.uncovered_bytes()
        self.evict_until(max(self.ledger.total - max(nbytes - pending, 0), 0))
        self.drain()
        return max(before - self.held_bytes(), 0)

    def background_step(self) -> bool:
        """Spill one key while the device tier is past its spill target; return
        whether there is more to do."""
        self.reap()
        limit = self.limit
        if limit is None:
            return False
        target = self.spill_target * limit
        if self.ledger.total <= target:
            return False
        key = self.device.victim()
        if key is None:
            return False
        self.evict_key(key)
        return self.ledger.total > target

    # ------------------------------------------------------------------ copies
    def reap(self, wait: bool = False) -> None:
        """Retire completed device -> host copies (all of them, waiting, with `wait`)."""
        self.inflight.reap(self._is_current, self._spill_done, wait)

    def drain(self) -> None:
        self.reap(wait=True)

    def _is_current(self, key: Key, gen: int) -> bool:
        return self.gen.get(key) == gen and key in self.spilled

    def _spill_done(self, copies: list[Copy]) -> None:
        engine = self.lazy.current
        if engine is not None:
            self.metrics.spill_done(copies, engine.stream_seconds)

    def held_bytes(self) -> int:
        """Device memory held: the ledger, plus what copies in flight still hold."""
        return self.ledger.total + self.inflight.uncovered_bytes()


def _fmt(nbytes: int | None) -> str:
    return "None" if nbytes is None else format_bytes(nbytes)


__all__ = ["DeviceBuffer", "Unspill"]
