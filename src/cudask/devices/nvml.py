"""The NVML backend: the only module of cudask that imports pynvml.

Covers: reading each GPU's UUID, name, memory, PCI bus id, NUMA node, NVML CPU
affinity and MIG instances, and the driver and CUDA versions. Every NVML call
that a part does not support degrades to "unknown" rather than failing.
Also the processes holding a CUDA context on a device (`compute_processes`),
`default_backend()`, the process's one NVMLBackend, and two cheap reads for
running workers: `transfer_counters`, `gpu_model` and `gpus_without_peer_access`.
Does not cover: combining these with the process's own CPU set and the PCI
tree (discovery.py, topology.py).

Threading: NVML is thread-safe once started; a backend starts it on first use
(two threads racing there both call nvmlInit, which NVML counts and allows).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from cudask.devices import topology
from cudask.devices.model import GPUProcess, MIGInstance, NVMLUnavailable, RawGPU

T = TypeVar("T")


def _pynvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:  # nvidia-ml-py is a dependency, but be plain about it
        raise NVMLUnavailable(f"nvidia-ml-py is not installed ({exc})") from exc
    return pynvml


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class NVMLBackend:
    """Reads GPUs through NVML; initialises NVML on first use, never at import."""

    def __init__(self, sysfs: str = "/sys") -> None:
        self._sysfs = sysfs
        self._ready = False

    def _init(self) -> Any:
        nv = _pynvml()
        if not self._ready:
            try:
                nv.nvmlInit()
            except nv.NVMLError as exc:
                raise NVMLUnavailable(f"NVML could not start: {exc}") from exc
            self._ready = True
        return nv

    def _maybe(self, fn: Callable[[], T]) -> T | None:
        nv = self._init()
        try:
            return fn()
        except (nv.NVMLError, AttributeError):
            return None

    def driver_version(self) -> str:
        nv = self._init()
        return _text(nv.nvmlSystemGetDriverVersion())

    def cuda_version(self) -> str:
        nv = self._init()
        v = nv.nvmlSystemGetCudaDriverVersion_v2()
        return f"{v // 1000}.{(v % 1000) // 10}"

    def gpus(self) -> list[RawGPU]:
        nv = self._init()
        return [self._gpu(nv, i) for i in range(nv.nvmlDeviceGetCount())]

    def _gpu(self, nv: Any, index: int) -> RawGPU:
        h = nv.nvmlDeviceGetHandleByIndex(index)
        mem = self._maybe(lambda: nv.nvmlDeviceGetMemoryInfo(h))
        bus_id = _text(nv.nvmlDeviceGetPciInfo(h).busId)
        affinity = self._affinity(nv, h)
        numa = self._maybe(lambda: int(nv.nvmlDeviceGetNumaNodeId(h)))
        if numa is None or numa < 0:
            numa = topology.numa_node(bus_id, self._sysfs)
        if numa is None:
            numa = topology.numa_node_of_cpus(affinity, self._sysfs)
        return RawGPU(
            index=index,
            uuid=_text(nv.nvmlDeviceGetUUID(h)),
            name=_text(nv.nvmlDeviceGetName(h)),
            memory_total=int(mem.total) if mem is not None else None,
            memory_free=int(mem.free) if mem is not None else None,
            pci_bus_id=topology.normalize_bus_id(bus_id),
            numa_node=numa,
            nvml_cpu_affinity=affinity,
            mig=self._mig(nv, h),
        )

    def _affinity(self, nv: Any, handle: Any) -> tuple[int, ...] | None:
        words = (os.cpu_count() or 64) // 64 + 1
        mask = self._maybe(lambda: nv.nvmlDeviceGetCpuAffinity(handle, words))
        if mask is None:
            return None
        cpus = [
            w * 64 + b for w, word in enumerate(mask) for b in range(64) if (int(word) >> b) & 1
        ]
        return tuple(cpus)

    def _mig(self, nv: Any, handle: Any) -> tuple[MIGInstance, ...]:
        mode = self._maybe(lambda: nv.nvmlDeviceGetMigMode(handle))
        if not mode or mode[0] != nv.NVML_DEVICE_MIG_ENABLE:
            return ()
        out = []
        for i in range(nv.nvmlDeviceGetMaxMigDeviceCount(handle)):
            mh = self._maybe(partial(nv.nvmlDeviceGetMigDeviceHandleByIndex, handle, i))
            if mh is None:
                continue
            mem = self._maybe(partial(nv.nvmlDeviceGetMemoryInfo, mh))
            out.append(
                MIGInstance(
                    index=i,
                    uuid=_text(nv.nvmlDeviceGetUUID(mh)),
                    memory_total=int(mem.total) if mem else 0,
                    memory_free=int(mem.free) if mem else 0,
                )
            )
        return tuple(out)

    def allowed_cpus(self) -> set[int]:
        return set(os.sched_getaffinity(0))

    def compute_processes(self, uuid: str) -> list[GPUProcess]:
        """The processes with a CUDA context on the GPU or MIG instance `uuid`."""
        nv = self._init()
        try:
            handle = nv.nvmlDeviceGetHandleByUUID(uuid)
            listed = nv.nvmlDeviceGetComputeRunningProcesses(handle)
        except (nv.NVMLError, AttributeError) as exc:
            raise NVMLUnavailable(f"NVML cannot list the processes on {uuid}: {exc}") from exc
        out = []
        for p in listed:
            used = getattr(p, "usedGpuMemory", None)  # None: NVML_VALUE_NOT_AVAILABLE
            out.append(GPUProcess(int(p.pid), uuid, int(used) if used is not None else None))
        return out

    def nics_near(self, pci_bus_id: str) -> tuple[str, ...]:
        return topology.nearest_nics(pci_bus_id, self._sysfs)


_default: NVMLBackend | None = None


def default_backend() -> NVMLBackend:
    """The process's NVMLBackend, made on the first call (NVML starts on first use)."""
    global _default
    if _default is None:
        _default = NVMLBackend()
    return _default


# NVML field ids of cumulative transfer counters (nvml.h): PCIe bytes, NVLink KiB.
_PCIE_TX, _PCIE_RX = 197, 198
_NVLINK_TX, _NVLINK_RX = 138, 139
_ALL_LINKS = 0xFFFFFFFF


def transfer_counters(uuid: str, backend: NVMLBackend | None = None) -> dict[str, int | None]:
    """Cumulative bytes the GPU `uuid` sent and received over PCIe and NVLink, as
    NVML counts them (None for each counter NVML does not expose here; all None
    without NVML). Cheap: one field-value query, no sampling window."""
    names = ("pcie-tx-bytes", "pcie-rx-bytes", "nvlink-tx-bytes", "nvlink-rx-bytes")
    out: dict[str, int | None] = dict.fromkeys(names)
    backend = backend if backend is not None else default_backend()
    try:
        nv = backend._init()
        handle = nv.nvmlDeviceGetHandleByUUID(uuid)
        values = nv.nvmlDeviceGetFieldValues(
            handle, [_PCIE_TX, _PCIE_RX, (_NVLINK_TX, _ALL_LINKS), (_NVLINK_RX, _ALL_LINKS)]
        )
    except Exception:  # noqa: BLE001 - no NVML, unknown UUID, old driver: nothing to show
        return out
    for name, value, scale in zip(names, values, (1, 1, 1024, 1024)):
        if getattr(value, "nvmlReturn", 1) == 0:
            out[name] = int(value.value.ullVal) * scale
    return out


def gpu_model(uuid: str, backend: NVMLBackend | None = None) -> str | None:
    """The product name NVML gives the GPU `uuid` (e.g. "NVIDIA H100 80GB HBM3");
    None without NVML or for an unknown UUID."""
    backend = backend if backend is not None else default_backend()
    try:
        nv = backend._init()
        return _text(nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByUUID(uuid)))
    except Exception:  # noqa: BLE001 - no NVML, unknown UUID: nothing to show
        return None


def gpus_without_peer_access(uuid: str, backend: NVMLBackend | None = None) -> list[str] | None:
    """The other GPUs NVML shows here whose memory the GPU `uuid` cannot read by
    peer access (NVLink or PCIe peer-to-peer), by UUID; None when NVML cannot tell."""
    backend = backend if backend is not None else default_backend()
    try:
        nv = backend._init()
        mine = nv.nvmlDeviceGetHandleByUUID(uuid)
        out = []
        for i in range(nv.nvmlDeviceGetCount()):
            other = nv.nvmlDeviceGetHandleByIndex(i)
            other_uuid = _text(nv.nvmlDeviceGetUUID(other))
            if other_uuid == uuid:
                continue
            status = nv.nvmlDeviceGetP2PStatus(mine, other, nv.NVML_P2P_CAPS_INDEX_READ)
            if status != nv.NVML_P2P_STATUS_OK:
                out.append(other_uuid)
    except Exception:  # noqa: BLE001 - no NVML, unknown UUID, old driver: cannot tell
        return None
    return out
