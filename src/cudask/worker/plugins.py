"""The worker plugins cudask installs on every GPU worker, in this order:

1. ``cudask-cpu-affinity``: pins every thread of the worker process to the CPUs
   nearest its GPU (within the CPUs the process may use).
2. ``cudask-cuda-context``: creates the CUDA context on the worker's GPU (device
   0 of its rotated CUDA_VISIBLE_DEVICES) at start, checks it is that GPU, warns
   of contexts the process held before (a library using CUDA at import), logs
   once the other processes holding contexts there (cudask.worker.neighbours), and
   imports CuPy in a background thread while the worker registers, so the first
   task using it does not wait for the whole import.
3. ``cudask-close-store``: closes the worker's data store when the worker closes,
   before the teardowns after it (cudask.worker.closing).
4. ``cudask-rmm``: the RMM memory resource stack and external allocators
   (cudask.worker.rmm).
5. ``cudask-pre-import``: imports modules; a missing one fails the start.
6. ``cudask-cudf-spill``: cuDF's spilling options, when cuDF is installed.
7. ``cudask-metrics``: the store's per-tier sizes and spill counters as worker
   metrics (cudask.worker.metrics).
8. ``cudask-device-ipc``: sends device arrays to workers on the same host by
   CUDA IPC (cudask.comm.ipc), where this GPU can read the others' memory.
9. ``cudask-gc-freeze`` (``gc_freeze``, off by default): once the CuPy import of 2 is done,
   collects garbage once and freezes the objects the worker has (gc.freeze), so
   the full collections Python runs later, each a pause of the whole worker, scan
   only objects made after start (docs/design/worker-start.md).

Each has a stable name, is idempotent (a second setup on the same worker does
nothing) and undoes what it did on teardown where that is possible.
Does not cover: deciding which ones a worker gets (cudask.worker.spec).

Threading: distributed runs setup and teardown on the worker's event loop. The
two threads started here (importing CuPy; collecting and freezing once it is
done) are joined at teardown.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any, ClassVar

from distributed import WorkerPlugin

from cudask.comm import cudf_wire, ipc, ipc_cuda, leases, staging
from cudask.comm.ahead import MapAhead
from cudask.devices.nvml import gpus_without_peer_access
from cudask.worker import neighbours
from cudask.worker.context import active_contexts, device0_uuid

logger = logging.getLogger("cudask.worker")


def _thread_ids() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


class CPUAffinity(WorkerPlugin):
    """Pin all threads of the worker process (and so the threads it starts) to `cpus`."""

    name = "cudask-cpu-affinity"

    def __init__(self, cpus: Sequence[int]) -> None:
        self.cpus = tuple(cpus)
        self.previous: set[int] | None = None

    def setup(self, worker: Any) -> None:
        if self.previous is not None or not self.cpus:
            return
        self.previous = set(os.sched_getaffinity(0))
        for tid in _thread_ids():
            try:
                os.sched_setaffinity(tid, self.cpus)
            except OSError as exc:  # a thread that ended, or a cpuset that changed
                logger.debug("could not pin thread %s: %s", tid, exc)

    def teardown(self, worker: Any) -> None:
        if self.previous is None:
            return
        for tid in _thread_ids():
            try:
                os.sched_setaffinity(tid, self.previous)
            except OSError:
                pass
        self.previous = None


class CUDAContext(WorkerPlugin):
    """Create the CUDA context on the worker's own GPU when the worker starts.

    `seconds` is how long creating it took. The context comes from the CUDA driver
    (cudask.worker.context), so CuPy is not imported on the start path; a thread
    imports it (when installed) while the driver creates the context, and teardown
    waits for that thread. `neighbours`: the other processes found holding a
    context on the GPU at start (None: NVML could not tell)."""

    name = "cudask-cuda-context"
    background_imports = ("cupy",)

    def __init__(self, expected_uuid: str | None) -> None:
        self.expected_uuid = expected_uuid
        self.uuid: str | None = None
        self.seconds: float | None = None
        self.importer: threading.Thread | None = None
        self.neighbours: list[neighbours.Neighbour] | None = None

    def setup(self, worker: Any) -> None:
        if self.uuid is not None:
            return
        # The driver holds no GIL while it creates the context, so the library
        # imports run meanwhile rather than competing with the worker's start
        # (docs/design/worker-start.md).
        modules = [m for m in self.background_imports if importlib.util.find_spec(m) is not None]
        if modules:
            self.importer = threading.Thread(
                target=_import_all, args=(modules,), name="cudask-import", daemon=True
            )
            self.importer.start()
        _warn_earlier_contexts()
        start = time.perf_counter()
        self.uuid = device0_uuid()
        self.seconds = time.perf_counter() - start
        expected = self.expected_uuid
        if expected and expected.startswith("GPU-") and self.uuid != expected:
            raise RuntimeError(
                f"worker {worker.name}: CUDA device 0 is {self.uuid}, expected {expected}: "
                "CUDA numbers the GPUs differently from NVML here (CUDA_DEVICE_ORDER="
                f"{os.environ.get('CUDA_DEVICE_ORDER')!r}; PCI_BUS_ID matches NVML)"
            )
        self.neighbours = neighbours.report(worker.name, expected or self.uuid)

    def teardown(self, worker: Any) -> None:
        # The context lives as long as its process; an import still running must not
        # meet the interpreter's shutdown.
        if self.importer is not None:
            self.importer.join(timeout=60)
            self.importer = None


#: The words of the warning about a context that was there before the worker made its
#: own; they keep dask-cuda's, which log filters and tests look for.
EARLIER_CONTEXT = (
    "A CUDA context for device {ordinal} ({uuid}) already exists on process ID {pid}. This "
    "is often the result of a CUDA-enabled library calling a CUDA runtime function before "
    "Dask-CUDA (cudask) started the worker: import such a library inside tasks, or after the "
    "cluster has started (docs/cuda-contexts.md)."
)


def _warn_earlier_contexts() -> None:
    """Log each CUDA context this worker process held before its plugin made one: a
    library that used CUDA at import (e.g. in a spawned worker re-importing the script)."""
    for ordinal, uuid in active_contexts() or ():
        logger.warning(EARLIER_CONTEXT.format(ordinal=ordinal, uuid=uuid, pid=os.getpid()))


class GCFreeze(WorkerPlugin):
    """Collect garbage once the worker's start-up imports are done (CuPy's by
    `cudask-cuda-context` included), then freeze every object left (gc.freeze), so
    later full collections skip them. In a thread: the collection holds the GIL for
    as long as one full collection does, once, while the worker starts. A worker
    that already holds tasks by then freezes nothing (their data must stay
    collectable). gc.freeze acts on the whole process: workers sharing one count
    their freezes, and the last teardown unfreezes."""

    name = "cudask-gc-freeze"
    _lock: ClassVar[threading.Lock] = threading.Lock()
    _freezes: ClassVar[int] = 0  # plugins of this process whose freeze stands

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.frozen: int | None = None  # objects frozen, once done
        self.cancelled = False

    def setup(self, worker: Any) -> None:
        if self.thread is not None:
            return
        self.cancelled = False
        context = worker.plugins.get(CUDAContext.name)
        importer = getattr(context, "importer", None)
        self.thread = threading.Thread(
            target=self._freeze, args=(worker, importer), name="cudask-gc-freeze", daemon=True
        )
        self.thread.start()

    def _freeze(self, worker: Any, importer: threading.Thread | None) -> None:
        if importer is not None:
            importer.join()
        start = time.perf_counter()
        with GCFreeze._lock:
            if self.cancelled:
                return
            if worker.state.tasks:
                logger.info(
                    "gc_freeze: worker %s had tasks before its start-up imports "
                    "were done; nothing frozen",
                    worker.name,
                )
                return
            gc.collect()
            gc.freeze()
            GCFreeze._freezes += 1
            self.frozen = gc.get_freeze_count()
        logger.debug("froze %d objects in %.3f s", self.frozen, time.perf_counter() - start)

    def teardown(self, worker: Any) -> None:
        with GCFreeze._lock:
            self.cancelled = True  # a freeze not yet made is not made
        if self.thread is not None:
            self.thread.join(timeout=60)
            self.thread = None
        with GCFreeze._lock:
            if self.frozen is not None:
                self.frozen = None
                GCFreeze._freezes -= 1
                if GCFreeze._freezes == 0:
                    gc.unfreeze()


def _import_all(modules: Sequence[str]) -> None:
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - the task that needs it will raise it
            logger.debug("background import of %s failed: %s", module, exc)


class PreImport(WorkerPlugin):
    """Import `modules` at start; a missing one fails the worker start at once."""

    name = "cudask-pre-import"

    def __init__(self, modules: Sequence[str]) -> None:
        self.modules = tuple(modules)

    def setup(self, worker: Any) -> None:
        for module in self.modules:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise ImportError(
                    f"pre_import: worker {worker.name} cannot import {module!r}: {exc}"
                ) from exc


class CudfSpill(WorkerPlugin):
    """Set cuDF's spilling options in the worker process: `spill` and `spill_stats`
    as asked, and, with spilling on, `spill_on_demand` on and `spill_device_limit`
    unset, so cuDF spills its buffers only when an allocation fails; the worker's
    store holds `device_memory_limit` as in every mode. With spilling on, cuDF's
    spill manager is made here, at start: its failure callback then sits under the
    store's hooks (cuDF refuses to add one above another), so on a failed allocation
    cuDF spills first, then the store. The worker also sends cuDF objects in a form
    any process can read (cudask.comm.cudf_wire). Teardown restores the options; a
    spill manager once made stays for the life of the process (cuDF offers no undo)."""

    name = "cudask-cudf-spill"
    OPTIONS = ("spill", "spill_stats", "spill_on_demand", "spill_device_limit")

    def __init__(self, enable: bool, stats: int) -> None:
        self.enable = enable
        self.stats = stats
        self.previous: dict[str, Any] | None = None

    def setup(self, worker: Any) -> None:
        if self.previous is not None:
            return
        try:
            import cudf
        except ImportError:
            if self.enable:
                raise
            return
        self.previous = {name: cudf.get_option(name) for name in self.OPTIONS}
        cudf.set_option("spill", self.enable)
        cudf.set_option("spill_stats", self.stats)
        if self.enable:
            cudf.set_option("spill_on_demand", True)
            cudf.set_option("spill_device_limit", None)
            _start_cudf_spilling()
            cudf_wire.register()

    def teardown(self, worker: Any) -> None:
        if self.previous is None:
            return
        import cudf

        for name, value in self.previous.items():
            cudf.set_option(name, value)
        self.previous = None


def _start_cudf_spilling() -> None:
    """Make cuDF's spill manager now (it is made at first use otherwise); warn when
    this process had already made it without spilling, or when cuDF could not add
    its failure callback."""
    from cudf.core.buffer.spill_manager import get_global_manager

    try:
        manager = get_global_manager()
    except ValueError as exc:  # another failure callback is already in the RMM stack
        logger.warning(
            "enable_cudf_spill=True: cuDF spills at no failed allocation in this worker: %s", exc
        )
        return
    if manager is None:
        logger.warning(
            "enable_cudf_spill=True has no effect in this worker: cuDF was used "
            "here before the worker started, with spilling off"
        )


def _sweep() -> None:
    ipc.sweep()
    leases.sweep()


class DeviceIPC(WorkerPlugin):
    """Turn on `cudask.comm.ipc` in the worker process: device arrays for workers
    on this host go by CUDA IPC handle. Stays off, with one log line, on a MIG
    instance (CUDA IPC does not work there), when NVML shows a GPU of this host
    that this one cannot read by peer access (a receiver there could not map
    the memory), or without CuPy or cuda-bindings. With a lease, CuPy's default
    pool gives way to cudask.comm.leases' pool, whose sent chunks receivers keep
    mapped. The workers of a host map each other's RMM pool slabs when they
    start (cudask.comm.ahead), unless `map_ahead` (`cudask.comm.map-ahead`) is off,
    and with `staging` bytes, its staging area (cudask.comm.staging) among them,
    made when the worker first meets a peer of its host or first sends by IPC."""

    name = "cudask-device-ipc"
    # seconds between checks for kept mappings that have ended and leased chunks to free
    sweep_interval = 2.0

    def __init__(
        self,
        device_uuid: str,
        min_size: int,
        lease: float = 0.0,
        *,
        map_ahead: bool,
        staging: int = 0,
    ) -> None:
        self.device_uuid = device_uuid
        self.min_size = min_size
        self.lease = lease  # cudask.comm.device-ipc-lease: 0, no leasing pool
        self.map_ahead = map_ahead  # cudask.comm.map-ahead
        self.staging = staging  # cudask.comm.device-ipc-staging: bytes, 0 for none
        self.off_because: str | None = None  # why it stayed off (`cudask config` shows it)
        self._sweep: Any = None
        self._ahead: MapAhead | None = None

    def setup(self, worker: Any) -> None:
        if ipc.enabled():
            return
        from tornado.ioloop import PeriodicCallback

        # Kept mappings end with their sender or lease (cudask.comm.lifetimes); swept also
        # where this worker does not send by IPC, since its peers may still send to it.
        self._sweep = PeriodicCallback(_sweep, self.sweep_interval * 1000)
        self._sweep.start()
        reason = self.unavailable()
        backend = None
        if reason is None:
            try:
                backend = ipc_cuda.CudaBackend()
            except ImportError as exc:
                reason = f"{exc.name or exc} is not installed"
        if backend is not None and self.staging:  # made when first needed (cudask.comm.staging)
            staging.defer(backend, self.staging)
        if self.map_ahead:  # this host's workers' pool slabs mapped at start (cudask.comm.ahead)
            self._ahead = MapAhead(worker, staging.ensure)  # the area too, once a peer is met
            self._ahead.start()
        if backend is not None:
            ipc.enable(backend, self.min_size)
            if self.lease:  # CuPy's own pool: its sent chunks leased (cudask.comm.leases)
                leases.install(self.lease)
            return
        self.off_because = reason
        logger.info(
            "cudask: device data between this host's workers go through host memory, "
            "not CUDA IPC: %s",
            reason,
        )

    def unavailable(self) -> str | None:
        """Why this worker cannot send by CUDA IPC, or None."""
        if self.device_uuid.startswith("MIG-"):
            return f"{self.device_uuid} is a MIG instance"
        blocked = gpus_without_peer_access(self.device_uuid)
        if blocked:
            return f"{self.device_uuid} has no peer access to {', '.join(blocked)}"
        return None

    def teardown(self, worker: Any) -> None:
        if self._sweep is not None:
            self._sweep.stop()
            self._sweep = None
        if self._ahead is not None:
            self._ahead.stop()
            self._ahead = None
        ipc.close_mappings()  # while the backend that opened them is still set
        ipc.disable()
