"""The handler registry: precedence over the generic handler, lazy registration,
no CUDA library imported by cudask's own imports."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from handler_testing import arange

from cudask.memory import handlers
from cudask.memory.handlers import UnspillableError, registry
from cudask.memory.host.copy_engine import TransferEngine
from cudask.testing.fake_cuda import FakeDeviceArray, FakeHandler, as_numpy


def test_register_handler_takes_precedence_over_generic() -> None:
    class Special(FakeDeviceArray):
        __slots__ = ()

    class SpecialHandler(handlers.CudaArrayInterfaceHandler):
        name = "special-test"

        def allocations(self, obj: Any) -> list[tuple[int, int]]:
            return [(1, 2)]

    assert handlers.allocations(Special(np.zeros(2))) != [(1, 2)]  # inherits the fake handler
    handlers.register_handler(Special, SpecialHandler())
    try:
        assert handlers.allocations(Special(np.zeros(2))) == [(1, 2)]
    finally:
        del registry._HANDLERS[Special]
        registry._RESOLVED.clear()


def test_the_generic_handler_is_the_fallback() -> None:
    # an unregistered type is a device object exactly when its instance exposes the
    # interface; containers are never leaves
    class Plain:
        pass

    plain = Plain()
    assert registry.leaf_handler(plain) is None
    plain.__cuda_array_interface__ = arange(2).__cuda_array_interface__  # type: ignore[attr-defined]
    found = registry.leaf_handler(plain)
    assert found is not None and found.name == "cuda_array_interface"
    assert registry.leaf_handler([plain]) is None and handlers.is_device_object([plain])


def test_a_host_copy_registers_its_handler_where_the_library_was_never_met(
    engine: TransferEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a client that receives a spilled proxy of a cuDF frame has never met a cuDF object:
    # rebuilding it must register the handler named in the copy (found on an H100)
    class LazyHandler(FakeHandler):
        name = "lazy-lib"

    copy = handlers.to_host(arange(6), engine)
    copy.handler = "lazy-lib"  # as if made by a handler this process has not registered yet
    calls: list[int] = []

    def register() -> None:
        calls.append(1)
        handlers.register_handler(LazyHandler, LazyHandler())

    monkeypatch.setattr(registry, "_BY_NAME", dict(registry._BY_NAME))
    monkeypatch.setattr(registry, "_HANDLERS", dict(registry._HANDLERS))
    monkeypatch.setitem(registry._LAZY, "lazy-lib", register)
    monkeypatch.setitem(registry._LAZY, "missing-lib", lambda: __import__("no_such_module_x"))
    try:
        value, copies = handlers.to_device(copy, engine)
        for c in copies:
            c.wait()
        np.testing.assert_array_equal(as_numpy(value), np.arange(6.0))
        assert calls == [1] and handlers.handler_named("lazy-lib").name == "lazy-lib"
        with pytest.raises(UnspillableError, match="'missing-lib'.*no_such_module_x"):
            handlers.handler_named("missing-lib")
    finally:
        registry._RESOLVED.clear()


def test_import_creates_no_cuda_dependency() -> None:
    """Importing cudask's memory core imports no CUDA library; each library family
    is registered lazily, under its top-level module name."""
    code = (
        "import sys, cudask.memory, cudask.memory.store, cudask.memory.handlers;"
        "import cudask.memory.backend, cudask.memory.host.pool, cudask.memory.host.copy_engine;"
        "bad = [m for m in ('cupy', 'torch', 'numba', 'rmm', 'cudf') if m in sys.modules];"
        "assert not bad, bad;"
        "from cudask.memory.handlers import registry;"
        "lazy = sorted(registry._LAZY);"
        "assert lazy == ['cudf', 'cupy', 'numba', 'numba_cuda', 'rmm', 'torch'], lazy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
