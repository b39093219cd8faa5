"""Functions over values: recognition, allocations, host copies and rebuilds of
device objects and of containers holding them."""

from __future__ import annotations

import weakref
from typing import Any, ClassVar

import numpy as np
import pytest
from handler_testing import arange, roundtrip

from cudask.memory import handlers
from cudask.memory.handlers import ContainerCopy, UnspillableError, interface_extent
from cudask.memory.host.blocks import HostBlock
from cudask.memory.host.pool import PinnedPool
from cudask.memory.host.transfer import TransferEngine
from cudask.testing.fake_cuda import FakeCopyBackend, FakeDeviceArray, ForeignDeviceObject, as_numpy


def test_recognises_device_objects() -> None:
    a = arange(4)
    assert handlers.is_device_object(a)
    assert handlers.is_device_object(ForeignDeviceObject(a))
    assert handlers.is_device_object([1, (2, {"x": a})])
    for host in (np.arange(3), b"x", 3, None, [], (1, 2), {"a": np.zeros(2)}, "s"):
        assert not handlers.is_device_object(host)


class Masked:
    __cuda_array_interface__: ClassVar[dict[str, Any]] = {
        "shape": (2,), "typestr": "<f8", "data": (0, False), "version": 3, "mask": object(),
    }


class Raises:
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        raise AttributeError("not on a device")  # like a CPU torch tensor


def test_object_whose_interface_raises_is_host() -> None:
    assert not handlers.is_device_object(Raises())


def test_masked_interface_is_unspillable(engine: TransferEngine) -> None:
    assert handlers.is_device_object(Masked())
    with pytest.raises(UnspillableError, match="masked"):
        handlers.to_host(Masked(), engine)


def test_a_host_object_is_unspillable(engine: TransferEngine) -> None:
    with pytest.raises(UnspillableError, match="ndarray is not a device object"):
        handlers.to_host(np.zeros(3), engine)


def test_views_count_their_whole_allocation() -> None:
    a = arange(100)
    view = a.view(slice(10, 20))
    assert handlers.allocations(view) == handlers.allocations(a) == [
        (a.allocation[0], a.allocation[0] + 800)
    ]
    assert handlers.allocations([a, view]) == handlers.allocations(a) * 2


def test_device_leaves_weak_leaves_and_producer_streams() -> None:
    a, b = arange(3), arange(4)
    value = {"x": [a, 1, (b, "s")], "y": np.zeros(2)}
    assert [(leaf, h.name) for leaf, h in handlers.device_leaves(value)] == [
        (a, "fake"), (b, "fake")]
    refs = handlers.weak_leaves(value)
    assert refs is not None and [r() for r in refs] == [a, b]
    dead: list[weakref.ref[Any]] = []
    refs = handlers.weak_leaves([arange(2)], dead.append)  # the leaf dies at once
    assert refs is not None and len(dead) == 1
    foreign = ForeignDeviceObject(a)
    foreign.__cuda_array_interface__ = {**a.__cuda_array_interface__, "stream": 7}
    assert handlers.producer_streams([foreign, a, foreign]) == (7, 7)


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
    host = handlers.to_host(column, engine)
    assert host.nbytes == column.nbytes == 500 * 8
    dense = weakref.ref(host.copies[0].source)  # the compact copy, alive while copied
    assert not host.ready() and dense() is not None
    host.wait()
    assert dense() is None
    out, copies = handlers.to_device(host, engine)
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
    copy = handlers.to_host(value, engine)
    assert isinstance(copy, ContainerCopy)
    assert copy.nbytes == a.nbytes * 2 + b.nbytes
    out = roundtrip(value, engine)
    assert type(out["rest"]) is list and type(out["rest"][2]) is tuple
    assert out["rest"][1] == "label" and out["rest"][2][1] == 5
    np.testing.assert_array_equal(out["n"], value["n"])
    assert out["n"] is value["n"]  # host objects are kept, not copied
    np.testing.assert_equal(as_numpy(out["rest"][0]), b.get())


def test_container_images_nest_only_where_device_objects_are(engine: TransferEngine) -> None:
    """Inner containers holding device objects become ContainerCopy of their kind;
    inner containers of host objects are kept as they are (the same objects); the
    outer one is always an image, even of host objects only."""
    hosts = [1, (2, "x")]
    value = ({"k": arange(2)}, hosts, [arange(1)])
    copy = handlers.to_host(value, engine)
    assert isinstance(copy, ContainerCopy) and copy.kind == "tuple" and copy.keys is None
    first, second, third = copy.items
    assert isinstance(first, ContainerCopy) and (first.kind, first.keys) == ("dict", ["k"])
    assert second is hosts
    assert isinstance(third, ContainerCopy) and third.kind == "list"
    only_hosts = handlers.to_host([1, "a"], engine)
    assert isinstance(only_hosts, ContainerCopy) and only_hosts.items == [1, "a"]


def test_copy_is_ordered_after_producers(engine: TransferEngine) -> None:
    backend = engine.backend
    assert isinstance(backend, FakeCopyBackend)
    lagging = FakeCopyBackend(lag=1000)
    eng = TransferEngine(lagging, PinnedPool(lagging, 1 << 16, 1 << 16))
    eng.order_after_producers((12345,))
    d2h = eng._stream("d2h")
    assert [op[0] for op in d2h.ops] == ["wait", "wait"]


def test_host_to_device_copies_wait_for_the_default_stream() -> None:
    backend = FakeCopyBackend(lag=10_000)
    engine = TransferEngine(backend, PinnedPool(backend, 0, 0))
    src, dst = HostBlock.pageable(8), HostBlock.pageable(8)
    engine.to_device(dst.ptr, src.ptr, 8)
    h2d = engine._stream("h2d")
    # the destination may be memory freed by work queued on the default stream
    assert h2d.ops[0][0] == "wait" and h2d.ops[0][1].stream is backend.null
