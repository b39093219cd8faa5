"""A CUDA context of the cluster's own process on a worker's GPU, named once at start
(cudask.deploy.contexts), on fake machines whose NVML lists processes."""

from __future__ import annotations

import asyncio
import os
import warnings
from typing import Any

import pytest

from cudask.deploy import contexts, local, node
from cudask.devices import discover
from cudask.errors import CUDAContextWarning
from cudask.testing import FakeBackend

MiB = 1 << 20


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> FakeBackend:
    """Two fake GPUs, discovered and listing processes through the same fake."""
    fake = FakeBackend.dgx(2, cores=8)
    machine = discover(fake)
    monkeypatch.setattr(local, "discover", lambda: machine)
    monkeypatch.setattr(node, "discover", lambda: machine)
    monkeypatch.setattr(contexts, "default_backend", lambda: fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr("distributed.diagnostics.nvml.device_get_count", lambda: 0)
    return fake


def _devices(fake: FakeBackend) -> list[Any]:
    from cudask.devices import parse_visible_devices

    return parse_visible_devices(None, discover(fake))


def test_this_process_on_a_workers_gpu_is_named(backend: FakeBackend) -> None:
    backend.add_context(os.getpid(), gpu=1, used_memory=1062 * MiB)
    backend.add_context(4242, gpu=0)  # someone else's: the workers' logs say so, not this
    with pytest.warns(CUDAContextWarning) as record:
        found = contexts.warn_own_contexts(_devices(backend))
    assert [(d.gpu.index, p.pid) for d, p in found] == [(1, os.getpid())]
    (w,) = record
    text = str(w.message)
    assert f"pid {os.getpid()}" in text and "GPU 1 (GPU-" in text and "1.04 GiB" in text
    assert "4242" not in text and "GPU 0" not in text
    assert "start the cluster before this process uses the GPU" in text
    assert "CUDA_VISIBLE_DEVICES" in text


def test_nothing_said_without_a_context_or_without_nvml(backend: FakeBackend) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert contexts.warn_own_contexts(_devices(backend)) == []
        assert contexts.warn_own_contexts(_devices(backend), backend=FakeBackend.no_nvml()) == []
    unknown = FakeBackend.dgx(1)  # lists no process for GPUs it does not know
    assert contexts.own_contexts(_devices(backend)[1:], os.getpid(), unknown) == []


def test_memory_not_reported(backend: FakeBackend) -> None:
    backend.add_context(os.getpid(), gpu=0, used_memory=None)
    with pytest.warns(CUDAContextWarning, match="memory not reported"):
        contexts.warn_own_contexts(_devices(backend))


def test_local_cluster_warns_once_at_start(backend: FakeBackend) -> None:
    backend.add_context(os.getpid(), gpu=0)

    async def main() -> None:
        cluster = local.LocalCUDACluster(
            asynchronous=True, dashboard_address=":0", device_memory_limit=None, workers_per_gpu=2
        )
        cluster.scale(2)
        cluster.scale(4)  # scaling up again says nothing more
        await cluster.close()

    with pytest.warns(CUDAContextWarning, match="the client, scheduler and nannies") as record:
        asyncio.run(main())
    (w,) = [w for w in record if w.category is CUDAContextWarning]
    assert w.filename == __file__  # the line that made the cluster


def test_an_error_for_those_who_want_one(backend: FakeBackend) -> None:
    backend.add_context(os.getpid(), gpu=0)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", category=CUDAContextWarning)
        with pytest.raises(CUDAContextWarning, match=f"pid {os.getpid()}"):
            local.LocalCUDACluster(device_memory_limit=None)


def _node(**kwargs: Any) -> node.CUDAWorker:
    async def main() -> node.CUDAWorker:
        return node.CUDAWorker("tcp://10.0.0.1:8786", device_memory_limit=None, **kwargs)

    return asyncio.run(main())


def test_cudask_worker_warns_for_its_nannies_process(
    backend: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend.add_context(os.getpid(), gpu=0)
    with pytest.warns(CUDAContextWarning, match="the nannies' process") as record:
        _node()
    assert record[0].filename == __file__
    # without a nanny this process is the worker: its context is the worker's own
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # a worker in this process sets it
    with warnings.catch_warnings():
        warnings.simplefilter("error", CUDAContextWarning)
        _node(nanny=False)
