"""Device -> host copies under way, and spilled objects still alive elsewhere.

Covers: `InFlightCopies`. A device object moved to the host is kept here until
its copy completes, so that a read meanwhile returns it without a copy and its
memory keeps counting (`uncovered_bytes`). Only the raw copies are kept to
know completion, never the host copy itself: the host tier alone decides how
long that stays in host memory (it may go to disk while its source is here). Once the copy is done, a spilled
object a task still references becomes a ghost: its allocations stay in the
store's ledger under ("g", key) until it dies, and a read of the key returns
it as it is (`source`).

Does not cover: making the copies (`cudask.memory.handlers`), or telling
whether a copy is still the key's current one (the store passes `current`).

Threading: not thread-safe; the store calls every method under its lock. The
weak-reference callbacks of dying ghosts only append to a deque (atomic),
which `reap` drains.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from dask.typing import Key

from cudask.memory import handlers
from cudask.memory.accounting import AllocationLedger, Range
from cudask.memory.backend import Copy

# (generation, weak refs to the device leaves, weak ref to the whole value when
# it is a leaf that can be handed out again as it is)
Ghost = tuple[int, list[weakref.ref[Any]], weakref.ref[Any] | None]


class InFlight:
    """A device object whose copies to the host are under way."""

    __slots__ = ("copies", "gen", "key", "nbytes", "ranges", "timed", "value")

    def __init__(
        self,
        key: Key,
        value: object,
        copies: list[Copy],
        nbytes: int,
        gen: int,
        ranges: list[Range],
        timed: bool = True,
    ) -> None:
        self.key = key
        self.value: object | None = value
        self.copies = copies
        self.gen = gen
        self.nbytes = nbytes
        self.ranges = ranges  # device memory held until the copies complete
        self.timed = timed  # whether retiring it reports the copies (once per copy)

    def ready(self) -> bool:
        return all(c.ready() for c in self.copies)

    def wait(self) -> None:
        for c in self.copies:
            c.wait()


class InFlightCopies:
    """Copies to the host in the order they were issued, and the ghosts they leave."""

    def __init__(self, ledger: AllocationLedger) -> None:
        self.ledger = ledger
        self._queue: deque[InFlight] = deque()
        self._by_key: dict[Key, InFlight] = {}
        self.ghosts: dict[Key, Ghost] = {}
        self._dead: deque[tuple[Key, int]] = deque()

    def __bool__(self) -> bool:
        """Whether copies are still under way."""
        return bool(self._queue)

    @property
    def nbytes(self) -> int:
        """Bytes of the copies under way."""
        return sum(i.nbytes for i in self._queue)

    def add(
        self,
        key: Key,
        value: object,
        copies: list[Copy],
        nbytes: int,
        gen: int,
        ranges: list[Range],
        *,
        timed: bool = True,
    ) -> None:
        """`value` is being copied to the host by `copies` (`nbytes` in all). `timed`
        false: the copies were issued for an earlier spill, which reports them."""
        inflight = InFlight(key, value, copies, nbytes, gen, ranges, timed)
        self._queue.append(inflight)
        self._by_key[key] = inflight

    def source(self, key: Key) -> object | None:
        """The original device object of a spilled key, when it is still alive
        (copy in flight, or referenced elsewhere); else None."""
        inflight = self._by_key.get(key)
        if inflight is not None and inflight.value is not None:
            return inflight.value
        ghost = self.ghosts.get(key)
        if ghost is not None and ghost[2] is not None:
            obj = ghost[2]()
            if obj is not None:
                return obj
        return None

    def forget(self, key: Key) -> None:
        """`key` left the host tier (deleted, overwritten or unspilled)."""
        self._by_key.pop(key, None)
        if self.ghosts.pop(key, None) is not None:
            self.ledger.discard(("g", key))

    def uncovered_bytes(self) -> int:
        """Device bytes the copies under way hold beyond what the ledger counts."""
        inflight = [r for i in self._queue if i.value is not None for r in i.ranges]
        return self.ledger.uncovered_bytes(inflight) if inflight else 0

    def reap(
        self,
        current: Callable[[Key, int], bool],
        retired: Callable[[list[Copy]], None],
        wait: bool = False,
    ) -> None:
        """Retire completed copies (all of them, waiting, with `wait`): drop the
        reference to their sources; a source still alive elsewhere, of a copy
        that is still its key's (`current(key, generation)`), becomes a ghost.
        `retired(copies)` is called with the raw copies of each spilled object."""
        queue = self._queue
        while queue:
            head = queue[0]
            if wait:
                head.wait()
            elif not head.ready():
                break
            queue.popleft()
            if head.timed:
                retired(head.copies)
            is_current = self._by_key.get(head.key) is head and current(head.key, head.gen)
            if is_current:
                del self._by_key[head.key]
            if not is_current or head.value is None:
                head.value = None
                continue
            self._track_ghost(head)
        while self._dead:
            key, gen = self._dead.popleft()
            ghost = self.ghosts.get(key)
            if ghost is not None and ghost[0] == gen and all(r() is None for r in ghost[1]):
                del self.ghosts[key]
                self.ledger.discard(("g", key))

    def _track_ghost(self, head: InFlight) -> None:
        """Drop the in-flight reference to a spilled object; if it is still alive
        elsewhere, keep counting its allocations until it dies."""
        key, gen = head.key, head.gen
        value, head.value = head.value, None
        ranges = handlers.allocations(value)
        callback = _ghost_callback(self._dead, key, gen)
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
            self.ghosts[key] = (gen, refs, whole)
            self.ledger.add(("g", key), ranges)


def _ghost_callback(dead: deque[tuple[Key, int]], key: Key, gen: int) -> Callable[[Any], None]:
    def callback(_: weakref.ref[Any]) -> None:
        dead.append((key, gen))  # deque.append is atomic

    return callback


__all__ = ["Ghost", "InFlight", "InFlightCopies"]
