"""Device-object handlers: what a device object is, which device memory it
holds, and how it moves to host memory and back.

Covers, one module each: host images (`images`: HostCopy, ContainerCopy),
the handler contract (`protocol`), `__cuda_array_interface__` geometry
(`geometry`), the generic interface handler (`cai`), one module per library
family (`cupy`, `numba`, `torch`, `rmm`, `cudf`), the registry (`registry`),
the one walk over lists/tuples/dicts (`walk`) and the functions over values
built on them (`values`). This package registers each library family lazily:
a library is imported only when an object of it is met, or a host copy made
by its handler is rebuilt.

Does not cover: when to move (`cudask.memory.store`), how copies are issued
(`cudask.memory.backend`, `cudask.memory.host.transfer`), JIT-unspill proxies (`cudask.memory.jit`).

Imports: images -> pinned; protocol -> images; geometry; cai -> geometry,
images, protocol; registry -> cai, protocol; library modules -> cai or
images, registry; walk (none); values -> registry, walk, images. No module
here imports from the package itself.

Threading: registration is expected at import time; everything else may be
called from any thread.
"""

from __future__ import annotations

from cudask.memory.handlers import cudf, cupy, numba, rmm, torch
from cudask.memory.handlers.cai import CudaArrayInterfaceHandler
from cudask.memory.handlers.cudf import CudfHandler
from cudask.memory.handlers.cupy import CupyHandler
from cudask.memory.handlers.geometry import interface_extent, interface_nbytes
from cudask.memory.handlers.images import AnyHostCopy, ContainerCopy, HostCopy
from cudask.memory.handlers.numba import NumbaHandler
from cudask.memory.handlers.protocol import DeviceHandler, UnspillableError
from cudask.memory.handlers.registry import handler_named, register_handler, register_lazy
from cudask.memory.handlers.rmm import RmmDeviceBufferHandler
from cudask.memory.handlers.torch import TorchHandler
from cudask.memory.handlers.values import (
    allocations,
    device_leaves,
    is_device_object,
    producer_streams,
    to_device,
    to_host,
    weak_leaves,
)

register_lazy("cupy", cupy.register)
register_lazy("numba", numba.register)
register_lazy("numba_cuda", numba.register)
register_lazy("torch", torch.register)
register_lazy("rmm", rmm.register)
register_lazy("cudf", cudf.register)

__all__ = [
    "AnyHostCopy",
    "ContainerCopy",
    "CudaArrayInterfaceHandler",
    "CudfHandler",
    "CupyHandler",
    "DeviceHandler",
    "HostCopy",
    "NumbaHandler",
    "RmmDeviceBufferHandler",
    "TorchHandler",
    "UnspillableError",
    "allocations",
    "device_leaves",
    "handler_named",
    "interface_extent",
    "interface_nbytes",
    "is_device_object",
    "producer_streams",
    "register_handler",
    "register_lazy",
    "to_device",
    "to_host",
    "weak_leaves",
]
