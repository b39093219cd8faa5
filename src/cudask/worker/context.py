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
    device = cupy.cuda.Device(0)
    device.use()
    cupy.cuda.runtime.free(0)  # forces context creation
    raw = cupy.cuda.runtime.getDeviceProperties(0)["uuid"]
    if isinstance(raw, str) or len(raw) == 16:
        return _format_uuid(raw)
    # CuPy ends the 16 UUID bytes at the first zero byte (GPU-0c3fd5d4-0096-... came back
    # as 4 bytes): take the UUID NVML gives the GPU at the same PCI bus id.
    return _uuid_at_bus(device.pci_bus_id)


def _uuid_at_bus(bus_id: str) -> str:
    from cudask.devices import discover
    from cudask.devices.topology import normalize_bus_id

    wanted = normalize_bus_id(bus_id)
    machine = discover()
    for gpu in machine.gpus:
        if gpu.pci_bus_id == wanted:
            return gpu.uuid
    raise RuntimeError(f"CUDA device 0 is at PCI bus {bus_id}, where NVML lists no GPU "
                       f"(it lists {', '.join(g.pci_bus_id for g in machine.gpus) or 'none'})")
