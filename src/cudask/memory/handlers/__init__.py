"""Device-object handlers: what a device object is, which device memory it
holds, and how it moves to host memory and back.

Covers, by module: host images (`images`); the handler contract and registry
(`registry`); the container walk and the functions over values (`values`);
`__cuda_array_interface__` geometry and the generic, CuPy and Numba handlers
(`cai`); PyTorch and RMM (`libraries`); cuDF (`cudf`). Importing the package
registers the generic handler as the fallback and each library lazily: a library
is imported only when one of its objects, or a host copy its handler made, is
met. Imports: images <- registry <- values, cai, libraries; cai <- cudf.

Does not cover: when to move (`cudask.memory.store`), how copies are issued
(`cudask.memory.host.copy_engine`), JIT-unspill proxies (`cudask.memory.jit`).

Threading: registration at import time; everything else from any thread.
"""

from __future__ import annotations

from cudask.memory.handlers.cai import (
    CudaArrayInterfaceHandler,
    CupyHandler,
    NumbaHandler,
    interface_extent,
    interface_nbytes,
    register_cupy,
    register_numba,
)
from cudask.memory.handlers.cudf import CudfHandler, register_cudf
from cudask.memory.handlers.images import AnyHostCopy, ContainerCopy, HostCopy
from cudask.memory.handlers.libraries import (
    RmmDeviceBufferHandler,
    TorchHandler,
    register_rmm,
    register_torch,
)
from cudask.memory.handlers.registry import (
    DeviceHandler,
    UnspillableError,
    handler_named,
    register_fallback,
    register_handler,
    register_lazy,
)
from cudask.memory.handlers.values import (
    allocations,
    device_leaves,
    is_device_object,
    producer_streams,
    to_device,
    to_host,
    weak_leaves,
)

register_fallback(CudaArrayInterfaceHandler())
register_lazy("cupy", register_cupy)
register_lazy("numba", register_numba)
register_lazy("numba_cuda", register_numba)
register_lazy("torch", register_torch)
register_lazy("rmm", register_rmm)
register_lazy("cudf", register_cudf)

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
