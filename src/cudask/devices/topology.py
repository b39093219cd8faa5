"""Host topology read from sysfs: NUMA nodes and the network devices nearest a GPU.

Covers: normalising PCI bus ids, reading a device's NUMA node, and finding the
network/InfiniBand interfaces that share the closest PCI switch with a GPU by
walking /sys/bus/pci/devices (the same tree `nvidia-smi topo -m` reflects),
and formatting CPU sets. Does not cover: NVML (nvml.py).

Threading: pure reads of sysfs; call them from any thread.
"""

from __future__ import annotations

import os
import pathlib


def normalize_bus_id(bus_id: str) -> str:
    """NVML reports "00000000:1B:00.0"; sysfs names it "0000:1b:00.0"."""
    bus_id = bus_id.strip().lower()
    domain, _, rest = bus_id.partition(":")
    if rest and len(domain) > 4:
        domain = domain[-4:]
    return f"{domain}:{rest}" if rest else bus_id


def _device_path(bus_id: str, sysfs: str) -> pathlib.Path:
    return pathlib.Path(sysfs) / "bus" / "pci" / "devices" / normalize_bus_id(bus_id)


def numa_node(bus_id: str, sysfs: str = "/sys") -> int | None:
    """The NUMA node sysfs gives the PCI device, or None (-1 or unreadable)."""
    try:
        node = int((_device_path(bus_id, sysfs) / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def numa_node_of_cpus(cpus: tuple[int, ...] | None, sysfs: str = "/sys") -> int | None:
    """The NUMA node holding most of `cpus` (how `nvidia-smi topo -m` fills "NUMA
    Affinity" when the PCI device reports none), or None."""
    if not cpus:
        return None
    best: tuple[int, int] | None = None
    for node_dir in sorted(
        (pathlib.Path(sysfs) / "devices" / "system" / "node").glob("node[0-9]*")
    ):
        try:
            listed = parse_cpus((node_dir / "cpulist").read_text())
        except OSError:
            continue
        overlap = len(listed & set(cpus))
        if overlap and (best is None or overlap > best[0]):
            best = (overlap, int(node_dir.name[4:]))
    return best[1] if best else None


def parse_cpus(text: str) -> set[int]:
    """Parse a kernel CPU list such as "0-3,8,10-11"."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _pci_chain(path: pathlib.Path) -> list[str]:
    """The device and its PCI ancestors, nearest first."""
    try:
        real = path.resolve(strict=True)
    except OSError:
        return []
    parts = [p for p in real.parts if ":" in p and "." in p]
    return list(reversed(parts))


def nearest_nics(bus_id: str, sysfs: str = "/sys") -> tuple[str, ...]:
    """Names of network and InfiniBand devices nearest the GPU: those sharing
    the lowest PCI bridge with it first (PIX/PXB/PHB in `nvidia-smi topo -m`),
    else those on the GPU's NUMA node (NODE); () when none is near."""
    gpu_chain = _pci_chain(_device_path(bus_id, sysfs))
    if not gpu_chain:
        return ()
    root = pathlib.Path(sysfs)
    node = numa_node(bus_id, sysfs)
    nics: list[tuple[int, str]] = []
    for kind in ("net", "infiniband"):
        cls = root / "class" / kind
        if not cls.is_dir():
            continue
        for entry in sorted(cls.iterdir()):
            dev = entry / "device"
            if not dev.exists():
                continue  # virtual interfaces (lo, bridges, veth) have no PCI device
            chain = _pci_chain(dev)
            shared = [depth for depth, bridge in enumerate(gpu_chain) if bridge in chain]
            if shared:
                nics.append((shared[0], entry.name))
            elif node is not None and numa_node(chain[0] if chain else "", sysfs) == node:
                nics.append((len(gpu_chain), entry.name))
    if not nics:
        return ()
    best = min(depth for depth, _ in nics)
    return tuple(sorted({name for depth, name in nics if depth == best}))


def format_cpus(cpus: tuple[int, ...] | list[int] | set[int]) -> str:
    """Compact CPU list, as in /proc/self/status: 0-15,32-47."""
    ordered = sorted(set(cpus))
    if not ordered:
        return ""
    runs: list[str] = []
    start = prev = ordered[0]
    for c in ordered[1:] + [None]:  # type: ignore[list-item]
        if c is not None and c == prev + 1:
            prev = c
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if c is not None:
            start = prev = c
    return ",".join(runs)


def allowed_cpus() -> set[int]:
    """The CPUs this process may run on."""
    return set(os.sched_getaffinity(0))
