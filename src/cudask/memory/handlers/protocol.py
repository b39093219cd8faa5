"""The contract every device handler keeps, and the error for what none can move.

Covers: `DeviceHandler`, the Protocol a handler implements for one family of
device objects (whether an instance is on the device, the device ranges it
keeps alive, the streams it was written on, its host image and its rebuild),
and `UnspillableError`, raised for objects that cannot be copied to the host
(the store then keeps them on the device).

Does not cover: which handler an object gets (`registry`), containers
(`walk`, `values`), the handlers themselves (one module per library family).

Threading: handlers hold no state; every method may be called from any thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from cudask.memory.accounting import Range
from cudask.memory.handlers.images import HostCopy

if TYPE_CHECKING:
    from cudask.memory.backend import Copy
    from cudask.memory.host.transfer import TransferEngine


class UnspillableError(TypeError):
    """A device object that cudask cannot copy to host memory."""


class DeviceHandler(Protocol):
    """How one family of device objects is accounted, copied out and rebuilt."""

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


__all__ = ["DeviceHandler", "UnspillableError"]
