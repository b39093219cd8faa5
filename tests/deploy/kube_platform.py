"""The platform wrapper's call shared by the Kubernetes tests (test_kubernetes*.py):
its keywords (memory in GiB, with the image and namespace it implies), and the
DaskCluster cudask makes of them, with other keywords over them."""

from __future__ import annotations

from typing import Any

from cudask.deploy.kube_spec import check_pods, cluster_spec

# The platform wrapper's call (memory in GiB), with the image and namespace it implies
PLATFORM: dict[str, Any] = {
    "num_workers": 2,
    "worker_cpu": 4,
    "nvidia_gpu": 2,
    "worker_memory": 12,
    "scheduler_cpu": 4,
    "scheduler_memory": 12,
    "image": "registry.example.com/cudask:0.1.0",
    "namespace": "dask-gpu",
    "name": "gpu-cluster",
}


def _spec(**kwargs: Any) -> dict[str, Any]:
    return cluster_spec(check_pods(**{**PLATFORM, **kwargs}))
