"""faulting: memory faulted in by threads, in steps short enough that the CUDA
calls waiting for the memory-map lock get in between."""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy
import psutil
import pytest

from cudask.memory.host import faulting

pytestmark = pytest.mark.skipif(not faulting.available(), reason="needs Linux mappings")

MiB = 1 << 20


class _Counting:
    """The C library, with the sizes of MADV_POPULATE_WRITE calls recorded."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self.populate_sizes: list[int] = []
        self.lock = threading.Lock()

    def madvise(self, ptr: int, nbytes: int, advice: int) -> int:
        if advice == faulting.MADV_POPULATE_WRITE:
            with self.lock:
                self.populate_sizes.append(nbytes)
        return int(self._lib.madvise(ptr, nbytes, advice))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lib, name)


def test_memory_is_faulted_in_by_bounded_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    counting = _Counting(faulting._libc())
    monkeypatch.setattr(faulting, "_lib", counting)
    nbytes = 5 * faulting.POPULATE_STEP + 3 * MiB
    before = psutil.Process().memory_info().rss
    ptr = faulting.map_populated(nbytes, threads=2)
    try:
        resident = psutil.Process().memory_info().rss - before
        pages = numpy.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))
        assert not pages.any()  # zeroed, writable
        pages[-1] = 7
    finally:
        faulting.unmap(ptr, nbytes)
    if not faulting._no_populate_write:  # kernels before 5.14 fault pages in by writes
        assert counting.populate_sizes and max(counting.populate_sizes) <= faulting.POPULATE_STEP
        assert sum(counting.populate_sizes) >= nbytes
    assert resident >= nbytes * 0.9  # every page was in before the first read
