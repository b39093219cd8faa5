"""What a bench worker counts: its IPC counters, its fetches, its store's figures.

Covers: functions run on every worker with `client.run` (by reference, so cudask_bench
must be importable there): `worker_counters`, this worker's IPC counters
(cudask.comm.ipc), what it fetched from other workers (distributed's transfer log:
count, bytes, seconds) and its store's pinned-pool and spill figures; `store_figures`
alone; `ipc_stats`, the IPC counters with the reasons a transfer declined IPC;
`incoming`, the transfer log itself; `difference`, what changed between two readings
(rates left out). Does not cover: when the benchmarks take readings. Threading: the
worker functions run on the worker's event loop and only read; `difference` is pure.
"""

from __future__ import annotations

from typing import Any


def difference(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """How much each counter that changed went up or down from `before` to `after`;
    rates ("-gbps") are left out: their difference means nothing."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()
            if v != before.get(k, 0.0) and not k.endswith("gbps")}


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


__all__ = ["difference", "incoming", "ipc_stats", "store_figures", "worker_counters"]
