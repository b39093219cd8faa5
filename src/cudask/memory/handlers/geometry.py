"""Where the memory a `__cuda_array_interface__` describes lies.

Covers: the bytes of its elements (`interface_nbytes`), the extent from its
lowest to its highest byte for any strides, negative and transposed included
(`interface_extent`), and the producer stream it names (`interface_stream`).

Does not cover: reading the interface off an object (masked interfaces are
refused by `cai.CudaArrayInterfaceHandler`), copying.

Threading: pure functions of the interface dict.
"""

from __future__ import annotations

from typing import Any

import numpy


def interface_nbytes(cai: dict[str, Any]) -> int:
    """Bytes of the elements a `__cuda_array_interface__` describes."""
    itemsize = numpy.dtype(cai["typestr"]).itemsize
    return itemsize * int(numpy.prod([int(n) for n in cai["shape"]], dtype=numpy.int64))


def interface_extent(cai: dict[str, Any]) -> tuple[int, int, int]:
    """(lowest address, end address, offset of element 0 from the lowest address)
    of the memory a `__cuda_array_interface__` describes."""
    ptr = int(cai["data"][0] or 0)
    shape = tuple(int(n) for n in cai["shape"])
    strides = cai.get("strides")
    if any(n == 0 for n in shape):
        return ptr, ptr, 0
    if strides is None:
        return ptr, ptr + interface_nbytes(cai), 0
    itemsize = numpy.dtype(cai["typestr"]).itemsize
    low = sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
    high = sum((n - 1) * s for n, s in zip(shape, strides) if s > 0)
    return ptr + low, ptr + high + itemsize, -low


def interface_stream(cai: dict[str, Any]) -> tuple[int, ...]:
    """The raw stream handle the interface says its data is written on, if any."""
    stream = cai.get("stream")
    return (int(stream),) if stream else ()


__all__ = ["interface_extent", "interface_nbytes", "interface_stream"]
