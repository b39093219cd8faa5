"""A fake device backend: describe any machine to cudask's discovery.

Covers: FakeBackend, which stands where NVML would (8 GPUs, MIG, SoC parts
without dedicated memory, no NVML at all, a restricted cpuset, NICs near a
GPU, processes holding CUDA contexts on a GPU), and a few ready-made machines. Tests pass it to `cudask.devices.discover`
and to the spec builder; runtime code never looks for it.
Does not cover: fake device *objects* for the store (fake_cuda.py). Threading: a
FakeBackend is read-only once built.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cudask.devices.model import GPUProcess, MIGInstance, NVMLUnavailable, RawGPU

GiB = 1 << 30


def fake_gpu(
    index: int,
    *,
    name: str = "NVIDIA H100 80GB HBM3",
    memory_total: int | None = 80 * GiB,
    memory_free: int | None = None,
    numa_node: int | None = None,
    cpus: Iterable[int] | None = None,
    mig: int = 0,
) -> RawGPU:
    """One fake GPU; `mig` > 0 gives it that many MIG instances."""
    uuid = f"GPU-{index:08x}-fake-4000-8000-{index:012x}"
    migs = tuple(
        MIGInstance(
            index=m,
            uuid=f"MIG-{index:08x}-{m:04x}-fake-8000-{m:012x}",
            memory_total=(memory_total or 0) // max(mig, 1),
            memory_free=(memory_total or 0) // max(mig, 1),
        )
        for m in range(mig)
    )
    return RawGPU(
        index=index,
        uuid=uuid,
        name=name,
        memory_total=memory_total,
        memory_free=memory_total if memory_free is None and memory_total else memory_free,
        pci_bus_id=f"0000:{0x18 + 0x10 * index:02x}:00.0",
        numa_node=numa_node,
        nvml_cpu_affinity=tuple(cpus) if cpus is not None else None,
        mig=migs,
    )


@dataclass
class FakeBackend:
    """A DeviceBackend holding a described machine instead of asking NVML."""

    gpu_list: list[RawGPU] = field(default_factory=list)
    cpus: set[int] = field(default_factory=lambda: set(range(64)))
    nics: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    driver: str = "580.159.04"
    cuda: str = "13.0"
    nvml: bool = True
    processes: list[GPUProcess] = field(default_factory=list)  # contexts on the GPUs

    def _check(self) -> None:
        if not self.nvml:
            raise NVMLUnavailable("NVML Shared Library Not Found (fake)")

    def driver_version(self) -> str:
        self._check()
        return self.driver

    def cuda_version(self) -> str:
        self._check()
        return self.cuda

    def gpus(self) -> list[RawGPU]:
        self._check()
        return list(self.gpu_list)

    def allowed_cpus(self) -> set[int]:
        return set(self.cpus)

    def nics_near(self, pci_bus_id: str) -> tuple[str, ...]:
        return tuple(self.nics.get(pci_bus_id, ()))

    def compute_processes(self, uuid: str) -> list[GPUProcess]:
        self._check()
        known = {g.uuid for g in self.gpu_list} | {m.uuid for g in self.gpu_list for m in g.mig}
        if uuid not in known:
            raise NVMLUnavailable(f"no GPU {uuid} (fake)")
        return [p for p in self.processes if p.uuid == uuid]

    def add_context(self, pid: int, gpu: int = 0, used_memory: int | None = 512 << 20) -> None:
        """Say that process `pid` holds a CUDA context on GPU `gpu` (its index)."""
        uuid = next(g.uuid for g in self.gpu_list if g.index == gpu)
        self.processes.append(GPUProcess(pid, uuid, used_memory))

    @classmethod
    def dgx(cls, n: int = 8, *, cores: int = 128, memory: int = 80 * GiB) -> FakeBackend:
        """n GPUs over two NUMA nodes, each with an InfiniBand NIC."""
        per_node = cores // 2
        gpus = [
            fake_gpu(
                i,
                memory_total=memory,
                numa_node=0 if i < n // 2 else 1,
                cpus=range(per_node) if i < max(n // 2, 1) else range(per_node, cores),
            )
            for i in range(n)
        ]
        nics = {g.pci_bus_id: (f"mlx5_{g.index}",) for g in gpus}
        return cls(gpus, set(range(cores)), nics)

    @classmethod
    def no_nvml(cls) -> FakeBackend:
        return cls(nvml=False)
