"""dask-jobqueue jobs running cudask's worker on real GPUs (issue 15, item 3).

Covers: dask_jobqueue's LocalCluster (its LocalJob runs the job script as a local
process, the way sbatch/qsub would run it on a node) with `job_kwargs("local", ...)`:
each job runs `python -m cudask.cli worker`, whose workers join with the job's GPUs
(CUDA_VISIBLE_DEVICES as the queue system would set it), under the names jobqueue
expects, with the worker options in effect. Needs dask-jobqueue (carried as a wheel to
GPU machines: dask_jobqueue-0.9.0-py2.py3-none-any.whl); skips without it.
"""

from __future__ import annotations

from typing import Any

import pytest
from dask.utils import parse_bytes
from distributed import Client

from cudask.deploy.jobqueue import job_kwargs
from cudask.devices import discover
from cudask.testing import current_gpu_uuid, wait_for, workers_info

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def machine() -> Any:
    return discover()


@pytest.fixture
def local_cluster() -> Any:
    pytest.importorskip("cupy")
    pytest.importorskip(
        "dask_jobqueue",
        reason="dask-jobqueue is not installed here; carry "
        "its wheel (dask_jobqueue-0.9.0-py2.py3-none-any.whl, pure Python)",
    )
    from dask_jobqueue.local import LocalCluster

    return LocalCluster


def _check_jobs(cluster: Any, client: Any, gpus: list[Any], nthreads: int) -> None:
    client.wait_for_workers(len(gpus), timeout=180)
    info = workers_info(client)
    # the names jobqueue gave the job's processes: NAME, or NAME-0, NAME-1, ...
    assert wait_for(lambda: cluster.observed == cluster.requested, timeout=60), (
        cluster.observed,
        cluster.requested,
    )
    uuids = client.run(current_gpu_uuid)
    assert sorted(uuids.values()) == sorted(g.uuid for g in gpus)
    limits = client.run(lambda dask_worker: dask_worker.data.device_memory_limit)
    assert set(limits.values()) == {parse_bytes("1GB")}
    assert {w["nthreads"] for w in info.values()} == {nthreads}
    if len(gpus) > 1:
        by_name = {w["name"]: addr for addr, w in info.items()}
        for i, gpu in enumerate(gpus):  # NAME-i on the job's i-th GPU
            (name,) = [n for n in by_name if str(n).endswith(f"-{i}")]
            assert uuids[by_name[name]] == gpu.uuid
    # let the workers go (their nannies too) before jobqueue kills the job's process
    client.retire_workers(list(info), close_workers=True)
    assert wait_for(lambda: not workers_info(client), timeout=120)


def test_jobqueue_local_job_runs_cudask_worker(
    local_cluster: Any, machine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu = machine.gpus[-1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", gpu.uuid)  # what SLURM sets for a job's GPU
    kwargs = job_kwargs(
        "local", gpus_per_job=1, cores=2, memory="8GB", device_memory_limit="1GB", jit_unspill=False
    )
    with (
        local_cluster(scheduler_options={"dashboard_address": ":0"}, **kwargs) as cluster,
        Client(cluster) as client,
    ):
        cluster.scale(jobs=1)
        _check_jobs(cluster, client, [gpu], nthreads=2)


@pytest.mark.multigpu
def test_jobqueue_job_of_two_gpus(
    local_cluster: Any, machine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpus = [machine.gpus[1], machine.gpus[0]]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    kwargs = job_kwargs("local", gpus_per_job=2, cores=4, memory="16GB", device_memory_limit="1GB")
    with (
        local_cluster(scheduler_options={"dashboard_address": ":0"}, **kwargs) as cluster,
        Client(cluster) as client,
    ):
        cluster.scale(2)  # two workers: one job of two processes
        assert len(cluster.worker_spec) == 1
        _check_jobs(cluster, client, gpus, nthreads=2)
