"""`cudask info`: one row per GPU with what discovery found, as text or JSON.

Covers: formatting a Machine for people and for programs. With no GPU or no
NVML library it says so and exits 0. Its last line says which package `dask cuda`
runs (cudask, or dask-cuda where that is installed; cudask.cli.dask_cuda_owner).
Does not cover: discovery itself. Threading: runs in the command's thread only.
"""

from __future__ import annotations

import json

import click

from cudask.cli.dask_cuda_owner import dask_cuda_runs, which_line
from cudask.devices import Machine, discover
from cudask.devices.topology import format_cpus
from cudask.sizes import format_bytes


def _mem(n: int | None) -> str:
    return format_bytes(n) if n is not None else "shared"


def render(machine: Machine) -> str:
    """The human-readable report of `cudask info`."""
    if not machine.gpus:
        why = machine.nvml_error or "NVML lists no GPU"
        return f"No NVIDIA GPU found ({why}).\nCPUs this process may use: {format_cpus(machine.allowed_cpus)}"
    lines = [
        (
            f"NVIDIA driver {machine.driver_version}, CUDA {machine.cuda_version}, "
            f"{len(machine.gpus)} GPU(s); CPUs this process may use: {format_cpus(machine.allowed_cpus)}"
        ),
    ]
    header = (
        "GPU",
        "Name",
        "Memory (free/total)",
        "PCI bus",
        "NUMA",
        "CPU affinity",
        "NICs",
        "UUID",
    )
    rows = [header]
    for g in machine.gpus:
        mem = (
            f"{_mem(g.memory_free)}/{_mem(g.memory_total)}"
            if g.dedicated_memory
            else "shared (SoC)"
        )
        rows.append(
            (
                str(g.index),
                g.name,
                mem,
                g.pci_bus_id,
                "-" if g.numa_node is None else str(g.numa_node),
                format_cpus(g.cpu_affinity),
                ",".join(g.nics) or "-",
                g.uuid,
            )
        )
        for m in g.mig:
            rows.append(
                (
                    f"{g.index}.{m.index}",
                    "  MIG",
                    f"{_mem(m.memory_free)}/{_mem(m.memory_total)}",
                    "",
                    "",
                    "",
                    "",
                    m.uuid,
                )
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


@click.command("info")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def info(as_json: bool) -> None:
    """List every GPU: memory, PCI bus, NUMA node, CPU affinity, NICs, UUID; and which package
    `dask cuda` runs."""
    machine = discover()
    if as_json:
        data = machine.to_dict()
        data["dask_cuda_runs"] = dask_cuda_runs()
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(render(machine))
        click.echo(which_line())
