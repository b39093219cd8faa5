"""The cuDF handler on a cuDF-like object (device_serialize / device_deserialize)."""

from __future__ import annotations

import pickle
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from cudask.memory.handlers import CudfHandler
from cudask.memory.host.transfer import TransferEngine
from cudask.testing.fake_cuda import FakeDeviceArray


class FrameObject:
    """cuDF-like: moved through device_serialize() as one device and one host frame."""

    def __init__(self, values: np.ndarray, label: bytes) -> None:
        self.values = values
        self.label = label

    def device_serialize(self) -> tuple[dict[str, Any], list[Any]]:
        header = {"is-cuda": [True, False], "dtype": self.values.dtype.str}
        return header, [FakeDeviceArray.from_numpy(self.values), self.label]

    @classmethod
    def device_deserialize(cls, header: dict[str, Any], frames: list[Any]) -> FrameObject:
        assert len(frames) == len(header["is-cuda"]), "frames lost"
        device, label = frames
        return cls(device.array.view(header["dtype"]).copy(), bytes(label))


class FakeRmmBuffer:
    """rmm.DeviceBuffer over host memory, for the fake copy backend."""

    def __init__(self, size: int) -> None:
        self.array = np.zeros(max(size, 1), dtype=np.uint8)[:size]
        self.ptr = int(self.array.ctypes.data)


@pytest.mark.parametrize("sent", [False, True])
def test_cudf_like_frames_roundtrip_also_after_pickling(
    sent: bool, engine: TransferEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a proxy sent to a client carries its host copy pickled: the rebuilt copy has no
    # device->host copies to wait for, and every frame must still come back (found on an
    # H100: the cuDF frames of a dask-cuDF result were dropped at the client)
    monkeypatch.setitem(sys.modules, "rmm", SimpleNamespace(DeviceBuffer=FakeRmmBuffer))
    handler = CudfHandler()
    obj = FrameObject(np.arange(1000, dtype="f8") * 1.5, b"meta")
    assert handler.allocations(obj) and handler.producer_streams(obj) == ()
    copy = handler.to_host(obj, engine)
    if sent:
        buffers: list[pickle.PickleBuffer] = []
        data = pickle.dumps(copy, protocol=5, buffer_callback=buffers.append)
        copy = pickle.loads(data, buffers=[bytes(b.raw()) for b in buffers])
        assert not copy.copies
    value, copies = handler.to_device(copy, engine)
    assert not copies
    assert isinstance(value, FrameObject) and value.label == b"meta"
    np.testing.assert_array_equal(value.values, obj.values)
