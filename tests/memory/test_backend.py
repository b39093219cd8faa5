"""The CUDA boundary without CUDA: the out-of-memory test and host addresses."""

from __future__ import annotations

import numpy as np

from cudask.memory.backend import address_of, is_out_of_memory, memoryview_at


class OutOfMemoryError(Exception):
    """Named like CuPy's cupy.cuda.memory.OutOfMemoryError."""


class CUDARuntimeError(RuntimeError):
    pass


def test_out_of_memory_is_recognised_by_type_name_or_message() -> None:
    assert is_out_of_memory(MemoryError("fake cudaHostAlloc refused 16 bytes"))
    assert is_out_of_memory(OutOfMemoryError("allocating 1024 bytes"))
    assert is_out_of_memory(CUDARuntimeError("cudaErrorMemoryAllocation: out of memory"))
    assert is_out_of_memory(CUDARuntimeError("cudaErrorMemoryAllocation"))
    assert is_out_of_memory(RuntimeError("CUDA error: Out Of Memory"))
    assert not is_out_of_memory(RuntimeError("operation not supported"))
    assert not is_out_of_memory(CUDARuntimeError("cudaErrorInvalidValue: invalid argument"))


def test_memoryview_at_sees_the_buffer_at_its_address() -> None:
    array = np.arange(16, dtype=np.uint8)
    view = memoryview_at(address_of(array), array.nbytes)
    view[0] = 99
    assert array[0] == 99 and bytes(view[1:3]) == b"\x01\x02"
    assert address_of(b"") == 0
