"""The one walk over containers that may hold device objects (or proxies of them).

Covers: which values are containers - exactly `list`, `tuple` and `dict`
(subclasses such as namedtuples or OrderedDicts are leaves, like every other
type) - and the two ways through them: `leaves` (every leaf a `pick` function
recognises, depth first, dict values in insertion order; or only the first
few) and `rebuild` (the same shape with each leaf replaced; a container none
of whose leaves changed is kept as it is, the same object).

Does not cover: what a device object is (the handlers' `pick` is
`registry.leaf_handler`), host images of containers (`images.ContainerCopy`).
Cycles are not detected: a container holding itself recurses without end.

Threading: pure functions; a container another thread mutates while it is
walked gives whatever Python's iteration gives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

CONTAINERS: frozenset[type] = frozenset({list, tuple, dict})

#: make(container, keys, items) -> the rebuilt container (keys: a dict's, else None)
Make = Callable[[Any, list[Any] | None, list[Any]], Any]


def split(container: Any) -> tuple[list[Any] | None, list[Any]]:
    """(keys, values) of a container: keys for a dict (in order), None otherwise."""
    if type(container) is dict:
        keys = list(container)
        return keys, [container[k] for k in keys]
    return None, list(container)


def leaves(obj: Any, pick: Callable[[Any], T | None], limit: int = 0) -> list[tuple[Any, T]]:
    """(leaf, pick(leaf)) for every leaf of `obj` (itself when not a container)
    for which `pick` gives something other than None; with `limit`, the walk stops
    once it found that many."""
    if type(obj) not in CONTAINERS:
        found = pick(obj)
        return [] if found is None else [(obj, found)]
    out: list[tuple[Any, T]] = []
    _collect(obj, pick, out, limit)
    return out


def _collect(obj: Any, pick: Callable[[Any], T | None], out: list[tuple[Any, T]],
             limit: int) -> bool:
    """Append the picked leaves of `obj` to `out`; return whether `limit` was reached."""
    t = type(obj)
    if t in CONTAINERS:
        for value in (obj.values() if t is dict else obj):
            if _collect(value, pick, out, limit):
                return True
        return False
    found = pick(obj)
    if found is None:
        return False
    out.append((obj, found))
    return len(out) == limit


def same_kind(container: Any, keys: list[Any] | None, items: list[Any]) -> Any:
    """A container of the kind of `container` holding `items` (under `keys`)."""
    if keys is not None:
        return dict(zip(keys, items))
    return type(container)(items)


def rebuild(obj: Any, replace: Callable[[Any], Any], make: Make = same_kind) -> Any:
    """`obj` with every leaf replaced by `replace(leaf)`. A container all of whose
    items come back as the same objects is returned as it is; one that changed is
    built by `make(container, keys, items)`."""
    if type(obj) not in CONTAINERS:
        return replace(obj)
    keys, values = split(obj)
    items = [rebuild(value, replace, make) for value in values]
    if all(new is old for new, old in zip(items, values)):
        return obj
    return make(obj, keys, items)


__all__ = ["CONTAINERS", "leaves", "rebuild", "same_kind", "split"]
