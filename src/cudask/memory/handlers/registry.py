"""Which device handler, if any, an object gets.

Covers: handlers registered by type and resolved through the MRO (a subclass
without a handler of its own uses its nearest base's); lazy registrations keyed
by a library's top-level module name, called the first time an object of that
module is met, or the first time a host copy names a handler of that name (a
process that receives a spilled object, a client say, may never have met its
library); the generic `__cuda_array_interface__` handler for types no handler
claims; host types that are never asked about. `leaf_handler` answers for one
object, never looking inside containers.

Does not cover: containers (`walk`, `values`), the handlers themselves (one
module per library family), which lazy registrations cudask makes (the
package's `__init__`).

Threading: registration is expected at import time; lookups are safe from any
thread (dict reads; a racing double resolution is harmless).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy

from cudask.memory.handlers.cai import CudaArrayInterfaceHandler
from cudask.memory.handlers.protocol import DeviceHandler, UnspillableError

logger = logging.getLogger(__name__)

_HANDLERS: dict[type, DeviceHandler] = {}
_RESOLVED: dict[type, DeviceHandler | None] = {}
_LAZY: dict[str, Callable[[], None]] = {}
_BY_NAME: dict[str, DeviceHandler] = {}
GENERIC = CudaArrayInterfaceHandler()
_BY_NAME[GENERIC.name] = GENERIC
_HOST_LEAVES = frozenset({int, float, complex, str, bytes, bytearray, bool, type(None),
                          memoryview, numpy.ndarray})


def register_handler(typ: type, handler: DeviceHandler) -> None:
    """Use `handler` for instances of `typ` (and subclasses without their own)."""
    _HANDLERS[typ] = handler
    _BY_NAME[handler.name] = handler
    _RESOLVED.clear()


def register_lazy(toplevel: str, register: Callable[[], None]) -> None:
    """Call `register()` the first time an object of module `toplevel` is met, or the first
    time a host copy names the handler `toplevel` (handlers are named after their library:
    a process that receives a spilled proxy, a client say, may never have met the library)."""
    _LAZY[toplevel] = register


def handler_named(name: str) -> DeviceHandler:
    """The handler that made a host copy, registering it now if its library was never met."""
    register = _LAZY.pop(name, None) if name not in _BY_NAME else None
    if register is not None:
        try:
            register()
        except ImportError as exc:
            raise UnspillableError(
                f"data spilled from {name!r} objects cannot be rebuilt here: {exc}"
            ) from None
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnspillableError(f"no device handler named {name!r} is registered") from None


def _resolve(typ: type) -> DeviceHandler | None:
    for cls in typ.__mro__:
        toplevel = cls.__module__.partition(".")[0]
        register = _LAZY.pop(toplevel, None)
        if register is not None:
            try:
                register()
            except ImportError:
                logger.debug("cudask: could not register device handler for %s", toplevel)
    for cls in typ.__mro__:
        handler = _HANDLERS.get(cls)
        if handler is not None:
            return handler
    if hasattr(typ, "__cuda_array_interface__"):
        return GENERIC
    return None


def leaf_handler(obj: Any) -> DeviceHandler | None:
    """The handler of `obj` when it is a device object itself (containers: None)."""
    typ = type(obj)
    if typ in _HOST_LEAVES:
        return None
    try:
        handler = _RESOLVED[typ]
    except KeyError:
        handler = _RESOLVED[typ] = _resolve(typ)
    if handler is None:
        if hasattr(obj, "__cuda_array_interface__"):  # set on the instance
            handler = GENERIC
        else:
            return None
    return handler if handler.accepts(obj) else None


__all__ = ["GENERIC", "handler_named", "leaf_handler", "register_handler", "register_lazy"]
