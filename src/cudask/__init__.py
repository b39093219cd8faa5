"""cudask: one dask.distributed worker per NVIDIA GPU.

Importing cudask registers its config defaults with dask.config and does
nothing else: no environment writes, no CUDA context, no NVML calls. The
cluster classes are imported lazily on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cudask import config as config  # registers the `cudask` config defaults

__version__ = "0.1.0"

_LAZY = {
    "LocalCUDACluster": "cudask.deploy.local",
    "CUDAWorker": "cudask.deploy.node",
    "KubeCUDACluster": "cudask.deploy.kubernetes",  # needs cudask[kubernetes]
    "DaskCudaCluster": "cudask.deploy.kubernetes",
}

if TYPE_CHECKING:
    from cudask.deploy.kubernetes import DaskCudaCluster as DaskCudaCluster
    from cudask.deploy.kubernetes import KubeCUDACluster as KubeCUDACluster
    from cudask.deploy.local import LocalCUDACluster as LocalCUDACluster
    from cudask.deploy.node import CUDAWorker as CUDAWorker


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cudask' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


# KubeCUDACluster and DaskCudaCluster (cudask[kubernetes]) are left out of `import *`
__all__ = ["CUDAWorker", "LocalCUDACluster", "__version__", "config"]
