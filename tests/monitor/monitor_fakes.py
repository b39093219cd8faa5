"""A stand-in for MonitorPlugin's two views, for the page's tests: synthetic GPU
workers with plausible figures and five minutes of bursty spill history."""

from __future__ import annotations

import math
import time
from typing import Any

GiB = 2**30


def synthetic_row(i: int) -> dict[str, Any]:
    """A plausible row of `MonitorPlugin.snapshot()` for GPU worker i (8 per host)."""
    return {
        "name": f"gpu-{i}",
        "address": f"tcp://10.0.{i // 8}.{i % 8 + 10}:40000",
        "host": f"node{i // 8:02d}",
        "gpu_uuid": f"GPU-{0x5F3A1C00 + i:08x}-2b4d-4e6f-8a9b-0c1d2e3f4a5b",
        "gpu_name": "NVIDIA H100 80GB HBM3",
        "cudask": True,
        "device_bytes": float((24 + (i * 7) % 40) * GiB),
        "device_limit_bytes": float(64 * GiB),
        "host_bytes": float(((i * 13) % 90) * GiB),
        "disk_bytes": float(((i * 5) % 3) * 32 * GiB),
        "pinned_reserved_bytes": float(8 * GiB),
        "pinned_in_use_bytes": float((i % 8) * GiB),
        "spilled_bytes_total": 1e12 + i * 1e9,
        "unspilled_bytes_total": 4e11 + i * 1e9,
        "spill_gbps": round(8 + (i % 9) * 3.7, 2),
        "unspill_gbps": round(2 + (i % 5) * 2.5, 2),
        "gpu_utilization": float((i * 17) % 100),
        "gpu_memory_used_bytes": float(74 * GiB),
        "gpu_memory_total_bytes": float(80 * GiB),
        "pcie_tx_gbps": 21.5,
        "pcie_rx_gbps": 12.25,
        "nvlink_tx_gbps": None if i % 2 else 180.0,
        "nvlink_rx_gbps": None if i % 2 else 175.5,
    }


def _burst(k: int, period: float, height: float) -> float:
    """GB/s at second k of a worker that spills for a third of every `period`."""
    phase = k % period
    if phase >= period / 3:
        return 0.0
    return round(height * math.sin(math.pi * phase / (period / 3)), 3)


class FakeMonitor:
    """What `cudask.monitor.page` reads of a MonitorPlugin, for `workers` synthetic
    GPU workers: snapshot() and five minutes of history() (one sample a second,
    each worker spilling in bursts of its own)."""

    def __init__(self, workers: int, reason: str | None = None) -> None:
        self.workers = workers
        self.reason = reason
        self.now = time.time()

    def snapshot(self) -> dict[str, Any]:
        rows = [synthetic_row(i) for i in range(self.workers)]
        return {
            "time": self.now,
            "workers": rows,
            "cudask_workers": len(rows),
            "reason": self.reason if not rows else None,
        }

    def history(self) -> dict[str, Any]:
        times = [self.now - 299 + k for k in range(300)]
        workers = {}
        for i in range(self.workers):
            spill = [
                None if k < 2 else _burst(k + 37 * i, 60 + 7 * (i % 5), 6 + (i % 9) * 3.7)
                for k in range(300)
            ]
            unspill = [
                None if k < 2 else _burst(k + 20 + 37 * i, 45 + 5 * (i % 4), 2 + (i % 5) * 2.5)
                for k in range(300)
            ]
            workers[f"gpu-{i}"] = {
                "spill_gbps": spill,
                "unspill_gbps": unspill,
                "device_bytes": [0.0] * 300,
                "host_bytes": [0.0] * 300,
                "disk_bytes": [0.0] * 300,
            }
        return {"time": times, "workers": workers}
