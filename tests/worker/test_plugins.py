"""Worker plugins on CPU: idempotence, teardown, failures."""

from __future__ import annotations

import os
import types
from typing import Any

import pytest

from cudask.testing import wait_for
from cudask.worker.metrics import StoreMetrics
from cudask.worker.plugins import CPUAffinity, PreImport


def test_affinity_pins_and_restores():
    before = os.sched_getaffinity(0)
    target = {min(before)}
    p = CPUAffinity(sorted(target))
    p.setup(worker=None)
    p.setup(worker=None)  # idempotent
    assert os.sched_getaffinity(0) == target
    p.teardown(worker=None)
    assert os.sched_getaffinity(0) == before


def test_pre_import_missing_module_fails():
    p = PreImport(["json", "surely_not_a_module_xyz"])
    with pytest.raises(ImportError, match="surely_not_a_module_xyz"):
        p.setup(worker=types.SimpleNamespace(name="w0"))


class _Worker:
    """What the metrics plugin touches on a worker (weak-referenceable, as Worker is)."""

    def __init__(self, metrics: dict[str, float], name: str = "w0") -> None:
        self.name = name
        self.metrics: dict[str, object] = {}
        self.data = types.SimpleNamespace(metrics=lambda: metrics)
        self.plugins: dict[str, object] = {}


def test_store_metrics_registered_and_removed():
    w = _Worker({"device_bytes": 5.0})
    p = StoreMetrics()
    p.setup(w)
    assert w.metrics["cudask"](w) == {"device_bytes": 5.0}
    assert w.metrics["cudask-gpu"](w) == {"uuid": None}  # no CUDA context plugin here
    p.teardown(w)
    assert "cudask" not in w.metrics and "cudask-gpu" not in w.metrics


def test_store_metrics_on_the_prometheus_page():
    prometheus_client = pytest.importorskip("prometheus_client")
    a, b = _Worker({"device-bytes": 5.0, "host-keys": 2.0}), _Worker({"device-bytes": 7.0}, "w1")
    p = StoreMetrics()
    p.setup(a)
    p.setup(a)  # idempotent: one collector
    p.setup(b)  # two in-process workers share the registry
    try:
        page = prometheus_client.generate_latest().decode()
        assert 'cudask_store_device_bytes{worker="w0"} 5.0' in page
        assert 'cudask_store_device_bytes{worker="w1"} 7.0' in page
        assert 'cudask_store_host_keys{worker="w0"} 2.0' in page
    finally:
        p.teardown(a)
        p.teardown(b)
    assert "cudask_store_device_bytes{" not in prometheus_client.generate_latest().decode()


def test_store_metrics_never_change_the_dict_a_heartbeat_iterates():
    """distributed's Worker.get_metrics iterates `worker.metrics` and awaits the metrics
    that return awaitables on the way; the plugin's teardown, run while one such call is
    suspended there, leaves that call to finish with every value it reads."""
    import asyncio

    from distributed import Scheduler, Worker

    async def main() -> None:
        suspended, release = asyncio.Event(), asyncio.Event()
        armed = [False]

        async def slow_metric(worker: Any) -> int:  # another plugin's awaitable metric
            if armed[0]:
                armed[0] = False
                suspended.set()
                await release.wait()
            return 1

        async with (
            Scheduler(dashboard_address=":0", port=0) as scheduler,
            Worker(
                scheduler.address,
                nthreads=1,
                dashboard_address=":0",
                heartbeat_interval="1h",
                metrics={"slow": slow_metric},
            ) as worker,
        ):
            plugin = StoreMetrics()
            await worker.plugin_add(plugin)
            seen = worker.metrics
            assert list(seen) == ["slow", "cudask", "cudask-gpu"]
            armed[0] = True
            call = asyncio.create_task(worker.get_metrics())
            await asyncio.wait_for(suspended.wait(), 60)  # get_metrics is inside the loop
            await worker.plugin_remove(plugin.name)
            assert "cudask" not in worker.metrics and "cudask-gpu" not in worker.metrics
            release.set()
            out = await asyncio.wait_for(call, 60)
            assert out["slow"] == 1
            assert out["cudask"] == {}  # the store is a dict: nothing to report
            assert out["cudask-gpu"] == {"uuid": None}
            assert list(seen) == ["slow", "cudask", "cudask-gpu"]  # the dict iterated: unchanged
            await worker.plugin_add(plugin)  # and registered again after a teardown
            assert list(worker.metrics) == ["slow", "cudask", "cudask-gpu"]

    asyncio.run(main())


def _on_disk(n: int) -> object:
    from cudask.testing.fake_cuda import filled

    return filled(n, 7)


def test_close_store_closes_the_store_as_the_worker_closes(tmp_path: Any) -> None:
    """A worker with keys on disk closes: its store is closed (spilled files removed)
    before the worker's directory goes; a plain dict store is left as it is."""
    import asyncio

    from distributed import Client, Scheduler, Worker, wait

    from cudask.testing.stores import fake_store
    from cudask.worker.closing import CloseStore

    async def main() -> None:
        store = {"device_memory_limit": 1 << 20, "memory_limit": 2 << 20}
        async with Scheduler(dashboard_address=":0", port=0) as scheduler:
            async with (
                Worker(
                    scheduler.address,
                    nthreads=1,
                    dashboard_address=":0",
                    data=(fake_store, store),
                    plugins=[CloseStore()],
                    local_directory=str(tmp_path),
                ) as worker,
                Client(scheduler.address, asynchronous=True) as client,
            ):
                futures = client.map(_on_disk, [256 << 10] * 32, pure=False)
                await wait(futures)
                data = worker.data
                assert data.metrics()["disk-keys"] > 0
            assert data.closed and len(data) == 0
            async with Worker(
                scheduler.address,
                nthreads=1,
                dashboard_address=":0",
                data=dict,
                plugins=[CloseStore()],
                local_directory=str(tmp_path),
            ) as worker:
                plain = worker.data
            assert type(plain) is dict

    asyncio.run(main())
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and not p.name.endswith(".lock")]


class _FakeCupy:
    """Just what device0_uuid touches, with CuPy's NUL-cut UUID."""

    def __init__(self, uuid: bytes, bus_id: str) -> None:
        import types

        device = types.SimpleNamespace(use=lambda: None, pci_bus_id=bus_id)
        runtime = types.SimpleNamespace(
            free=lambda ptr: None, getDeviceProperties=lambda i: {"uuid": uuid}
        )
        self.cuda = types.SimpleNamespace(Device=lambda i: device, runtime=runtime)


def test_device0_uuid_when_cupy_cuts_it_at_a_zero_byte(monkeypatch):
    """Seen on an H100 (GPU-0c3fd5d4-0096-...): CuPy returned 4 of the 16 bytes."""
    import sys

    import cudask.devices
    from cudask.devices import discover
    from cudask.testing import FakeBackend, fake_gpu
    from cudask.worker.context import device0_uuid

    machine = discover(FakeBackend([fake_gpu(0, cpus=range(8)), fake_gpu(1, cpus=range(8))]))
    monkeypatch.setattr(cudask.devices, "discover", lambda: machine)
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # no driver API: CuPy's path
    second = machine.gpus[1]
    monkeypatch.setitem(
        sys.modules, "cupy", _FakeCupy(b"\x00\x00\x00\x01", second.pci_bus_id.upper())
    )
    assert device0_uuid() == second.uuid
    whole = bytes(range(1, 17))
    monkeypatch.setitem(sys.modules, "cupy", _FakeCupy(whole, second.pci_bus_id))
    assert device0_uuid() == "GPU-01020304-0506-0708-090a-0b0c0d0e0f10"
    monkeypatch.setitem(sys.modules, "cupy", _FakeCupy(b"\x0c", "0000:ff:00.0"))
    with pytest.raises(RuntimeError, match="0000:ff:00.0"):
        device0_uuid()


class _FakeDriver:
    """Just what device0_uuid calls of cuda-bindings' driver module; records the calls."""

    class CUresult:
        CUDA_SUCCESS = 0
        CUDA_ERROR_NO_DEVICE = 100

    def __init__(self, uuid: bytes, fail: str | None = None) -> None:
        self.calls: list[str] = []
        self.uuid = uuid
        self.fail = fail

    def _ok(self, name: str, *out: object) -> tuple:
        self.calls.append(name)
        return (self.CUresult.CUDA_ERROR_NO_DEVICE if name == self.fail else 0, *out)

    def cuInit(self, flags: int) -> tuple:
        return self._ok("cuInit")

    def cuDeviceGet(self, ordinal: int) -> tuple:
        return self._ok("cuDeviceGet", ordinal)

    def cuDevicePrimaryCtxRetain(self, device: int) -> tuple:
        return self._ok("cuDevicePrimaryCtxRetain", "ctx")

    def cuCtxSetCurrent(self, ctx: str) -> tuple:
        assert ctx == "ctx"
        return self._ok("cuCtxSetCurrent")

    def cuDeviceGetUuid(self, device: int) -> tuple:
        import types

        return self._ok("cuDeviceGetUuid", types.SimpleNamespace(bytes=self.uuid))

    def cuGetErrorName(self, err: int) -> tuple:
        return (0, b"CUDA_ERROR_NO_DEVICE")

    def cuDeviceGetCount(self) -> tuple:
        return self._ok("cuDeviceGetCount", 1)

    def cuDevicePrimaryCtxGetState(self, device: int) -> tuple:
        return self._ok("cuDevicePrimaryCtxGetState", 0, self.active)

    active = 0  # whether the primary context was active before the worker made one


def _use_driver(monkeypatch, driver: _FakeDriver) -> None:
    import sys
    import types

    bindings = types.ModuleType("cuda.bindings")
    bindings.driver = driver
    monkeypatch.setitem(sys.modules, "cuda", types.ModuleType("cuda"))
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", driver)


def test_device0_uuid_through_the_driver_api_never_imports_cupy(monkeypatch):
    import sys

    from cudask.worker.context import device0_uuid

    driver = _FakeDriver(bytes(range(1, 17)))
    _use_driver(monkeypatch, driver)
    monkeypatch.setitem(sys.modules, "cupy", None)  # importing it would raise
    assert device0_uuid() == "GPU-01020304-0506-0708-090a-0b0c0d0e0f10"
    assert driver.calls == [
        "cuInit",
        "cuDeviceGet",
        "cuDevicePrimaryCtxRetain",
        "cuCtxSetCurrent",
        "cuDeviceGetUuid",
    ]


def test_a_failing_driver_call_is_named(monkeypatch):
    from cudask.worker.context import device0_uuid

    _use_driver(monkeypatch, _FakeDriver(bytes(16), fail="cuDevicePrimaryCtxRetain"))
    with pytest.raises(RuntimeError, match="cuDevicePrimaryCtxRetain failed: CUDA_ERROR_NO_DEVICE"):
        device0_uuid()


def test_cuda_context_plugin_imports_cupy_in_the_background(monkeypatch):
    """The import starts before the context is created (the driver call leaves the GIL
    to it) and runs in a thread: setup returns once the context exists, teardown waits
    for the import."""
    import importlib.util
    import threading
    import types

    from cudask.worker import plugins as P

    started, release = threading.Event(), threading.Event()
    seen_by_cuinit: list[bool] = []

    class ImportFirstDriver(_FakeDriver):
        def cuInit(self, flags: int) -> tuple:
            seen_by_cuinit.append(started.wait(10))
            return super().cuInit(flags)

    _use_driver(monkeypatch, ImportFirstDriver(bytes(range(1, 17))))
    imported: list[str] = []

    def slow_import(name: str) -> object:
        started.set()
        release.wait(10)
        imported.append(name)
        return types.ModuleType(name)

    monkeypatch.setattr(P.importlib, "import_module", slow_import)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    plugin = P.CUDAContext("GPU-01020304-0506-0708-090a-0b0c0d0e0f10")
    worker = types.SimpleNamespace(name="w")
    plugin.setup(worker)
    assert plugin.uuid == plugin.expected_uuid and plugin.seconds is not None
    assert seen_by_cuinit and all(
        seen_by_cuinit
    )  # the import was under way when the driver started
    assert imported == []  # setup did not wait for the import
    release.set()
    plugin.teardown(worker)
    assert imported == ["cupy"] and plugin.importer is None
    plugin.setup(worker)  # idempotent: no second context, no second import
    assert imported == ["cupy"]


def test_cuda_context_plugin_names_a_context_made_before_it(monkeypatch, caplog):
    """A library that used CUDA at import (a spawned worker re-imports the script) left a
    context: the worker's log says so, in the words dask-cuda's users filter on."""
    import logging
    import types

    from cudask.worker import plugins as P

    driver = _FakeDriver(bytes(range(1, 17)))
    driver.active = 1
    _use_driver(monkeypatch, driver)
    monkeypatch.setattr(P.CUDAContext, "background_imports", ())
    with caplog.at_level(logging.WARNING, logger="cudask.worker"):
        P.CUDAContext(None).setup(types.SimpleNamespace(name="w"))
    (record,) = [r for r in caplog.records if "already exists" in r.getMessage()]
    message = record.getMessage()
    assert message.startswith(
        "A CUDA context for device 0 (GPU-01020304-0506-0708-090a-"
        "0b0c0d0e0f10) already exists on process ID "
    )
    assert (
        "This is often the result of a CUDA-enabled library calling a CUDA runtime "
        "function before Dask-CUDA"
    ) in message


def test_device_ipc_stays_off_where_it_cannot_work(monkeypatch, caplog):
    """MIG, a GPU of the host without peer access, or no cuda-bindings: one log
    line and the worker sends device data the usual way."""
    import logging

    from cudask.comm import ipc, ipc_cuda
    from cudask.worker import plugins

    monkeypatch.setattr(ipc, "_state", ipc._State())
    uuid = "GPU-00000000-fake-4000-8000-000000000000"
    monkeypatch.setattr(plugins, "gpus_without_peer_access", lambda u: ["GPU-other"])
    assert (
        plugins.DeviceIPC(uuid, 1 << 20, map_ahead=False).unavailable()
        == f"{uuid} has no peer access to GPU-other"
    )
    assert "MIG instance" in plugins.DeviceIPC("MIG-1234", 1 << 20, map_ahead=False).unavailable()
    monkeypatch.setattr(plugins, "gpus_without_peer_access", lambda u: [])
    assert plugins.DeviceIPC(uuid, 1 << 20, map_ahead=False).unavailable() is None

    def no_bindings() -> None:
        raise ImportError("No module named 'cuda.bindings'", name="cuda.bindings")

    monkeypatch.setattr(ipc_cuda, "CudaBackend", no_bindings)
    off = plugins.DeviceIPC(uuid, 1 << 20, map_ahead=False)
    with caplog.at_level(logging.INFO, logger="cudask.worker"):
        off.setup(types.SimpleNamespace(handlers={}))
    assert not ipc.enabled()
    assert "not CUDA IPC: cuda.bindings is not installed" in caplog.text
    # its peers may still send to it by IPC: the mappings it keeps are still swept
    assert off._sweep is not None and off._sweep.is_running()
    off.teardown(types.SimpleNamespace())
    assert off._sweep is None and off._ahead is None

    monkeypatch.setattr(ipc_cuda, "CudaBackend", lambda: object())
    plugin = plugins.DeviceIPC(uuid, 4096, map_ahead=False)
    plugin.setup(types.SimpleNamespace(handlers={}))
    assert ipc.enabled() and ipc._state.min_size == 4096
    plugin.teardown(types.SimpleNamespace())
    assert not ipc.enabled()


def test_device_ipc_starts_the_exchange_of_pool_slabs_only_when_asked(monkeypatch):
    """`map_ahead` (cudask.comm.map-ahead) decides whether setup starts the exchange
    of pool slabs (cudask.comm.ahead): its handler answers while the plugin is set
    up and declines (None) after teardown; without it there is no handler."""
    import asyncio

    from distributed.core import Status

    from cudask.comm import ahead, ipc, ipc_cuda, ipc_peers
    from cudask.worker import plugins

    monkeypatch.setattr(ipc, "_state", ipc._State())
    monkeypatch.setattr(plugins, "gpus_without_peer_access", lambda u: [])
    monkeypatch.setattr(ipc_cuda, "CudaBackend", lambda: object())

    async def set_up_and_down(map_ahead: bool) -> tuple[bool, bool, object]:
        worker = types.SimpleNamespace(handlers={}, status=Status.closed)
        plugin = plugins.DeviceIPC("GPU-x", 4096, map_ahead=map_ahead)
        plugin.setup(worker)
        during = worker.handlers.get(ahead.HANDLER)
        started = plugin._ahead is not None and during == plugin._ahead.answer
        plugin.teardown(worker)
        assert plugin._ahead is None
        after = worker.handlers.get(ahead.HANDLER)
        return started, after is not None, after and await after(peer=ipc_peers.identity())

    assert asyncio.run(set_up_and_down(True)) == (True, True, None)  # declined after teardown
    assert asyncio.run(set_up_and_down(False)) == (False, False, None)  # never registered


def _gc_worker(plugins: dict | None = None, tasks: dict | None = None) -> Any:
    return types.SimpleNamespace(
        name="w", plugins=plugins or {}, state=types.SimpleNamespace(tasks=tasks or {})
    )


def test_gc_freeze_waits_for_the_cupy_import_then_freezes_and_unfreezes_at_teardown():
    """The freeze comes after the background import (its objects are frozen too), in
    a thread of its own; teardown joins it and gives the objects back to the collector."""
    import gc
    import threading
    import types

    from cudask.worker import plugins as P

    release = threading.Event()
    importer = threading.Thread(target=release.wait, args=(30,))
    importer.start()
    worker = _gc_worker({P.CUDAContext.name: types.SimpleNamespace(importer=importer)})
    plugin = P.GCFreeze()
    gc.unfreeze()  # a clean start, whatever ran before in this process
    try:
        plugin.setup(worker)
        thread = plugin.thread
        assert thread is not None and thread.is_alive() and plugin.frozen is None
        plugin.setup(worker)  # idempotent
        assert plugin.thread is thread
        release.set()
        thread.join(30)
        assert plugin.frozen is not None and plugin.frozen > 0
        assert gc.get_freeze_count() > 0  # frozen objects freed since leave the count
    finally:
        release.set()
        plugin.teardown(worker)
    assert plugin.thread is None and gc.get_freeze_count() == 0


def test_gc_freeze_torn_down_before_the_import_ends_freezes_nothing():
    import gc
    import threading
    import types

    from cudask.worker import plugins as P

    release = threading.Event()
    importer = threading.Thread(target=release.wait, args=(30,))
    importer.start()
    worker = _gc_worker({P.CUDAContext.name: types.SimpleNamespace(importer=importer)})
    plugin = P.GCFreeze()
    gc.unfreeze()
    plugin.setup(worker)
    thread = plugin.thread
    assert thread is not None
    closer = threading.Thread(target=plugin.teardown, args=(worker,))
    closer.start()  # waits for the freeze thread, which waits for the import
    assert wait_for(lambda: plugin.cancelled, 30)
    release.set()
    closer.join(60)
    assert not thread.is_alive() and plugin.frozen is None and gc.get_freeze_count() == 0


def test_gc_freeze_leaves_a_worker_that_already_has_tasks_unfrozen():
    import gc

    from cudask.worker import plugins as P

    worker = _gc_worker(tasks={"x": object()})
    plugin = P.GCFreeze()
    gc.unfreeze()
    try:
        plugin.setup(worker)
        assert plugin.thread is not None
        plugin.thread.join(30)
        assert plugin.frozen is None and gc.get_freeze_count() == 0
    finally:
        plugin.teardown(worker)


def test_gc_freeze_of_two_workers_in_one_process_stands_until_the_last_teardown():
    import gc

    from cudask.worker import plugins as P

    first, second = P.GCFreeze(), P.GCFreeze()
    worker_a, worker_b = _gc_worker(), _gc_worker()
    gc.unfreeze()
    try:
        for plugin, worker in ((first, worker_a), (second, worker_b)):
            plugin.setup(worker)
            assert plugin.thread is not None
            plugin.thread.join(30)
            assert plugin.frozen
        first.teardown(worker_a)
        assert gc.get_freeze_count() > 0  # the other worker's freeze stands
    finally:
        first.teardown(worker_a)
        second.teardown(worker_b)
    assert gc.get_freeze_count() == 0
