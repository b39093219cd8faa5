"""Which stored entry each public key names: keys that hold the very same device object.

Covers: `EntryNames`, the map from the keys a worker stores to the entries of
the tiers. A key written with a device object that another key already holds
on the device (dask-expr's `Alias` tasks store the object they read under a
second key), or with a `Linked` value naming another key, becomes a link to that
key's entry instead of a second entry: the
object is counted, spilled and read back once for all of its keys, and the
entry is dropped with its last key. An entry whose own key was deleted or
written with another value while links remain stays under its name, hidden;
a new value for that key then gets an entry of its own under a fresh
`Renamed` name.

Does not cover: the tiers themselves (`device`, `host`, `cudask.memory.tiers.
buffer`), host values (a host object stored twice is stored twice, as in
distributed's SpillBuffer; only a `Linked` value shares one), or the store without
a device limit (its dict path keeps every key's value itself, at no cost; a `Linked`
value takes the store off it).

Threading: not thread-safe; the store calls every method under its lock,
except `entry`, a dict read that may run without it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import cast

from dask.typing import Key


class Linked:
    """A value that names another key's entry: stored under a key, it makes that key
    a second name of `target`'s entry without moving any data (what cudask's worker
    stores for an Alias task over a spilled key: cudask.worker.gpu_worker)."""

    __slots__ = ("target",)

    def __init__(self, target: Key) -> None:
        self.target = target

    def __repr__(self) -> str:
        return f"Linked({self.target!r})"


class Renamed:
    """The entry name of a key whose own name is still held by a hidden entry."""

    __slots__ = ("key", "serial")
    _serials = itertools.count(1)

    def __init__(self, key: Key) -> None:
        self.key = key
        self.serial = next(Renamed._serials)

    def __repr__(self) -> str:
        return f"{self.key!r}#{self.serial}"

    def __str__(self) -> str:
        return f"{self.key}#{self.serial}"


class EntryNames:
    """Public keys to entry names; see the module docstring."""

    def __init__(self) -> None:
        self.links: dict[Key, Key] = {}  # key -> entry name, where they differ
        self.users: dict[Key, set[Key]] = {}  # shared or hidden entries -> their keys
        self._seen: dict[int, Key] = {}  # id of a device object -> the entry holding it
        self._seen_id: dict[Key, int] = {}

    def __bool__(self) -> bool:
        """Whether any key names an entry other than its own."""
        return bool(self.links) or bool(self.users)

    def entry(self, key: Key) -> Key:
        """The entry name of `key` (`key` itself unless it is a link or renamed)."""
        return self.links.get(key, key)

    def visible(self, key: object) -> Key | None:
        """The entry name of `key`, or None when `key` is the name of a hidden
        entry (an entry kept only for other keys: `key` itself is gone)."""
        name = self.links.get(key)  # type: ignore[call-overload]
        if name is not None:
            return cast(Key, name)
        users = self.users.get(key)  # type: ignore[call-overload]
        return None if users is not None and key not in users else cast(Key, key)

    def note(self, name: Key, value: object) -> None:
        """Entry `name` now holds device object `value`."""
        old = self._seen_id.pop(name, None)
        if old is not None and self._seen.get(old) == name:
            del self._seen[old]
        self._seen[id(value)] = name
        self._seen_id[name] = id(value)

    def holder(self, value: object, device: Mapping[Key, object]) -> Key | None:
        """The entry holding `value` on the device now, or None."""
        name = self._seen.get(id(value))
        if name is not None and device.get(name) is value:
            return name
        return None

    def assign(
        self, key: Key, value: object, device: Mapping[Key, object], *, device_object: bool
    ) -> tuple[Key, Key | None, bool]:
        """Which entry `value`, written under `key`, goes to: (its name, the entry now
        unused that the tiers must drop or None, whether that entry already holds
        `value`: a second key of the same device object)."""
        dropped = self.release(key)
        holder = self.holder(value, device) if device_object else None
        drop = (
            dropped
            if dropped is not None and dropped != holder and (holder is not None or dropped != key)
            else None
        )  # (else replaced in place)
        if drop is not None:
            self.forget(drop)
        if holder is not None:
            if holder != key or key in self.users:
                self.link(key, holder, orphan=dropped == holder)
            return holder, drop, True
        name = self.fresh(key)
        if device_object:
            self.note(name, value)
        return name, drop, False

    def link(self, key: Key, name: Key, *, orphan: bool = False) -> None:
        """Make `key` (holding nothing now) name entry `name`; `orphan`: the
        entry's own key let go of it (`release` returned its name)."""
        users = self.users.get(name)
        if users is None:
            users = self.users[name] = set() if orphan else {_own_key(name)}
        users.add(key)
        if key != name:
            self.links[key] = name

    def join(self, key: Key, name: Key) -> Key | None:
        """Make `key` name entry `name` (which holds data now), letting go of the
        entry it named before; return that entry's name when it must be dropped."""
        dropped = self.release(key)
        if name != key or key in self.users:
            self.link(key, name, orphan=dropped == name)
        return dropped if dropped != name else None

    def release(self, key: Key) -> Key | None:
        """`key` lets go of its entry: return the entry's name when it is now
        unused and must be dropped (None: kept for other keys, or no entry)."""
        name = self.links.pop(key, key)
        users = self.users.get(name)
        if users is None:
            return name
        users.discard(key)
        if users and users != {_own_key(name)}:
            return None
        del self.users[name]  # unshared again, or unused
        return None if users else name

    def fresh(self, key: Key) -> Key:
        """The entry name for a new value of `key` (which holds nothing now)."""
        if key in self.users:  # a hidden entry still holds this name
            name = cast(Key, Renamed(key))  # any hashable names an entry
            self.links[key] = name
            return name
        return key

    def forget(self, name: Key) -> None:
        """Entry `name` was dropped."""
        seen = self._seen_id.pop(name, None)
        if seen is not None and self._seen.get(seen) == name:
            del self._seen[seen]

    def public(self, names: Iterable[Key]) -> list[Key]:
        """The keys naming the entries `names`."""
        out: list[Key] = []
        for name in names:
            users = self.users.get(name)
            if users is not None:
                out.extend(users)
            else:
                out.append(_own_key(name))
        return out

    def count(self, entries: int) -> int:
        """How many keys name the store's `entries` entries."""
        return entries + sum(len(users) - 1 for users in self.users.values())


def _own_key(name: Key) -> Key:
    """The key an unshared entry belongs to."""
    return name.key if isinstance(name, Renamed) else name


__all__ = ["EntryNames", "Linked", "Renamed"]
