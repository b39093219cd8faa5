"""Where a device array's elements lie, as the cudask-ipc family sends it.

Covers: `Layout` and `layout` (shape, type string, address of the first element,
byte strides of any sign, and the order of the receiver's copy, read from
`__cuda_array_interface__`), `contiguous_strides`, `extent` (the lowest address and byte span of a
strided array) and `device_serializable` (whether an object follows cuDF's
device-serialization protocol).

Does not cover: exporting or mapping memory (cudask.comm.ipc_cuda), headers
(cudask.comm.ipc).

Threading: pure functions of their arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Layout:
    """Where an array's elements lie, by its __cuda_array_interface__."""

    shape: tuple[int, ...]
    typestr: str
    address: int  # of its first element
    strides: tuple[int, ...]  # in bytes, any sign
    order: str  # of the copy the receiver makes: "F" for Fortran-contiguous arrays, else "C"


def layout(x: Any) -> Layout | None:
    """The layout of `x`; None for structured dtypes (the type string loses the fields)."""
    cai = x.__cuda_array_interface__
    shape = tuple(int(n) for n in cai["shape"])
    typestr = str(cai["typestr"])
    if len(cai.get("descr") or [("", typestr)]) > 1 or typestr[1] == "V":
        return None
    itemsize = int(typestr[2:])
    given = cai.get("strides")
    strides = (
        contiguous_strides(shape, itemsize, "C") if given is None else tuple(int(s) for s in given)
    )
    fortran = strides != contiguous_strides(shape, itemsize, "C") and strides == contiguous_strides(
        shape, itemsize, "F"
    )
    return Layout(shape, typestr, int(cai["data"][0]), strides, "F" if fortran else "C")


def contiguous_strides(shape: tuple[int, ...], itemsize: int, order: str) -> tuple[int, ...]:
    """The byte strides of a contiguous array of `order` ("C" or "F")."""
    out, step = [], itemsize
    for n in reversed(shape) if order == "C" else shape:
        out.append(step)
        step *= n
    return tuple(reversed(out)) if order == "C" else tuple(out)


def extent(
    address: int, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int
) -> tuple[int, int]:
    """The lowest address and the byte span of the elements of an array whose first
    element is at `address`, laid out with these byte strides (any sign)."""
    low = address + sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if s < 0)
    return low, sum((n - 1) * abs(s) for n, s in zip(shape, strides, strict=True)) + itemsize


def device_serializable(x: Any) -> bool:
    """Whether `x` follows cuDF's device-serialization protocol: `x.device_serialize()`
    gives (header, frames), device frames exposing __cuda_array_interface__, and
    `type(x).device_deserialize(header, frames)` rebuilds it (cuDF frames, series,
    indexes and columns do)."""
    kind = type(x)
    return callable(getattr(kind, "device_serialize", None)) and callable(
        getattr(kind, "device_deserialize", None)
    )


__all__ = ["Layout", "contiguous_strides", "device_serializable", "extent", "layout"]
