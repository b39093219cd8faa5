"""Kubernetes GPU clusters without a cluster and without a GPU (cudask.deploy.kubernetes,
.operator_api, .node): scaling down by pod, and the cluster classes.

- Scaling down by pod: a real scheduler with cudask's /api/v1 and workers named and
  tagged as CUDAWorker names them, asked by the operator controller's own
  `retire_workers`, retires whole pods and answers their Deployment names.
- KubeCUDACluster / DaskCudaCluster over a fake KubeCluster: built from the checked
  spec, scale() in pods, close(), a bounded wait for a scheduler that never comes up.
"""

from __future__ import annotations

import asyncio
import logging
import math
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

try:
    from dask_kubernetes.operator import KubeCluster
except ImportError:  # comes with cudask[test-deploy]
    pytest.skip(
        "needs dask-kubernetes (pip install -e '.[test,test-deploy]')", allow_module_level=True
    )
from distributed import Client, Scheduler, Worker
from kube_platform import PLATFORM, _spec

from cudask.deploy import kubernetes as kube
from cudask.deploy import operator_api
from cudask.errors import CudaskError, OptionError
from cudask.worker.spec import node_information


# ------------------------------------------------------------ naming and scaling down
def test_cuda_worker_tells_the_scheduler_its_node(monkeypatch: pytest.MonkeyPatch) -> None:
    from cudask.deploy import node
    from cudask.devices import discover
    from cudask.testing import FakeBackend, fake_gpu

    machine = discover(FakeBackend([fake_gpu(0, cpus=range(2)), fake_gpu(1, cpus=range(2))]))
    monkeypatch.setattr(node, "discover", lambda: machine)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    async def build(**kwargs: Any) -> node.CUDAWorker:
        return node.CUDAWorker("tcp://10.0.0.1:8786", device_memory_limit=None, **kwargs)

    w = asyncio.run(build(name="gpu-cluster-default-worker-0123456789"))
    assert [n.name for n in w.nannies] == [
        "gpu-cluster-default-worker-0123456789-0",
        "gpu-cluster-default-worker-0123456789-1",
    ]
    for n in w.nannies:
        info = {k: f(None) for k, f in n.worker_kwargs["startup_information"].items()}
        assert info == {
            "cudask_node": "gpu-cluster-default-worker-0123456789",
            "cudask_node_workers": 2,
        }
    unnamed = asyncio.run(build())
    assert all("startup_information" not in n.worker_kwargs for n in unnamed.nannies)


async def _pods(scheduler: Scheduler, names: list[str], gpus: int) -> list[Worker]:
    """In-process workers as `cudask worker --name POD` starts them in each pod."""
    workers = []
    for pod in names:
        for i in range(gpus):
            worker_name = pod if gpus == 1 else f"{pod}-{i}"
            workers.append(
                await Worker(
                    scheduler.address,
                    name=worker_name,
                    nthreads=1,
                    startup_information=node_information(pod, gpus),
                )
            )
    return workers


def _fake_addresses(monkeypatch: pytest.MonkeyPatch, scheduler: Scheduler) -> Any:
    """The controller, pointed at this scheduler instead of a Kubernetes service."""
    from dask_kubernetes.operator.controller import controller

    async def address(service: str, namespace: str, port_name: str = "tcp-comm", **_: Any) -> str:
        if port_name == "http-dashboard":
            return f"http://127.0.0.1:{scheduler.http_server.port}"
        return scheduler.address

    monkeypatch.setattr(controller, "get_scheduler_address", address)
    return controller


def _controller_retires(controller: Any, n: int) -> Any:
    return controller.retire_workers(
        n_workers=n,
        scheduler_service_name="gpu-cluster-scheduler",
        worker_group_name="gpu-cluster-default",
        namespace="dask-gpu",
        logger=logging.getLogger("test"),
    )


POD_A, POD_B = "gpu-cluster-default-worker-aaaaaaaaaa", "gpu-cluster-default-worker-bbbbbbbbbb"


def test_operator_retires_whole_pods_by_deployment_name(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        async with Scheduler(
            host="127.0.0.1",
            port=0,
            dashboard_address="127.0.0.1:0",
            preload=["cudask.deploy.operator_api"],
            preload_argv=["--gpus-per-pod", "2"],
        ) as s:
            controller = _fake_addresses(monkeypatch, s)
            workers = await _pods(s, [POD_A, POD_B], gpus=2)
            by_name = {w.name: w for w in workers}
            try:
                async with Client(s.address, asynchronous=True) as c:
                    # more data on pod A: the scheduler prefers to retire pod B
                    big = await c.scatter(list(range(20)), workers=[by_name[f"{POD_A}-0"].address])
                    small = await c.scatter([1], workers=[by_name[f"{POD_B}-1"].address])
                    assert await _controller_retires(controller, 1) == [POD_B]
                    assert sorted(str(ws.name) for ws in s.workers.values()) == [
                        f"{POD_A}-0",
                        f"{POD_A}-1",
                    ]
                    assert await c.gather(small) == [1]  # moved to pod A, not lost
                    # the last pod holds the only copies: neither retired nor named
                    assert await _controller_retires(controller, 1) == []
                    assert len(s.workers) == 2 and await c.gather(big) == list(range(20))
            finally:
                for w in workers:
                    await w.close()

    asyncio.run(main())


def test_one_gpu_pods_keep_the_controllers_own_mapping(monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-GPU pod's worker is named exactly as its Deployment, so even the
    controller's fallback over the dask RPC (no /api/v1) maps it back."""

    async def main() -> None:
        async with Scheduler(host="127.0.0.1", port=0, dashboard_address="127.0.0.1:0") as s:
            controller = _fake_addresses(monkeypatch, s)
            workers = await _pods(s, [POD_A, POD_B], gpus=1)
            assert set(await _controller_retires(controller, 1)) <= {POD_A, POD_B}
            assert len(s.workers) == 1
            for w in workers:
                await w.close()

    asyncio.run(main())


def test_distributeds_own_api_would_name_workers_not_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why cudask serves /api/v1: distributed's retires one worker (n counts workers)
    and answers its name, NAME-0, which names no Deployment."""
    import dask.config

    routes = [*dask.config.get("distributed.scheduler.http.routes"), operator_api.DISTRIBUTED_API]

    async def main() -> None:
        with dask.config.set({"distributed.scheduler.http.routes": routes}):
            async with Scheduler(host="127.0.0.1", port=0, dashboard_address="127.0.0.1:0") as s:
                controller = _fake_addresses(monkeypatch, s)
                workers = await _pods(s, [POD_A, POD_B], gpus=2)
                names = await _controller_retires(controller, 1)
                assert len(names) == 1 and names[0] not in (POD_A, POD_B)
                assert len(s.workers) == 3  # half a pod retired
                for w in workers:
                    await w.close()

    asyncio.run(main())


def test_the_pod_api_refuses_to_be_shadowed() -> None:
    import dask.config

    routes = [*dask.config.get("distributed.scheduler.http.routes"), operator_api.DISTRIBUTED_API]

    async def main() -> None:
        with dask.config.set({"distributed.scheduler.http.routes": routes}):
            s = Scheduler(
                host="127.0.0.1",
                port=0,
                dashboard_address="127.0.0.1:0",
                preload=["cudask.deploy.operator_api"],
            )
            with pytest.raises(RuntimeError) as info:
                await s
            await s.close()
            assert "remove it from that list" in str(info.value.__cause__)

    asyncio.run(main())


def test_adaptive_target_counts_pods() -> None:
    import urllib.request

    async def main() -> None:
        async with Scheduler(
            host="127.0.0.1",
            port=0,
            dashboard_address="127.0.0.1:0",
            preload=["cudask.deploy.operator_api"],
            preload_argv=["--gpus-per-pod", "4"],
        ) as s:
            url = f"http://127.0.0.1:{s.http_server.port}/api/v1/adaptive_target"
            s.adaptive_target = lambda *a, **k: 9  # type: ignore[method-assign]

            def get() -> dict[str, Any]:
                with urllib.request.urlopen(url, timeout=30) as r:
                    return dict(yaml.safe_load(r.read()))

            assert await asyncio.to_thread(get) == {"workers": 3, "gpus_per_pod": 4}
            workers = await _pods(s, [POD_A], gpus=2)  # what the workers say wins
            assert await asyncio.to_thread(get) == {"workers": 5, "gpus_per_pod": 2}
            for w in workers:
                await w.close()

    asyncio.run(main())


def test_pods_to_retire_takes_whole_pods_only() -> None:
    def ws(address: str, name: str, pod: str | None) -> Any:
        extra = {} if pod is None else {"cudask_node": pod}
        return SimpleNamespace(address=address, name=name, extra=extra)

    workers = {
        w.address: w
        for w in [
            ws("a0", "A-0", "A"),
            ws("a1", "A-1", "A"),
            ws("b0", "B-0", "B"),
            ws("b1", "B-1", "B"),
            ws("c", "C", None),
        ]
    }
    # distributed lists closable workers best first; b1 runs a long task: B is not closable
    fake = SimpleNamespace(workers=workers, workers_to_close=lambda n, key: ["c", "b0", "a0", "a1"])
    assert operator_api.pods_to_retire(fake, 1) == ["C"]  # type: ignore[arg-type]
    assert operator_api.pods_to_retire(fake, 5) == ["C", "A"]  # type: ignore[arg-type]
    assert operator_api.pods_to_retire(fake, 0) == []  # type: ignore[arg-type]
    # data must have a worker to go to that is not retired with it
    del workers["b0"], workers["b1"]
    workers["a0"].has_what = {"x"}
    fake.workers_to_close = lambda n, key: ["c", "a0", "a1"]
    assert operator_api.pods_to_retire(fake, 5) == ["C"]  # type: ignore[arg-type]
    fake.workers_to_close = lambda n, key: ["a0", "a1", "c"]
    assert operator_api.pods_to_retire(fake, 5) == ["A"]  # type: ignore[arg-type]
    assert operator_api.pods_for(5, 2) == 3 and operator_api.pods_for(0, 2) == 0
    assert math.ceil(7 / 8) == operator_api.pods_for(7, 8)


# ------------------------------------------------------- the cluster over a fake KubeCluster
class FakeKube:
    """Stands in for the Kubernetes side of KubeCluster: records what it was asked."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, start: str = "ok") -> None:
        self.started: list[dict[str, Any]] = []
        self.closed = 0
        self.scaled: list[tuple[int, str]] = []
        fake = self

        async def _start(cluster: Any) -> None:
            fake.started.append(
                {
                    "spec": cluster._custom_cluster_spec,
                    "namespace": cluster.namespace,
                    "create_mode": cluster.create_mode,
                }
            )
            if start == "hang":  # a scheduler pod that never becomes ready
                cluster._startup_component_status = {
                    "cluster": "Pending",
                    "schedulerpod": "Pending",
                }
                await asyncio.sleep(3600)
            if start == "operator-timeout":
                raise TimeoutError(
                    "Dask Cluster resource not actioned after 60 seconds, is "
                    "the Dask Operator running?"
                )
            cluster.scheduler_comm = SimpleNamespace(address="tcp://10.0.0.9:8786")

        async def _close(cluster: Any, timeout: float = 3600) -> None:
            from distributed.core import Status

            fake.closed += 1
            cluster.status = Status.closed

        async def _scale(cluster: Any, n: int, worker_group: str = "default") -> None:
            fake.scaled.append((n, worker_group))

        monkeypatch.setattr(KubeCluster, "_start", _start)
        monkeypatch.setattr(KubeCluster, "_close", _close)
        monkeypatch.setattr(KubeCluster, "_scale", _scale)


def test_cluster_creates_the_checked_spec_scales_in_pods_and_closes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dask_kubernetes.operator.kubecluster.kubecluster import CreateMode

    fake = FakeKube(monkeypatch)
    cluster = kube.KubeCUDACluster(**PLATFORM, quiet=True)
    try:
        (started,) = fake.started
        assert started["spec"] == _spec() and started["namespace"] == "dask-gpu"
        assert started["create_mode"] == CreateMode.CREATE_ONLY
        assert cluster.get_client_url() == "tcp://10.0.0.9:8786"
        cluster.scale(3)
        assert fake.scaled == [(3, "default")]
        with pytest.raises(OptionError, match="n=-1"):
            cluster.scale(-1)
        assert fake.scaled == [(3, "default")]
    finally:
        cluster.close()
    assert fake.closed == 1


def test_cluster_without_namespace_leaves_it_to_kube_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No namespace: KubeCluster takes the current context's when it starts (its own
    rule), and the DaskCluster resource names none."""
    fake = FakeKube(monkeypatch)
    cluster = kube.KubeCUDACluster(**{**PLATFORM, "namespace": None}, quiet=True)
    try:
        (started,) = fake.started
        assert started["namespace"] is None  # KubeCluster._start asks the context
        assert "namespace" not in started["spec"]["metadata"]
    finally:
        cluster.close()


def test_dask_cuda_cluster_is_the_platform_interface(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeKube(monkeypatch)
    cluster = kube.DaskCudaCluster(
        num_workers=2,
        worker_cpu=4,
        nvidia_gpu=2,
        worker_memory=12,
        scheduler_cpu=4,
        scheduler_memory=12,
        quiet=True,
        image=PLATFORM["image"],
        namespace="dask-gpu",
    )
    assert not fake.started  # checked, not created
    with pytest.raises(CudaskError, match="init"):
        cluster.get_client_url()
    cluster.init()
    cluster.init()
    try:
        assert len(fake.started) == 1
        assert cluster.get_client_url() == "tcp://10.0.0.9:8786"
        spec = fake.started[0]["spec"]
        limits = spec["spec"]["worker"]["spec"]["containers"][0]["resources"]["limits"]
        assert limits == {"cpu": "4", "memory": "12Gi", "nvidia.com/gpu": "2"}
        cluster.scale(1)
        assert fake.scaled == [(1, "default")]
    finally:
        cluster.close()
    assert fake.closed == 1


def test_a_scheduler_that_never_comes_up(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeKube(monkeypatch, start="hang")
    with pytest.raises(kube.SchedulerTimeoutError) as info:
        kube.KubeCUDACluster(**PLATFORM, quiet=True, scheduler_timeout=0.5)
    message = str(info.value)
    assert "scheduler_timeout=0.5" in message and "scheduler pod Pending" in message
    assert "gpu-cluster" in message and "\n" not in message
    assert fake.closed == 1  # what was created is deleted


def test_an_operator_that_never_acts(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeKube(monkeypatch, start="operator-timeout")
    with pytest.raises(kube.SchedulerTimeoutError, match="is the dask-kubernetes operator running"):
        kube.KubeCUDACluster(**PLATFORM, quiet=True)
