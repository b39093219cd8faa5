"""What the rest of cudask asks about a value: a device object, or a list,
tuple or dict holding some (through `walk`, the one container walk).

Covers: `is_device_object`, `device_leaves` (each device object with its
handler), `allocations` (the device ranges a value keeps alive, possibly
overlapping: `cudask.memory.accounting` counts them once), `producer_streams`,
`weak_leaves`, `to_host` (an image whose copies are enqueued on the engine:
`HostCopy` for a device object, `ContainerCopy` for a container, host items
kept as they are) and `to_device` (the value rebuilt from its image, with the
host -> device copies to wait for before it is handed out).

Does not cover: when to move (`cudask.memory.store`), how copies are issued
(`cudask.memory.backend`, `cudask.memory.host.transfer`), the handlers themselves (`registry` and the
library modules). A value no handler can move raises `UnspillableError`.

Threading: as the handlers: any thread; the value must not be mutated while
it is walked.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cudask.memory.accounting import Range
from cudask.memory.handlers.images import AnyHostCopy, ContainerCopy, HostCopy
from cudask.memory.handlers.protocol import DeviceHandler, UnspillableError
from cudask.memory.handlers.registry import handler_named, leaf_handler
from cudask.memory.handlers.walk import CONTAINERS, leaves, rebuild, split

if TYPE_CHECKING:
    from cudask.memory.backend import Copy
    from cudask.memory.host.transfer import TransferEngine


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
    "allocations",
    "device_leaves",
    "is_device_object",
    "producer_streams",
    "to_device",
    "to_host",
    "weak_leaves",
]
