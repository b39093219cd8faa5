"""On a real GPU: the scheduler's view shows the worker's own GPU, its NVML
figures and a spill while it happens (/metrics and the page's JSON)."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest
from distributed import Client

from cudask.monitor.state import snapshot

pytestmark = pytest.mark.gpu

MiB = 1 << 20


def _fill(n: int, dask_worker: Any) -> float:
    import cupy

    for i in range(n):
        dask_worker.data[f"x{i}"] = cupy.full(64 * MiB, i, dtype="u1")
    return dask_worker.data.metrics()["host-bytes"]


def test_the_scheduler_shows_the_gpu_and_its_spill() -> None:
    pytest.importorskip("cupy")
    from cudask import LocalCUDACluster
    from cudask.devices import discover

    gpu = discover().gpus[0]
    with (
        LocalCUDACluster(
            n_workers=1,
            CUDA_VISIBLE_DEVICES=gpu.uuid,
            device_memory_limit=256 * MiB,
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        host = next(iter(client.run(_fill, 8).values()))  # 512 MiB through 256 MiB
        assert host > 0
        deadline = time.monotonic() + 60
        row: dict[str, Any] = {}
        while time.monotonic() < deadline:
            rows = client.run_on_scheduler(snapshot)["workers"]
            row = rows[0] if rows else {}
            if (
                row.get("host_bytes")
                and row.get("gpu_uuid")
                and row.get("gpu_utilization") is not None
            ):
                break
            time.sleep(0.5)
        assert row["gpu_uuid"] == gpu.uuid and row["cudask"]
        assert row["host_bytes"] == pytest.approx(host, rel=0.5)
        assert row["spilled_bytes_total"] >= 256 * MiB and row["gpu_memory_total_bytes"]
        base = cluster.dashboard_link.rsplit("/", 1)[0]
        with urllib.request.urlopen(f"{base}/metrics", timeout=30) as response:
            page = response.read().decode()
        assert f'gpu_uuid="{gpu.uuid}"' in page and "cudask_worker_spilled_bytes_total{" in page
        with urllib.request.urlopen(f"{base}/cudask/api/workers.json", timeout=30) as response:
            served = json.loads(response.read())
        assert served["workers"][0]["gpu_uuid"] == gpu.uuid
