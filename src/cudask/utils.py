"""The helpers of dask-cuda's `dask_cuda.utils` that users and libraries import, with its
names, arguments and return types, served by cudask's own parts.

Covers: GPU counts and facts (cudask.devices.queries), UCX settings and preload options
(cudask.comm.ucx), a cluster's configuration, printed or returned, and waiting for its
workers (cudask.deploy.inspection), and RMM's allocated bytes (cudask.worker.rmm).
Does not cover: dask-cuda's private helpers (names starting with "_", except
`_all_to_all`, which its tests call).

Threading: as the modules it re-exports; nothing of its own.
"""

from __future__ import annotations

from cudask.comm.ucx import get_preload_options, get_ucx_config
from cudask.deploy.inspection import (
    _all_to_all,
    all_to_all,
    get_cluster_configuration,
    get_scheduler_configuration,
    get_worker_config,
    print_cluster_config,
    wait_workers,
)
from cudask.devices.queries import (
    cuda_visible_devices,
    get_cpu_affinity,
    get_cpu_count,
    get_device_total_memory,
    get_gpu_count,
    get_gpu_count_mig,
    get_gpu_handle,
    get_gpu_uuid,
    get_n_gpus,
    has_device_memory_resource,
    nvml_device_index,
    parse_cuda_visible_device,
    parse_device_bytes,
    parse_device_memory_limit,
    unpack_bitmask,
)
from cudask.worker.rmm import get_rmm_device_memory_usage

__all__ = [
    "_all_to_all",
    "all_to_all",
    "cuda_visible_devices",
    "get_cluster_configuration",
    "get_cpu_affinity",
    "get_cpu_count",
    "get_device_total_memory",
    "get_gpu_count",
    "get_gpu_count_mig",
    "get_gpu_handle",
    "get_gpu_uuid",
    "get_n_gpus",
    "get_preload_options",
    "get_rmm_device_memory_usage",
    "get_scheduler_configuration",
    "get_ucx_config",
    "get_worker_config",
    "has_device_memory_resource",
    "nvml_device_index",
    "parse_cuda_visible_device",
    "parse_device_bytes",
    "parse_device_memory_limit",
    "print_cluster_config",
    "unpack_bitmask",
    "wait_workers",
]
