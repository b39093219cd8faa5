"""`dask cuda config` / `cudask config`: what each GPU worker of a cluster runs with.

Covers: connecting to a scheduler and printing, per worker, its GPU, CPU
affinity, memory limits, data store, RMM set-up, protocol, device IPC and plugins.
Does not cover: changing anything. Threading: the command's thread (a synchronous
Client).
"""

from __future__ import annotations

import json
import os
from typing import Any

import click

from cudask.cli.connect import SchedulerTarget, connect, scheduler_options


def worker_report(dask_worker: Any) -> dict[str, Any]:
    """Runs on each worker (through Client.run)."""
    plugins = dict(dask_worker.plugins)
    ctx = plugins.get("cudask-cuda-context")
    rmm = plugins.get("cudask-rmm")
    device_ipc = plugins.get("cudask-device-ipc")
    store = dask_worker.data
    return {
        "name": str(dask_worker.name),
        "address": dask_worker.address,
        "protocol": dask_worker.address.split("://")[0],
        "nthreads": dask_worker.state.nthreads,
        "gpu": getattr(ctx, "uuid", None),
        "cuda_context_s": getattr(ctx, "seconds", None),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
        "memory_limit": dask_worker.memory_manager.memory_limit,
        "device_memory_limit": getattr(store, "device_memory_limit", None),
        "data": type(store).__module__ + "." + type(store).__qualname__,
        "rmm": rmm.describe() if rmm is not None else None,
        "device_ipc": _device_ipc(device_ipc),
        "plugins": list(plugins),
    }


def _device_ipc(plugin: Any) -> str:
    """Whether this worker sends device arrays to workers of its host by CUDA IPC."""
    from cudask.comm import ipc

    if plugin is None:
        return "off (cudask.comm.device-ipc is false, or UCX carries device data)"
    if ipc.enabled():
        return f"on (CuPy arrays of {plugin.min_size} bytes or more to workers of this host)"
    return f"off: {plugin.off_because or 'turned off'}"


def _render(reports: dict[str, dict[str, Any]]) -> str:
    from cudask.devices.topology import format_cpus
    from cudask.sizes import format_bytes

    lines = []
    for address, r in sorted(reports.items(), key=lambda kv: kv[1]["name"]):

        def size(n: int | None) -> str:
            return format_bytes(n) if n else "off"

        rmm = r["rmm"]
        rmm_text = (
            "default (no pool)"
            if rmm is None
            else ", ".join(
                f"{k}={format_bytes(v) if isinstance(v, int) and not isinstance(v, bool) else v}"
                for k, v in rmm.items()
                if v not in (None, False, [])
            )
        )
        context = r.get("cuda_context_s")
        context_text = f", context created in {context:.2f} s" if context is not None else ""
        lines += [
            f"worker {r['name']} at {address}",
            (
                f"  GPU              {r['gpu']} (CUDA_VISIBLE_DEVICES="
                f"{r['cuda_visible_devices']}{context_text})"
            ),
            f"  CPU affinity     {format_cpus(r['cpu_affinity'])}",
            f"  threads          {r['nthreads']}",
            f"  memory limit     host {size(r['memory_limit'])}, device {size(r['device_memory_limit'])}",
            f"  data store       {r['data']}",
            f"  RMM              {rmm_text}",
            f"  protocol         {r['protocol']}",
            f"  device IPC       {r.get('device_ipc', 'unknown')}",
            f"  plugins          {', '.join(r['plugins'])}",
        ]
    return "\n".join(lines) if lines else "no workers are connected"


@click.command("config", context_settings={"help_option_names": ["-h", "--help"]})
@scheduler_options
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def config(target: SchedulerTarget, as_json: bool) -> None:
    """Print each GPU worker's set-up: GPU, limits, RMM, protocol, plugins."""
    with connect(target) as client:
        reports = client.run(worker_report)
    click.echo(json.dumps(reports, indent=2) if as_json else _render(reports))
