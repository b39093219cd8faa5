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
