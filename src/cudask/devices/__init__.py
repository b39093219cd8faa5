"""GPU discovery and topology: the GPUs of this machine, as plain records.

Covers: `discover()`, every GPU NVML sees (index, UUID, MIG instances, name,
memory, dedicated memory, PCI bus id, NUMA node, CPU affinity within this
process's CPU set, nearest NICs); the processes holding a CUDA context on a GPU
(`ProcessBackend`); `parse_visible_devices()`, which reads
CUDA_VISIBLE_DEVICES; `rotate()`, which gives worker i a list starting with its
GPU. Nothing here touches NVML at import.

Does not cover: CUDA (contexts, memory): cudask.worker.context, cudask.memory.

Threading: `discover()` may be called from any thread; the NVML backend it
shares starts NVML once per process, on first use.
"""

from __future__ import annotations

from cudask.devices.discovery import (
    Device,
    discover,
    parse_visible_devices,
    require_gpus,
    rotate,
    worker_visible_devices,
)
from cudask.devices.model import (
    GPU,
    DeviceBackend,
    GPUProcess,
    Machine,
    MIGInstance,
    NVMLUnavailable,
    ProcessBackend,
    RawGPU,
)
from cudask.devices.nvml import default_backend

__all__ = [
    "GPU",
    "Device",
    "DeviceBackend",
    "GPUProcess",
    "MIGInstance",
    "Machine",
    "NVMLUnavailable",
    "ProcessBackend",
    "RawGPU",
    "default_backend",
    "discover",
    "parse_visible_devices",
    "require_gpus",
    "rotate",
    "worker_visible_devices",
]
