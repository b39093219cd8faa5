"""Helpers shared by the handler tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

from typing import Any

import numpy as np

from cudask.memory import handlers
from cudask.memory.host.copy_engine import TransferEngine
from cudask.testing.fake_cuda import FakeDeviceArray


def roundtrip(obj: Any, engine: TransferEngine) -> Any:
    copy = handlers.to_host(obj, engine)
    value, copies = handlers.to_device(copy, engine)
    for c in copies:
        c.wait()
    return value


def arange(n: int, dtype: str = "f8") -> FakeDeviceArray:
    return FakeDeviceArray.from_numpy(np.arange(n).astype(dtype))
