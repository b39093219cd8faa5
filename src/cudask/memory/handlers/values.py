"""The one container walk, and what the rest of cudask asks about a value.

Covers: containers - exactly `list`, `tuple` and `dict` (namedtuples,
OrderedDicts and other subclasses are leaves) - walked depth first, dict
values in order, by `leaves` (the leaves a `pick` function recognises) and
`rebuild` (each leaf replaced; a container none of whose leaves changed is
kept, the same object). Over them: `is_device_object`, `device_leaves`,
`allocations` (possibly overlapping: `cudask.memory.accounting` counts them
once), `producer_streams`, `weak_leaves`, `to_host` (host items kept as they
are) and `to_device` (with the copies to wait for).

Does not cover: when to move (`cudask.memory.store`), how copies are issued
(`cudask.memory.host.copy_engine`), the handlers. Cycles are not detected.

Threading: any thread; a value must not be mutated while it is walked.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from cudask.memory.accounting import Range
from cudask.memory.handlers.images import AnyHostCopy, ContainerCopy, HostCopy
from cudask.memory.handlers.registry import (
    DeviceHandler,
    UnspillableError,
    handler_named,
    leaf_handler,
)

if TYPE_CHECKING:
    from cudask.memory.backend import Copy
    from cudask.memory.host.copy_engine import TransferEngine

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


def _collect(
    obj: Any, pick: Callable[[Any], T | None], out: list[tuple[Any, T]], limit: int
) -> bool:
    """Append the picked leaves of `obj` to `out`; return whether `limit` was reached."""
    t = type(obj)
    if t in CONTAINERS:
        for value in obj.values() if t is dict else obj:
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


def is_device_object(obj: Any) -> bool:
    """Whether `obj` is, or is a list/tuple/dict containing, a device object."""
    if type(obj) not in CONTAINERS:
        return leaf_handler(obj) is not None
    return bool(leaves(obj, leaf_handler, limit=1))


def device_leaves(obj: Any) -> list[tuple[Any, DeviceHandler]]:
    """The device objects inside `obj` (itself when it is one) with their handlers."""
    return leaves(obj, leaf_handler)


def allocations(obj: Any) -> list[Range]:
    """Device address ranges kept alive by `obj` (possibly overlapping)."""
    return [r for leaf, handler in device_leaves(obj) for r in handler.allocations(leaf)]


def producer_streams(obj: Any) -> tuple[int, ...]:
    """Raw stream handles the device objects in `obj` were written on, where known."""
    return tuple(s for leaf, handler in device_leaves(obj) for s in handler.producer_streams(leaf))


def weak_leaves(
    obj: Any, callback: Callable[[weakref.ref[Any]], Any] | None = None
) -> list[weakref.ref[Any]] | None:
    """Weak references (with `callback`) to every device object in `obj`, or None
    when one of them does not support weak references."""
    refs: list[weakref.ref[Any]] = []
    for leaf, _ in device_leaves(obj):
        try:
            refs.append(weakref.ref(leaf, callback))
        except TypeError:
            return None
    return refs


def to_host(obj: Any, engine: TransferEngine) -> AnyHostCopy:
    """Enqueue the copies of every device object in `obj`; host objects inside
    containers are kept as they are."""

    def copy_leaf(leaf: Any) -> Any:
        handler = leaf_handler(leaf)
        return leaf if handler is None else handler.to_host(leaf, engine)

    if type(obj) in CONTAINERS:
        keys, values = split(obj)
        items = [rebuild(value, copy_leaf, _container_copy) for value in values]
        return _container_copy(obj, keys, items)
    handler = leaf_handler(obj)
    if handler is None:
        raise UnspillableError(f"{type(obj).__name__} is not a device object")
    return handler.to_host(obj, engine)


def _container_copy(container: Any, keys: list[Any] | None, items: list[Any]) -> ContainerCopy:
    return ContainerCopy(type(container).__name__, keys, items)


def to_device(copy: AnyHostCopy, engine: TransferEngine) -> tuple[Any, list[Copy]]:
    """Rebuild the object `copy` was made from; return it and the host -> device
    copies to wait for before handing it out."""
    if isinstance(copy, ContainerCopy):
        pending: list[Copy] = []
        items: list[Any] = []
        for item in copy.items:
            if isinstance(item, HostCopy | ContainerCopy):
                value, copies = to_device(item, engine)
                pending.extend(copies)
                items.append(value)
            else:
                items.append(item)
        if copy.kind == "dict":
            assert copy.keys is not None
            return dict(zip(copy.keys, items)), pending
        return (tuple(items) if copy.kind == "tuple" else items), pending
    value, copies = handler_named(copy.handler).to_device(copy, engine)
    for c in copies:  # the host copy outlives the copies that read it
        if c.source is None:
            c.source = copy
    return value, copies


__all__ = [
    "CONTAINERS",
    "allocations",
    "device_leaves",
    "is_device_object",
    "leaves",
    "producer_streams",
    "rebuild",
    "same_kind",
    "split",
    "to_device",
    "to_host",
    "weak_leaves",
]
