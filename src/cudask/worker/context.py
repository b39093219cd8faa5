"""The CUDA context of a worker process.

Covers: creating the context on CUDA device 0 of the process (its own GPU,
since CUDA_VISIBLE_DEVICES is rotated per worker) and naming that device by
UUID, with CuPy or, without it, Numba. Does not cover: choosing the device.
"""

from __future__ import annotations


def _format_uuid(raw: bytes | str) -> str:
    if isinstance(raw, str):
        return raw if raw.startswith(("GPU-", "MIG-")) else f"GPU-{raw}"
    h = bytes(raw).hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def device0_uuid() -> str:
    """Create (or reuse) the CUDA context on device 0 and return the device's UUID."""
    try:
        import cupy
    except ImportError:
        from numba import cuda

        return _format_uuid(str(cuda.current_context().device.uuid))
    cupy.cuda.Device(0).use()
    cupy.cuda.runtime.free(0)  # forces context creation
    return _format_uuid(cupy.cuda.runtime.getDeviceProperties(0)["uuid"])
