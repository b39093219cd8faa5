"""The scheduler's view of GPU workers: rows, rates, history, Prometheus series,
the plugin's installation, and what it says when there is nothing to show."""

from __future__ import annotations

import json
import types
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from distributed import Client, LocalCluster

from cudask.memory.settings import store_settings
from cudask.memory.store import TieredStore
from cudask.monitor import dask_setup
from cudask.monitor.state import MonitorPlugin, install, snapshot, worker_row
from cudask.testing import wait_for
from cudask.testing.fake_cuda import FakeCopyBackend, FakeDeviceArray
from cudask.worker.metrics import StoreMetrics

MiB = 1 << 20


def _ws(name: str, metrics: dict[str, Any], extra: dict[str, Any] | None = None) -> Any:
    return types.SimpleNamespace(
        name=name, address=f"tcp://h:{name}", host="h", metrics=metrics, extra=extra or {}
    )


def test_rows_read_heartbeats_and_rates_come_from_counter_differences(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr("cudask.monitor.state.time.time", lambda: now[0])
    store = {
        "device-bytes": 5.0,
        "device-limit-bytes": 10.0,
        "spill-device-to-host-bytes": 0.0,
        "unspill-host-to-device-bytes": 0.0,
    }
    gpu = {"uuid": "GPU-1", "pcie-tx-bytes": 0, "pcie-rx-bytes": None}
    worker = _ws(
        "0",
        {"cudask": store, "cudask-gpu": gpu, "gpu": {"utilization": 40}},
        {"gpu": {"name": "H100", "memory-total": 80e9}},
    )
    plugin = MonitorPlugin(window=10.0)
    plugin.scheduler = types.SimpleNamespace(workers={worker.address: worker})  # type: ignore[assignment]
    plugin.sample()
    for _ in range(20):  # 20 s at 2 GB/s spilled, 1 GB/s unspilled, 3 GB/s over PCIe
        now[0] += 1.0
        store["spill-device-to-host-bytes"] += 2e9
        store["unspill-host-to-device-bytes"] += 1e9
        gpu["pcie-tx-bytes"] += 3e9
        plugin.sample()
    (row,) = plugin.rows()
    assert row["gpu_uuid"] == "GPU-1" and row["gpu_name"] == "H100" and row["cudask"]
    named = _ws("1", {"cudask": store, "cudask-gpu": {**gpu, "name": "NVIDIA H100 80GB HBM3"}}, {})
    assert worker_row(named)["gpu_name"] == "NVIDIA H100 80GB HBM3"  # without distributed's
    assert row["device_bytes"] == 5.0 and row["device_limit_bytes"] == 10.0
    assert row["spill_gbps"] == pytest.approx(2.0) and row["unspill_gbps"] == pytest.approx(1.0)
    assert row["pcie_tx_gbps"] == pytest.approx(3.0) and row["pcie_rx_gbps"] is None
    assert row["gpu_utilization"] == 40 and row["gpu_memory_total_bytes"] == 80e9
    history = plugin.history()
    assert len(history["time"]) == 21
    series = history["workers"]["0"]
    assert len(series["spill_gbps"]) == 21 and series["spill_gbps"][-1] == pytest.approx(2.0)
    now[0] += 400  # older than the five minutes kept: forgotten
    plugin.sample()
    assert len(plugin.history()["time"]) == 1


def test_a_worker_without_cudask_metrics_is_shown_as_such() -> None:
    row = worker_row(_ws("plain", {"gpu": {"utilization": 3, "memory-used": 7}}))
    assert not row["cudask"] and row["device_bytes"] == 0.0 and row["spill_gbps"] is None
    scheduler = types.SimpleNamespace(workers={"a": _ws("plain", {})}, plugins={})
    snap = snapshot(scheduler)  # type: ignore[arg-type]
    assert not snap["plugin"] and "reports cudask metrics" in snap["reason"]
    empty = snapshot(types.SimpleNamespace(workers={}, plugins={}))  # type: ignore[arg-type]
    assert empty["workers"] == [] and "no workers" in empty["reason"]


def _store() -> TieredStore:
    return TieredStore(
        device_memory_limit=MiB,
        memory_limit=1 << 30,
        backend=FakeCopyBackend(),
        settings=store_settings(MiB, 1 << 30, pinned_pool_size=4 * MiB, pinned_slab_size=MiB),
    )


def _fill(n: int, dask_worker: Any) -> dict[str, float]:
    for i in range(n):
        dask_worker.data[f"x{i}"] = FakeDeviceArray.empty(MiB // 4, "u1")
    return dask_worker.data.metrics()


def _store_metrics(dask_worker: Any) -> dict[str, float]:
    return dask_worker.data.metrics()


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    stores: list[TieredStore] = []

    def store() -> TieredStore:
        stores.append(_store())
        return stores[-1]

    with LocalCluster(
        n_workers=2,
        processes=False,
        dashboard_address=":0",
        data=store,
        scheduler_kwargs={"plugins": [MonitorPlugin()]},
    ) as c:
        yield c
    for made in stores:  # a worker does not close the store it was given (its disk folder)
        made.close()


def test_snapshot_and_prometheus_show_what_the_stores_hold(cluster: LocalCluster) -> None:
    with Client(cluster) as client:
        client.register_plugin(StoreMetrics())
        client.run(_fill, 8)  # 2 MiB through a 1 MiB device tier: spills

        def settled() -> bool:
            rows = client.run_on_scheduler(snapshot)["workers"]
            stores = client.run(_store_metrics)
            by_name = {
                str(w.name): m
                for w, m in ((cluster.scheduler.workers[a], m) for a, m in stores.items())
            }
            return len(rows) == 2 and all(
                r["device_bytes"] == by_name[r["name"]]["device-bytes"]
                and r["host_bytes"] == by_name[r["name"]]["host-bytes"]
                and r["spilled_bytes_total"] == by_name[r["name"]]["spill-device-to-host-bytes"]
                for r in rows
            )

        assert wait_for(settled, interval=0.2)
        snap = client.run_on_scheduler(snapshot)
        assert snap["plugin"] and snap["cudask_workers"] == 2 and snap["reason"] is None
        assert all(
            r["spilled_bytes_total"] > 0 and r["device_limit_bytes"] == MiB for r in snap["workers"]
        )
        base = cluster.dashboard_link.rsplit("/", 1)[0]
        with urllib.request.urlopen(f"{base}/metrics", timeout=30) as response:
            page = response.read().decode()
        for r in snap["workers"]:
            assert (
                f'cudask_worker_device_limit_bytes{{gpu_uuid="",host="{r["host"]}",'
                f'worker="{r["name"]}"}} 1.048576e+06'
            ) in page
        assert "# TYPE cudask_worker_spilled_bytes_total counter" in page
        with urllib.request.urlopen(f"{base}/cudask/api/workers.json", timeout=30) as response:
            served = json.loads(response.read())
        assert {r["name"] for r in served["workers"]} == {r["name"] for r in snap["workers"]}


def test_install_adds_the_plugin_once() -> None:
    with (
        LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        assert not client.run_on_scheduler(snapshot)["plugin"]
        assert install(client) is True
        assert install(client) is False
        assert client.run_on_scheduler(snapshot)["plugin"]


def test_preload_hook_adds_the_plugin() -> None:
    scheduler = types.SimpleNamespace(
        plugins={}, add_plugin=lambda p: scheduler.plugins.update({p.name: p})
    )
    dask_setup(scheduler)
    dask_setup(scheduler)
    assert list(scheduler.plugins) == ["cudask-monitor"]
