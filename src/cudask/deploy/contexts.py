"""A CUDA context of this process on a GPU its workers will own, named at start.

Covers: `own_contexts`, the contexts a process holds on given devices as NVML
lists them (`cudask.devices.ProcessBackend`), and `warn_own_contexts`, which
LocalCUDACluster and CUDAWorker call once, before any worker starts: a context
that this process (the client, the scheduler and the nannies of a
LocalCUDACluster; the nannies of `cudask worker`) made on a worker's GPU — CuPy,
cuDF, Numba, PyTorch or RMM used before the cluster started — holds device
memory the worker never gets back. The warning (`CUDAContextWarning`, which
`warnings.filterwarnings("error", category=...)` turns into an error) names the
pid, each GPU, the memory held there and how to avoid it. Where NVML cannot list
processes (no NVML, a MIG instance it does not list, a driver that does not
tell), nothing is said.

Does not cover: other processes on a worker's GPU, which each worker names in
its log (cudask.worker.neighbours); contexts made after the cluster started.

Threading: reads NVML and warns from the calling thread; no state of its own.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Sequence

from dask.utils import format_bytes

from cudask.devices import Device, GPUProcess, NVMLUnavailable, ProcessBackend, default_backend
from cudask.errors import CUDAContextWarning

logger = logging.getLogger("cudask")

AVOID = (
    "start the cluster before this process uses the GPU (CuPy, cuDF, Numba, PyTorch, RMM "
    "or a library that imports them), or leave this GPU to this process: a "
    "CUDA_VISIBLE_DEVICES for the workers without it (docs/cuda-contexts.md)"
)


def own_contexts(
    devices: Sequence[Device], pid: int, backend: ProcessBackend | None = None
) -> list[tuple[Device, GPUProcess]]:
    """The contexts process `pid` holds on `devices`, each with its device; devices
    whose processes NVML cannot list are left out."""
    backend = backend if backend is not None else default_backend()
    found = []
    for device in devices:
        try:
            listed = backend.compute_processes(device.uuid)
        except NVMLUnavailable as exc:
            logger.debug("cudask: cannot list the processes on %s: %s", device.label, exc)
            continue
        found += [(device, p) for p in listed if p.pid == pid]
    return found


def describe(found: Sequence[tuple[Device, GPUProcess]], pid: int, role: str) -> str:
    """The warning's text: who, where, how much, how to avoid it."""
    places = ", ".join(
        f"{d.label} ({d.uuid}, "
        f"{format_bytes(p.used_memory) if p.used_memory is not None else 'memory not reported'})"
        for d, p in found
    )
    return (
        f"this process (pid {pid}: {role}) holds a CUDA context on {places}, which its "
        f"workers will use: what the context holds there is lost to them. To avoid it, "
        f"{AVOID}"
    )


def warn_own_contexts(
    devices: Sequence[Device],
    role: str = "the client, scheduler and nannies",
    *,
    backend: ProcessBackend | None = None,
    stacklevel: int = 3,
) -> list[tuple[Device, GPUProcess]]:
    """Warn once (CUDAContextWarning) when this process holds a CUDA context on one
    of `devices`; return what was found. Never raises for NVML's sake."""
    pid = os.getpid()
    try:
        found = own_contexts(devices, pid, backend)
    except NVMLUnavailable as exc:  # no NVML at all
        logger.debug("cudask: cannot list the processes on the workers' GPUs: %s", exc)
        return []
    if found:
        warnings.warn(describe(found, pid, role), CUDAContextWarning, stacklevel=stacklevel)
    return found


__all__ = ["AVOID", "describe", "own_contexts", "warn_own_contexts"]
