"""The RMM worker plugin: memory resource stack and external allocators.

Covers: building the RMM memory resource for one worker from the rmm_* options
— a pool (PoolMemoryResource over CUDA memory, its slabs recorded for
cudask.comm.lifetimes, or over managed memory) or the async
allocator (CudaAsyncMemoryResource, optionally under a LimitingResourceAdaptor
for rmm_maximum_pool_size), then logging and tracking adaptors — making it
the current device resource, and routing CuPy's and PyTorch's allocations
through it; teardown restores the previous resource and CuPy allocator. Sizes
arrive as bytes (parsed per device by the spec builder).
Does not cover: option validation (cudask.options), which slabs stay mapped in
the workers they are sent to (cudask.comm.lifetimes).

Threading: setup and teardown run on the worker's event loop; the resource
they set is process-wide, shared by every thread's allocations.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from distributed import WorkerPlugin

from cudask.comm import lifetimes


class RMMSetup(WorkerPlugin):
    """Make the rmm_* options' memory resource the worker's, and route the
    `external_libs` (CuPy, PyTorch) through it."""

    name = "cudask-rmm"

    def __init__(
        self,
        *,
        pool_size: int | None,
        maximum_pool_size: int | None,
        managed_memory: bool,
        async_alloc: bool,
        release_threshold: int | None,
        log_directory: str | None,
        track_allocations: bool,
        external_libs: Sequence[str] = (),
    ) -> None:
        self.pool_size = pool_size
        self.maximum_pool_size = maximum_pool_size
        self.managed_memory = managed_memory
        self.async_alloc = async_alloc
        self.release_threshold = release_threshold
        self.log_directory = log_directory
        self.track_allocations = track_allocations
        self.external_libs = tuple(external_libs)
        self.previous: Any = None
        self.previous_cupy: Any = None
        self.resource: Any = None
        self.slabs: lifetimes.Slabs | None = None  # a pool over cudaMalloc: its slabs
        self.active = False

    @property
    def needed(self) -> bool:
        return bool(
            self.pool_size is not None
            or self.managed_memory
            or self.async_alloc
            or self.log_directory
            or self.track_allocations
            or self.external_libs
        )

    def describe(self) -> dict[str, Any]:
        """The settings, under dask-cuda's names (its get_cluster_configuration reads
        them as "[plugin] RMMSetup")."""
        return {
            "initial_pool_size": self.pool_size,
            "maximum_pool_size": self.maximum_pool_size,
            "managed_memory": self.managed_memory,
            "async_alloc": self.async_alloc,
            "release_threshold": self.release_threshold,
            "log_directory": self.log_directory,
            "track_allocations": self.track_allocations,
            "external_lib_list": list(self.external_libs),
        }

    def _resource(self, worker: Any) -> Any:
        import rmm

        mr: Any
        if self.async_alloc:
            mr = rmm.mr.CudaAsyncMemoryResource(
                initial_pool_size=self.pool_size, release_threshold=self.release_threshold
            )
            if self.maximum_pool_size is not None:
                mr = rmm.mr.LimitingResourceAdaptor(mr, allocation_limit=self.maximum_pool_size)
        else:
            if self.managed_memory:
                mr = rmm.mr.ManagedMemoryResource()
            elif self.pool_size is not None:
                # The pool's slabs, recorded: they live as long as the pool, so a worker
                # receiving them by CUDA IPC may keep them mapped (cudask.comm.lifetimes).
                self.slabs = lifetimes.Slabs(rmm.mr.CudaMemoryResource())
                mr = rmm.mr.CallbackMemoryResource(self.slabs.allocate, self.slabs.deallocate)
            else:
                mr = rmm.mr.CudaMemoryResource()
            if self.pool_size is not None:
                mr = rmm.mr.PoolMemoryResource(
                    mr, initial_pool_size=self.pool_size, maximum_pool_size=self.maximum_pool_size
                )
        if self.log_directory:
            os.makedirs(self.log_directory, exist_ok=True)
            safe = str(worker.name).replace("/", "_").replace(":", "_")
            mr = rmm.mr.LoggingResourceAdaptor(
                mr, log_file_name=os.path.join(self.log_directory, f"rmm_log_{safe}.txt")
            )
        if self.track_allocations:
            mr = rmm.mr.TrackingResourceAdaptor(mr)
        return mr

    def setup(self, worker: Any) -> None:
        if self.active or not self.needed:
            return
        import rmm

        self.previous = rmm.mr.get_current_device_resource()
        self.resource = self._resource(worker)
        rmm.mr.set_current_device_resource(self.resource)
        for lib in self.external_libs:
            if lib == "cupy":
                import cupy
                from rmm.allocators.cupy import rmm_cupy_allocator

                self.previous_cupy = cupy.cuda.get_allocator()
                cupy.cuda.set_allocator(rmm_cupy_allocator)
            elif lib == "torch":
                import torch
                from rmm.allocators.torch import rmm_torch_allocator

                try:
                    torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
                except RuntimeError as exc:  # torch already allocated with its own
                    raise RuntimeError(
                        f"worker {worker.name}: PyTorch already allocated GPU memory, so its "
                        f"allocator can no longer be set to RMM ({exc})"
                    ) from exc
        self.active = True

    def teardown(self, worker: Any) -> None:
        """Restore the previous resource and CuPy allocator. PyTorch cannot change its
        allocator back once it has been used; it keeps RMM's. A pool one of whose
        slabs went to another worker by IPC handle is held until the process ends
        (cudask.comm.lifetimes.keep_if_shared)."""
        if not self.active:
            return
        import rmm

        if self.previous_cupy is not None:
            import cupy

            cupy.cuda.set_allocator(self.previous_cupy)
        rmm.mr.set_current_device_resource(self.previous)
        if self.slabs is not None:
            lifetimes.keep_if_shared(self.slabs, self.resource)
            self.slabs = None
        self.resource = None
        self.active = False


def get_rmm_device_memory_usage() -> int | None:
    """Bytes allocated through RMM on the current device, where the current resource
    stack counts them (a tracking or statistics adaptor); None otherwise, or without
    RMM."""
    try:
        import rmm
    except ImportError:
        return None
    resource = rmm.mr.get_current_device_resource()
    while resource is not None:
        if isinstance(resource, rmm.mr.TrackingResourceAdaptor):
            return int(resource.get_allocated_bytes())
        if isinstance(resource, rmm.mr.StatisticsResourceAdaptor):
            return int(resource.allocation_counts["current_bytes"])
        resource = getattr(resource, "upstream_mr", None)
    return None
