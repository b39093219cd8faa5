"""`__cuda_array_interface__` geometry: extents for any strides."""

from __future__ import annotations

import numpy as np

from cudask.memory.handlers import interface_extent, interface_nbytes
from cudask.memory.handlers.geometry import interface_stream
from cudask.testing.fake_cuda import FakeDeviceArray


def test_interface_extent_with_negative_and_transposed_strides() -> None:
    base = np.arange(24, dtype="i4").reshape(4, 6)
    for view in (base[::-1], base[:, ::-2], base.T, base[1:3, 2:5], base[::2, ::3].T):
        cai = FakeDeviceArray(view).__cuda_array_interface__
        low, high, offset = interface_extent(cai)
        ptr = cai["data"][0]
        assert low <= ptr < high and ptr - low == offset
        # every element lies inside [low, high)
        addrs = [ptr + sum(i * s for i, s in zip(idx, view.strides)) for idx in np.ndindex(view.shape)]
        assert min(addrs) == low and max(addrs) + 4 == high


def test_empty_and_contiguous_interfaces() -> None:
    empty = {"shape": (0, 3), "typestr": "<f4", "data": (4096, False), "strides": (12, 4)}
    assert interface_extent(empty) == (4096, 4096, 0) and interface_nbytes(empty) == 0
    dense = {"shape": (2, 3), "typestr": "<f8", "data": (4096, False)}
    assert interface_extent(dense) == (4096, 4096 + 48, 0) and interface_nbytes(dense) == 48
    assert interface_stream(dense) == () and interface_stream({**dense, "stream": 2}) == (2,)
