"""The pods of a generated DaskCluster, run as local processes on real GPUs.

Each pod runs the EXACT command line and environment of its container, as the
dask-kubernetes operator's controller builds its Deployment from the DaskCluster
(its own build_* functions: DASK_WORKER_NAME = the Deployment's name, `$(VAR)` in
args expanded as the kubelet does). Three things stand in for Kubernetes:

- the NVIDIA device plugin: a worker pod's process gets CUDA_VISIBLE_DEVICES (and
  NVIDIA_VISIBLE_DEVICES) set to the UUIDs of the GPUs it is given;
- the scheduler's Service: DASK_SCHEDULER_ADDRESS is tcp://127.0.0.1:8786 instead
  of the Service's DNS name (the scheduler pod's command binds 0.0.0.0:8786 and :8787
  as in the pod; the test skips if those ports are taken);
- deleting a Deployment: SIGTERM to the pod's first process (what the kubelet sends),
  then the pod's process group must be gone within the grace period (60 s).

Scaling down goes through the controller's own `retire_workers` (its HTTP call to
the scheduler's /api/v1/retire_workers), pointed at the local scheduler.

Run on a GPU host: pip install -e '.[test,test-deploy]' (dask-kubernetes, kubernetes-validate)
with CuPy, then `python3 -m pytest -m "gpu or multigpu" tests/deploy/test_kubernetes_pods_gpu.py`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

try:
    from dask_kubernetes.operator.controller import controller
except ImportError:  # comes with cudask[test-deploy]
    pytest.skip(
        "needs dask-kubernetes (pip install -e '.[test,test-deploy]')", allow_module_level=True
    )
from distributed import Client
from kube_pods import container, container_argv, container_env, operator_objects

from cudask.deploy.kube_spec import check_pods, cluster_spec
from cudask.devices import discover
from cudask.testing import current_gpu_uuid, wait_for, workers_info

pytestmark = pytest.mark.timeout(600)

SCHEDULER = "tcp://127.0.0.1:8786"
DASHBOARD = "http://127.0.0.1:8787"
NAMESPACE = "dask-gpu"
GRACE = 60.0  # Kubernetes' default terminationGracePeriodSeconds is 30; be generous
START = 120.0  # a worker's first CUDA context and CuPy import can take a while


@dataclass
class Pod:
    """One pod's container, as a local process group."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        """Whether any process of the pod's process group is left."""
        self.process.poll()  # reap the first process if it has exited
        try:
            os.killpg(self.process.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def delete(self) -> None:
        """What deleting its Deployment does: SIGTERM, then SIGKILL after the grace."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        gone = wait_for(lambda: not self.alive(), timeout=GRACE, interval=0.2)
        if not gone:
            os.killpg(self.process.pid, signal.SIGKILL)
        assert gone, f"pod {self.name} left processes behind after SIGTERM: see {self.log}"


class Pods:
    """Starts containers of a DaskCluster as local processes; kills what is left."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[Pod] = []

    def start(self, deployment: dict[str, Any], devices: dict[str, str] | None = None) -> Pod:
        c = container(deployment)
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
        }
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
        env.update(container_env(c))  # the pod's own environment, exactly
        if "DASK_SCHEDULER_ADDRESS" in env:  # the Service's DNS name does not resolve here
            env["DASK_SCHEDULER_ADDRESS"] = SCHEDULER
        env.update(devices or {})  # what the device plugin gives the container
        name = deployment["metadata"]["name"]
        log = self.tmp_path / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                container_argv(c),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.tmp_path,
                start_new_session=True,
            )
        pod = Pod(name, process, log)
        self.started.append(pod)
        return pod

    def kill_all(self) -> None:
        for pod in self.started:
            with suppress(ProcessLookupError):
                os.killpg(pod.process.pid, signal.SIGKILL)
            with suppress(subprocess.TimeoutExpired):
                pod.process.wait(timeout=30)


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[Pods]:
    for port in (8786, 8787):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                pytest.skip(f"port {port} is taken here; the scheduler pod's command binds it")
    started = Pods(tmp_path)
    yield started
    started.kill_all()


@pytest.fixture
def machine() -> Any:
    pytest.importorskip("cupy")
    return discover()


def _spec(num_workers: int, gpus: int) -> dict[str, Any]:
    return cluster_spec(
        check_pods(
            name="gpu-test",
            namespace=NAMESPACE,
            image="local",
            num_workers=num_workers,
            nvidia_gpu=gpus,
            worker_cpu=2,
            worker_memory=8 * gpus,
            scheduler_cpu=1,
            scheduler_memory=2,
        )
    )


def _device_plugin(uuids: list[str]) -> dict[str, str]:
    return {"CUDA_VISIBLE_DEVICES": ",".join(uuids), "NVIDIA_VISIBLE_DEVICES": ",".join(uuids)}


def _controller_retires(n: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    async def address(service: str, namespace: str, port_name: str = "tcp-comm", **_: Any) -> str:
        return DASHBOARD if port_name == "http-dashboard" else SCHEDULER

    monkeypatch.setattr(controller, "get_scheduler_address", address)
    return list(
        asyncio.run(
            controller.retire_workers(
                n_workers=n,
                scheduler_service_name="gpu-test-scheduler",
                worker_group_name="gpu-test-default",
                namespace=NAMESPACE,
                logger=logging.getLogger("controller"),
            )
        )
    )


def _names(client: Client) -> dict[str, str]:
    """Worker name -> address."""
    return {str(w["name"]): a for a, w in workers_info(client).items()}


def _start_scheduler(pods: Pods, objects: dict[str, Any]) -> Client:
    pods.start(objects["scheduler"])
    client = Client(SCHEDULER, timeout=START)
    assert workers_info(client) == {}
    # the scheduler pod sees no GPU
    env = client.run_on_scheduler(
        lambda: {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")}
    )
    assert env == {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void"}
    return client


def _nothing_held(client: Client) -> bool:
    """No worker holds a key. distributed retires no worker whose keys no other worker can
    take, so a test retiring the last pod waits for the client to release its results."""
    return not any(client.has_what().values())


def _on_own_gpu(client: Client, address: str, uuid: str) -> None:
    import cupy

    assert client.submit(current_gpu_uuid, workers=[address], pure=False).result() == uuid
    # Library functions only: the scheduler runs in its own pod's process and cannot import
    # this test module (a graph is pickled by reference, whatever cloudpickle is told).
    values = client.submit(cupy.arange, 1000, dtype="float64", workers=[address], pure=False)
    assert (
        float(client.submit(cupy.sum, values, workers=[address], pure=False).result()) == 499500.0
    )


@pytest.mark.gpu
def test_one_gpu_pod(pods: Pods, machine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = machine.gpus[0]
    objects = operator_objects(_spec(num_workers=1, gpus=1))
    with _start_scheduler(pods, objects) as client:
        (deployment,) = objects["workers"]
        pod = pods.start(deployment, _device_plugin([gpu.uuid]))
        assert wait_for(lambda: pod.name in _names(client), timeout=START), pod.log.read_text()
        assert list(_names(client)) == [pod.name]  # one GPU: named as its Deployment
        _on_own_gpu(client, _names(client)[pod.name], gpu.uuid)
        assert wait_for(lambda: _nothing_held(client), timeout=GRACE)
        assert _controller_retires(1, monkeypatch) == [pod.name]
        pod.delete()
        assert wait_for(lambda: not _names(client), timeout=GRACE)


@pytest.mark.multigpu
def test_two_pods_scale_down_by_pod(
    pods: Pods, machine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpus = machine.gpus[:2]
    objects = operator_objects(_spec(num_workers=2, gpus=1))
    with _start_scheduler(pods, objects) as client:
        started = {
            d["metadata"]["name"]: pods.start(d, _device_plugin([g.uuid]))
            for d, g in zip(objects["workers"], gpus)
        }
        assert wait_for(lambda: set(_names(client)) == set(started), timeout=START), [
            p.log.read_text() for p in started.values()
        ]
        for (name, _), gpu in zip(started.items(), gpus):
            _on_own_gpu(client, _names(client)[name], gpu.uuid)
        data = client.scatter(list(range(10)), broadcast=False)
        (retired,) = _controller_retires(1, monkeypatch)
        assert retired in started  # a Deployment's name
        started[retired].delete()
        (kept,) = set(started) - {retired}
        assert wait_for(lambda: list(_names(client)) == [kept], timeout=GRACE)
        assert client.gather(data) == list(range(10))  # moved off the retired pod first
        assert started[kept].alive()


@pytest.mark.multigpu
def test_a_two_gpu_pod_is_retired_whole(
    pods: Pods, machine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpus = machine.gpus[:2]
    objects = operator_objects(_spec(num_workers=1, gpus=2))
    with _start_scheduler(pods, objects) as client:
        (deployment,) = objects["workers"]
        pod = pods.start(deployment, _device_plugin([g.uuid for g in gpus]))
        names = [f"{pod.name}-0", f"{pod.name}-1"]  # one worker per GPU of the pod
        assert wait_for(lambda: sorted(_names(client)) == names, timeout=START), pod.log.read_text()
        for name, gpu in zip(names, gpus):
            _on_own_gpu(client, _names(client)[name], gpu.uuid)
        # the controller asks for one pod and gets the Deployment's name, not NAME-0
        assert wait_for(lambda: _nothing_held(client), timeout=GRACE)
        assert _controller_retires(1, monkeypatch) == [pod.name]
        assert wait_for(lambda: not _names(client), timeout=GRACE)
        pod.delete()
        assert not _names(client)
