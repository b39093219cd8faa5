"""dask-cuda's behaviour on a real GPU: CUDA_VISIBLE_DEVICES from the environment with
UUIDs kept, CUDAWorker given a Cluster, the cluster's configuration as dask-cuda's
utils report it, a worker that cannot reach its scheduler, and a CUDA context made
before the cluster, named by each worker."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest
from distributed import Client

from cudask import CUDAWorker, LocalCUDACluster, utils
from cudask.devices import discover

pytestmark = pytest.mark.gpu


def _visible() -> str:
    return os.environ["CUDA_VISIBLE_DEVICES"]


def test_the_environment_chooses_the_gpus_and_uuids_stay(monkeypatch):
    machine = discover()
    uuids = [g.uuid for g in machine.gpus][::-1]  # the reverse of NVML's order
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(uuids))
    with (
        LocalCUDACluster(dashboard_address=":0", device_memory_limit=None) as cluster,
        Client(cluster) as client,
    ):
        seen = sorted(client.run(_visible).values())
        rotations = sorted(",".join(uuids[i:] + uuids[:i]) for i in range(len(uuids)))
        assert seen == rotations
        assert len(cluster.workers) == len(uuids)


def test_cuda_worker_joins_a_cluster_object_and_reports_its_configuration():
    with (
        LocalCUDACluster(
            n_workers=1, dashboard_address=":0", device_memory_limit="30B", CUDA_VISIBLE_DEVICES="0"
        ) as cluster,
        Client(cluster) as client,
    ):
        report = utils.get_cluster_configuration(client)
        assert report["device-memory-limit"] == 30 and report["nworkers"] == 1
        assert "[plugin] CUDAContext" in report

        async def join() -> int:
            async with Client(cluster.scheduler_address, asynchronous=True) as c:
                worker = CUDAWorker(cluster, device_memory_limit=None, name="extra")
                await worker
                await c.wait_for_workers(2, timeout=120)
                joined = len((await c.scheduler.identity(n_workers=-1))["workers"])
                await worker.close()
                return joined

        assert client.sync(join) == 2


def test_a_worker_that_cannot_reach_its_scheduler_exits_1():
    with socket.socket() as s:  # a port on this machine that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cudask.cli",
            "worker",
            f"127.0.0.1:{port}",
            "--death-timeout",
            "2",
            "--no-dashboard",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"},
    )
    assert done.returncode == 1, done.stderr
    assert "closing nanny at" in done.stderr.lower()
    assert "Traceback" not in done.stderr


SCRIPT = """
import cupy
cupy.cuda.runtime.free(0)  # a CUDA context at import, as some libraries make
if __name__ == "__main__":
    from cudask import LocalCUDACluster
    with LocalCUDACluster(n_workers=1, CUDA_VISIBLE_DEVICES="0", dashboard_address=None,
                          device_memory_limit=None):
        print("started")
"""


def test_a_context_made_before_the_cluster_is_named_by_the_worker(tmp_path):
    pytest.importorskip("cupy")
    script = tmp_path / "early_context.py"
    script.write_text(textwrap.dedent(SCRIPT))
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=tmp_path,
    )
    assert "started" in done.stdout, done.stderr
    lines = [
        line
        for line in done.stderr.splitlines()
        if "A CUDA context for device" in line and "already exists" in line
    ]
    assert len(lines) == 1, done.stderr  # the worker's spawned process re-imported the script
