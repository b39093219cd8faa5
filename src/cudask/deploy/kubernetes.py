"""KubeCUDACluster: cudask GPU workers on Kubernetes, through the dask-kubernetes operator.

Covers: a dask_kubernetes.operator.KubeCluster whose DaskCluster is cudask's
(cudask.deploy.kube_spec: worker pods of `nvidia_gpu` GPUs running `cudask worker`,
a scheduler pod without a GPU), with every input checked before anything is
created, a bounded wait for the scheduler (`scheduler_timeout`) that deletes what
it created and says what it last saw, `scale(n)` in worker pods and
`get_client_url()`; and DaskCudaCluster, the interface of the platform wrapper
people use today (`DaskCudaCluster(num_workers=2, worker_cpu=4, nvidia_gpu=2,
worker_memory=12, scheduler_cpu=4, scheduler_memory=12)`, `init()`,
`get_client_url()`), as a thin layer over it.

Does not cover: the resources themselves (cudask.deploy.kube_spec), the scheduler's
pod-counting API the operator scales through (cudask.deploy.operator_api), or the
operator and the NVIDIA device plugin, which must be installed in the cluster
(docs/kubernetes.md). Needs `pip install 'cudask[kubernetes]'`.

Threading: as KubeCluster: sync use from one thread, async use on its loop.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import suppress
from typing import Any, Self

from cudask.deploy.kube_checks import GPU_RESOURCE, check_count
from cudask.deploy.kube_spec import INSTALL, GPUPods, check_pods, cluster_spec
from cudask.errors import CudaskError, MissingDependencyError, OptionError

try:
    from dask_kubernetes.operator import KubeCluster
    from dask_kubernetes.operator.kubecluster.kubecluster import CreateMode
except ImportError as exc:  # pragma: no cover - the extra is installed for the tests
    raise MissingDependencyError(
        "dask_kubernetes", "cudask.deploy.kubernetes (KubeCUDACluster)", INSTALL
    ) from exc

#: Seconds to wait for the scheduler by default: a GPU image can take minutes to pull.
SCHEDULER_TIMEOUT = 600.0
#: Seconds given to deleting the DaskCluster after a start that timed out.
GIVE_UP_TIMEOUT = 60.0


class SchedulerTimeoutError(CudaskError, TimeoutError):
    """The scheduler did not come up in time; what was created has been deleted."""


def _seconds(keyword: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise OptionError(
            f"{keyword}={value!r} is not accepted; accepted: seconds above 0, e.g. {keyword}=600",
            option=keyword,
        )
    return float(value)


class KubeCUDACluster(KubeCluster):  # type: ignore[misc]
    """A dask cluster on Kubernetes with one dask worker per GPU of its worker pods.

    `num_workers` worker pods each get `nvidia_gpu` GPUs (`nvidia.com/gpu`, or
    `gpu_resource`), `worker_cpu` cores and `worker_memory` (GiB as a number, or
    '12Gi'), and run `cudask worker`: one worker per GPU, each with host memory
    `worker_memory / nvidia_gpu`. The scheduler pod gets `scheduler_cpu` and
    `scheduler_memory` and no GPU. `image` (with cudask installed) is required;
    `namespace` defaults to the current kubectl context's, as KubeCluster's does;
    `env` goes to every pod, `resources` (limits/requests) to the worker pods;
    other keywords are `cudask worker` options (docs/options.md).

    Every input is checked before anything is created. The start waits at most
    `scheduler_timeout` seconds for the scheduler; past that it deletes the
    DaskCluster and raises SchedulerTimeoutError. `scale(n)` and `adapt()` count
    worker pods. Needs the dask-kubernetes operator in the cluster.
    """

    def __init__(
        self,
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
        worker_command: list[str] | None = None,
        scheduler_service_type: str = "ClusterIP",
        idle_timeout: int = 0,
        scheduler_timeout: float = SCHEDULER_TIMEOUT,
        resource_timeout: int = 60,
        shutdown_on_close: bool = True,
        port_forward_cluster_ip: bool | None = None,
        scheduler_forward_port: int | None = None,
        quiet: bool = False,
        asynchronous: bool = False,
        loop: Any = None,
        **worker_options: Any,
    ) -> None:
        self.scheduler_timeout = _seconds("scheduler_timeout", scheduler_timeout)
        check_count("resource_timeout", resource_timeout, 1, 60)
        # every check, before anything is created
        self.pods: GPUPods = check_pods(
            name=name,
            namespace=namespace,
            image=image,
            num_workers=num_workers,
            nvidia_gpu=nvidia_gpu,
            worker_cpu=worker_cpu,
            worker_memory=worker_memory,
            scheduler_cpu=scheduler_cpu,
            scheduler_memory=scheduler_memory,
            env=env,
            resources=resources,
            gpu_resource=gpu_resource,
            worker_command=worker_command,
            scheduler_service_type=scheduler_service_type,
            idle_timeout=idle_timeout,
            **worker_options,
        )
        self.cluster_spec: dict[str, Any] = cluster_spec(self.pods)
        super().__init__(
            custom_cluster_spec=self.cluster_spec,
            namespace=self.pods.namespace,
            create_mode=CreateMode.CREATE_ONLY,  # never attach to someone else's cluster
            shutdown_on_close=shutdown_on_close,
            resource_timeout=resource_timeout,
            port_forward_cluster_ip=port_forward_cluster_ip,
            scheduler_forward_port=scheduler_forward_port,
            quiet=quiet,
            asynchronous=asynchronous,
            loop=loop,
        )

    async def _start(self) -> None:
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.scheduler_timeout) as deadline:
                await super()._start()
        except TimeoutError as exc:
            seen = self._last_seen()
            await self._give_up()
            p = self.pods
            namespace = getattr(self, "namespace", None) or p.namespace  # None: the context's
            where = f"-n {namespace} " if namespace else ""
            if deadline.expired():
                raise SchedulerTimeoutError(
                    f"the scheduler of cluster {p.name!r} (namespace {namespace!r}) was not up "
                    f"within scheduler_timeout={self.scheduler_timeout:g} s ({seen}); its "
                    f"DaskCluster was deleted. See `kubectl {where}describe pods -l "
                    f"dask.org/cluster-name={p.name}` (image pull? no node with the CPU or "
                    "memory asked for?), or give a longer scheduler_timeout"
                ) from None
            raise SchedulerTimeoutError(
                f"cluster {p.name!r} (namespace {namespace!r}) did not start after "
                f"{time.monotonic() - started:.0f} s: {exc} ({seen}); is the dask-kubernetes "
                "operator running (`kubectl get pods -A -l "
                "app.kubernetes.io/name=dask-kubernetes-operator`)?"
            ) from None

    def _last_seen(self) -> str:
        """What KubeCluster last saw of the resources, for the error message."""
        status = dict(getattr(self, "_startup_component_status", {}) or {})
        if not status:
            return "no resource seen yet"
        labels = {
            "cluster": "DaskCluster",
            "schedulerpod": "scheduler pod",
            "schedulerservice": "scheduler service",
            "workergroup": "worker group",
        }
        return "last seen: " + ", ".join(f"{labels.get(k, k)} {v}" for k, v in status.items())

    async def _give_up(self) -> None:
        """Delete the DaskCluster created so far (if any), within a bound."""
        with suppress(Exception):
            await asyncio.wait_for(self._close(timeout=GIVE_UP_TIMEOUT), GIVE_UP_TIMEOUT)

    def scale(self, n: int, worker_group: str = "default") -> Any:  # type: ignore[override]
        """Scale to `n` worker pods, each running one dask worker per GPU it has
        (n * nvidia_gpu workers). The operator retires whole pods: the scheduler's
        /api/v1/retire_workers counts pods (cudask.deploy.operator_api)."""
        check_count("n", n, 0, 2)
        return super().scale(n, worker_group)

    def get_client_url(self) -> str:
        """The scheduler's address, for `Client(...)`."""
        return str(self.scheduler_address)


class DaskCudaCluster:
    """The platform wrapper's interface over KubeCUDACluster: arguments checked when
    it is made, the cluster created by `init()`.

        cluster = DaskCudaCluster(num_workers=2, worker_cpu=4, nvidia_gpu=2, worker_memory=12,
                                  scheduler_cpu=4, scheduler_memory=12,
                                  image="registry.example.com/cudask:0.1.0", namespace="dask")
        cluster.init()
        client = Client(cluster.get_client_url())

    Memory in GiB; `num_workers` counts worker pods. Other keywords are
    KubeCUDACluster's (image, namespace, env, resources, worker options, ...).
    """

    def __init__(
        self,
        num_workers: int = 1,
        worker_cpu: Any = 4,
        nvidia_gpu: int = 1,
        worker_memory: Any = 16,
        scheduler_cpu: Any = 1,
        scheduler_memory: Any = 4,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("name", f"cudask-{uuid.uuid4().hex[:10]}")
        self.kwargs: dict[str, Any] = dict(
            num_workers=num_workers,
            worker_cpu=worker_cpu,
            nvidia_gpu=nvidia_gpu,
            worker_memory=worker_memory,
            scheduler_cpu=scheduler_cpu,
            scheduler_memory=scheduler_memory,
            **kwargs,
        )
        cluster_keywords = {
            "scheduler_timeout",
            "resource_timeout",
            "shutdown_on_close",
            "port_forward_cluster_ip",
            "scheduler_forward_port",
            "quiet",
            "asynchronous",
            "loop",
        }
        if "scheduler_timeout" in kwargs:
            _seconds("scheduler_timeout", kwargs["scheduler_timeout"])
        self.pods = check_pods(
            **{k: v for k, v in self.kwargs.items() if k not in cluster_keywords}
        )
        self.cluster: KubeCUDACluster | None = None

    def init(self) -> KubeCUDACluster:
        """Create the cluster (once) and wait for its scheduler."""
        if self.cluster is None:
            self.cluster = KubeCUDACluster(**self.kwargs)
        return self.cluster

    def _started(self) -> KubeCUDACluster:
        if self.cluster is None:
            raise CudaskError("the cluster is not started yet: call init() first")
        return self.cluster

    def get_client_url(self) -> str:
        """The scheduler's address, for `Client(...)`."""
        return self._started().get_client_url()

    @property
    def dashboard_link(self) -> str:
        return str(self._started().dashboard_link)

    def scale(self, n: int) -> Any:
        """Scale to `n` worker pods."""
        return self._started().scale(n)

    def close(self) -> None:
        """Delete the cluster (nothing to do before init())."""
        if self.cluster is not None:
            self.cluster.close()

    def __enter__(self) -> Self:
        self.init()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["DaskCudaCluster", "KubeCUDACluster", "SchedulerTimeoutError"]
