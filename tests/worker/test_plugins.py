"""Worker plugins on CPU: idempotence, teardown, failures."""

from __future__ import annotations

import os
import types

import pytest

from cudask.worker.plugins import CPUAffinity, PreImport, StoreMetrics


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


def test_store_metrics_registered_and_removed():
    data = types.SimpleNamespace(metrics=lambda: {"device_bytes": 5.0})
    w = types.SimpleNamespace(metrics={}, data=data)
    p = StoreMetrics()
    p.setup(w)
    assert w.metrics["cudask"](w) == {"device_bytes": 5.0}
    p.teardown(w)
    assert "cudask" not in w.metrics


def test_store_metrics_on_the_prometheus_page():
    prometheus_client = pytest.importorskip("prometheus_client")
    data = types.SimpleNamespace(metrics=lambda: {"device-bytes": 5.0, "host-keys": 2.0})
    w = types.SimpleNamespace(metrics={}, data=data)
    p = StoreMetrics()
    p.setup(w)
    p.setup(w)  # idempotent: one collector
    try:
        page = prometheus_client.generate_latest().decode()
        assert "cudask_store_device_bytes 5.0" in page
        assert "cudask_store_host_keys 2.0" in page
    finally:
        p.teardown(w)
    assert "cudask_store_device_bytes" not in prometheus_client.generate_latest().decode()


class _FakeCupy:
    """Just what device0_uuid touches, with CuPy's NUL-cut UUID."""

    def __init__(self, uuid: bytes, bus_id: str) -> None:
        import types

        device = types.SimpleNamespace(use=lambda: None, pci_bus_id=bus_id)
        runtime = types.SimpleNamespace(free=lambda ptr: None,
                                        getDeviceProperties=lambda i: {"uuid": uuid})
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
    second = machine.gpus[1]
    monkeypatch.setitem(sys.modules, "cupy", _FakeCupy(b"\x00\x00\x00\x01", second.pci_bus_id.upper()))
    assert device0_uuid() == second.uuid
    whole = bytes(range(1, 17))
    monkeypatch.setitem(sys.modules, "cupy", _FakeCupy(whole, second.pci_bus_id))
    assert device0_uuid() == "GPU-01020304-0506-0708-090a-0b0c0d0e0f10"
    monkeypatch.setitem(sys.modules, "cupy", _FakeCupy(b"\x0c", "0000:ff:00.0"))
    with pytest.raises(RuntimeError, match="0000:ff:00.0"):
        device0_uuid()
