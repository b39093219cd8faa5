"""dask-cuda's `worker_spec` under its own module name: the workers a LocalCUDACluster
would start, as SpecCluster specs (cudask.deploy.local.worker_spec).

Covers: the name only. Does not cover: building the specs (cudask.worker.spec).
Threading: as cudask.deploy.local.worker_spec, any thread.
"""

from __future__ import annotations

from cudask.deploy.local import worker_spec

__all__ = ["worker_spec"]
