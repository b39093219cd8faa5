"""Device-object dispatch: recognition, allocations, host copies and rebuilds."""

from __future__ import annotations

import pickle
import subprocess
import sys
import weakref
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pytest

from cudask.memory import dispatch
from cudask.memory.dispatch import ContainerCopy, HostCopy, UnspillableError, interface_extent
from cudask.memory.host.pool import PinnedPool
from cudask.memory.host.transfer import TransferEngine
from cudask.testing.fake_cuda import (
    FakeCopyBackend,
    FakeDeviceArray,
    FakeHandler,
    ForeignDeviceObject,
    as_numpy,
)


@pytest.fixture
def engine() -> TransferEngine:
    backend = FakeCopyBackend()
    return TransferEngine(backend, PinnedPool(backend, 1 << 20, 1 << 16))


def roundtrip(obj: Any, engine: TransferEngine) -> Any:
    copy = dispatch.to_host(obj, engine)
    value, copies = dispatch.to_device(copy, engine)
    for c in copies:
        c.wait()
    return value


def arange(n: int, dtype: str = "f8") -> FakeDeviceArray:
    return FakeDeviceArray.from_numpy(np.arange(n).astype(dtype))


def test_recognises_device_objects() -> None:
    a = arange(4)
    assert dispatch.is_device_object(a)
    assert dispatch.is_device_object(ForeignDeviceObject(a))
    assert dispatch.is_device_object([1, (2, {"x": a})])
    for host in (np.arange(3), b"x", 3, None, [], (1, 2), {"a": np.zeros(2)}, "s"):
        assert not dispatch.is_device_object(host)


class Masked:
    __cuda_array_interface__: ClassVar[dict[str, Any]] = {
        "shape": (2,), "typestr": "<f8", "data": (0, False), "version": 3, "mask": object(),
    }


class Raises:
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        raise AttributeError("not on a device")  # like a CPU torch tensor


def test_object_whose_interface_raises_is_host() -> None:
    assert not dispatch.is_device_object(Raises())


def test_masked_interface_is_unspillable(engine: TransferEngine) -> None:
    assert dispatch.is_device_object(Masked())
    with pytest.raises(UnspillableError, match="masked"):
        dispatch.to_host(Masked(), engine)


def test_views_count_their_whole_allocation() -> None:
    a = arange(100)
    view = a.view(slice(10, 20))
    assert dispatch.allocations(view) == dispatch.allocations(a) == [
        (a.allocation[0], a.allocation[0] + 800)
    ]
    assert dispatch.allocations([a, view]) == dispatch.allocations(a) * 2


def test_interface_extent_with_negative_and_transposed_strides() -> None:
    base = np.arange(24, dtype="i4").reshape(4, 6)
    for view in (base[::-1], base[:, ::-2], base.T, base[1:3, 2:5], base[::2, ::3].T):
        cai = FakeDeviceArray(view).__cuda_array_interface__
        low, high, offset = interface_extent(cai)
        ptr = cai["data"][0]
        assert low <= ptr < high and ptr - low == offset
        flat = np.lib.stride_tricks.as_strided  # every element lies inside [low, high)
        addrs = [ptr + sum(i * s for i, s in zip(idx, view.strides)) for idx in np.ndindex(view.shape)]
        assert min(addrs) == low and max(addrs) + 4 == high
        del flat


@pytest.mark.parametrize(
    "make",
    [
        lambda: arange(10),
        lambda: arange(12, "i2").view((slice(None, None, -3),)),
        lambda: FakeDeviceArray.from_numpy(np.arange(30, dtype="u4").reshape(5, 6)).T,
        lambda: FakeDeviceArray.from_numpy(np.arange(30, dtype="c8").reshape(5, 6))[1:4, ::2],
        lambda: FakeDeviceArray.from_numpy(np.asarray(7.5)),
        lambda: FakeDeviceArray.empty((0, 3), "f4"),
        lambda: FakeDeviceArray.from_numpy(np.asfortranarray(np.arange(6.0).reshape(2, 3))),
    ],
)
def test_roundtrip_keeps_type_dtype_shape_strides(make: Any, engine: TransferEngine) -> None:
    """Dense layouts (C, F, transposed, a block) keep their strides; a sparse view
    (elements filling at most half its extent: `[::-3]`) comes back C-contiguous."""
    a = make()
    out = roundtrip(a, engine)
    assert type(out) is FakeDeviceArray
    assert out.dtype == a.dtype and out.shape == a.shape
    low, high, _ = interface_extent(a.__cuda_array_interface__)
    sparse = a.strides != np.empty(a.shape, a.dtype).strides and 2 * a.nbytes <= high - low
    if a.nbytes:
        assert out.strides == (np.empty(a.shape, a.dtype).strides if sparse else a.strides)
    np.testing.assert_array_equal(out.get(), a.get())
    assert out.allocation != a.allocation or a.nbytes == 0


def test_a_sparse_view_moves_its_elements_not_its_extent() -> None:
    """A column of a C-ordered chunk (what dask's map_overlap slices off each
    neighbour) spans nearly the whole chunk: it is compacted on the device, so
    the copies move the column's bytes both ways; without `compact` (a foreign
    object) the extent is copied and the strides kept."""
    backend = FakeCopyBackend(lag=1)
    engine = TransferEngine(backend, PinnedPool(backend, 1 << 22, 1 << 20))
    chunk = FakeDeviceArray.from_numpy(np.arange(500 * 400, dtype="f8").reshape(500, 400))
    column = chunk[:, 399:400]
    host = dispatch.to_host(column, engine)
    assert host.nbytes == column.nbytes == 500 * 8
    dense = weakref.ref(host.copies[0].source)  # the compact copy, alive while copied
    assert not host.ready() and dense() is not None
    host.wait()
    assert dense() is None
    out, copies = dispatch.to_device(host, engine)
    for c in copies:
        c.wait()
    assert out.shape == (500, 1) and out.strides == (8, 8)
    np.testing.assert_array_equal(out.get(), column.get())
    assert out.allocation[1] == 500 * 8  # unspilling allocates the column alone
    assert backend.copies == [("d2h", 4000), ("h2d", 4000)]

    backend.copies.clear()
    out = roundtrip(ForeignDeviceObject(column), engine)
    extent = 499 * 400 * 8 + 8
    assert backend.copies == [("d2h", extent), ("h2d", extent)]
    assert out.strides == column.strides
    np.testing.assert_array_equal(out.get(), column.get())


def test_foreign_object_comes_back_as_backend_array(engine: TransferEngine) -> None:
    a = arange(5, "i8")
    out = roundtrip(ForeignDeviceObject(a), engine)
    assert isinstance(out, FakeDeviceArray)
    np.testing.assert_array_equal(out.get(), a.get())


def test_containers_keep_their_shape_and_host_items(engine: TransferEngine) -> None:
    a, b = arange(3), arange(4, "i4")
    value = {"a": a, "rest": [b, "label", (a, 5)], "n": np.arange(2)}
    copy = dispatch.to_host(value, engine)
    assert isinstance(copy, ContainerCopy)
    assert copy.nbytes == a.nbytes * 2 + b.nbytes
    out = roundtrip(value, engine)
    assert type(out["rest"]) is list and type(out["rest"][2]) is tuple
    assert out["rest"][1] == "label" and out["rest"][2][1] == 5
    np.testing.assert_array_equal(out["n"], value["n"])
    assert out["n"] is value["n"]  # host objects are kept, not copied
    np.testing.assert_equal(as_numpy(out["rest"][0]), b.get())


def test_host_copy_pickles_out_of_band_and_rebuilds(engine: TransferEngine) -> None:
    a = FakeDeviceArray.from_numpy(np.arange(50, dtype="f4").reshape(5, 10))[:, 1::2]
    copy = dispatch.to_host(a, engine)
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(copy, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 1 and len(data) < 1000  # the bytes travel out of band
    loaded = pickle.loads(data, buffers=[bytes(b.raw()) for b in buffers])
    assert isinstance(loaded, HostCopy) and not loaded.pinned()
    value, copies = dispatch.to_device(loaded, engine)
    for c in copies:
        c.wait()
    np.testing.assert_array_equal(value.get(), a.get())
    # protocol < 5 still works (in-band bytes)
    value2, _ = dispatch.to_device(pickle.loads(pickle.dumps(copy, protocol=4)), engine)
    np.testing.assert_array_equal(value2.get(), a.get())


def test_host_copy_returns_its_pinned_block_when_it_dies() -> None:
    backend = FakeCopyBackend(lag=1000)
    pool = PinnedPool(backend, 1 << 16, 1 << 16)
    pool.preallocate()
    engine = TransferEngine(backend, pool)
    copy = dispatch.to_host(arange(100), engine)
    assert copy.pinned() and pool.in_use == 1024
    del copy  # copy still in flight: the block waits for it
    assert pool.in_use == 1024
    backend.drain()
    pool.allocate(10).release()
    assert pool.in_use == 0


def test_copy_is_ordered_after_producers(engine: TransferEngine) -> None:
    backend = engine.backend
    assert isinstance(backend, FakeCopyBackend)
    lagging = FakeCopyBackend(lag=1000)
    eng = TransferEngine(lagging, PinnedPool(lagging, 1 << 16, 1 << 16))
    eng.order_after_producers((12345,))
    d2h = eng._stream("d2h")
    assert [op[0] for op in d2h.ops] == ["wait", "wait"]


def test_register_handler_takes_precedence_over_generic() -> None:
    class Special(FakeDeviceArray):
        __slots__ = ()

    class SpecialHandler(dispatch.CudaArrayInterfaceHandler):
        name = "special-test"

        def allocations(self, obj: Any) -> list[tuple[int, int]]:
            return [(1, 2)]

    assert dispatch.allocations(Special(np.zeros(2))) != [(1, 2)]  # inherits the fake handler
    dispatch.register_handler(Special, SpecialHandler())
    try:
        assert dispatch.allocations(Special(np.zeros(2))) == [(1, 2)]
    finally:
        del dispatch._HANDLERS[Special]
        dispatch._RESOLVED.clear()


def test_a_host_copy_registers_its_handler_where_the_library_was_never_met(
    engine: TransferEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a client that receives a spilled proxy of a cuDF frame has never met a cuDF object:
    # rebuilding it must register the handler named in the copy (found on an H100)
    class LazyHandler(FakeHandler):
        name = "lazy-lib"

    copy = dispatch.to_host(arange(6), engine)
    copy.handler = "lazy-lib"  # as if made by a handler this process has not registered yet
    calls: list[int] = []

    def register() -> None:
        calls.append(1)
        dispatch.register_handler(LazyHandler, LazyHandler())

    monkeypatch.setattr(dispatch, "_BY_NAME", dict(dispatch._BY_NAME))
    monkeypatch.setattr(dispatch, "_HANDLERS", dict(dispatch._HANDLERS))
    monkeypatch.setitem(dispatch._LAZY, "lazy-lib", register)
    monkeypatch.setitem(dispatch._LAZY, "missing-lib", lambda: __import__("no_such_module_x"))
    try:
        value, copies = dispatch.to_device(copy, engine)
        for c in copies:
            c.wait()
        np.testing.assert_array_equal(as_numpy(value), np.arange(6.0))
        assert calls == [1] and dispatch.handler_named("lazy-lib").name == "lazy-lib"
        with pytest.raises(UnspillableError, match="'missing-lib'.*no_such_module_x"):
            dispatch.handler_named("missing-lib")
    finally:
        dispatch._RESOLVED.clear()


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
    handler = dispatch.CudfHandler()
    obj = FrameObject(np.arange(1000, dtype="f8") * 1.5, b"meta")
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


def test_import_creates_no_cuda_dependency() -> None:
    code = (
        "import sys, cudask.memory, cudask.memory.store, cudask.memory.dispatch;"
        "import cudask.memory.backend, cudask.memory.host.pool, cudask.memory.host.transfer;"
        "bad = [m for m in ('cupy', 'torch', 'numba', 'rmm', 'cudf') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_host_to_device_copies_wait_for_the_default_stream() -> None:
    from cudask.memory.host.blocks import HostBlock
    from cudask.memory.host.pool import PinnedPool
    from cudask.memory.host.transfer import TransferEngine
    from cudask.testing.fake_cuda import FakeCopyBackend

    backend = FakeCopyBackend(lag=10_000)
    engine = TransferEngine(backend, PinnedPool(backend, 0, 0))
    src, dst = HostBlock.pageable(8), HostBlock.pageable(8)
    engine.to_device(dst.ptr, src.ptr, 8)
    h2d = engine._stream("h2d")
    # the destination may be memory freed by work queued on the default stream
    assert h2d.ops[0][0] == "wait" and h2d.ops[0][1].stream is backend.null
