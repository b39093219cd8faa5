"""The `__cuda_array_interface__` handlers: geometry (extents for any strides),
recognition, masked interfaces, round trips that keep strides, sparse views
compacted, foreign objects rebuilt as the backend's array."""

from __future__ import annotations

import weakref
from typing import Any, ClassVar

import numpy as np
import pytest
from handler_testing import arange, roundtrip

from cudask.memory import handlers
from cudask.memory.handlers import UnspillableError, interface_extent, interface_nbytes
from cudask.memory.handlers.cai import interface_stream
from cudask.memory.host.copy_engine import TransferEngine
from cudask.memory.host.pool import PinnedPool
from cudask.testing.fake_cuda import FakeCopyBackend, FakeDeviceArray, ForeignDeviceObject


def test_interface_extent_with_negative_and_transposed_strides() -> None:
    base = np.arange(24, dtype="i4").reshape(4, 6)
    for view in (base[::-1], base[:, ::-2], base.T, base[1:3, 2:5], base[::2, ::3].T):
        cai = FakeDeviceArray(view).__cuda_array_interface__
        low, high, offset = interface_extent(cai)
        ptr = cai["data"][0]
        assert low <= ptr < high and ptr - low == offset
        # every element lies inside [low, high)
        addrs = [
            ptr + sum(i * s for i, s in zip(idx, view.strides)) for idx in np.ndindex(view.shape)
        ]
        assert min(addrs) == low and max(addrs) + 4 == high


def test_empty_and_contiguous_interfaces() -> None:
    empty = {"shape": (0, 3), "typestr": "<f4", "data": (4096, False), "strides": (12, 4)}
    assert interface_extent(empty) == (4096, 4096, 0) and interface_nbytes(empty) == 0
    dense = {"shape": (2, 3), "typestr": "<f8", "data": (4096, False)}
    assert interface_extent(dense) == (4096, 4096 + 48, 0) and interface_nbytes(dense) == 48
    assert interface_stream(dense) == () and interface_stream({**dense, "stream": 2}) == (2,)


class Masked:
    __cuda_array_interface__: ClassVar[dict[str, Any]] = {
        "shape": (2,),
        "typestr": "<f8",
        "data": (0, False),
        "version": 3,
        "mask": object(),
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
    engine = TransferEngine(backend, PinnedPool(backend, 1 << 22, slab_size=1 << 20))
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
