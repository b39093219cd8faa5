"""`cudask bench transfer`: device data between workers of one host, CUDA IPC
(cudask.comm.ipc) against TCP through host memory, in fresh clusters.

Covers: per setting ("ipc": `cudask.comm.device-ipc` on; "tcp": off), a fresh
scheduler in this process and one `cudask worker` process per placement entry
(its CUDA_VISIBLE_DEVICES: "0,0" puts two workers on GPU 0, "0,1" one on each
of two GPUs), then
- point to point: an array made on worker A is used by a task on worker B.
  The first transfer of each size is the cold figure, the median of the
  repeats the warm one; bandwidth is what distributed's transfer log on B
  records (bytes / duration of the get_data exchange), beside the task's time
  from submit;
- all-to-all: an N x N float64 CuPy array in row blocks rechunked to column
  blocks (task-based: see cudask.comm.rechunk), from the first submit, checked
  by its sum.
Does not cover: the CLI's checks of the plan (cudask.cli.bench).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SETTINGS = ("ipc", "tcp")


@dataclass(frozen=True)
class TransferPlan:
    placement: tuple[str, ...]  # CUDA_VISIBLE_DEVICES of each worker process
    sizes: tuple[int, ...]
    repeat: int
    n: int
    blocks: int
    device_memory_limit: str
    log_dir: str | None = None


def _fill(nbytes: int, value: float) -> Any:
    import cupy

    return cupy.full(nbytes // 8, value)


def _last(x: Any) -> float:
    return float(x[-1])


def _incoming(dask_worker: Any) -> list[dict[str, float]]:
    return [{"total": e["total"], "duration": e["duration"]} for e in dask_worker.transfer_incoming_log]


def _ipc_stats() -> dict[str, Any]:
    from cudask.comm import ipc

    return {**ipc.stats(), "declined-because": ipc.declined()}


def _cells(block_info: Any = None, n: int = 0) -> Any:
    import cupy

    (r0, r1), (c0, c1) = block_info[None]["array-location"]
    return cupy.arange(r0, r1, dtype="f8")[:, None] * n + cupy.arange(c0, c1, dtype="f8")[None, :]


def _point_to_point(client: Any, a: str, b: str, size: int, repeat: int) -> dict[str, Any]:
    from distributed import wait

    runs = []
    for i in range(repeat + 1):
        before = len(client.run(_incoming, workers=[b])[b])
        x = client.submit(_fill, size, float(i + 1), workers=[a], pure=False)
        wait(x)
        start = time.perf_counter()
        if client.submit(_last, x, workers=[b], pure=False).result() != float(i + 1):
            raise RuntimeError(f"worker {b} read a wrong value from {a}")
        task_s = time.perf_counter() - start
        log = client.run(_incoming, workers=[b])[b][before:]
        moved = sum(e["total"] for e in log)
        seconds = sum(e["duration"] for e in log)
        runs.append({"bytes": moved, "transfer_s": seconds, "task_s": task_s,
                     "GBps": moved / seconds / 1e9 if seconds else None})
        del x
    warm = [r["GBps"] for r in runs[1:] if r["GBps"]]
    return {"cold": runs[0], "warm_median_GBps": statistics.median(warm) if warm else None,
            "runs": runs}


def _all_to_all(client: Any, n: int, blocks: int) -> dict[str, Any]:
    import cupy
    import dask.array as da
    from distributed import wait

    side = (n // blocks,) * blocks
    x = client.persist(da.map_blocks(_cells, n=n, dtype="f8", chunks=(side, (n,)),
                                     meta=cupy.empty((0, 0))))
    wait(x)
    start = time.perf_counter()
    y = client.persist(x.rechunk(((n,), side), method="tasks"))
    wait(y)
    seconds = time.perf_counter() - start
    total = float(y.sum().compute())
    expected = n * n * (n * n - 1) / 2
    return {"n": n, "blocks": blocks, "bytes": n * n * 8, "seconds": seconds,
            "GBps": n * n * 8 / seconds / 1e9, "sum_ok": abs(total - expected) <= 1e-9 * expected}


def run_setting(setting: str, plan: TransferPlan) -> dict[str, Any]:
    """Start the workers with IPC on ("ipc") or off ("tcp") and measure."""
    from cudask.testing.processes import worker_processes

    log_dir = Path(plan.log_dir) / f"transfer-{setting}" if plan.log_dir else None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    with worker_processes(plan.placement, env={"DASK_CUDASK__COMM__DEVICE_IPC": str(setting == "ipc")},
                          log_dir=log_dir,
                          args=["--device-memory-limit", plan.device_memory_limit]) as client:
        a, b = sorted(client.scheduler_info()["workers"])[:2]
        out: dict[str, Any] = {"point_to_point": {
            str(size): _point_to_point(client, a, b, size, plan.repeat) for size in plan.sizes}}
        out["all_to_all"] = _all_to_all(client, plan.n, plan.blocks)
        out["ipc"] = client.run(_ipc_stats)
        return out


def run_transfer(plan: TransferPlan) -> dict[str, Any]:
    return {"plan": asdict(plan), **{s: run_setting(s, plan) for s in SETTINGS}}


def summary(report: dict[str, Any]) -> list[str]:
    lines = []
    for setting in SETTINGS:
        r = report[setting]
        for size, p in r["point_to_point"].items():
            cold = p["cold"]
            lines.append(f"{setting:4} {int(size) / 2**20:7.0f} MiB  cold {cold['GBps'] or 0:7.1f} GB/s "
                         f"({cold['task_s']:.3f} s task)  warm {p['warm_median_GBps'] or 0:7.1f} GB/s")
        a2a = r["all_to_all"]
        lines.append(f"{setting:4} all-to-all {a2a['bytes'] / 1e9:.1f} GB: {a2a['seconds']:.2f} s "
                     f"({a2a['GBps']:.1f} GB/s), sum ok: {a2a['sum_ok']}")
    return lines
