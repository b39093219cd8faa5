"""cudask: one dask.distributed worker per NVIDIA GPU.

Importing cudask registers its config defaults with dask.config and does
nothing else: no environment writes, no CUDA context, no NVML calls. The
cluster classes are imported lazily on first use. When a dask config file cannot
be read, dask cannot be imported at all: importing cudask then registers nothing,
the `cudask` command names the file (cudask.cli.main), and the first use of dask
raises dask's own error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

try:
    from cudask import config as config  # registers the `cudask` config defaults
except ValueError as exc:
    # A dask config file that YAML cannot read: dask itself cannot be imported. The
    # `cudask` command says so on one line (cudask.cli.main); using dask raises dask's error.
    if not str(exc).startswith("A dask config file at "):
        raise

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
