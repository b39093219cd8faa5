"""Host copies kept for keys read back to the device: spilling them again copies nothing.

Covers: `CleanCopies`, the host copies of keys that are back in the device tier
unchanged since they were read back, oldest first, with their total size.
A key read back from host memory keeps its host copy here (`keep`); when the key
is spilled again, the copy goes back to the host tier as it is (`take`), so no
device -> host copy is made; a key written, deleted or discarded loses its copy
the same way. The copies are host memory like any other: `trim` drops the oldest
until they fit the room the host tier leaves under its limit, and the store
gives them up first when distributed's memory manager asks for host memory.

Relies on dask's rule that tasks do not change their inputs in place: a task
that writes into a device object it was given would make the kept copy stale.
`cudask.memory.keep-host-copies: false` turns this off for such code.

Does not cover: deciding when a key is read back or spilled
(`cudask.memory.tiers.buffer.DeviceBuffer`), the host tier's disk.

Threading: not thread-safe; the store calls every method under its lock.
"""

from __future__ import annotations

from dask.typing import Key

from cudask.memory import handlers


class CleanCopies:
    """Host copies of device-tier keys, still equal to their device objects."""

    def __init__(self) -> None:
        self._copies: dict[Key, handlers.AnyHostCopy] = {}  # oldest first
        self.nbytes = 0

    def __contains__(self, key: object) -> bool:
        return key in self._copies

    def __len__(self) -> int:
        return len(self._copies)

    def keep(self, key: Key, copy: handlers.AnyHostCopy) -> None:
        """`key` is back on the device, unchanged from `copy`."""
        self.take(key)
        self._copies[key] = copy
        self.nbytes += copy.nbytes

    def take(self, key: Key) -> handlers.AnyHostCopy | None:
        """The kept copy of `key`, no longer kept here; None when there is none."""
        copy = self._copies.pop(key, None)
        if copy is not None:
            self.nbytes -= copy.nbytes
        return copy

    def drop_oldest(self) -> int:
        """Give up the oldest copy; return its size, or -1 when none is kept."""
        if not self._copies:
            return -1
        key = next(iter(self._copies))
        copy = self.take(key)
        assert copy is not None
        return copy.nbytes

    def trim(self, room: int | None) -> int:
        """Drop the oldest copies until the rest fit in `room` bytes (None: no
        bound); return the bytes dropped."""
        dropped = 0
        if room is None:
            return dropped
        while self.nbytes > max(room, 0):
            dropped += self.drop_oldest()
        return dropped


__all__ = ["CleanCopies"]
