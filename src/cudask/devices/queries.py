"""Questions about this process's GPUs, asked the way dask-cuda's utils ask them.

Covers: counts (`get_gpu_count`, `get_n_gpus`, `get_gpu_count_mig`), one GPU's facts
by NVML index or UUID (`get_gpu_uuid`, `get_device_total_memory`,
`has_device_memory_resource`, `get_cpu_affinity`, `get_gpu_handle`), reading and
rotating CUDA_VISIBLE_DEVICES entries (`parse_cuda_visible_device`,
`cuda_visible_devices`, `nvml_device_index`), CPU masks (`unpack_bitmask`) and sizes
relative to a GPU (`parse_device_bytes`, `parse_device_memory_limit`), with dask-cuda
26.10's names, arguments and return types. Answers come from cudask's discovery
(NVML), so a fake backend answers them in tests. Does not cover: choosing devices for
workers (cudask.devices.discovery).

Threading: pure functions over discovery, which may be called from any thread.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

from dask.utils import parse_bytes

from cudask.devices.discovery import discover, require_gpus
from cudask.devices.model import GPU, DeviceBackend, MIGInstance
from cudask.errors import DeviceError

DeviceId = int | str


def get_cpu_count() -> int:
    """CPUs of this machine."""
    return os.cpu_count() or 1


def get_gpu_count(backend: DeviceBackend | None = None) -> int:
    """GPUs NVML sees (whatever CUDA_VISIBLE_DEVICES says); NoGPUError without NVML."""
    return len(require_gpus(discover(backend)).gpus)


def get_n_gpus(backend: DeviceBackend | None = None) -> int:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES' entries when it is set, else
    every GPU NVML sees."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len(visible.split(","))
    return get_gpu_count(backend)


def get_gpu_count_mig(
    return_uuids: bool = False, backend: DeviceBackend | None = None
) -> int | tuple[int, list[str]]:
    """MIG instances of every GPU; with `return_uuids`, (count, their UUIDs)."""
    uuids = [m.uuid for g in discover(backend).gpus for m in g.mig]
    return (len(uuids), uuids) if return_uuids else len(uuids)


def _find(device: DeviceId, backend: DeviceBackend | None) -> tuple[GPU, MIGInstance | None]:
    """The GPU (and MIG instance) an NVML index or a GPU-/MIG- UUID names."""
    machine = require_gpus(discover(backend))
    text = str(device)
    for gpu in machine.gpus:
        if text.isdigit() and gpu.index == int(text) or gpu.uuid == text:
            return gpu, None
        for mig in gpu.mig:
            if mig.uuid == text:
                return gpu, mig
    raise DeviceError(
        f"device {device!r} names no GPU of this machine; accepted: an NVML "
        f"index 0..{len(machine.gpus) - 1} or a GPU-/MIG- UUID"
    )


def get_gpu_handle(device_id: DeviceId = 0) -> Any:
    """NVML's handle of a GPU by index or UUID (a MIG UUID gives its parent GPU)."""
    import pynvml

    gpu, _ = _find(device_id, None)
    pynvml.nvmlInit()
    return pynvml.nvmlDeviceGetHandleByIndex(gpu.index)


def get_gpu_uuid(device_index: DeviceId = 0, backend: DeviceBackend | None = None) -> str:
    """The UUID of a GPU (or MIG instance) given by index or UUID."""
    gpu, mig = _find(device_index, backend)
    return mig.uuid if mig else gpu.uuid


def get_device_total_memory(
    device_index: DeviceId = 0, backend: DeviceBackend | None = None
) -> int | None:
    """Bytes of a GPU's (or MIG instance's) memory; None for GPUs without dedicated
    memory (SoC parts)."""
    gpu, mig = _find(device_index, backend)
    return mig.memory_total if mig else gpu.memory_total


def has_device_memory_resource(
    device_index: DeviceId = 0, backend: DeviceBackend | None = None
) -> bool:
    """Whether the GPU has memory of its own (SoC parts share the host's)."""
    return get_device_total_memory(device_index, backend) is not None


def get_cpu_affinity(
    device_index: DeviceId | None = None, backend: DeviceBackend | None = None
) -> list[int]:
    """The CPUs nearest a GPU, within those this process may use; every CPU, with a
    warning, when the GPU is unknown."""
    try:
        gpu, _ = _find(0 if device_index is None else device_index, backend)
    except DeviceError as exc:
        warnings.warn(
            f"cannot get the CPU affinity of {device_index!r} ({exc}); using every CPU",
            UserWarning,
            stacklevel=2,
        )
        return list(range(get_cpu_count()))
    return list(gpu.cpu_affinity)


def unpack_bitmask(x: Sequence[int], mask_bits: int = 64) -> list[int]:
    """The set bits of a list of `mask_bits`-wide masks (NVML's CPU sets), counting
    from bit 0 of the first mask: [1 + 2 + 8] gives [0, 1, 3]."""
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"unpack_bitmask takes a list of integers, not {type(x).__name__}")
    out = []
    for word, mask in enumerate(x):
        if isinstance(mask, bool) or not isinstance(mask, int):
            raise TypeError(f"unpack_bitmask: element {mask!r} is not an integer")
        out += [word * mask_bits + bit for bit in range(mask_bits) if mask >> bit & 1]
    return out


def parse_cuda_visible_device(dev: Any) -> int | str:
    """One CUDA_VISIBLE_DEVICES entry: an index (as int) or a GPU-/MIG- UUID (as str)."""
    if isinstance(dev, bool) or not isinstance(dev, (int, str)):
        raise TypeError(f"a CUDA_VISIBLE_DEVICES entry is an int or a str, not {dev!r}")
    if isinstance(dev, int) or dev.strip().isdigit():
        return int(dev)
    if dev.startswith(("GPU-", "MIG-")):
        return dev
    raise ValueError(
        f"CUDA_VISIBLE_DEVICES entry {dev!r} is neither an index nor a UUID; "
        "accepted: comma-separated indices or GPU-/MIG- UUIDs, e.g. '0,1'"
    )


def cuda_visible_devices(i: int, visible: Iterable[DeviceId] | None = None) -> str:
    """CUDA_VISIBLE_DEVICES for the i-th of the visible devices: that device first, then
    the rest in order. `visible` defaults to this process's CUDA_VISIBLE_DEVICES (every
    GPU's index when unset)."""
    if visible is None:
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
        entries = (
            [parse_cuda_visible_device(e) for e in env.split(",")]
            if env is not None
            else list(range(get_n_gpus()))
        )
    else:
        entries = list(visible)
    return ",".join(str(e) for e in entries[i:] + entries[:i])


def nvml_device_index(i: int, CUDA_VISIBLE_DEVICES: str | list[DeviceId]) -> int | str:
    """The i-th entry of a CUDA_VISIBLE_DEVICES value: an int for an index, else the UUID."""
    if isinstance(CUDA_VISIBLE_DEVICES, str):
        entry = CUDA_VISIBLE_DEVICES.split(",")[i].strip()
        return int(entry) if entry.isdigit() else entry
    if isinstance(CUDA_VISIBLE_DEVICES, list):
        return CUDA_VISIBLE_DEVICES[i]
    raise ValueError("CUDA_VISIBLE_DEVICES must be a str or a list")


def _fraction(value: Any) -> float | None:
    """A fraction of device memory in (0, 1]: a float, or a string holding one ("0.5",
    "1.0"); the integer 1 and the string "1" are one byte."""
    if isinstance(value, (bool, int)):
        return None
    if isinstance(value, str) and "." not in value:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if 0 < number <= 1 else None


def parse_device_bytes(
    device_bytes: Any,
    device_index: DeviceId = 0,
    alignment_size: int = 1,
    *,
    backend: DeviceBackend | None = None,
) -> int | None:
    """Bytes of `device_bytes`: an int, a byte string ("5GB"), or a fraction of the GPU's
    memory (0.8); None for None and anything that comes to 0. Rounded down to a multiple of
    `alignment_size`. A fraction of a GPU without dedicated memory raises ValueError."""
    share = _fraction(device_bytes)
    if share is not None:
        total = get_device_total_memory(device_index, backend)
        if total is None:
            raise ValueError(
                f"a fraction of device memory ({device_bytes!r}) is not supported "
                "on a GPU without dedicated memory; give bytes such as '8GB'"
            )
        nbytes = int(total * share)
    elif device_bytes is None:
        return None
    elif isinstance(device_bytes, str):
        nbytes = parse_bytes(device_bytes)
    else:
        nbytes = int(device_bytes)
    return nbytes // alignment_size * alignment_size or None


def parse_device_memory_limit(
    device_memory_limit: Any,
    device_index: DeviceId = 0,
    alignment_size: int = 1,
    *,
    backend: DeviceBackend | None = None,
) -> int | None:
    """A device memory limit in bytes as parse_device_bytes reads it, and "auto" (all the
    GPU's memory) and "default" (80% of it); both are None on GPUs without dedicated
    memory."""
    if device_memory_limit in ("auto", "default"):
        if not has_device_memory_resource(device_index, backend):
            return None
        if device_memory_limit == "auto":
            return parse_device_bytes(
                get_device_total_memory(device_index, backend),
                device_index,
                alignment_size,
                backend=backend,
            )
        device_memory_limit = 0.8
    return parse_device_bytes(device_memory_limit, device_index, alignment_size, backend=backend)


__all__ = [
    "cuda_visible_devices",
    "get_cpu_affinity",
    "get_cpu_count",
    "get_device_total_memory",
    "get_gpu_count",
    "get_gpu_count_mig",
    "get_gpu_handle",
    "get_gpu_uuid",
    "get_n_gpus",
    "has_device_memory_resource",
    "nvml_device_index",
    "parse_cuda_visible_device",
    "parse_device_bytes",
    "parse_device_memory_limit",
    "unpack_bitmask",
]
