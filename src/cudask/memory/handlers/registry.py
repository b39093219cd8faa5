"""The handler contract, and which handler, if any, an object gets.

Covers: `DeviceHandler`, the Protocol a handler keeps for one family of device
objects; `UnspillableError`, for objects none can copy to the host; handlers
registered by type and resolved through the MRO; the fallback for what no
type claims but exposes `__cuda_array_interface__`; lazy registrations
keyed by a library's top-level module name, run when an object of that module,
or a host copy naming that handler, is first met; handlers by name.
`leaf_handler` answers for one object, never looking inside containers.

Does not cover: containers (`values`), the handlers themselves, which
registrations cudask makes (the package's `__init__`).

Threading: register at import time; lookups are safe from any thread (dict
reads; a racing double resolution is harmless).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy

from cudask.memory.accounting import Range
from cudask.memory.handlers.images import HostCopy

if TYPE_CHECKING:
    from cudask.memory.backend import Copy
    from cudask.memory.host.copy_engine import TransferEngine

logger = logging.getLogger(__name__)


class UnspillableError(TypeError):
    """A device object that cudask cannot copy to host memory."""


class DeviceHandler(Protocol):
    """How one family of device objects is accounted, copied out and rebuilt.

    Handlers hold no state: every method may be called from any thread."""

    name: str

    def accepts(self, obj: Any) -> bool:
        """Whether `obj` (an instance of a registered type) lives on the device."""

    def allocations(self, obj: Any) -> list[Range]:
        """Device address ranges that `obj` keeps alive."""

    def producer_streams(self, obj: Any) -> tuple[int, ...]:
        """Raw stream handles the object's data was last written on, when known."""

    def to_host(self, obj: Any, engine: TransferEngine) -> HostCopy:
        """Enqueue copies of the object's device data into host blocks."""

    def to_device(self, copy: HostCopy, engine: TransferEngine) -> tuple[Any, list[Copy]]:
        """Rebuild the object from `copy`; return it and the copies to wait for."""


_HANDLERS: dict[type, DeviceHandler] = {}
_RESOLVED: dict[type, DeviceHandler | None] = {}
_LAZY: dict[str, Callable[[], None]] = {}
_BY_NAME: dict[str, DeviceHandler] = {}
_fallback: DeviceHandler | None = None  # the package's generic interface handler
_HOST_LEAVES = frozenset(
    {int, float, complex, str, bytes, bytearray, bool, type(None), memoryview, numpy.ndarray}
)


def register_handler(typ: type, handler: DeviceHandler) -> None:
    """Use `handler` for instances of `typ` (and subclasses without their own)."""
    _HANDLERS[typ] = handler
    _BY_NAME[handler.name] = handler
    _RESOLVED.clear()


def register_fallback(handler: DeviceHandler) -> None:
    """Use `handler` for objects exposing `__cuda_array_interface__` whose types have no
    handler (the package registers the generic one, which this module cannot import)."""
    global _fallback
    _fallback = handler
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
    return _fallback if hasattr(typ, "__cuda_array_interface__") else None


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
        if _fallback is None or not hasattr(obj, "__cuda_array_interface__"):  # on the instance
            return None
        handler = _fallback
    return handler if handler.accepts(obj) else None


__all__ = [
    "DeviceHandler",
    "UnspillableError",
    "handler_named",
    "leaf_handler",
    "register_fallback",
    "register_handler",
    "register_lazy",
]
