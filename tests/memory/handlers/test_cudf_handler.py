"""The cuDF handler on a cuDF-like object (device_serialize / device_deserialize)."""

from __future__ import annotations

import pickle
import sys
import weakref
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pytest

from cudask.memory.handlers import CudfHandler
from cudask.memory.host.copy_engine import TransferEngine
from cudask.memory.host.pool import PinnedPool
from cudask.testing.fake_cuda import FakeCopyBackend, FakeDeviceArray


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
        # as cuDF does: wraps the device frame, reads none of it on the host
        assert len(frames) == len(header["is-cuda"]), "frames lost"
        device, label = frames
        return cls(device.array.view(header["dtype"]), bytes(label))


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
    assert [c.nbytes for c in copies] == [obj.values.nbytes]  # counted by the store's metrics
    for c in copies:
        c.wait()
    assert isinstance(value, FrameObject) and value.label == b"meta"
    np.testing.assert_array_equal(value.values, obj.values)


def test_work_on_the_default_stream_waits_for_the_copies_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # to_device returns with its copies under way; what cuDF enqueues on the legacy
    # default stream while or after deserializing must run after them
    monkeypatch.setitem(sys.modules, "rmm", SimpleNamespace(DeviceBuffer=FakeRmmBuffer))
    backend = FakeCopyBackend()
    engine = TransferEngine(backend, PinnedPool(backend, 1 << 20, slab_size=1 << 16))
    handler = CudfHandler()
    obj = FrameObject(np.arange(1000, dtype="f8"), b"meta")
    host_copy = handler.to_host(obj, engine)  # copied at once (no lag)
    backend.lag = 1_000_000  # from here on copies stay queued until something waits
    value, copies = handler.to_device(host_copy, engine)
    assert copies and not any(c.ready() for c in copies)  # not waited for on the host
    backend.synchronize(backend.record(None))  # the default stream's later work
    assert all(c.ready() for c in copies)
    np.testing.assert_array_equal(value.values, obj.values)


class TwoFrames(FrameObject):
    def device_serialize(self) -> tuple[dict[str, Any], list[Any]]:
        header = {"is-cuda": [True, True], "dtype": self.values.dtype.str}
        return header, [
            FakeDeviceArray.from_numpy(self.values),
            FakeDeviceArray.from_numpy(self.values),
        ]


def test_an_allocation_that_fails_midway_lets_the_earlier_copies_finish(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[Any] = []

    class SecondFails(FakeRmmBuffer):
        def __init__(self, size: int) -> None:
            if made:
                raise MemoryError("fake out of memory")
            super().__init__(size)
            made.append(self)

    backend = FakeCopyBackend()
    engine = TransferEngine(backend, PinnedPool(backend, 1 << 20, slab_size=1 << 16))
    handler = CudfHandler()
    host_copy = handler.to_host(TwoFrames(np.arange(100, dtype="f8"), b""), engine)
    backend.lag = 1_000_000  # copies stay queued until something waits
    monkeypatch.setitem(sys.modules, "rmm", SimpleNamespace(DeviceBuffer=SecondFails))
    with pytest.raises(MemoryError):
        handler.to_device(host_copy, engine)
    assert len(made) == 1 and backend.in_flight() == 0  # the first frame's copy finished


class Tracked(FrameObject):
    """Records a weak reference to each device frame it serializes."""

    frames: ClassVar[list[Any]] = []

    def device_serialize(self) -> tuple[dict[str, Any], list[Any]]:
        header, out = super().device_serialize()
        Tracked.frames.append(weakref.ref(out[0]))
        return header, out


def test_each_device_frame_lives_until_its_copy_is_seen_complete() -> None:
    # with cuDF spilling on, a device frame of device_serialize() holds a spill lock on
    # its buffer: dropped before the copy completes, cuDF could spill the buffer (and
    # free its memory) under the copy
    backend = FakeCopyBackend()
    engine = TransferEngine(backend, PinnedPool(backend, 1 << 20, slab_size=1 << 16))
    backend.lag = 1_000_000  # copies stay queued until something waits
    Tracked.frames.clear()
    host_copy = CudfHandler().to_host(Tracked(np.arange(100, dtype="f8"), b""), engine)
    (frame,) = Tracked.frames
    assert frame() is not None and not host_copy.ready()
    for c in host_copy.copies:
        c.wait()
    assert frame() is None


def test_an_empty_host_frame(monkeypatch: pytest.MonkeyPatch, engine: TransferEngine) -> None:
    # with cuDF spilling on, an empty buffer cuDF has spilled is an empty host frame
    monkeypatch.setitem(sys.modules, "rmm", SimpleNamespace(DeviceBuffer=FakeRmmBuffer))
    handler = CudfHandler()
    obj = FrameObject(np.arange(10, dtype="f8"), b"")
    value, copies = handler.to_device(handler.to_host(obj, engine), engine)
    for c in copies:
        c.wait()
    assert value.label == b""
    np.testing.assert_array_equal(value.values, obj.values)
