"""The CUDA context of a worker process.

Covers: creating the primary CUDA context of device 0 of the process (its own
GPU, since CUDA_VISIBLE_DEVICES is rotated per worker), making it current, and
naming that device by UUID; `active_contexts`, the devices on which the process
already holds one (a library that used CUDA at import). The CUDA driver API of cuda-bindings does this
where it is installed (a far lighter import than CuPy's: docs/design/worker-start.md);
the primary context is the one every CUDA runtime library in the process (CuPy,
RMM, PyTorch, Numba) then uses. Without cuda-bindings CuPy creates it, or
Numba without CuPy. Does not cover: choosing the device.

Threading: the primary context is process-wide; `device0_uuid` makes it current
on the calling thread only.
"""

from __future__ import annotations

from typing import Any


def _format_uuid(raw: bytes | str) -> str:
    if isinstance(raw, str):
        return raw if raw.startswith(("GPU-", "MIG-")) else f"GPU-{raw}"
    h = bytes(raw).hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def device0_uuid() -> str:
    """Create (or reuse) the CUDA context on device 0 and return the device's UUID."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return _device0_uuid_runtime()
    return _device0_uuid_driver(driver)


def active_contexts() -> list[tuple[int, str]] | None:
    """(CUDA ordinal, UUID) of each device of this process whose primary context is
    already active, before device0_uuid() makes one; None without cuda-bindings."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return None
    try:
        _driver_call(driver, "cuInit", 0)
        found = []
        for ordinal in range(_driver_call(driver, "cuDeviceGetCount")):
            device = _driver_call(driver, "cuDeviceGet", ordinal)
            err, _flags, active = driver.cuDevicePrimaryCtxGetState(device)
            if err == driver.CUresult.CUDA_SUCCESS and active:
                raw = bytes(_driver_call(driver, "cuDeviceGetUuid", device).bytes)
                found.append((ordinal, _format_uuid(raw)))
    except RuntimeError:  # no driver, no device: device0_uuid says so next
        return None
    return found


def _driver_call(driver: Any, name: str, *args: Any) -> Any:
    """Call a cuda-bindings driver function; raise naming it when it fails."""
    err, *out = getattr(driver, name)(*args)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, text = driver.cuGetErrorName(err)
        text = text.decode() if isinstance(text, bytes) else str(text)
        raise RuntimeError(f"CUDA driver call {name} failed: {text}")
    return out[0] if out else None


def _device0_uuid_driver(driver: Any) -> str:
    _driver_call(driver, "cuInit", 0)
    device = _driver_call(driver, "cuDeviceGet", 0)
    context = _driver_call(driver, "cuDevicePrimaryCtxRetain", device)
    _driver_call(driver, "cuCtxSetCurrent", context)
    raw = bytes(_driver_call(driver, "cuDeviceGetUuid", device).bytes)
    if len(raw) == 16:
        return _format_uuid(raw)
    bus = _driver_call(driver, "cuDeviceGetPCIBusId", 32, device)
    return _uuid_at_bus(bus.decode().rstrip("\x00") if isinstance(bus, bytes) else str(bus))


def _device0_uuid_runtime() -> str:
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
    raise RuntimeError(
        f"CUDA device 0 is at PCI bus {bus_id}, where NVML lists no GPU "
        f"(it lists {', '.join(g.pci_bus_id for g in machine.gpus) or 'none'})"
    )
