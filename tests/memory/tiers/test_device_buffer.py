"""Unspilling through the store: one retry after an out-of-memory, then an error
that names the limit; prefetching copies ahead."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from cudask.memory.store import TieredStore
from cudask.testing.fake_cuda import FakeCopyBackend, filled

MakeStore = Callable[..., TieredStore]


dev = filled  # a fake device array of n elements, each `fill`


class OOMOnce(FakeCopyBackend):
    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def alloc_device(self, nbytes: int, device: int) -> tuple[int, Any]:
        if self.failures:
            self.failures -= 1
            raise MemoryError("fake out of memory")
        return super().alloc_device(nbytes, device)


def test_unspill_out_of_memory_retries_then_names_the_limit(make_store: MakeStore) -> None:
    backend = OOMOnce(failures=1)
    store = make_store(device_memory_limit=100, backend=backend)
    store["a"] = dev(100, 1)
    store["b"] = dev(100, 2)
    assert (store["a"].get() == 1).all()  # first allocation failed, the retry worked
    backend.failures = 2
    with pytest.raises(MemoryError, match="device_memory_limit=100 B"):
        store["b"]
    assert store.where("b") == "host"  # not lost
    assert (store["b"].get() == 2).all()


def test_prefetch_starts_copies_ahead(make_store: MakeStore) -> None:
    backend = FakeCopyBackend(lag=10_000)
    store = make_store(device_memory_limit=300, backend=backend)
    for i in range(6):
        store[i] = dev(100, i)
    backend.drain()
    store[99] = b"host"
    del store[5], store[4], store[3]  # room for three
    assert store.prefetch([0, 1, 99, "missing", 2]) == 3
    assert store.device_bytes == 300
    assert store.prefetch([0]) == 0  # already under way
    for i in range(3):
        assert (store[i].get() == i).all()
    assert sum(d == "h2d" for d, _ in backend.copies) == 3
