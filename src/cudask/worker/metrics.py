"""The worker's metrics: its store's tiers and moves, its GPU and the GPU's traffic.

Covers: `StoreMetrics` (the ``cudask-metrics`` plugin), which publishes the data
store's metrics as the `cudask` worker metric and the GPU with its PCIe/NVLink
counters as `cudask-gpu` (heartbeats to the scheduler, whose monitor plugin turns them
into the dashboard page, Prometheus series and `cudask top`), and `StoreCollector`,
the same on the worker's own Prometheus page. Does not cover: the store's figures
(cudask.memory), the scheduler side (cudask.monitor).

Threading: the metrics run where distributed and prometheus_client read them; a lock
guards the collector's registration. distributed may iterate `worker.metrics` at any
time: setup and teardown replace the dict, never change it.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any, ClassVar

from distributed import WorkerPlugin

from cudask.devices.nvml import gpu_model, transfer_counters
from cudask.memory.store import worker_metrics
from cudask.worker.plugins import CUDAContext


class StoreCollector:
    """A Prometheus collector of the stores' metrics: every key of `metrics()` as a
    gauge `cudask_store_<key>{worker=...}` on the worker's /metrics page. One per
    process (workers started in-process share prometheus_client's registry)."""

    workers: ClassVar[weakref.WeakSet[Any]] = weakref.WeakSet()
    _registered: ClassVar[bool] = False
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def add(cls, worker: Any) -> None:
        """Collect `worker`'s store metrics (registers the collector once)."""
        cls.workers.add(worker)
        with cls._lock:
            if cls._registered:
                return
            try:
                import prometheus_client
            except ImportError:
                return
            prometheus_client.REGISTRY.register(cls())
            cls._registered = True

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        families: dict[str, Any] = {}
        for worker in list(self.workers):
            for key, value in sorted(store_metrics(worker).items()):
                name = "cudask_store_" + key.replace("-", "_")
                family = families.get(name)
                if family is None:
                    family = families[name] = GaugeMetricFamily(
                        name, f"cudask data store: {key}", labels=["worker"]
                    )
                family.add_metric([str(worker.name)], float(value))
        yield from families.values()


def store_metrics(worker: Any) -> dict[str, float]:
    """`cudask` worker metric: the worker's store metrics (`worker_metrics`); {} once the
    store is closed (it is closing when the worker closes: its lock may be held a while)."""
    if getattr(worker.data, "closed", False):
        return {}
    return worker_metrics(worker)


def gpu_identity(worker: Any) -> dict[str, Any]:
    """`cudask-gpu` worker metric: the worker's GPU (UUID from the CUDA context
    plugin, and its model name) and its cumulative PCIe and NVLink byte counters
    from NVML (None where NVML does not count them)."""
    context = worker.plugins.get(CUDAContext.name)
    uuid = getattr(context, "uuid", None)
    if uuid is None:
        return {"uuid": None}
    return {"uuid": uuid, "name": _model(uuid), **transfer_counters(uuid)}


@functools.lru_cache(maxsize=8)
def _model(uuid: str) -> str | None:
    return gpu_model(uuid)


class StoreMetrics(WorkerPlugin):
    """Publish the data store's tier sizes and spill counters as `cudask` worker
    metrics, and the worker's GPU with its PCIe/NVLink counters as `cudask-gpu`
    (heartbeats to the scheduler, whose cudask-monitor plugin turns them into the
    dashboard page, Prometheus series and `cudask top`), and the store's metrics
    on the worker's own Prometheus page."""

    name = "cudask-metrics"
    key = "cudask"
    gpu_key = "cudask-gpu"

    # distributed's Worker.get_metrics iterates `worker.metrics` itself, awaiting the
    # metrics that return awaitables on the way (a heartbeat may be suspended there at
    # any time): setup and teardown put a new dict in its place and never change the
    # one it may be iterating. A call that began before a teardown still calls these
    # metrics once more; both answer a closed store or a missing plugin harmlessly.
    def setup(self, worker: Any) -> None:
        ours = {self.key: store_metrics, self.gpu_key: gpu_identity}
        if any(worker.metrics.get(k) is not v for k, v in ours.items()):
            worker.metrics = {**worker.metrics, **ours}
        StoreCollector.add(worker)

    def teardown(self, worker: Any) -> None:
        ours = (self.key, self.gpu_key)
        if any(k in worker.metrics for k in ours):
            worker.metrics = {k: v for k, v in worker.metrics.items() if k not in ours}
        StoreCollector.workers.discard(worker)


__all__ = ["StoreCollector", "StoreMetrics", "gpu_identity", "store_metrics"]
