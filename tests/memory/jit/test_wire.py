"""A proxy's header and frames (cudask.memory.jit.wire) on a CPU: the registry of
device families that the comm layer fills, and the layering that keeps the
JIT-unspill layer above the core and below comm.

Not covered here: proxies through distributed's serializers (test_proxy.py) and
through the cudask-ipc family (test_proxy.py, tests/comm/test_ipc_cpu.py).
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from distributed.protocol.serialize import families

from cudask.memory.jit import wire
from cudask.memory.jit.cell import FRAMES, OBJECT, new_cell


def test_device_families_register_once_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "_device_families", ())
    for name in ("first", "second", "first"):
        wire.register_device_family(name)
    assert wire.device_families() == ("first", "second")


def test_a_direct_peer_gets_a_registered_family_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A family the comm layer registered is tried first only when the comm layer
    says the peer takes it (`direct`); its frames count as device frames, so the
    receiver rebuilds the object at once."""
    sent: list[Any] = []

    def dumps(x: Any, context: Any = None) -> tuple[dict[str, Any], list[Any]]:
        sent.append(context)
        return {"handle": "fake"}, []

    def loads(header: dict[str, Any], frames: list[Any]) -> Any:
        return np.arange(4)

    monkeypatch.setitem(families, "test-direct", (dumps, loads, True))
    monkeypatch.setattr(wire, "_device_families", ())
    wire.register_device_family("test-direct")
    context = {"recipient": {"address": "tcp://127.0.0.1:1"}}

    header, frames = wire.serialize(new_cell(np.arange(4)), device=False, context=context)
    assert header["sub-header"]["serializer"] != "test-direct" and not header["device-frames"]
    assert header["form"] == FRAMES and sent == []
    cell = wire.deserialize(header, frames)
    assert cell.form == FRAMES and (cell.payload.deserialize() == np.arange(4)).all()

    header, frames = wire.serialize(
        new_cell(np.arange(4)), device=False, context=context, direct=True
    )
    assert header["sub-header"]["serializer"] == "test-direct" and header["device-frames"]
    assert sent == [context]
    cell = wire.deserialize(header, frames)
    assert cell.form == OBJECT and (cell.payload == np.arange(4)).all()
    assert cell.cls is np.ndarray and cell.nbytes == np.arange(4).nbytes


def test_the_core_never_imports_jit_and_jit_never_imports_comm() -> None:
    code = (
        "import sys, cudask.memory.store, cudask.memory.handlers; "
        "assert not [m for m in sys.modules if m.startswith('cudask.memory.jit')]; "
        "import cudask.memory.jit.proxy_store, cudask.memory.jit.proxy; "
        "assert not [m for m in sys.modules if m.startswith('cudask.comm')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
