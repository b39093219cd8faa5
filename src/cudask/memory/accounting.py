"""Per-allocation accounting of device memory.

Covers: `AllocationLedger`, which counts the bytes of the union of device
address ranges held by a set of owners (store keys, keys being prefetched,
spilled keys whose objects are still alive elsewhere). Two keys holding views
of one allocation, or the same array twice, are counted once; a range is
uncounted only when its last owner lets go.

Does not cover: finding the ranges of an object (`cudask.memory.handlers`) or
deciding what to spill (`cudask.memory.store`).

Threading: not thread-safe; the store calls it under its lock.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Hashable, Iterable

Range = tuple[int, int]  # [start, end) device addresses


class AllocationLedger:
    """Bytes covered by the union of owners' address ranges.

    The address line is kept as sorted breakpoints with, for each segment
    between consecutive breakpoints, how many owner ranges cover it; `total` is
    updated incrementally (O(segments touched) per change).
    """

    def __init__(self) -> None:
        self._points: list[int] = []  # breakpoints, sorted
        self._counts: list[int] = []  # coverage of [points[i], points[i+1])
        self._owners: dict[Hashable, list[Range]] = {}
        self.total = 0

    def __contains__(self, owner: Hashable) -> bool:
        return owner in self._owners

    def __len__(self) -> int:
        return len(self._owners)

    def ranges(self, owner: Hashable) -> list[Range]:
        return list(self._owners.get(owner, ()))

    def owners(self) -> list[Hashable]:
        return list(self._owners)

    def _split(self, x: int) -> int:
        """Ensure `x` is a breakpoint; return its index."""
        i = bisect.bisect_left(self._points, x)
        if i < len(self._points) and self._points[i] == x:
            return i
        count = self._counts[i - 1] if i > 0 else 0
        self._points.insert(i, x)
        self._counts.insert(i, count)
        return i

    def _apply(self, start: int, end: int, delta: int) -> None:
        i = self._split(start)
        j = self._split(end)
        points, counts = self._points, self._counts
        for k in range(i, j):
            before = counts[k]
            after = before + delta
            if after < 0:
                raise AssertionError("ledger coverage below zero")
            counts[k] = after
            if before == 0 and after > 0:
                self.total += points[k + 1] - points[k]
            elif before > 0 and after == 0:
                self.total -= points[k + 1] - points[k]
        self._compact(max(i - 1, 0), min(j + 1, len(points) - 1))

    def _compact(self, lo: int, hi: int) -> None:
        """Drop breakpoints in [lo, hi] that separate segments of equal coverage."""
        points, counts = self._points, self._counts
        k = hi
        while k >= lo and k < len(points):
            prev = counts[k - 1] if k > 0 else 0
            if counts[k] == prev:
                del points[k], counts[k]
            k -= 1

    def add(self, owner: Hashable, ranges: Iterable[Range]) -> None:
        """Record that `owner` holds `ranges` (replacing what it held before)."""
        if owner in self._owners:
            self.discard(owner)
        kept = [(int(a), int(b)) for a, b in ranges if b > a]
        self._owners[owner] = kept
        for a, b in kept:
            self._apply(a, b, +1)

    def discard(self, owner: Hashable) -> None:
        """Forget `owner`'s ranges (no error when it holds none)."""
        for a, b in self._owners.pop(owner, ()):
            self._apply(a, b, -1)

    def uncovered_bytes(self, ranges: Iterable[Range]) -> int:
        """Bytes of the union of `ranges` that no owner covers now (what the total
        would grow by if an owner added them)."""
        points, counts = self._points, self._counts
        out = 0
        for a, b in _union(ranges):
            if b <= a:
                continue
            # walk the segments of the address line overlapping [a, b)
            i = bisect.bisect_right(points, a) - 1  # segment holding a (-1: before all)
            x = a
            while x < b:
                end = min(points[i + 1], b) if i + 1 < len(points) else b
                if i < 0 or counts[i] == 0:
                    out += end - x
                x = end
                i += 1
        return out

    def exclusive_bytes(self, owner: Hashable) -> int:
        """Bytes that would be uncounted if `owner` let go."""
        mine = self._owners.get(owner, ())
        if not mine:
            return 0
        points, counts = self._points, self._counts
        cuts = sorted({x for r in mine for x in r} | set(points))
        freed = 0
        for lo, hi in itertools.pairwise(cuts):
            held = sum(1 for a, b in mine if a <= lo and hi <= b)
            if not held:
                continue
            i = bisect.bisect_right(points, lo) - 1
            if i >= 0 and counts[i] == held:
                freed += hi - lo
        return freed


def _union(ranges: Iterable[Range]) -> list[Range]:
    out: list[Range] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def union_bytes(ranges: Iterable[Range]) -> int:
    """Bytes covered by the union of `ranges`."""
    return sum(b - a for a, b in _union(ranges))


__all__ = ["AllocationLedger", "Range", "union_bytes"]
