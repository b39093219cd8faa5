"""The Numba family: `numba.cuda` device arrays (`DeviceNDArray`).

Covers: `NumbaHandler` (accounted and copied as by `cai`, through the array's
`__cuda_array_interface__`; rebuilt with `numba.cuda.from_cuda_array_interface`
over a new Numba device allocation) and `register`, which the package calls
the first time an object of `numba` or `numba_cuda` is met.

Does not cover: other arrays exposing `__cuda_array_interface__` (`cai`).

Threading: stateless; any thread. Numba is imported only inside the methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy

from cudask.memory.handlers.cai import CudaArrayInterfaceHandler
from cudask.memory.handlers.registry import register_handler

if TYPE_CHECKING:
    from cudask.memory.host.transfer import TransferEngine


class NumbaHandler(CudaArrayInterfaceHandler):
    """Numba DeviceNDArray: rebuilt with numba.cuda.from_cuda_array_interface over
    a numba device allocation."""

    name = "numba"

    def allocate(self, nbytes: int, meta: dict[str, Any], engine: TransferEngine) -> tuple[int, Any]:
        from numba import cuda

        owner = cuda.device_array(max(nbytes, 1), dtype=numpy.uint8)
        return int(owner.__cuda_array_interface__["data"][0]), owner

    def rebuild(self, owner: Any, ptr: int, meta: dict[str, Any], engine: TransferEngine) -> Any:
        from numba import cuda

        return cuda.from_cuda_array_interface(self.interface_of(meta, ptr), owner=owner, sync=False)


def register() -> None:
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    register_handler(DeviceNDArray, NumbaHandler())


__all__ = ["NumbaHandler", "register"]
