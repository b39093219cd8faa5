"""Kubernetes resources for cudask GPU clusters, checked before anything is created.

Covers: `check_pods()`, which checks every input (cudask.deploy.kube_checks, each
failing with a one-line OptionError that names the value and what is accepted)
into a `GPUPods` record, and what the checked `GPUPods` turn into:

- `cluster_spec()`: a DaskCluster resource (`kubernetes.dask.org/v1`) for the
  dask-kubernetes operator, made by the operator's own `make_cluster_spec` and then
  adjusted: worker pods run `cudask worker` (one dask worker per GPU the pod gets)
  with `nvidia.com/gpu` limits, CPU and memory, and `--memory-limit` = pod memory /
  GPUs; the scheduler pod has no GPU (`NVIDIA_VISIBLE_DEVICES=void`,
  `CUDA_VISIBLE_DEVICES=""`) and runs `dask scheduler` with cudask's monitor and the
  pod-counting API the operator scales through (cudask.deploy.operator_api).
- `helm_values()`: values for the dask Helm chart (dask/helm-chart, chart `dask`)
  that run the same pods.

Does not cover: talking to Kubernetes (cudask.deploy.kubernetes), which GPUs a pod
gets (the NVIDIA device plugin: docs/kubernetes.md).

Threading: pure functions of their inputs; call them from any thread.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cudask.deploy.kube_checks import (
    GPU_RESOURCE,
    MAX_CLUSTER_NAME,
    WORKER_COMMAND,
    check_count,
    check_cpu,
    check_dns_label,
    check_env,
    check_gpu_resource,
    check_gpus,
    check_image,
    check_known,
    check_memory,
    check_namespace,
    check_resources,
    check_service_type,
    check_worker_command,
    check_worker_options,
    memory_quantity,
)
from cudask.errors import OptionError, require
from cudask.options import BY_NAME, flag_args
from cudask.worker import sharing

SCHEDULER_COMMAND = (
    "dask",
    "scheduler",
    "--host",
    "0.0.0.0",
    "--preload",
    "cudask.monitor",
    "--preload",
    "cudask.deploy.operator_api",
)
INSTALL = "pip install 'cudask[kubernetes]'"
#: The scheduler pod never sees a GPU: the NVIDIA container runtime injects none
#: (`void`), and CUDA would find none if it did.
NO_GPU_ENV = {"NVIDIA_VISIBLE_DEVICES": "void", "CUDA_VISIBLE_DEVICES": ""}


@dataclass(frozen=True)
class GPUPods:
    """Checked inputs: one scheduler pod and `num_workers` worker pods of `gpus` GPUs."""

    name: str
    namespace: str | None  # None: the current kubectl context's
    image: str
    num_workers: int
    gpus: int
    worker_cpu: str  # Kubernetes quantities
    worker_memory: int  # bytes per worker pod
    scheduler_cpu: str
    scheduler_memory: int
    gpu_resource: str = GPU_RESOURCE
    env: list[dict[str, Any]] = field(default_factory=list)
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)
    worker_options: dict[str, Any] = field(default_factory=dict)  # canonical, as given
    worker_command: tuple[str, ...] = WORKER_COMMAND
    scheduler_service_type: str = "ClusterIP"
    idle_timeout: int = 0

    @property
    def workers_per_pod(self) -> int:
        """dask workers of each pod: its GPUs x workers_per_gpu."""
        return self.gpus * sharing.workers_per_gpu(self.worker_options)

    @property
    def memory_per_worker(self) -> int:
        """Host memory of each GPU worker: the pod's, shared evenly by its workers."""
        return self.worker_memory // self.workers_per_pod

    def worker_flags(self) -> list[str]:
        """`cudask worker` flags for the worker options (memory_limit always among them)."""
        args: list[str] = []
        for key, value in self.worker_options.items():
            args += flag_args(BY_NAME[key], value)
        return args

    def worker_args(self) -> list[str]:
        return [*self.worker_command, *self.worker_flags()]


def check_pods(
    *,
    name: str | None = None,
    namespace: str | None = None,
    image: str | None = None,
    num_workers: int = 1,
    nvidia_gpu: int = 1,
    worker_cpu: Any = 4,
    worker_memory: Any = 16,
    scheduler_cpu: Any = 1,
    scheduler_memory: Any = 4,
    env: Any = None,
    resources: Any = None,
    gpu_resource: str = GPU_RESOURCE,
    worker_command: Sequence[str] | None = None,
    scheduler_service_type: str = "ClusterIP",
    idle_timeout: int = 0,
    worker_resources: Any = None,
    **worker_options: Any,
) -> GPUPods:
    """Every input checked, nothing created. Memory in GiB when a number ('12Gi' etc.
    as strings), CPU in cores; `num_workers` counts worker pods, each with `nvidia_gpu`
    GPUs and as many dask workers; `resources` are the worker pods' extra Kubernetes
    resources; `worker_options` are `cudask worker`'s (docs/options.md), with
    `worker_resources` for its `resources` (dask's abstract resources, 'GPU=1').
    `namespace` None: the current kubectl context's (the manifest names none).
    Raises OptionError (`option` names the keyword at fault)."""
    check_known(worker_options)
    if worker_resources is not None:
        worker_options["resources"] = worker_resources
    gpu_resource = check_gpu_resource(gpu_resource)
    gpus = check_gpus(nvidia_gpu)
    pod_memory = check_memory("worker_memory", worker_memory)
    command = check_worker_command(worker_command)
    scheduler_service_type = check_service_type(scheduler_service_type)
    return GPUPods(
        name=check_dns_label("name", name, MAX_CLUSTER_NAME, "gpu-cluster")
        if name is not None
        else f"cudask-{uuid.uuid4().hex[:10]}",
        namespace=check_namespace(namespace),
        image=check_image(image),
        num_workers=check_count("num_workers", num_workers, 0, 2),
        gpus=gpus,
        worker_cpu=check_cpu("worker_cpu", worker_cpu),
        worker_memory=pod_memory,
        scheduler_cpu=check_cpu("scheduler_cpu", scheduler_cpu),
        scheduler_memory=check_memory("scheduler_memory", scheduler_memory),
        gpu_resource=gpu_resource,
        env=check_env(env),
        resources=check_resources(resources, gpu_resource),
        worker_options=check_worker_options(worker_options, gpus, pod_memory),
        worker_command=command,
        scheduler_service_type=scheduler_service_type,
        idle_timeout=check_count("idle_timeout", idle_timeout, 0, 3600),
    )


# ------------------------------------------------------------------------ resources
def worker_resources(p: GPUPods) -> dict[str, dict[str, str]]:
    """A worker container's resources: CPU and memory requested as limited (so the pod
    is not evicted first under memory pressure), the GPUs as a limit. Quantities are
    strings: the operator's CRD takes nothing else (Kubernetes also takes numbers)."""
    extra = {part: {k: str(v) for k, v in amounts.items()} for part, amounts in p.resources.items()}
    limits = {
        "cpu": p.worker_cpu,
        "memory": memory_quantity(p.worker_memory),
        p.gpu_resource: str(p.gpus),
        **extra.get("limits", {}),
    }
    requests = {
        "cpu": p.worker_cpu,
        "memory": memory_quantity(p.worker_memory),
        **extra.get("requests", {}),
    }
    return {"limits": limits, "requests": requests}


def scheduler_resources(p: GPUPods) -> dict[str, dict[str, str]]:
    amounts = {"cpu": p.scheduler_cpu, "memory": memory_quantity(p.scheduler_memory)}
    return {"limits": dict(amounts), "requests": dict(amounts)}


def scheduler_args(p: GPUPods) -> list[str]:
    """`dask scheduler` with cudask's monitor page and the pod-counting /api/v1."""
    return [*SCHEDULER_COMMAND, "--gpus-per-pod", str(p.workers_per_pod)]  # workers, each pod


def scheduler_env(p: GPUPods) -> list[dict[str, Any]]:
    return [*copy.deepcopy(p.env), *({"name": k, "value": v} for k, v in NO_GPU_ENV.items())]


def cluster_spec(p: GPUPods) -> dict[str, Any]:
    """The DaskCluster resource: the operator's make_cluster_spec, adjusted."""
    operator = require(
        "dask_kubernetes.operator", needed_for="cudask's Kubernetes clusters", install=INSTALL
    )
    spec: dict[str, Any] = operator.make_cluster_spec(  # type: ignore[attr-defined]
        name=p.name,
        image=p.image,
        n_workers=p.num_workers,
        resources=None,
        env=copy.deepcopy(p.env),
        worker_command=p.worker_args(),  # + --name $(DASK_WORKER_NAME) --dashboard ...
        scheduler_service_type=p.scheduler_service_type,
        idle_timeout=p.idle_timeout,
    )
    if p.namespace is not None:
        spec["metadata"]["namespace"] = p.namespace
    worker = spec["spec"]["worker"]["spec"]["containers"][0]
    worker["resources"] = worker_resources(p)
    worker["env"] = copy.deepcopy(p.env)
    scheduler = spec["spec"]["scheduler"]["spec"]["containers"][0]
    scheduler["args"] = scheduler_args(p)
    scheduler["env"] = scheduler_env(p)
    scheduler["resources"] = scheduler_resources(p)
    return spec


# ------------------------------------------------------------------------ Helm chart
def helm_values(p: GPUPods) -> dict[str, Any]:
    """Values for the dask Helm chart (`helm install NAME dask/dask -f values.yaml`).

    The chart's worker container runs `<worker.image.dask_worker> <scheduler URL>
    [--nthreads T --memory-limit <pod limit>] --no-dashboard --dashboard-address P
    <extraArgs>` (dask/templates/dask-worker-deployment.yaml). cudask's command is two
    words, so `dask_worker` is `cudask` and `custom_scheduler_url` holds `worker`; the
    scheduler's address opens extraArgs, and the `--memory-limit` there (each GPU
    worker's share) overrides the chart's (the pod's): the later flag wins. Each
    worker is named after its pod (POD_NAME, from the downward API).
    `fullnameOverride` makes the scheduler's service `<name>-scheduler`."""
    if len(p.worker_command) != 2:
        raise OptionError(
            f"worker_command={list(p.worker_command)!r}: the Helm "
            "chart puts its flags after the command's second word, "
            "so it takes a two-word command; accepted: e.g. "
            "['cudask', 'worker']",
            option="worker_command",
        )
    last = p.image.rsplit("/", 1)[-1]
    repository, tag = p.image.rsplit(":", 1) if ":" in last else (p.image, "latest")
    image = {"repository": repository, "tag": tag}
    env = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        *copy.deepcopy(p.env),
    ]
    return {
        "fullnameOverride": p.name,
        "scheduler": {
            "image": dict(image),
            "extraArgs": ["--preload", "cudask.monitor"],
            "env": scheduler_env(p),
            "resources": scheduler_resources(p),
        },
        "worker": {
            "image": {**image, "dask_worker": p.worker_command[0]},
            "custom_scheduler_url": p.worker_command[1],
            "replicas": p.num_workers,
            "threads_per_worker": p.worker_options.get("nthreads") or 1,
            "resources": worker_resources(p),
            "env": env,
            "extraArgs": [
                f"tcp://{p.name}-scheduler:8786",
                *p.worker_flags(),
                "--name",
                "$(POD_NAME)",
            ],
        },
    }


__all__ = [
    "GPUPods",
    "check_pods",
    "cluster_spec",
    "helm_values",
    "memory_quantity",
    "scheduler_args",
    "scheduler_env",
    "scheduler_resources",
    "worker_resources",
]
