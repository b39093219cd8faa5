"""Each worker's sizes: device limit, RMM pool sizes, host limit and IPC staging area.

Covers: `device_sizes`, a worker's sizes parsed against its GPU's memory (a size
larger than the GPU is an error; with workers_per_gpu N, each worker's share, RMM
sizes 256-aligned: cudask.worker.sharing), `check_devices`, every device's before any
process starts (and CuPy, which spilling copies with), the warning for an RMM pool
larger than the device limit, `host_memory_limit` ('auto': an even share of the host),
and the CUDA IPC staging area and smallest IPC array (`staging_size`,
`device_ipc_min_size`). Does not cover: the specs built from them (cudask.worker.spec).

Threading: pure functions of the options and devices; any thread.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from dask.utils import format_bytes
from distributed.worker_memory import parse_memory_limit

from cudask import config
from cudask.comm import ipc_settings as comm_settings
from cudask.devices import Device
from cudask.errors import DeviceMemoryLimitWarning, MissingDependencyError, OptionError
from cudask.options import UCX_PROTOCOLS, WorkerOptions, require_library
from cudask.sizes import parse_size
from cudask.worker.sharing import share, workers_per_gpu

RMM_ALIGNMENT = 256


@dataclass(frozen=True)
class DeviceSizes:
    """Sizes of one worker, parsed against its device's memory (None: off); with
    several workers per GPU, each worker's share of them."""

    device_memory_limit: int | None
    rmm_pool_size: int | None
    rmm_maximum_pool_size: int | None
    rmm_release_threshold: int | None


def device_sizes(o: WorkerOptions, device: Device) -> DeviceSizes:
    """Parse the per-device sizes; a limit larger than the device is an error. With
    workers_per_gpu N, each worker gets 1/N of each (RMM sizes kept 256-aligned)."""
    total = device.memory_total
    where = f" on {device.label} ({device.gpu.name})"
    dedicated = device.gpu.dedicated_memory
    if not dedicated and o.device_memory_limit not in (None, "default", 0, "0"):
        raise OptionError(
            f"device_memory_limit={o.device_memory_limit!r}: {device.label} ({device.gpu.name}) "
            "has no dedicated memory, so there is nothing to spill from; leave it 'default'"
        )
    limit = parse_size(
        o.device_memory_limit,
        total=total,
        name="device_memory_limit" + where,
        auto=1.0 if dedicated else None,
        default=0.8 if dedicated else None,
        maximum=total,
    )

    def rmm(name: str) -> int | None:
        return parse_size(
            o[name],
            total=total,
            name=name + where,
            auto=1.0,
            default=None,
            maximum=total,
            alignment=RMM_ALIGNMENT,
        )

    pool, maximum = rmm("rmm_pool_size"), rmm("rmm_maximum_pool_size")
    if pool is not None and maximum is not None and maximum < pool:
        raise OptionError(
            f"rmm_maximum_pool_size={o.rmm_maximum_pool_size!r} is smaller than "
            f"rmm_pool_size={o.rmm_pool_size!r} on {device.label}, the size the "
            "pool starts at; accepted: a maximum at least as large, or none (the "
            "pool grows as needed)"
        )
    n = workers_per_gpu(o)
    return DeviceSizes(
        share(limit, n),
        share(pool, n, RMM_ALIGNMENT),
        share(maximum, n, RMM_ALIGNMENT),
        share(rmm("rmm_release_threshold"), n, RMM_ALIGNMENT),
    )


def check_devices(o: WorkerOptions, devices: Sequence[Device]) -> list[DeviceSizes]:
    """Every per-device size, parsed before any process starts; and CuPy, which the
    store copies device data with, when any worker will spill or hand out proxies."""
    sizes = [device_sizes(o, d) for d in devices]
    if device_ipc_min_size(o) is not None:
        for device, size in zip(devices, sizes, strict=True):
            staging_size(o, size, device)  # an area larger than the GPU: said now
    warn_pool_past_limit(o, sizes)
    if o.jit_unspill or any(s.device_memory_limit is not None for s in sizes):
        what = (
            "jit_unspill=True"
            if o.jit_unspill
            else (f"device_memory_limit={o.device_memory_limit!r} (spilling from the GPU)")
        )
        try:
            require_library("cupy", what)
        except MissingDependencyError as exc:
            raise MissingDependencyError(
                exc.library,
                exc.needed_for,
                exc.install + " -- or turn spilling off with device_memory_limit=None",
            ) from None
    return sizes


def warn_pool_past_limit(o: WorkerOptions, sizes: Sequence[DeviceSizes]) -> None:
    """One warning when an RMM pool reserves more than the device limit: the worker's
    GPU memory is then the pool's size whatever the store spills."""
    over = [
        s
        for s in sizes
        if s.rmm_pool_size is not None
        and s.device_memory_limit is not None
        and s.rmm_pool_size > s.device_memory_limit
    ]
    if over:
        s = over[0]
        warnings.warn(
            f"rmm_pool_size={o.rmm_pool_size!r} reserves {format_bytes(s.rmm_pool_size or 0)} "
            f"per worker up front, more than device_memory_limit={o.device_memory_limit!r} "
            f"({format_bytes(s.device_memory_limit or 0)}): each worker holds the pool's size "
            "on its GPU from the start, and the limit holds only what is allocated inside the "
            "pool. To hold the GPU to the limit, give rmm_pool_size at most the limit (the "
            "pool grows as needed, up to rmm_maximum_pool_size).",
            DeviceMemoryLimitWarning,
            stacklevel=3,
        )


def host_memory_limit(o: WorkerOptions, n_workers: int) -> int | None:
    """Host memory of each worker: 'auto' is an even share of the system's."""
    try:
        limit = parse_memory_limit(
            o.memory_limit,
            nthreads=1,
            total_cores=max(n_workers, 1),
            logger=logging.getLogger("cudask"),
        )
    except (ValueError, TypeError) as exc:
        raise OptionError(
            f"memory_limit={o.memory_limit!r} is not accepted ({exc}); accepted: bytes, '40GB', "
            "a fraction of system memory, 'auto' or 0/None"
        ) from None
    return limit or None


def staging_size(o: WorkerOptions, sizes: DeviceSizes, device: Device) -> int:
    """Bytes of the worker's IPC staging area (`cudask.comm.device-ipc-staging`, per
    GPU: with workers_per_gpu N each worker's share): none with an RMM pool whose
    slabs the host's workers map at start instead; an area with RMM memory CUDA cannot
    export (cudaMallocAsync, managed), pool or not. OptionError when it is more than
    the GPU's memory."""
    exportable_pool = sizes.rmm_pool_size and not (o.rmm_async or o.rmm_managed_memory)
    if exportable_pool:
        return 0
    area, total = comm_settings.device_ipc_staging(), device.memory_total
    if total is not None and area > total:
        raise OptionError(
            f"cudask.comm.device-ipc-staging={config.get('comm.device-ipc-staging')!r} "
            f"({format_bytes(area)}) is more than the memory of "
            f"{device.label} ({device.gpu.name}, {format_bytes(total)}): give a "
            "few percent of it, or 0 for no staging area"
        )
    return share(area, workers_per_gpu(o), 256) or 0


def device_ipc_min_size(o: WorkerOptions) -> int | None:
    """The smallest array sent to workers of the same host by CUDA IPC
    (`cudask.comm`), or None when IPC is off: by config, or under UCX, whose
    cuda_ipc transport does it and which chooses its own serializers."""
    size = comm_settings.device_ipc_min_size()
    return None if o.protocol in UCX_PROTOCOLS else size


__all__ = [
    "RMM_ALIGNMENT",
    "DeviceSizes",
    "check_devices",
    "device_ipc_min_size",
    "device_sizes",
    "host_memory_limit",
    "staging_size",
    "warn_pool_past_limit",
]
