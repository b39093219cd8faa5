"""The JSON the dashboard page reads (cudask.monitor.views): display columns made
from snapshot()/history(), the status line, and the rate charts' lines."""

from __future__ import annotations

import json

import pytest
from monitor_fakes import FakeMonitor, GiB, synthetic_row

from cudask.monitor.views import (
    TABLE_COLUMNS,
    TOP,
    history_columns,
    history_view,
    status_html,
    table_columns,
)


@pytest.mark.parametrize("workers", [8, 64])
def test_table_columns_one_display_row_per_worker(workers: int) -> None:
    columns = table_columns(FakeMonitor(workers).snapshot())
    assert list(columns) == list(TABLE_COLUMNS)
    assert all(len(values) == workers for values in columns.values())
    # natural order: host, then gpu-2 before gpu-10
    assert columns["name"] == [f"gpu-{i}" for i in range(workers)]
    assert columns["host"][0] == "node00" and columns["host"][-1] == f"node{(workers - 1) // 8:02d}"
    row = {name: values[3] for name, values in columns.items()}  # worker 3: see synthetic_row
    assert row["gpu"] == "GPU-5f3a1c03"
    assert row["gpu_title"] == "NVIDIA H100 80GB HBM3 GPU-5f3a1c03-2b4d-4e6f-8a9b-0c1d2e3f4a5b"
    assert row["device"] == "45.00 GiB / 64.00 GiB"
    assert row["device_pct"] == "70 %"
    assert row["host_tier"] == "39.00 GiB"
    assert row["disk_tier"] == "0 B"
    assert row["pinned"] == "3.00 GiB / 8.00 GiB"
    assert row["spill"] == "19.10" and row["unspill"] == "9.50"
    assert row["util"] == "51 %"
    assert row["gpu_memory"] == "74.00 GiB / 80.00 GiB"
    assert row["pcie"] == "21.50 / 12.25"
    assert row["nvlink"] == ""  # odd workers: NVML reports no NVLink
    assert columns["nvlink"][2] == "180.00 / 175.50"
    assert row["device_bytes"] == 45 * GiB and row["host_bytes"] == 39 * GiB
    assert row["limit_bytes"] == 64 * GiB
    json.dumps(columns, allow_nan=False)  # what the page receives


def test_table_columns_unknown_figures_are_empty_not_zero() -> None:
    row = synthetic_row(0)
    row.update(
        gpu_uuid=None,
        gpu_name=None,
        spill_gbps=None,
        unspill_gbps=0.001,
        gpu_utilization=None,
        gpu_memory_used_bytes=None,
        gpu_memory_total_bytes=None,
        pcie_tx_gbps=None,
        pcie_rx_gbps=None,
        nvlink_tx_gbps=None,
        nvlink_rx_gbps=3.0,
        device_limit_bytes=0.0,
        disk_bytes=float("nan"),
    )
    plain = {
        "name": "cpu-worker",
        "address": "tcp://a:1",
        "host": "a",
        "cudask": False,
        "gpu_uuid": None,
        "gpu_name": None,
        "device_bytes": 0.0,
        "device_limit_bytes": 0.0,
        "host_bytes": 0.0,
        "disk_bytes": 0.0,
    }
    columns = table_columns({"workers": [row, plain], "reason": None})
    first = {name: values[0] for name, values in columns.items()}
    assert first["name"] == "cpu-worker"  # host "a" sorts before "node00"
    assert all(
        first[c] == ""
        for c in (
            "gpu",
            "gpu_title",
            "device",
            "device_pct",
            "host_tier",
            "disk_tier",
            "pinned",
            "spill",
            "util",
            "gpu_memory",
            "pcie",
            "nvlink",
        )
    )
    assert first["limit_bytes"] is None and first["device_bytes"] == 0.0
    gpu = {name: values[1] for name, values in columns.items()}
    assert gpu["gpu"] == "" and gpu["gpu_title"] == ""
    assert gpu["device"] == "24.00 GiB / no limit" and gpu["device_pct"] == ""
    assert gpu["limit_bytes"] is None  # no limit marker
    assert gpu["disk_tier"] == "" and gpu["disk_bytes"] == 0.0  # NaN is unknown
    assert gpu["spill"] == "" and gpu["unspill"] == "<0.01"
    assert gpu["util"] == "" and gpu["gpu_memory"] == "" and gpu["pcie"] == ""
    assert gpu["nvlink"] == "? / 3.00"
    json.dumps(columns, allow_nan=False)


def test_empty_snapshot_gives_empty_columns_and_says_why() -> None:
    reason = "no workers are connected to this scheduler"
    snapshot = {"time": 1.0, "workers": [], "cudask_workers": 0, "reason": reason}
    columns = table_columns(snapshot)
    assert set(columns) == set(TABLE_COLUMNS) and not any(columns.values())
    assert reason in status_html(snapshot)
    assert "no workers" in status_html({"workers": [], "reason": None})
    # rows but none with cudask metrics: rows shown, and the reason too
    odd = {
        "workers": [{"name": "a", "host": "h", "cudask": False}],
        "reason": "none of the 1 worker(s) reports cudask metrics <script>",
    }
    text = status_html(odd)
    assert "1 worker</b>" in text and "&lt;script&gt;" in text and "<script>" not in text


def test_status_line_totals() -> None:
    text = status_html(FakeMonitor(8).snapshot())
    assert "<b>8 workers</b> on 1 host (8 with cudask metrics)" in text
    assert "device 308.00 GiB of 512.00 GiB" in text  # 8 x 24 GiB + (0+7+...+9) GiB


def test_history_columns_total_and_busiest_workers() -> None:
    history = FakeMonitor(64).history()
    view = history_view(history)
    assert set(view) == {"spill", "unspill"}
    spill = view["spill"]
    (total_xs,) = spill["total"]["xs"]
    (total_ys,) = spill["total"]["ys"]
    assert spill["total"]["label"] == ["total of 64 workers (right axis)"]
    assert total_xs[-1] == 0.0 and total_xs[0] == -297.0  # the first two samples have no rate
    workers = history["workers"]
    assert total_ys[-1] == pytest.approx(sum(w["spill_gbps"][-1] for w in workers.values()))
    labels = spill["workers"]["label"]
    assert len(labels) == TOP and len(set(spill["workers"]["color"])) == TOP
    moved = {n: sum(v for v in w["spill_gbps"] if v is not None) for n, w in workers.items()}
    assert labels == sorted(moved, key=lambda n: -moved[n])[:TOP]
    assert all(
        len(xs) == len(ys)
        for xs, ys in zip(spill["workers"]["xs"], spill["workers"]["ys"], strict=True)
    )
    json.dumps(view, allow_nan=False)


def test_history_columns_skip_unknown_points_and_idle_workers() -> None:
    history = {
        "time": [10.0, 11.0, 12.0, 13.0],
        "workers": {
            "a": {"spill_gbps": [None, 1.0, None, 2.0]},
            "b": {"spill_gbps": [None, 0.0, 0.0, 0.0]},
            "c": {"spill_gbps": [None, None, None, None]},
        },
    }
    cols = history_columns(history, "spill")
    assert cols["total"]["xs"] == [[-2.0, -1.0, 0.0]] and cols["total"]["ys"] == [[1.0, 0.0, 2.0]]
    assert cols["total"]["label"] == ["total of 3 workers (right axis)"]
    assert cols["workers"]["label"] == ["a"]  # b never moved a byte, c has no rate yet
    assert cols["workers"]["xs"] == [[-2.0, 0.0]] and cols["workers"]["ys"] == [[1.0, 2.0]]
    empty = history_columns({"time": [], "workers": {}}, "unspill")
    assert all(v == [] for part in empty.values() for v in part.values())
    with pytest.raises(ValueError, match=r"rate='bogus': accepted are spill, unspill"):
        history_columns(history, "bogus")
