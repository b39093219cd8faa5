"""Slab bookkeeping of the pinned pool: which ranges of which slab are free.

Covers: `Slab`, one reserved range of host memory with its free ranges (sorted
offsets, first-fit `take`, `give` coalescing with both neighbours, since when
it is wholly free), and `Slabs`, the pool's slabs in reservation order: carve
a range from the first slab that has one, give it back, count the bytes in
use, and pick the slabs idle long enough to go back to the operating system
(newest first, keeping a floor); `wider`, the size of later slabs once a block
found no slab large enough. Plain data: addresses are numbers here.

Does not cover: reserving or freeing memory (`cudask.memory.host.pinning`),
locking, or when slabs come and go (`cudask.memory.host.provision`).

Threading: none of it is thread-safe; the pool and its provisioner call it
with the pool's lock held.
No CUDA, no threads, no system calls: testable alone.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class Slab:
    """`size` bytes at `ptr`; `registered`: a cudaHostRegister'ed mapping (else
    cudaHostAlloc memory)."""

    ptr: int
    size: int
    registered: bool
    # free ranges: sorted offsets and their sizes
    free_offsets: list[int] = field(default_factory=list)
    free_sizes: list[int] = field(default_factory=list)
    # time.monotonic() since when the slab is wholly free; None while in use
    idle_since: float | None = None

    def __post_init__(self) -> None:
        self.free_offsets = [0]
        self.free_sizes = [self.size]
        self.idle_since = time.monotonic()

    def take(self, nbytes: int) -> int | None:
        """The offset of the first free range of `nbytes`, now in use; None if none."""
        for i, size in enumerate(self.free_sizes):
            if size >= nbytes:
                self.idle_since = None
                offset = self.free_offsets[i]
                if size == nbytes:
                    del self.free_offsets[i], self.free_sizes[i]
                else:
                    self.free_offsets[i] += nbytes
                    self.free_sizes[i] -= nbytes
                return offset
        return None

    def give(self, offset: int, nbytes: int) -> None:
        """Free `nbytes` at `offset`, merged with the free ranges around it."""
        i = bisect.bisect_left(self.free_offsets, offset)
        # merge with the next free range
        if i < len(self.free_offsets) and offset + nbytes == self.free_offsets[i]:
            nbytes += self.free_sizes[i]
            del self.free_offsets[i], self.free_sizes[i]
        # merge with the previous free range
        if i > 0 and self.free_offsets[i - 1] + self.free_sizes[i - 1] == offset:
            self.free_sizes[i - 1] += nbytes
        else:
            self.free_offsets.insert(i, offset)
            self.free_sizes.insert(i, nbytes)
        if self.free_sizes == [self.size]:
            self.idle_since = time.monotonic()

    @property
    def free_bytes(self) -> int:
        return sum(self.free_sizes)

    @property
    def largest_free(self) -> int:
        return max(self.free_sizes, default=0)


class Slabs:
    """The pool's slabs, oldest first, and the bytes carved out of them."""

    def __init__(self) -> None:
        self._slabs: list[Slab] = []
        self.in_use = 0

    def __iter__(self) -> Iterator[Slab]:
        return iter(self._slabs)

    def __len__(self) -> int:
        return len(self._slabs)

    @property
    def size(self) -> int:
        """Bytes of all the slabs."""
        return sum(slab.size for slab in self._slabs)

    def add(self, slab: Slab) -> None:
        self._slabs.append(slab)

    def take(self, nbytes: int) -> tuple[Slab, int] | None:
        """First fit: (slab, offset) of a free range of `nbytes`, now in use."""
        for slab in self._slabs:
            offset = slab.take(nbytes)
            if offset is not None:
                self.in_use += nbytes
                return slab, offset
        return None

    def give(self, slab: Slab, offset: int, nbytes: int) -> None:
        """Free a range from `take`."""
        slab.give(offset, nbytes)
        self.in_use -= nbytes

    def take_idle(
        self,
        release_after: float | None,
        keep: int,
        *,
        trim: bool = False,
        upto: int | None = None,
    ) -> tuple[list[Slab], float | None]:
        """Take out the wholly free slabs idle for `release_after` seconds (every
        wholly free one with `trim`), newest first, leaving at least `keep` bytes of
        slabs and stopping once `upto` bytes are taken (None: no bound); also
        return how long until the next could go (None: no timer)."""
        if release_after is None and not trim:
            return [], None
        now = time.monotonic()
        reserved = total = self.size
        idle: list[Slab] = []
        wait: float | None = None
        for slab in reversed(self._slabs):
            if upto is not None and total - reserved >= upto:
                break
            if slab.idle_since is None or reserved - slab.size < keep:
                continue
            due = 0.0 if trim or release_after is None else (slab.idle_since + release_after - now)
            if due <= 0:
                idle.append(slab)
                reserved -= slab.size
            else:
                wait = due if wait is None else min(wait, due)
        if idle:
            self._slabs = [slab for slab in self._slabs if all(slab is not i for i in idle)]
        return idle, wait

    def clear(self) -> list[Slab]:
        """Take out every slab (closing); the bytes in use drop to zero."""
        slabs, self._slabs = self._slabs, []
        self.in_use = 0
        return slabs


# Slabs widen for blocks up to this size (or the base size, if larger): each slab is one
# registration, during which the worker's other CUDA calls wait (docs/design/host-memory.md).
# A larger block gets a slab of its own instead.
WIDEST = 1 << 30


def wider(block: int, base: int, current: int) -> int:
    """The size of later slabs once a block of `block` bytes found no free range: a
    multiple of `base` holding two such blocks, at most `WIDEST` (or `base`), and at
    least one block; `current` for a block past that bound (the pool gives it a slab
    of its own), and never below `current`. A block lies in one slab, so slabs smaller
    than a workload's blocks leave their free bytes unusable to it."""

    def multiple(n: int) -> int:
        return -(-n // base) * base

    widest = max(base, WIDEST)
    if multiple(block) > widest:
        return current
    return max(current, min(multiple(2 * block), widest))


__all__ = ["WIDEST", "Slab", "Slabs", "wider"]
