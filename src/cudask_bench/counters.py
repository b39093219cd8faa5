"""What a bench worker counts: its IPC counters, its fetches, its store's figures.

Covers: functions run on every worker with `client.run` (by reference, so cudask_bench
must be importable there): `worker_counters`, this worker's IPC counters
(cudask.comm.ipc), what it fetched from other workers (distributed's transfer log:
count, bytes, seconds) and its store's pinned-pool and spill figures; `store_figures`
alone; `held_figures`, the bytes its store holds on device and host now, with the spill
figures; `watch_spills`, which has a store built on a zict Buffer over the device
(dask-cuda's DeviceHostFile) count what it moves to host from then on, so
`store_figures` gives its spills as cudask's store gives its own; `ipc_stats`, the IPC
counters with the reasons a transfer declined IPC; `incoming`, the transfer log itself;
`difference`, what changed between two readings (rates left out); `stream_figures`,
what the workers did in a window of the scheduler's task stream.

Does not cover: when the benchmarks take readings.

Threading: the worker functions run on the worker's event loop and only read, but
`watch_spills`, which adds a callback that runs in the thread that spills (one float
addition per spill under the GIL); `difference` and `stream_figures` are pure.
"""

from __future__ import annotations

import weakref
from collections.abc import Collection, Iterable, Mapping
from typing import Any


def difference(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """How much each counter that changed went up or down from `before` to `after`;
    rates ("-gbps") are left out: their difference means nothing."""
    return {
        k: v - before.get(k, 0.0)
        for k, v in after.items()
        if v != before.get(k, 0.0) and not k.endswith("gbps")
    }


def _key(key: Any) -> Any:
    """A task key as the graph has it (a tuple key may arrive as a list)."""
    return tuple(_key(k) for k in key) if isinstance(key, (list, tuple)) else key


def stream_figures(
    records: Iterable[Mapping[str, Any]] | None,
    began: float,
    ended: float,
    keys: Collection[Any] | None = None,
) -> dict[str, float]:
    """What the workers did between `began` and `ended` (epoch seconds) by the scheduler's
    task stream (`client.get_task_stream`): the tasks (of `keys` only, when given), the
    seconds of each action summed over workers (`compute_s`, `transfer_s`, ...), and the
    wait before the first span started (`before_first_s`), from the first start to the
    last stop (`busy_s`) and after it (`after_last_s`): how much of a run was the
    workers' work."""
    out: dict[str, float] = {"tasks": 0.0}
    first, last = ended, began
    for record in records or ():
        if keys is not None and _key(record.get("key")) not in keys:
            continue
        out["tasks"] += 1
        for span in record.get("startstops", ()):
            start, stop = max(began, float(span["start"])), min(ended, float(span["stop"]))
            if stop > start:
                key = f"{span.get('action')}_s"
                out[key] = out.get(key, 0.0) + stop - start
                first, last = min(first, start), max(last, stop)
    busy = max(0.0, last - first)
    return {
        **out,
        "before_first_s": (first - began) if busy else 0.0,
        "busy_s": busy,
        "after_last_s": (ended - last) if busy else 0.0,
    }


def incoming(dask_worker: Any) -> list[dict[str, float]]:
    return [
        {"total": e["total"], "duration": e["duration"]} for e in dask_worker.transfer_incoming_log
    ]


def ipc_stats() -> dict[str, Any]:
    from cudask.comm import ipc

    return {**ipc.stats(), "declined-because": ipc.declined()}


# What each watched zict Buffer (by id, with a weak reference telling a reused id from
# the buffer itself) moved from device to host since `watch_spills`.
_watched: dict[int, tuple[weakref.ref[Any], dict[str, float]]] = {}


def _counts(buffer: Any) -> dict[str, float] | None:
    """What `watch_spills` counts for `buffer`; None when it is not watched."""
    entry = _watched.get(id(buffer))
    return entry[1] if entry is not None and entry[0]() is buffer else None


def watch_spills(dask_worker: Any) -> bool:
    """Count, from now on, what the worker's store moves from device to host when the
    store keeps the device tier in a zict Buffer (`data.device_buffer`, as dask-cuda's
    DeviceHostFile does); False for other stores (cudask's count their own) and when
    already watched."""
    from distributed.sizeof import safe_sizeof

    buffer = getattr(dask_worker.data, "device_buffer", None)
    callbacks = getattr(buffer, "fast_to_slow_callbacks", None)
    if not isinstance(callbacks, list) or _counts(buffer) is not None:
        return False
    counts = {"spill-device-to-host-count": 0.0, "spill-device-to-host-bytes": 0.0}
    _watched[id(buffer)] = (weakref.ref(buffer), counts)

    def moved(key: Any, value: Any) -> None:
        counts["spill-device-to-host-count"] += 1
        counts["spill-device-to-host-bytes"] += float(safe_sizeof(value))

    callbacks.append(moved)
    return True


def store_figures(dask_worker: Any) -> dict[str, float]:
    """The cudask store's pinned-pool and spill figures; for a store `watch_spills`
    watches, what it moved from device to host; nothing for other stores. Pinning
    host memory ahead of spills can slow the worker's GPU work
    (docs/design/device-transfers.md)."""
    metrics = getattr(dask_worker.data, "metrics", None)
    if not callable(metrics):
        watched = _counts(getattr(dask_worker.data, "device_buffer", None)) or {}
        return {k: v for k, v in watched.items() if v}
    return _moves_and_pinning(metrics())


def _moves_and_pinning(metrics: Mapping[str, float]) -> dict[str, float]:
    """The spill and pinned-pool figures of a cudask store's `metrics()` that are not 0
    (cumulative: a figure never falls back to 0)."""
    return {
        k: v
        for k, v in metrics.items()
        if v and ("provision" in k or "deferred" in k or k.startswith(("spill-", "unspill-")))
    }


def held_figures(dask_worker: Any) -> dict[str, float]:
    """What the worker's store holds now and has spilled so far: `device-bytes` (cudask's
    store: the union of its device keys' allocations; a store built on a zict Buffer over
    the device, as dask-cuda's: the sum of its device keys' sizes), `host-bytes` and the
    spill figures of `store_figures`; nothing for other stores."""
    data = dask_worker.data
    metrics = getattr(data, "metrics", None)
    if callable(metrics):
        now = metrics()
        return {
            **{k: float(now.get(k, 0.0)) for k in ("device-bytes", "host-bytes")},
            **_moves_and_pinning(now),
        }
    buffer = getattr(data, "device_buffer", None)
    fast, slow = getattr(buffer, "fast", None), getattr(data, "host_buffer", None)
    if fast is None or not hasattr(fast, "total_weight"):
        return {}
    host = getattr(getattr(slow, "fast", None), "total_weight", None)
    return {
        "device-bytes": float(fast.total_weight),
        **({"host-bytes": float(host)} if host is not None else {}),
        **store_figures(dask_worker),
    }


def worker_counters(dask_worker: Any) -> dict[str, float]:
    """This worker's IPC counters (`ipc-*`), what it fetched from other workers
    (distributed's transfer log: count, bytes, seconds) and its store's figures."""
    from cudask.comm import ipc

    log = incoming(dask_worker)
    fetched = {
        "fetches": float(len(log)),
        "fetched-bytes": float(sum(e["total"] for e in log)),
        "fetch-seconds": float(sum(e["duration"] for e in log)),
    }
    return {
        **{f"ipc-{k}": float(v) for k, v in ipc.stats().items()},
        **fetched,
        **store_figures(dask_worker),
    }


__all__ = [
    "difference",
    "held_figures",
    "incoming",
    "ipc_stats",
    "store_figures",
    "stream_figures",
    "watch_spills",
    "worker_counters",
]
