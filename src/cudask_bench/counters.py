"""What a bench worker counts: its IPC counters, its fetches, its store's figures.

Covers: functions run on every worker with `client.run` (by reference, so cudask_bench
must be importable there): `worker_counters`, this worker's IPC counters
(cudask.comm.ipc), what it fetched from other workers (distributed's transfer log:
count, bytes, seconds) and its store's pinned-pool and spill figures; `store_figures`
alone; `ipc_stats`, the IPC counters with the reasons a transfer declined IPC;
`incoming`, the transfer log itself. Does not cover: differences between two readings
(the benchmarks take them). Threading: each call runs on the worker's event loop and
only reads.
"""

from __future__ import annotations

from typing import Any


def incoming(dask_worker: Any) -> list[dict[str, float]]:
    return [{"total": e["total"], "duration": e["duration"]} for e in dask_worker.transfer_incoming_log]


def ipc_stats() -> dict[str, Any]:
    from cudask.comm import ipc

    return {**ipc.stats(), "declined-because": ipc.declined()}


def store_figures(dask_worker: Any) -> dict[str, float]:
    """The cudask store's pinned-pool and spill figures (nothing for other stores):
    pinning ahead of spills runs while the device tier is past
    `memory.pinned-headroom-from` of its limit and can slow the worker's GPU work
    (docs/design/device-transfers.md)."""
    metrics = getattr(dask_worker.data, "metrics", None)
    if not callable(metrics):
        return {}
    return {k: v for k, v in metrics().items()  # cumulative: a figure never falls to 0
            if v and ("provision" in k or "deferred" in k or k.startswith(("spill-", "unspill-")))}


def worker_counters(dask_worker: Any) -> dict[str, float]:
    """This worker's IPC counters (`ipc-*`), what it fetched from other workers
    (distributed's transfer log: count, bytes, seconds) and its store's figures."""
    from cudask.comm import ipc

    log = incoming(dask_worker)
    fetched = {"fetches": float(len(log)), "fetched-bytes": float(sum(e["total"] for e in log)),
               "fetch-seconds": float(sum(e["duration"] for e in log))}
    return {**{f"ipc-{k}": float(v) for k, v in ipc.stats().items()}, **fetched, **store_figures(dask_worker)}


__all__ = ["incoming", "ipc_stats", "store_figures", "worker_counters"]
