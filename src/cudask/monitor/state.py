"""What the scheduler knows of every GPU worker: tiers, pinned memory, rates, GPU.

Covers: `MonitorPlugin`, a distributed SchedulerPlugin ("cudask-monitor") that
samples every worker's heartbeat metrics once a second (cudask's store
metrics under `cudask`, the GPU's UUID and PCIe/NVLink counters under
`cudask-gpu`, distributed's own NVML figures under `gpu`) and keeps five
minutes of them, so it can tell spill, unspill, PCIe and NVLink rates over
the last seconds; `snapshot()` and `history()` give that as JSON-ready
dicts. On start it adds the dashboard page and its JSON routes
(`cudask.monitor.page.routes`) to the scheduler's HTTP server, and puts every
worker's series on the scheduler's Prometheus page (`/metrics`), labelled by
worker, host and GPU UUID (`SchedulerCollector`).

Also `snapshot(dask_scheduler)` for `client.run_on_scheduler` (works without
the plugin too, rates then unknown) and `install(client)`, which registers
the plugin on a running scheduler that lacks it (`cudask top` does; a
LocalCUDACluster's scheduler has it, `dask scheduler --preload cudask.monitor` too).

Does not cover: the page (`cudask.monitor.views`, `.document`, `.page`), the terminal view
(`cudask.cli.top`), the workers' side (`cudask.worker.metrics.StoreMetrics`).

Threading: everything runs on the scheduler's event loop, except the
Prometheus collector, which reads `snapshot()` (built from plain dicts under a
lock) from prometheus_client's calling thread.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import SchedulerPlugin

if TYPE_CHECKING:
    from distributed import Client, Scheduler

NAME = "cudask-monitor"
#: Seconds over which rates are measured.
WINDOW = 10.0
#: Seconds of history kept.
KEEP = 300.0

# (row field, `cudask` store metric) for the tier and pinned-memory figures
_SIZES = (
    ("device_bytes", "device-bytes"),
    ("device_limit_bytes", "device-limit-bytes"),
    ("host_bytes", "host-bytes"),
    ("disk_bytes", "disk-bytes"),
    ("pinned_reserved_bytes", "pinned-reserved-bytes"),
    ("pinned_in_use_bytes", "pinned-in-use-bytes"),
)
# cumulative counters: (name, source dict, key); rates come from their differences
_COUNTERS = (
    ("spilled_bytes_total", "cudask", "spill-device-to-host-bytes"),
    ("unspilled_bytes_total", "cudask", "unspill-host-to-device-bytes"),
    ("disk_written_bytes_total", "cudask", "spill-host-to-disk-bytes"),
    ("disk_read_bytes_total", "cudask", "unspill-disk-to-host-bytes"),
    ("pcie_tx_bytes_total", "cudask-gpu", "pcie-tx-bytes"),
    ("pcie_rx_bytes_total", "cudask-gpu", "pcie-rx-bytes"),
    ("nvlink_tx_bytes_total", "cudask-gpu", "nvlink-tx-bytes"),
    ("nvlink_rx_bytes_total", "cudask-gpu", "nvlink-rx-bytes"),
)
# rate field -> the counter it comes from
_RATES = {
    "spill_gbps": "spilled_bytes_total",
    "unspill_gbps": "unspilled_bytes_total",
    "pcie_tx_gbps": "pcie_tx_bytes_total",
    "pcie_rx_gbps": "pcie_rx_bytes_total",
    "nvlink_tx_gbps": "nvlink_tx_bytes_total",
    "nvlink_rx_gbps": "nvlink_rx_bytes_total",
}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def worker_row(ws: Any) -> dict[str, Any]:
    """One worker's figures from its last heartbeat (rates left None)."""
    metrics: Mapping[str, Any] = ws.metrics or {}
    store = metrics.get("cudask")
    store = store if isinstance(store, Mapping) else {}
    gpu = metrics.get("cudask-gpu")
    gpu = gpu if isinstance(gpu, Mapping) else {}
    nvml = metrics.get("gpu")
    nvml = nvml if isinstance(nvml, Mapping) else {}
    static = (ws.extra or {}).get("gpu") or {}
    row: dict[str, Any] = {
        "name": str(ws.name),
        "address": ws.address,
        "host": ws.host,
        "gpu_uuid": gpu.get("uuid"),
        "gpu_name": gpu.get("name")
        or (static.get("name") if isinstance(static, Mapping) else None),
        "cudask": bool(store),
    }
    for field, key in _SIZES:
        row[field] = _number(store.get(key)) or 0.0
    sources = {"cudask": store, "cudask-gpu": gpu}
    for field, source, key in _COUNTERS:
        row[field] = _number(sources[source].get(key))
    # distributed's NVML figures: flattened into the heartbeat's metrics by its
    # system monitor (gpu_utilization, gpu_memory_used, gpu-memory-total), or nested
    row["gpu_utilization"] = _number(metrics.get("gpu_utilization", nvml.get("utilization")))
    row["gpu_memory_used_bytes"] = _number(metrics.get("gpu_memory_used", nvml.get("memory-used")))
    total = static.get("memory-total") if isinstance(static, Mapping) else None
    row["gpu_memory_total_bytes"] = _number(metrics.get("gpu-memory-total", total))
    for field in _RATES:
        row[field] = None
    return row


def _reason(rows: list[dict[str, Any]], workers: int) -> str | None:
    if workers == 0:
        return "no workers are connected to this scheduler"
    if not any(row["cudask"] for row in rows):
        return (
            f"none of the {workers} worker(s) reports cudask metrics: start them with "
            "`cudask worker` / `dask cuda worker` or LocalCUDACluster"
        )
    return None


class MonitorPlugin(SchedulerPlugin):
    """Samples GPU workers' heartbeats; serves the page, its JSON and Prometheus."""

    name = NAME

    def __init__(self, interval: float = 1.0, window: float = WINDOW, keep: float = KEEP) -> None:
        self.interval = interval
        self.window = window
        self.keep = keep
        self.scheduler: Scheduler | None = None
        self._callback: Any = None
        self._lock = threading.Lock()
        self._times: deque[float] = deque()
        # worker address -> deque of (time, row) samples
        self._samples: dict[str, deque[tuple[float, dict[str, Any]]]] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        # sent to a scheduler by `install`: its settings, not its samples or lock
        return (MonitorPlugin, (self.interval, self.window, self.keep))

    # -- lifecycle -------------------------------------------------------------------
    async def start(self, scheduler: Scheduler) -> None:
        if self.scheduler is not None:
            return
        from tornado.ioloop import PeriodicCallback

        self.scheduler = scheduler
        self.sample()
        self._callback = PeriodicCallback(self.sample, self.interval * 1000)
        self._callback.start()
        app = getattr(scheduler, "http_application", None)
        if app is not None:
            from cudask.monitor.page import routes

            app.add_handlers(r".*", routes(self))
        _PLUGINS.add(self)
        _register_collector()

    async def close(self) -> None:
        if self._callback is not None:
            self._callback.stop()
            self._callback = None
        _PLUGINS.discard(self)

    # -- sampling --------------------------------------------------------------------
    def sample(self) -> None:
        """Record every worker's current figures (runs each `interval`)."""
        scheduler = self.scheduler
        if scheduler is None:
            return
        now = time.time()
        with self._lock:
            self._times.append(now)
            while self._times and self._times[0] < now - self.keep:
                self._times.popleft()
            present = set()
            for address, ws in list(scheduler.workers.items()):
                present.add(address)
                samples = self._samples.setdefault(address, deque())
                samples.append((now, worker_row(ws)))
                while samples and samples[0][0] < now - self.keep:
                    samples.popleft()
                samples[-1][1].update(self._rates(samples))
            for address in set(self._samples) - present:
                del self._samples[address]

    def _rates(self, samples: deque[tuple[float, dict[str, Any]]]) -> dict[str, Any]:
        """The rates at the newest sample, each over the `window` seconds before it
        or, early on, since the oldest sample that has its counter (lock held;
        walks back at most a window of samples)."""
        t1, last = samples[-1]
        out: dict[str, Any] = {}
        for field, counter in _RATES.items():
            end = last.get(counter)
            start: tuple[float, float] | None = None
            for i in range(len(samples) - 2, -1, -1):
                t0, row = samples[i]
                if row.get(counter) is not None:
                    start = (t0, row[counter])
                if t0 <= t1 - self.window:
                    break
            out[field] = (
                max(end - start[1], 0.0) / (t1 - start[0]) / 1e9
                if end is not None and start is not None and start[0] < t1
                else None
            )
        return out

    # -- views -----------------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        """Every worker's latest figures with its rates, sorted by host and name."""
        with self._lock:
            rows = [dict(samples[-1][1]) for samples in self._samples.values() if samples]
        return sorted(rows, key=lambda r: (r["host"], r["name"]))

    def snapshot(self) -> dict[str, Any]:
        """{"time", "workers": rows, "cudask_workers", "reason", "plugin": True}."""
        workers = len(self.scheduler.workers) if self.scheduler is not None else 0
        return _snapshot(self.rows(), workers, plugin=True)

    def history(self) -> dict[str, Any]:
        """The last `keep` seconds: {"time": [...], "workers": {name: {field: [...]}}},
        every list aligned with "time" (None where a worker has no sample)."""
        fields = ("spill_gbps", "unspill_gbps", "device_bytes", "host_bytes", "disk_bytes")
        with self._lock:
            times = list(self._times)
            position = {t: i for i, t in enumerate(times)}
            workers: dict[str, dict[str, list[float | None]]] = {}
            for samples in self._samples.values():
                if not samples:
                    continue
                series: dict[str, list[float | None]] = {f: [None] * len(times) for f in fields}
                for t, row in samples:
                    j = position.get(t)
                    if j is not None:
                        for f in fields:
                            series[f][j] = row[f]
                workers[samples[-1][1]["name"]] = series
        return {"time": times, "workers": workers}


def snapshot(dask_scheduler: Scheduler) -> dict[str, Any]:
    """For `client.run_on_scheduler`: the plugin's snapshot, or without the plugin
    the workers' last heartbeats (rates None, "plugin": False)."""
    plugin = dask_scheduler.plugins.get(NAME)
    if isinstance(plugin, MonitorPlugin):
        return plugin.snapshot()
    rows = sorted(
        (worker_row(ws) for ws in dask_scheduler.workers.values()),
        key=lambda r: (r["host"], r["name"]),
    )
    return _snapshot(rows, len(dask_scheduler.workers), plugin=False)


def _snapshot(rows: list[dict[str, Any]], workers: int, *, plugin: bool) -> dict[str, Any]:
    """The JSON view of `rows` out of `workers` connected workers."""
    return {
        "time": time.time(),
        "workers": rows,
        "cudask_workers": sum(1 for r in rows if r["cudask"]),
        "reason": _reason(rows, workers),
        "plugin": plugin,
    }


def _has_plugin(dask_scheduler: Scheduler) -> bool:
    return NAME in dask_scheduler.plugins


def install(client: Client) -> bool:
    """Register the MonitorPlugin on the client's scheduler unless it has one;
    return whether it was installed now. The scheduler must be able to import
    cudask."""
    if client.run_on_scheduler(_has_plugin):
        return False
    client.register_plugin(MonitorPlugin())
    return True


# ------------------------------------------------------------------------ Prometheus
_PLUGINS: weakref.WeakSet[MonitorPlugin] = weakref.WeakSet()
_collector_registered = False
_collector_lock = threading.Lock()

#: (series name, row field, help, kind) of the scheduler's Prometheus page
SERIES = (
    (
        "cudask_worker_device_bytes",
        "device_bytes",
        "Device memory held by the worker's store",
        "gauge",
    ),
    ("cudask_worker_device_limit_bytes", "device_limit_bytes", "Device tier limit", "gauge"),
    (
        "cudask_worker_host_bytes",
        "host_bytes",
        "Host memory held by the store's host tier",
        "gauge",
    ),
    ("cudask_worker_disk_bytes", "disk_bytes", "Bytes the store holds on disk", "gauge"),
    (
        "cudask_worker_pinned_reserved_bytes",
        "pinned_reserved_bytes",
        "Pinned host memory reserved",
        "gauge",
    ),
    (
        "cudask_worker_pinned_in_use_bytes",
        "pinned_in_use_bytes",
        "Pinned host memory in use",
        "gauge",
    ),
    (
        "cudask_worker_spilled_bytes",
        "spilled_bytes_total",
        "Bytes copied device to host",
        "counter",
    ),
    (
        "cudask_worker_unspilled_bytes",
        "unspilled_bytes_total",
        "Bytes copied host to device",
        "counter",
    ),
    (
        "cudask_worker_disk_written_bytes",
        "disk_written_bytes_total",
        "Bytes spilled host to disk",
        "counter",
    ),
    (
        "cudask_worker_disk_read_bytes",
        "disk_read_bytes_total",
        "Bytes read back from disk",
        "counter",
    ),
    (
        "cudask_worker_gpu_pcie_tx_bytes",
        "pcie_tx_bytes_total",
        "Bytes the GPU sent over PCIe (NVML)",
        "counter",
    ),
    (
        "cudask_worker_gpu_pcie_rx_bytes",
        "pcie_rx_bytes_total",
        "Bytes the GPU received over PCIe (NVML)",
        "counter",
    ),
    (
        "cudask_worker_gpu_nvlink_tx_bytes",
        "nvlink_tx_bytes_total",
        "Bytes sent over NVLink (NVML)",
        "counter",
    ),
    (
        "cudask_worker_gpu_nvlink_rx_bytes",
        "nvlink_rx_bytes_total",
        "Bytes received over NVLink (NVML)",
        "counter",
    ),
    (
        "cudask_worker_gpu_memory_used_bytes",
        "gpu_memory_used_bytes",
        "GPU memory used (NVML)",
        "gauge",
    ),
    (
        "cudask_worker_gpu_memory_total_bytes",
        "gpu_memory_total_bytes",
        "GPU memory (NVML)",
        "gauge",
    ),
    (
        "cudask_worker_gpu_utilization_ratio",
        "gpu_utilization",
        "GPU utilization, 0-1 (NVML)",
        "gauge",
    ),
)
LABELS = ("worker", "host", "gpu_uuid")


class SchedulerCollector:
    """Every cudask worker's series, from every running MonitorPlugin in this
    process, for prometheus_client (scheduler's /metrics)."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        rows = [row for plugin in list(_PLUGINS) for row in plugin.rows() if row["cudask"]]
        for name, field, help_text, kind in SERIES:
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                name, help_text, labels=LABELS
            )
            for row in rows:
                value = row.get(field)
                if value is None:
                    continue
                if field == "gpu_utilization":
                    value = value / 100.0
                family.add_metric([row["name"], row["host"], row["gpu_uuid"] or ""], float(value))
            yield family


def _register_collector() -> None:
    """Put `SchedulerCollector` in prometheus_client's registry, once per process."""
    global _collector_registered
    with _collector_lock:
        if _collector_registered:
            return
        try:
            import prometheus_client
        except ImportError:  # a dependency of cudask; absent only in a broken install
            return
        prometheus_client.REGISTRY.register(SchedulerCollector())
        _collector_registered = True


__all__ = [
    "KEEP",
    "LABELS",
    "NAME",
    "SERIES",
    "WINDOW",
    "MonitorPlugin",
    "SchedulerCollector",
    "install",
    "snapshot",
    "worker_row",
]
