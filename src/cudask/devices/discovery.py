"""GPU discovery: which GPUs this process can use, and how workers address them.

Covers: building a Machine from a DeviceBackend (NVML by default, a fake in
tests), intersecting each GPU's CPU affinity with the CPUs this process may
use, parsing CUDA_VISIBLE_DEVICES (indices, GPU-/MIG- UUIDs, unique UUID
prefixes, the empty string), and rotating a device list so worker i sees its
own GPU first. Does not cover: reading NVML or sysfs (nvml.py, topology.py).

Indices are NVML's (PCI bus order), as in dask-cuda: workers get whole GPUs by
index with CUDA_DEVICE_ORDER=PCI_BUS_ID in their environment, MIG instances by
UUID (cudask.worker.spec).

Threading: pure functions of the Machine and values they are given, except
`discover()`, which reads the backend; call them from any thread.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence

from cudask.devices.model import GPU, DeviceBackend, Machine, MIGInstance, NVMLUnavailable
from cudask.devices.nvml import default_backend
from cudask.devices.topology import format_cpus
from cudask.errors import DeviceError, NoGPUError, OptionError


def _resolve_affinity(
    raw: tuple[int, ...] | None, allowed: set[int], label: str
) -> tuple[int, ...]:
    if raw is None:
        warnings.warn(
            f"NVML gave no CPU affinity for {label}; using every CPU this process may use "
            f"({format_cpus(allowed)})",
            RuntimeWarning,
            stacklevel=3,
        )
        return tuple(sorted(allowed))
    both = set(raw) & allowed
    if not both:
        warnings.warn(
            f"the CPUs near {label} ({format_cpus(raw)}) are outside the CPUs this process "
            f"may use ({format_cpus(allowed)}); using the latter",
            RuntimeWarning,
            stacklevel=3,
        )
        return tuple(sorted(allowed))
    return tuple(sorted(both))


def discover(backend: DeviceBackend | None = None) -> Machine:
    """Every GPU the backend sees, with topology resolved; an empty Machine
    (with nvml_error set) when there is no NVML library or driver."""
    backend = backend or default_backend()
    try:
        allowed = set(backend.allowed_cpus())
    except OSError:
        allowed = set(range(os.cpu_count() or 1))
    try:
        driver = backend.driver_version()
        cuda = backend.cuda_version()
        raws = backend.gpus()
    except NVMLUnavailable as exc:
        return Machine(None, None, (), tuple(sorted(allowed)), nvml_error=str(exc))
    gpus = []
    for raw in raws:
        label = f"GPU {raw.index} ({raw.pci_bus_id})"
        gpus.append(
            GPU(
                index=raw.index,
                uuid=raw.uuid,
                name=raw.name,
                memory_total=raw.memory_total,
                memory_free=raw.memory_free,
                dedicated_memory=raw.memory_total is not None,
                pci_bus_id=raw.pci_bus_id,
                numa_node=raw.numa_node,
                cpu_affinity=_resolve_affinity(raw.nvml_cpu_affinity, allowed, label),
                nics=backend.nics_near(raw.pci_bus_id),
                mig=raw.mig,
            )
        )
    return Machine(driver, cuda, tuple(gpus), tuple(sorted(allowed)))


def require_gpus(machine: Machine) -> Machine:
    """The machine itself, or NoGPUError saying plainly why there is no GPU."""
    if not machine.gpus:
        why = machine.nvml_error or "NVML lists no GPU"
        raise NoGPUError(f"no NVIDIA GPU found: {why}. Run `cudask info` to see what NVML reports.")
    return machine


class Device:
    """One addressable device: a whole GPU or one MIG instance of it. `by_uuid`: it was
    named by UUID (or a prefix of one), so workers are given its UUID, not its index."""

    __slots__ = ("by_uuid", "gpu", "mig")

    def __init__(self, gpu: GPU, mig: MIGInstance | None = None, *, by_uuid: bool = False) -> None:
        self.gpu = gpu
        self.mig = mig
        self.by_uuid = by_uuid or mig is not None

    @property
    def uuid(self) -> str:
        return self.mig.uuid if self.mig else self.gpu.uuid

    @property
    def memory_total(self) -> int | None:
        return self.mig.memory_total if self.mig else self.gpu.memory_total

    @property
    def label(self) -> str:
        return f"GPU {self.gpu.index}" + (f" MIG {self.mig.index}" if self.mig else "")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other.uuid == self.uuid

    def __hash__(self) -> int:
        return hash(self.uuid)

    def __repr__(self) -> str:
        return f"Device({self.label}, {self.uuid})"


def _describe(machine: Machine) -> str:
    rows = []
    for g in machine.gpus:
        rows.append(f"{g.index} ({g.uuid})")
        rows.extend(f"  MIG {m.index} ({m.uuid})" for m in g.mig)
    return ", ".join(rows) if rows else "none"


def parse_visible_devices(
    value: str | int | Sequence[str | int] | None, machine: Machine
) -> list[Device]:
    """The devices a CUDA_VISIBLE_DEVICES value names, in its order.

    None means every GPU (its MIG instances instead where MIG is on); "" means
    none. Entries: NVML indices, GPU-/MIG- UUIDs, or unique prefixes of them.
    """
    if value is None:
        out: list[Device] = []
        for g in machine.gpus:
            out.extend([Device(g, m) for m in g.mig] if g.mig else [Device(g)])
        return out
    if isinstance(value, int):
        entries = [str(value)]
    elif isinstance(value, str):
        entries = [e.strip() for e in value.split(",")] if value.strip() else []
    else:
        entries = [str(e).strip() for e in value]
    seen: list[Device] = []
    for entry in entries:
        device = _parse_entry(entry, machine)
        if device in seen:
            raise DeviceError(
                f"CUDA_VISIBLE_DEVICES names {device.label} twice (entry {entry!r}); "
                "name each GPU once"
            )
        seen.append(device)
    return seen


VISIBLE_ACCEPTED = (
    "comma-separated GPU indices or GPU-/MIG- UUIDs (or unique prefixes of them), "
    "each once, e.g. '0,1' or 'GPU-5e4a'"
)


def _form_error(message: str) -> OptionError:
    exc = OptionError(message)
    exc.option = "CUDA_VISIBLE_DEVICES"
    return exc


def check_visible_devices(value: object) -> None:
    """Check the form of a CUDA_VISIBLE_DEVICES value without looking at any GPU:
    empty entries ('0,,1'), words that are neither an index nor a UUID ('x'),
    negative indices and repeated entries are refused here; whether an entry names
    a GPU of this machine is parse_visible_devices' business."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, str, list, tuple)):
        raise _form_error(
            f"CUDA_VISIBLE_DEVICES={value!r} is not accepted; accepted: {VISIBLE_ACCEPTED}"
        )
    if isinstance(value, int):
        entries = [str(value)]
    elif isinstance(value, str):
        if not value.strip():
            raise _form_error(
                f"CUDA_VISIBLE_DEVICES={value!r} is empty: no GPU to start a "
                f"worker on; accepted: {VISIBLE_ACCEPTED}"
            )
        entries = [e.strip() for e in value.split(",")]
    else:
        if not value:
            raise _form_error(
                f"CUDA_VISIBLE_DEVICES={value!r} is empty: no GPU to start a "
                f"worker on; accepted: {VISIBLE_ACCEPTED}"
            )
        for e in value:
            if isinstance(e, bool) or not isinstance(e, (int, str)):
                raise _form_error(
                    f"CUDA_VISIBLE_DEVICES={value!r}: entry {e!r} is not an index "
                    f"or a UUID; accepted: {VISIBLE_ACCEPTED}"
                )
        entries = [str(e).strip() for e in value]
    seen: set[str] = set()
    for entry in entries:
        if not entry:
            problem = "has an empty entry"
        elif entry.isdigit() or entry.lower().startswith(("gpu-", "mig-")):
            key = str(int(entry)) if entry.isdigit() else entry.lower()
            if key not in seen:
                seen.add(key)
                continue
            problem = f"names {entry!r} twice"
        elif entry.lstrip("-").isdigit():
            problem = f"has a negative index {entry!r}"
        else:
            problem = f"has an entry {entry!r} that is neither an index nor a UUID"
        raise _form_error(f"CUDA_VISIBLE_DEVICES={value!r} {problem}; accepted: {VISIBLE_ACCEPTED}")


def _parse_entry(entry: str, machine: Machine) -> Device:
    if not entry:
        raise DeviceError(
            "CUDA_VISIBLE_DEVICES has an empty entry; give comma-separated indices or UUIDs "
            f"such as '0,1'. Visible GPUs: {_describe(machine)}"
        )
    if entry.lstrip("-").isdigit():
        index = int(entry)
        for g in machine.gpus:
            if g.index == index:
                return Device(g)
        raise DeviceError(
            f"CUDA_VISIBLE_DEVICES entry {entry!r} names no GPU; accepted: indices "
            f"0..{len(machine.gpus) - 1} or UUIDs. Visible GPUs: {_describe(machine)}"
        )
    candidates = [Device(g) for g in machine.gpus] + [
        Device(g, m) for g in machine.gpus for m in g.mig
    ]
    if entry.lower().startswith(("gpu-", "mig-")):
        matches = [d for d in candidates if d.uuid.lower().startswith(entry.lower())]
        if len(matches) == 1:
            return Device(matches[0].gpu, matches[0].mig, by_uuid=True)
        if len(matches) > 1:
            raise DeviceError(
                f"CUDA_VISIBLE_DEVICES entry {entry!r} is a prefix of several UUIDs "
                f"({', '.join(d.uuid for d in matches)}); give more of it"
            )
    raise DeviceError(
        f"CUDA_VISIBLE_DEVICES entry {entry!r} names no visible GPU; accepted: an index, "
        f"a GPU-/MIG- UUID or a unique prefix of one. Visible GPUs: {_describe(machine)}"
    )


def rotate(devices: Sequence[str], i: int) -> list[str]:
    """The device list worker i is given: its own device first, then the rest."""
    if not devices:
        return []
    i %= len(devices)
    return list(devices[i:]) + list(devices[:i])


def worker_visible_devices(devices: Sequence[Device], i: int) -> str:
    """CUDA_VISIBLE_DEVICES for worker i: each device as it was named, its full UUID
    where a UUID (or a prefix) named it and for MIG instances, else its index."""
    ids = [d.uuid if d.by_uuid else str(d.gpu.index) for d in devices]
    return ",".join(rotate(ids, i))
