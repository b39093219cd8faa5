"""The facts cudask knows about a machine's GPUs, as plain frozen records.

Covers: GPU, MIGInstance and Machine records, and the DeviceBackend protocol
through which discovery reads them; GPUProcess, a process holding a CUDA
context on a GPU, and the ProcessBackend protocol that lists them. The real backend talks to NVML
(cudask.devices.nvml); cudask.testing.FakeBackend describes any machine for
tests. Does not cover: how the facts are read or combined (discovery.py).

Threading: the records are frozen; share them between threads freely.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class MIGInstance:
    """One MIG compute instance of a GPU: addressable only by its UUID."""

    index: int
    uuid: str
    memory_total: int
    memory_free: int


@dataclass(frozen=True)
class RawGPU:
    """What the backend reports of one GPU, before topology is applied."""

    index: int
    uuid: str
    name: str
    memory_total: int | None  # None: no dedicated memory (SoC / integrated parts)
    memory_free: int | None
    pci_bus_id: str
    numa_node: int | None
    nvml_cpu_affinity: tuple[int, ...] | None  # None: NVML could not tell
    mig: tuple[MIGInstance, ...] = ()


@dataclass(frozen=True)
class GPU:
    """One visible GPU, with topology resolved against this process."""

    index: int
    uuid: str
    name: str
    memory_total: int | None
    memory_free: int | None
    dedicated_memory: bool
    pci_bus_id: str
    numa_node: int | None
    cpu_affinity: tuple[int, ...]
    nics: tuple[str, ...]
    mig: tuple[MIGInstance, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Machine:
    """Every GPU NVML can see on this host, and the versions behind them."""

    driver_version: str | None
    cuda_version: str | None
    gpus: tuple[GPU, ...] = field(default_factory=tuple)
    allowed_cpus: tuple[int, ...] = ()
    nvml_error: str | None = None  # why no GPU could be listed, when none could

    def to_dict(self) -> dict[str, Any]:
        return {
            "driver_version": self.driver_version,
            "cuda_version": self.cuda_version,
            "allowed_cpus": list(self.allowed_cpus),
            "nvml_error": self.nvml_error,
            "gpus": [g.to_dict() for g in self.gpus],
        }


class DeviceBackend(Protocol):
    """Where discovery reads its facts. Methods raise NVMLUnavailable when the
    backend has no NVML library or no driver."""

    def driver_version(self) -> str: ...

    def cuda_version(self) -> str: ...

    def gpus(self) -> list[RawGPU]: ...

    def allowed_cpus(self) -> set[int]: ...

    def nics_near(self, pci_bus_id: str) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class GPUProcess:
    """A process holding a CUDA context on a GPU (or MIG instance), as NVML lists it:
    its pid as the driver numbers it (in a container with its own pid namespace, the
    host's), the device's UUID and the device memory it holds (None: not known)."""

    pid: int
    uuid: str
    used_memory: int | None


class ProcessBackend(Protocol):
    """Where the processes holding a CUDA context on a device are read. Raises
    NVMLUnavailable when the backend cannot tell (no NVML, unknown UUID, a part
    that does not list its processes)."""

    def compute_processes(self, uuid: str) -> list[GPUProcess]: ...


class NVMLUnavailable(Exception):
    """The NVML library or the driver is missing: the machine has no usable GPU."""
